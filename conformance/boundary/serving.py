"""The adapter side of the wire protocol, for any in-process adapter: `serve`.

`serve` answers the harness's requests, a JSON line each, with a Python adapter's results, so a
Python implementation can be checked through the wire exactly like one in Rust, Go or Java (the
bundled store is served so by `python -m leaseproof.conformance.boundary.serve`). A request that
breaks the protocol is a `ProtocolError`, answered with a fault, and never reaches the adapter;
`stdout_for_protocol` keeps an adapter's prints off the protocol's channel. The versions and the
machines it speaks are wire.py's, which the harness speaks too: this module imports wire.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import queue
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any, TextIO

import attrs

from leaseproof.conformance.boundary import codec
from leaseproof.conformance.boundary.protocols import ALL_OPERATIONS, DeliveryAdapter
from leaseproof.conformance.boundary.wire import (
    DATABASES_SINCE,
    LIFECYCLE_OPERATIONS,
    MACHINE,
    MACHINES,
    PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    SESSIONS_SINCE,
)


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
    "execute": (frozenset({"machine", "command"}), frozenset({"session"})),
    "snapshot": (frozenset({"machine"}), frozenset()),
    "open_session": (frozenset({"machine", "session"}), frozenset()),
    "close_session": (frozenset({"machine", "session"}), frozenset()),
    "close": (frozenset(), frozenset()),
    "attach": (frozenset({"machine", "database"}), frozenset()),
}


class _Session:
    """One session `serve` runs: the adapter's `session()` on a thread of its own,
    so its commands run concurrently with other sessions'. Replies are written
    as they finish; `write` serialises them."""

    def __init__(self, session: Any, write: Callable[[dict[str, Any]], None]) -> None:
        self.session, self.write = session, write
        self.jobs: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="leaseproof-serve-session", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            id_, command = job
            try:
                reply: dict[str, Any] = {"id": id_, "result": codec.encode(self.session.execute(command))}
            except Exception as exc:  # noqa: BLE001 - the implementation failed: a fault, and serving goes on
                code = "session-lost" if _lost_connection(exc) else "implementation"
                reply = {"id": id_, "fault": {"code": code, "message": f"{type(exc).__name__}: {exc}"}}
            self.write(reply)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        self.session.close()


def _lost_connection(exc: BaseException) -> bool:
    """Whether `exc` lost the session's connection: an OS-level error (a reset, a
    timeout), or a lost database connection (psycopg's OperationalError, by name)."""
    return isinstance(exc, OSError) or any(cls.__name__ == "OperationalError" for cls in type(exc).__mro__)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _request(line: bytes | str, served: Mapping[str, Any]) -> tuple[Any, str, dict[str, Any]]:
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
        if "machine" in params and params["machine"] not in served:
            names = " and ".join(repr(name) for name in served)
            raise ProtocolError(
                "wrong-machine", f"this adapter serves the {names} machine, not {json.dumps(params['machine'])}"
            )
    except ProtocolError as error:
        error.request_id = id_
        raise
    return id_, method, params


@attrs.define
class _Agreement:
    """What `serve`'s handshake agreed: the version, and what of the machines served
    and of sessions it carries (before any hello: everything)."""

    protocol: int
    served: Mapping[str, tuple[Any, frozenset[str]]]
    sessions: bool


def serve(
    adapter: DeliveryAdapter,
    *,
    implementation: str,
    operations: frozenset[str] = ALL_OPERATIONS,
    lifecycle: Any = None,
    stdin: IO[bytes] | TextIO | None = None,
    stdout: TextIO = sys.stdout,
    attach: Mapping[str, Callable[[str], Any]] | None = None,
    before_reset: Callable[[], None] | None = None,
) -> None:
    """Answer protocol requests, one per line of `stdin` (default: the process's
    standard input, read as bytes), until "close" or end of input: `adapter`'s
    for the delivery machine (offering `operations`) and, if given,
    `lifecycle`'s for the lifecycle machine (offering every one of its).

    A request that breaks the protocol (not UTF-8 or not JSON, an unknown
    method or member, wrong params, a machine not served, anything before
    "hello", a value that does not decode) gets a fault reply with its
    `code` and never reaches an adapter. An exception from an adapter is a
    fault with code "implementation". Either way `serve` goes on serving.

    `attach`: for each machine it names, how to make that machine's adapter serve the state
    in another database (its connection string), for the harness's `attach` after a
    restart (specs/adapter-protocol.md, section 5, "Restarts"); `before_reset`, called before
    each reset."""
    served: dict[str, tuple[Any, frozenset[str]]] = {MACHINE: (adapter, operations)}
    if lifecycle is not None:
        served["lifecycle"] = (lifecycle, LIFECYCLE_OPERATIONS)
    serving = _Serving(served, implementation, stdout, attach or {}, before_reset)
    try:
        for line in stdin if stdin is not None else sys.stdin.buffer:
            method, reply = serving.answer(line)
            if reply is None:
                continue  # its session's thread replies
            serving.write(reply)
            if method == "close" and "result" in reply:
                return
    finally:
        serving.close_sessions()


class _Serving:
    """What one `serve` holds while it serves: the machines served, the sessions open, what
    the handshake agreed; one method a step of answering a request line."""

    def __init__(
        self,
        served: dict[str, tuple[Any, frozenset[str]]],
        implementation: str,
        stdout: TextIO,
        attach: Mapping[str, Callable[[str], Any]],
        before_reset: Callable[[], None] | None,
    ) -> None:
        self.served, self.implementation, self.stdout = served, implementation, stdout
        self.attach, self.before_reset = attach, before_reset
        self.lock = threading.Lock()
        self.sessions: dict[tuple[str, str], _Session] = {}
        self.offers_sessions = all(hasattr(a, "session") for a, _ in served.values())
        # What the handshake agreed: a version-1 hello gets a version-1 adapter,
        # the delivery machine alone and no sessions. Until then, everything served.
        self.agreed = _Agreement(PROTOCOL_VERSION, served, self.offers_sessions)
        self.greeted = False
        self.handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "hello": self.hello,
            "reset": self.reset,
            "execute": lambda p: codec.encode(self.on(p).execute(p["command"])),
            "snapshot": lambda p: codec.encode_state(self.on(p).snapshot()),
            "open_session": self.open_session,
            "close_session": self.close_session,
            "close": lambda p: None,
            "attach": self.attach_to,
        }

    def write(self, reply: dict[str, Any]) -> None:
        with self.lock:
            self.stdout.write(json.dumps(reply, separators=(",", ":"), allow_nan=False) + "\n")
            self.stdout.flush()

    def answer(self, line: bytes | str) -> tuple[str | None, dict[str, Any] | None]:
        """The request's method (None if unreadable) and its reply: a result or a fault;
        None for a session's command, which its session's thread replies to."""
        id_, method = None, None
        try:
            id_, method, params = _request(line, self.agreed.served)
            self.admit(method, params)
            if method == "execute" and "session" in params:
                self.sessions[self.session_named(params)].jobs.put((id_, params["command"]))
                return method, None
            return method, self.handled(id_, method, params)
        except ProtocolError as error:
            fault = {"code": error.code, "message": str(error)}
            return method, {"id": id_ if id_ is not None else error.request_id, "fault": fault}

    def admit(self, method: str, params: dict[str, Any]) -> None:
        """A hello comes first; the request's start and command decode (into `params`)."""
        if not self.greeted and method not in ("hello", "close"):
            raise ProtocolError("hello-first", f"{method} before hello: the session starts with a hello")
        try:
            if "start" in params:
                params["start"] = codec.decode(params["start"], dt.datetime, "start")
            if "command" in params:
                command = codec.decode(params["command"], object, "command")
                params["command"] = _offered(command, params["machine"], self.served[params["machine"]][1])
        except codec.DecodeError as exc:
            raise ProtocolError("malformed-value", f"{method}: {exc}") from None
        self.greeted = self.greeted or method == "hello"

    def handled(self, id_: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The method's result, or a fault if the adapter failed (a broken rule raises ProtocolError)."""
        try:
            return {"id": id_, "result": self.handlers[method](params)}
        except ProtocolError:
            raise
        except Exception as exc:  # noqa: BLE001 - the adapter failed: a fault, and serving goes on
            # A session cut as it opens is lost, as one cut while it works (section 5).
            lost = method == "open_session" and _lost_connection(exc)
            fault = {
                "code": "session-lost" if lost else "implementation",
                "message": f"{type(exc).__name__}: {exc}",
            }
            return {"id": id_, "fault": fault}

    def hello(self, params: dict[str, Any]) -> dict[str, Any]:
        """The handshake: the newest version both speak, at most the harness's."""
        asked = params.get("protocol", PROTOCOL_VERSION)
        if type(asked) is not int or asked < PROTOCOL_VERSIONS[0]:
            wanted = f"the harness's newest version, an integer from {PROTOCOL_VERSIONS[0]}"
            raise ProtocolError("bad-params", f'hello: "protocol" must be {wanted}, not {json.dumps(asked)}')
        protocol = min(asked, PROTOCOL_VERSION)
        agreed = self.agreed
        agreed.protocol = protocol
        agreed.served = {name: both for name, both in self.served.items() if MACHINES[name].since <= protocol}
        agreed.sessions = self.offers_sessions and protocol >= SESSIONS_SINCE
        result: dict[str, Any] = {
            "protocol": protocol,
            "implementation": self.implementation,
            "machines": {name: sorted(ops) for name, (_, ops) in agreed.served.items()},
        }
        if agreed.sessions:
            result["sessions"] = True
        databases = {name: a.dsn for name, (a, _) in agreed.served.items() if isinstance(getattr(a, "dsn", None), str)}
        if databases and protocol >= DATABASES_SINCE:
            result["databases"] = databases
            if attachable := sorted(name for name in databases if name in self.attach):
                result["attach"] = attachable
        return result

    def session_named(self, params: dict[str, Any], opening: bool = False) -> tuple[str, str]:
        name = params["session"]
        if not isinstance(name, str) or not name:
            raise ProtocolError("bad-params", f'"session" must be a non-empty string, not {json.dumps(name)}')
        key = (params["machine"], name)
        if opening and key in self.sessions:
            raise ProtocolError("bad-params", f"session {name!r} is already open")
        if not opening and key not in self.sessions:
            raise ProtocolError("bad-params", f"no session {name!r} is open")
        if not self.agreed.sessions:
            why = f"protocol {self.agreed.protocol} has none" if self.offers_sessions else "its hello says so"
            raise ProtocolError("unknown-method", f"this adapter offers no sessions ({why})")
        return key

    def open_session(self, params: dict[str, Any]) -> None:
        key = self.session_named(params, opening=True)
        self.sessions[key] = _Session(self.served[key[0]][0].session(), self.write)

    def close_session(self, params: dict[str, Any]) -> None:
        self.sessions.pop(self.session_named(params)).close()

    def close_sessions(self) -> None:
        for session in self.sessions.values():
            session.close()

    def attach_to(self, params: dict[str, Any]) -> None:
        """Serve a machine from the database an earlier process announced, as it stands."""
        machine, database = params["machine"], params["database"]
        if not isinstance(database, str) or not database:
            raise ProtocolError("bad-params", f'"database" must be a connection string, not {json.dumps(database)}')
        if self.agreed.protocol < DATABASES_SINCE or machine not in self.attach:
            raise ProtocolError("unknown-method", f"this adapter cannot attach the {machine} machine to a database")
        if any(name == machine for name, _ in self.sessions):
            raise ProtocolError("bad-params", "attach comes before any session of its machine is opened")
        operations = self.served[machine][1]
        self.served[machine] = self.agreed.served[machine] = (self.attach[machine](database), operations)  # type: ignore[index]

    def on(self, params: dict[str, Any]) -> Any:
        return self.served[params["machine"]][0]

    def reset(self, params: dict[str, Any]) -> None:
        if self.before_reset is not None:
            self.before_reset()
        self.on(params).reset(params["start"])


def _offered(command: Any, machine: str, operations: frozenset[str]) -> Any:
    """A decoded command of `machine` that the adapter offers."""
    if type(command) not in MACHINES[machine].variants:
        raise codec.DecodeError("command", f"{type(command).__name__} is not a {machine} command")
    if type(command).__name__ not in operations:
        raise codec.DecodeError("command", f"{type(command).__name__} is not among the operations this adapter offers")
    return command


def stdout_for_protocol() -> TextIO:
    """Reserve the real stdout for protocol lines; anything else printed goes to stderr."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return protocol
