"""The out-of-process adapter boundary: JSON lines over a child's stdin/stdout.

`specs/adapter-protocol.md` is the contract. `SubprocessAdapter` is the
harness side: it starts the child, shakes hands and turns every reply into
a model value. `serve` is the adapter side for any in-process adapter, so a
Python implementation can be checked through the wire exactly like one in
Rust, Go or Java.

Anything that is not a well-formed, timely reply to the request just sent
is an `AdapterFault`: the run stops and says why. Faults are never compared
with the model.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import json
import os
import queue
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, TextIO

from leaseproof.conformance.boundary import codec
from leaseproof.conformance.boundary.protocols import ALL_OPERATIONS, CORE_OPERATIONS, DeliveryAdapter
from leaseproof.model import delivery as m

PROTOCOL_VERSION = 1
MACHINE = "delivery"
STDERR_TAIL_LINES = 20


class AdapterFault(Exception):
    """The adapter or its infrastructure broke; the run stops, nothing is compared."""


class SubprocessAdapter:
    """A `DeliveryAdapter` whose implementation runs in a child process."""

    def __init__(self, command: str, *, reply_timeout: float = 30.0) -> None:
        self.command = command
        self.reply_timeout = reply_timeout
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._replies: queue.Queue[str | Exception | None] = queue.Queue()
        self._next_id = 0
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise AdapterFault(f"cannot parse the adapter command {command!r}: {exc}") from None
        if not argv:
            raise AdapterFault("the adapter command is empty")
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                bufsize=1,
            )
        except OSError as exc:
            raise AdapterFault(f"could not start the adapter {command!r}: {exc}") from None
        threading.Thread(target=self._pump_stdout, daemon=True).start()
        threading.Thread(target=self._pump_stderr, daemon=True).start()
        try:
            self.name, self.operations = _check_hello(self._call("hello", {"protocol": PROTOCOL_VERSION}))
        except AdapterFault as fault:
            self.close()  # a refused handshake leaves no child behind
            raise fault if str(fault).startswith("adapter ") else self._fault(str(fault)) from None

    # -- the DeliveryAdapter interface --------------------------------------------

    def reset(self, start: dt.datetime) -> None:
        self._call("reset", {"machine": MACHINE, "start": codec.encode(start)})

    def execute(self, command: m.Command) -> m.Outcome:
        result = self._call("execute", {"machine": MACHINE, "command": codec.encode(command)})
        try:
            outcome = codec.decode(result)
        except codec.DecodeError as exc:
            raise self._fault(f"its outcome for {type(command).__name__} is malformed: {exc}") from None
        expected = m.OUTCOME_VARIANTS[type(command)]
        if m.variant(outcome) not in expected:
            raise self._fault(
                f"it answered {type(command).__name__} with {type(outcome).__name__}, "
                f"which is not an outcome of that operation ({', '.join(expected)})"
            )
        return outcome

    def snapshot(self) -> m.DeliverySystem:
        result = self._call("snapshot", {"machine": MACHINE})
        try:
            state: m.DeliverySystem = codec.decode_state(result)
        except codec.DecodeError as exc:
            raise self._fault(f"its snapshot is malformed: {exc}") from None
        return state

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(AdapterFault):
                self._call("close", {}, timeout=5)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def stderr_tail(self) -> list[str]:
        return list(self._stderr)

    # -- the exchange ---------------------------------------------------------------

    def _call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        self._next_id += 1
        request = {"id": self._next_id, "method": method, "params": params}
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(request, separators=(",", ":")) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._fault(f"it stopped reading before the {method!r} request{self._exit_note()}") from None
        wait = self.reply_timeout if timeout is None else timeout
        try:
            line = self._replies.get(timeout=wait)
        except queue.Empty:
            self.process.kill()
            raise self._fault(f"no reply to {method!r} within {wait:g}s") from None
        if line is None:
            raise self._fault(f"it closed its stdout before replying to {method!r}{self._exit_note()}")
        if isinstance(line, Exception):
            self.process.kill()
            raise self._fault(f"its reply to {method!r} is not valid UTF-8: {line}")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise self._fault(f"its reply to {method!r} is not JSON: {line[:200]!r}") from None
        if not isinstance(reply, dict) or type(reply.get("id")) is not int or reply["id"] != self._next_id:
            raise self._fault(f"its reply to {method!r} (request id {self._next_id}) has the wrong id: {line[:200]!r}")
        if "fault" in reply:
            fault = reply["fault"]
            message = fault.get("message") if isinstance(fault, dict) else fault
            raise self._fault(f"it reported a fault on {method!r}: {message}")
        if "result" not in reply:
            raise self._fault(f"its reply to {method!r} has neither \"result\" nor \"fault\": {line[:200]!r}")
        return reply["result"]

    def _fault(self, problem: str) -> AdapterFault:
        tail = self.stderr_tail()
        text = f"adapter {self.command!r} failed: {problem}"
        if tail:
            text += "\nits last stderr lines:\n" + "\n".join(f"  | {line}" for line in tail)
        return AdapterFault(text)

    def _exit_note(self) -> str:
        try:
            code = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        return f" (it exited with status {code})"

    def _pump_stdout(self) -> None:
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                self._replies.put(line)
        except UnicodeDecodeError as exc:
            self._replies.put(exc)
            return
        self._replies.put(None)

    def _pump_stderr(self) -> None:
        assert self.process.stderr is not None
        try:
            for line in self.process.stderr:
                self._stderr.append(line.rstrip("\n"))
        except UnicodeDecodeError:
            self._stderr.append("(the rest of stderr is not valid UTF-8)")


def _check_hello(result: Any) -> tuple[str, frozenset[str]]:
    if not isinstance(result, dict):
        raise AdapterFault(f"its hello reply is not an object: {result!r}")
    if type(result.get("protocol")) is not int or result["protocol"] != PROTOCOL_VERSION:
        raise AdapterFault(
            f"it speaks protocol {result.get('protocol')!r}; this harness speaks {PROTOCOL_VERSION}"
        )
    machines = result.get("machines")
    if not isinstance(machines, dict) or MACHINE not in machines:
        raise AdapterFault(f"it does not offer the {MACHINE!r} machine (machines: {machines!r})")
    operations = machines[MACHINE]
    if not isinstance(operations, list) or not all(isinstance(op, str) for op in operations):
        raise AdapterFault(f"its {MACHINE!r} operations are not a list of names: {operations!r}")
    unknown = set(operations) - ALL_OPERATIONS
    if unknown:
        raise AdapterFault(f"it offers operations the model does not have: {sorted(unknown)}")
    missing = CORE_OPERATIONS - set(operations)
    if missing:
        raise AdapterFault(f"it lacks mandatory operations: {sorted(missing)}")
    name = result.get("implementation")
    return (name if isinstance(name, str) else "unnamed adapter"), frozenset(operations)


# -- the adapter side, for any in-process adapter ---------------------------------


class ProtocolError(Exception):
    """A request `serve` refuses before it reaches the adapter: `code` says which
    rule it breaks (specs/adapter-protocol.md, section 11), the message what is wrong."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.request_id: Any = None  # the request's id, when that much of it was readable


# Each method's params: the members it requires, and any it may also carry.
_PARAMS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "hello": (frozenset(), frozenset({"protocol"})),
    "reset": (frozenset({"machine", "start"}), frozenset()),
    "execute": (frozenset({"machine", "command"}), frozenset()),
    "snapshot": (frozenset({"machine"}), frozenset()),
    "close": (frozenset(), frozenset()),
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _request(line: bytes | str) -> tuple[Any, str, dict[str, Any]]:
    """One request line as (id, method, params), or the ProtocolError it breaks."""
    try:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
    except UnicodeDecodeError as exc:
        raise ProtocolError("not-json", f"the request is not UTF-8 (byte {exc.start})") from None
    try:
        request = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError, or NaN / Infinity
        raise ProtocolError("not-json", f"the request is not JSON: {getattr(exc, 'msg', exc)}") from None
    if not isinstance(request, dict):
        raise ProtocolError("not-an-object", "the request is not a JSON object")
    id_ = request.get("id")
    if not (id_ is None or isinstance(id_, str) or (isinstance(id_, int) and not isinstance(id_, bool))):
        raise ProtocolError("bad-request", f'"id" must be an integer or a string, not {json.dumps(id_)}')
    try:
        unknown = sorted(set(request) - {"id", "method", "params"})
        if unknown:
            raise ProtocolError("bad-request", f"unknown members {unknown}: a request has id, method and params")
        method = request.get("method")
        if method not in _PARAMS:
            known = ", ".join(_PARAMS)
            raise ProtocolError("unknown-method", f"unknown method {json.dumps(method)}: the methods are {known}")
        params = request.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ProtocolError("bad-params", f'"params" of {method} must be an object')
        required, optional = _PARAMS[method]
        if required - set(params):
            raise ProtocolError("bad-params", f"{method} needs params {sorted(required - set(params))}")
        if set(params) - required - optional:
            raise ProtocolError("bad-params", f"{method} takes no params {sorted(set(params) - required - optional)}")
        if "machine" in params and params["machine"] != MACHINE:
            raise ProtocolError(
                "wrong-machine", f"this adapter serves the {MACHINE!r} machine, not {json.dumps(params['machine'])}"
            )
    except ProtocolError as error:
        error.request_id = id_
        raise
    return id_, method, params


def serve(
    adapter: DeliveryAdapter,
    *,
    implementation: str,
    operations: frozenset[str] = ALL_OPERATIONS,
    stdin: IO[bytes] | TextIO | None = None,
    stdout: TextIO = sys.stdout,
) -> None:
    """Answer protocol requests, one per line of `stdin` (default: the process's
    standard input, read as bytes), until "close" or end of input.

    A request that breaks the protocol (not UTF-8 or not JSON, an unknown
    method or member, wrong params, another machine, anything before
    "hello", a value that does not decode) gets a fault reply with its
    `code` and never reaches the adapter. An exception from the adapter is a
    fault with code "implementation". Either way `serve` goes on serving."""
    handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
        "hello": lambda p: {
            "protocol": PROTOCOL_VERSION,
            "implementation": implementation,
            "machines": {MACHINE: sorted(operations)},
        },
        "reset": lambda p: adapter.reset(p["start"]),
        "execute": lambda p: codec.encode(adapter.execute(p["command"])),
        "snapshot": lambda p: codec.encode_state(adapter.snapshot()),
        "close": lambda p: None,
    }
    decoders: dict[str, Callable[[Any], Any]] = {
        "start": lambda value: codec.decode(value, dt.datetime, "start"),
        "command": lambda value: _offered(codec.decode(value, object, "command"), operations),
    }
    greeted = False
    for line in stdin if stdin is not None else sys.stdin.buffer:
        id_, method = None, None
        try:
            id_, method, params = _request(line)
            if not greeted and method not in ("hello", "close"):
                raise ProtocolError("hello-first", f"{method} before hello: the session starts with a hello")
            try:
                params = {key: decoders.get(key, lambda v: v)(value) for key, value in params.items()}
            except codec.DecodeError as exc:
                raise ProtocolError("malformed-value", f"{method}: {exc}") from None
            greeted = greeted or method == "hello"
            try:
                reply: dict[str, Any] = {"id": id_, "result": handlers[method](params)}
            except Exception as exc:  # noqa: BLE001 - the adapter failed: a fault, and serving goes on
                reply = {"id": id_, "fault": {"code": "implementation", "message": f"{type(exc).__name__}: {exc}"}}
        except ProtocolError as error:
            fault = {"code": error.code, "message": str(error)}
            reply = {"id": id_ if id_ is not None else error.request_id, "fault": fault}
        stdout.write(json.dumps(reply, separators=(",", ":"), allow_nan=False) + "\n")
        stdout.flush()
        if method == "close" and "result" in reply:
            return


def _offered(command: Any, operations: frozenset[str]) -> Any:
    """A decoded command of the delivery machine that the adapter offers."""
    if type(command) not in m.OUTCOME_VARIANTS:
        raise codec.DecodeError("command", f"{type(command).__name__} is not a {MACHINE} command")
    if type(command).__name__ not in operations:
        raise codec.DecodeError("command", f"{type(command).__name__} is not among the operations this adapter offers")
    return command


def stdout_for_protocol() -> TextIO:
    """Reserve the real stdout for protocol lines; anything else printed goes to stderr."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return protocol
