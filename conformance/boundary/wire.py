"""The harness side of the out-of-process adapter boundary: JSON lines over a child's stdin/stdout.

`specs/adapter-protocol.md` is the contract. `SubprocessAdapter` starts the child, shakes hands
and turns every reply into a model value; `WireSession` is one of its sessions. Anything that is
not a well-formed, timely reply to the request just sent is an `AdapterFault`: the run stops and
says why; faults are never compared with the model. The versions and machines both sides speak
(`PROTOCOL_VERSIONS`, `MACHINES`) are defined here; serving.py, the adapter side, imports them.
`serve` and `stdout_for_protocol` moved there; adapters that import them from here still get them.
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
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from leaseproof.conformance.boundary import codec
from leaseproof.conformance.boundary.protocols import ALL_OPERATIONS, CORE_OPERATIONS
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc

# The versions of specs/adapter-protocol.md this harness (and `serve`) speak, and
# the newest, which the harness's hello offers first. Version 1 carries the
# delivery machine alone, one request at a time; version 2 adds the lifecycle
# machine and sessions (section 6 of the page says how the handshake picks one).
PROTOCOL_VERSIONS = (1, 2, 3)
PROTOCOL_VERSION = PROTOCOL_VERSIONS[-1]
SESSIONS_SINCE = 2  # the first version with sessions
DATABASES_SINCE = 3  # the first version whose hello may announce its databases
REQUEST_KEYS_SINCE = 3  # the first version with a claim's request key (Claim.request_key, Delivery.claim_key)
MACHINE = "delivery"  # the machine a request names when it names none, and the harness's default
LIFECYCLE_OPERATIONS = frozenset(op.__name__ for op in lc.OUTCOME_VARIANTS)


@attrs.frozen
class _Machine:
    """What the boundary knows of one machine: its operations (and those every adapter
    of it must offer), each operation's outcome variants, how to name an outcome's,
    and the first protocol version that carries it."""

    operations: frozenset[str]
    core: frozenset[str]
    variants: Mapping[type, tuple[str, ...]]
    variant: Callable[[Any], str]
    since: int


# The lifecycle's lockstep machine sends every one of its operations, so an
# adapter of it offers them all.
MACHINES = {
    "delivery": _Machine(ALL_OPERATIONS, CORE_OPERATIONS, m.OUTCOME_VARIANTS, m.variant, since=1),
    "lifecycle": _Machine(LIFECYCLE_OPERATIONS, LIFECYCLE_OPERATIONS, lc.OUTCOME_VARIANTS, lc.variant, since=2),
}
STDERR_TAIL_LINES = 20


class AdapterFault(Exception):
    """The adapter or its infrastructure broke; the run stops, nothing is compared."""

    # A fault reply's message, as the adapter sent it; None: the adapter broke
    # the protocol instead (or the harness refused it).
    reported: Any = None


def _speaks(versions: tuple[int, ...] = PROTOCOL_VERSIONS) -> str:
    names = [str(version) for version in versions]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


_NOT_JSON = object()  # what a reply line that does not parse parses to
# A reply line and its JSON; None: stdout ended; an exception: stdout is not UTF-8.
_Line = tuple[str, Any] | Exception | None


def _parsed(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return _NOT_JSON


class SessionLost(ConnectionError):
    """A session's command may or may not have taken effect: the adapter lost the
    session while carrying it out (its fault code "session-lost"). A concurrent
    run records the operation as indeterminate and opens another session."""


class _Stale(Exception):
    """A session's request was not sent: the child it belongs to was replaced first."""


class WireSession:
    """One session of a `SubprocessAdapter`: another client of the same implementation.

    A session belongs to the child that opened it. After a restart (`SubprocessAdapter.restart`)
    its next command first opens a session of the same client on the new child: the
    command was not sent before, so nothing about it is unknown."""

    def __init__(self, adapter: SubprocessAdapter, name: str) -> None:
        self.adapter, self.name = adapter, name
        self._open()

    def _open(self) -> None:
        self.incarnation = self.adapter.incarnation
        self.adapter._call("open_session", {"machine": self.adapter.machine, "session": self.name})

    def execute(self, command: m.Command) -> m.Outcome:
        while True:
            if self.incarnation != self.adapter.incarnation:
                self.name = self.adapter._session_name()
                self._open()
            try:
                return self.adapter._execute(command, {"session": self.name}, self.incarnation)
            except _Stale:
                continue  # the child was started again before the command was sent: send it to the new one

    def close(self) -> None:
        if self.incarnation != self.adapter.incarnation:
            return  # its child is gone, and the session with it
        with contextlib.suppress(AdapterFault, SessionLost):
            self.adapter._call("close_session", {"machine": self.adapter.machine, "session": self.name})


class SubprocessAdapter:
    """An adapter of `machine` (a `DeliveryAdapter`, or the lifecycle's) whose
    implementation runs in a child process.

    One child serves every machine its hello announces: `use(machine)` points
    the adapter at another of them, so a run over both machines starts one child."""

    def __init__(
        self,
        command: str,
        *,
        machine: str | None = MACHINE,
        reply_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`machine` None: only shake hands (to learn the `machines` it offers); `use` picks one later.
        `env`: variables set in the child's environment beside the harness's own."""
        if machine is not None and machine not in MACHINES:
            raise ValueError(f"no machine {machine!r}: the machines are {sorted(MACHINES)}")
        self.command, self.machine = command, machine or MACHINE
        self.reply_timeout = reply_timeout
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        # Replies are routed, parsed once, to the call waiting for their id
        # (sessions have several in flight); what names no waiting call goes to
        # every one. None or an exception: stdout ended, or was not UTF-8.
        self._waiting: dict[int, queue.Queue[_Line]] = {}
        self._routing = threading.Lock()
        self._writing = threading.Lock()
        self._ended: Exception | Literal[False] | None = False  # False while stdout is open
        self._next_id = 0
        self._sessions = 0
        # Restarts (`restart`): which child this is (0 the first), and whether one is running
        # (calls wait while the next one starts).
        self.incarnation = 0
        self._up = threading.Event()
        self._up.set()
        self._pumps: list[threading.Thread] = []
        self.sessions = False  # whether it offers sessions: protocol 2, and its hello says so
        self.operations: frozenset[str] = frozenset()  # what it offers of `machine`, once `use`d
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise AdapterFault(f"cannot parse the adapter command {command!r}: {exc}") from None
        if not argv:
            raise AdapterFault("the adapter command is empty")
        self._argv = argv
        self._env = None if env is None else {**os.environ, **env}
        self._start()
        try:
            self._hello = self._handshake()
            self.protocol: int = self._hello["protocol"]
            self.name = self._hello["implementation"]
            self.machines = frozenset(self._hello["machines"])
            self.sessions = self.protocol >= SESSIONS_SINCE and self._hello.get("sessions") is True
            # The PostgreSQL database each machine's sessions use, where the hello says (section 5):
            # where a fault injector may end their backends.
            self.databases: dict[str, str] = dict(self._hello.get("databases") or {})
            if machine is not None:
                self.use(machine)
        except AdapterFault as fault:
            self.close()  # a refused handshake leaves no child behind
            raise fault if str(fault).startswith("adapter ") else self._fault(str(fault)) from None

    def _start(self) -> None:
        """Start the child and the threads that read its stdout and stderr."""
        try:
            self.process = subprocess.Popen(
                self._argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                bufsize=1,
                env=self._env,
            )
        except OSError as exc:
            raise AdapterFault(f"could not start the adapter {self.command!r}: {exc}") from None
        self._pumps = [
            threading.Thread(target=self._pump_stdout, args=(self.process,), daemon=True),
            threading.Thread(target=self._pump_stderr, args=(self.process,), daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    def _handshake(self, restarting: bool = False) -> dict[str, Any]:
        """The checked hello result (its "implementation" always a string).

        The harness offers its newest version; the adapter answers the version
        it speaks, at most that. A version-1 adapter may instead answer a fault,
        as the version-1 page allowed for a version it does not speak: it is
        asked again at version 1, once."""
        try:
            result = self._call("hello", {"protocol": PROTOCOL_VERSION}, restarting=restarting)
        except AdapterFault as newest:
            if newest.reported is None:
                raise
            try:
                result = self._call("hello", {"protocol": PROTOCOL_VERSIONS[0]}, restarting=restarting)
            except AdapterFault as oldest:
                if oldest.reported is None:
                    raise
                raise AdapterFault(
                    f"it answered hello with a fault at every protocol version this harness speaks: at"
                    f" {PROTOCOL_VERSION}, {newest.reported}; at {PROTOCOL_VERSIONS[0]}, {oldest.reported}"
                ) from None
        return _check_hello(result)

    def use(self, machine: str) -> SubprocessAdapter:
        """Point this adapter at `machine`, which its hello must offer at a version that carries it."""
        if machine not in MACHINES:
            raise ValueError(f"no machine {machine!r}: the machines are {sorted(MACHINES)}")
        if self.process.poll() is not None:  # it died serving the machine before
            raise self._fault(f"it exited (status {self.process.returncode}) before the {machine} machine's turn")
        since = MACHINES[machine].since
        if self.protocol < since:
            raise AdapterFault(
                f"adapter {self.command!r} speaks protocol {self.protocol}, which carries the delivery machine"
                f' alone: the {machine} machine needs protocol {since} (its hello answers "protocol": {since})'
            )
        try:
            self.operations = _check_machine(self._hello["machines"], machine)
        except AdapterFault as fault:
            raise self._fault(str(fault)) from None
        self.machine = machine
        return self

    def announced(self) -> list[str]:
        """The machines its hello announces, in the harness's order; at least one."""
        machines = [machine for machine in MACHINES if machine in self.machines]
        if not machines:
            offered = self._hello["machines"]
            raise self._fault(f"it offers none of the machines {sorted(MACHINES)} (machines: {offered!r})")
        return machines

    def why_no_restart(self) -> str:
        """Why this adapter's child cannot be killed and started again without losing the
        state of `machine` ("" if it can): its state must live in a database its hello
        announces (section 5, "Restarts")."""
        if self.machine not in self.databases:
            return (
                f"its hello announces no database for the {self.machine} machine, so its state would die with its"
                ' process (a restart needs the state in a database it announces: "databases", protocol 3)'
            )
        return ""

    def restart(self, settle: Callable[[], None] | None = None) -> None:
        """Kill the child (SIGKILL: a crash) and start its command again: a new hello, then,
        if the new child's database for the machine in use differs from the first's,
        `attach` to the first's (section 5, "Restarts"); other machines start afresh.
        Calls to the old child, in flight or of its sessions, end as `SessionLost`: nobody
        knows whether they took effect. Others wait until the new child is up. `settle`
        runs once the old child is gone, before the new one starts (what it left behind,
        such as its database backends, is then the caller's to wait for)."""
        first = dict(self.databases)
        self._up.clear()
        try:
            self.process.kill()
            self.process.wait(timeout=self.reply_timeout)
            self._pumps[0].join(timeout=self.reply_timeout)  # the end of its stdout reaches every waiting call
            if settle is not None:
                settle()
            with self._routing, self._writing:  # a session's request goes to the old child, or is _Stale
                self.incarnation += 1
                self._ended = False
                self._start()
            hello = self._handshake(restarting=True)
            if hello["protocol"] != self.protocol or frozenset(hello["machines"]) != self.machines:
                raise self._fault(
                    f"it was started again and its hello differs from the first: {hello!r}, not {self._hello!r}"
                )
            now = dict(hello.get("databases") or {})
            machine, dsn = self.machine, first.get(self.machine)
            if dsn is not None and now.get(machine) != dsn:
                if machine not in (hello.get("attach") or ()):
                    raise self._fault(
                        f"it was started again with another database for the {machine} machine and offers no"
                        ' attach to the first ("attach" in its hello: section 5, "Restarts")'
                    )
                self._call("attach", {"machine": machine, "database": dsn}, restarting=True)
                now[machine] = dsn
            self.databases = now
        finally:
            self._up.set()

    def _session_name(self) -> str:
        self._sessions += 1
        return f"s{self._sessions}"

    def why_no_sessions(self) -> str:
        """Why this adapter cannot be run concurrently ("" if it can)."""
        if self.protocol < SESSIONS_SINCE:
            return (
                f"it speaks protocol {self.protocol}, which has no sessions: concurrent runs need protocol"
                f' {SESSIONS_SINCE}\'s (its hello answers "protocol": {SESSIONS_SINCE}, "sessions": true)'
            )
        if not self.sessions:
            return 'it announced no sessions in its hello ("sessions": true)'
        return ""

    # -- the DeliveryAdapter interface --------------------------------------------

    def reset(self, start: dt.datetime) -> None:
        self._call("reset", {"machine": self.machine, "start": codec.encode(start)})

    def execute(self, command: m.Command) -> m.Outcome:
        return self._execute(command, {})

    def session(self) -> WireSession:
        """Another client of the same implementation (an `open_session`), for concurrent runs."""
        if not self.sessions:
            raise AdapterFault(f"adapter {self.command!r}: {self.why_no_sessions()}")
        return WireSession(self, self._session_name())

    def _execute(self, command: m.Command, session: dict[str, str], incarnation: int | None = None) -> m.Outcome:
        params = {"machine": self.machine, **session, "command": codec.encode(command)}
        result = self._call("execute", params, incarnation=incarnation)
        try:
            outcome = codec.decode(result)
        except codec.DecodeError as exc:
            raise self._fault(f"its outcome for {type(command).__name__} is malformed: {exc}") from None
        machine = MACHINES[self.machine]
        expected = machine.variants[type(command)]
        if machine.variant(outcome) not in expected:
            raise self._fault(
                f"it answered {type(command).__name__} with {type(outcome).__name__}, "
                f"which is not an outcome of that operation ({', '.join(expected)})"
            )
        return outcome

    def snapshot(self) -> Any:
        """The implementation's state: a `DeliverySystem`, or a `LifecycleSystem`."""
        result = self._call("snapshot", {"machine": self.machine})
        expected = m.DeliverySystem if self.machine == MACHINE else lc.LifecycleSystem
        try:
            state = codec.decode_state(result, "", expected)
        except codec.DecodeError as exc:
            raise self._fault(f"its snapshot is malformed: {exc}") from None
        return state

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(AdapterFault):
                self._call("close", {}, timeout=5)
            # End its stdin too: an adapter that reads requests until end of
            # input (and does not exit on "close") then ends at once.
            with contextlib.suppress(OSError, ValueError):
                if self.process.stdin is not None:
                    with self._writing:
                        self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def stderr_tail(self) -> list[str]:
        return list(self._stderr)

    # -- the exchange ---------------------------------------------------------------

    def _call(
        self,
        method: str,
        params: dict[str, Any],
        timeout: float | None = None,
        restarting: bool = False,
        incarnation: int | None = None,
    ) -> Any:
        """Send one request and wait for its reply (other threads' calls may be in flight).
        While a restart starts the next child, wait for it (`restarting`: the restart's own
        requests); a call to a child that was killed meanwhile is `SessionLost`, and one
        for a session of an `incarnation` that is gone, not yet sent, is `_Stale`."""
        if not restarting and not self._up.wait(self.reply_timeout):
            raise self._fault(f"it was not up again within {self.reply_timeout:g}s of a restart, for {method!r}")
        sent_to = self.incarnation if incarnation is None else incarnation
        try:
            return self._exchange(method, params, timeout, incarnation)
        except AdapterFault:
            if (sent_to == self.incarnation and self._up.is_set()) or restarting:
                raise
            # Lost when the restart is done, not before: what the killed child set going (a
            # statement its database backend still runs) may take effect until it settled.
            self._up.wait(self.reply_timeout)
            raise SessionLost(f"{method}: the adapter's process was killed while it ran (a restart)") from None

    def _exchange(self, method: str, params: dict[str, Any], timeout: float | None, incarnation: int | None) -> Any:
        slot: queue.Queue[_Line] = queue.Queue()
        with self._routing:
            self._next_id += 1
            id_ = self._next_id
            if self._ended is not False:
                slot.put(self._ended)
            self._waiting[id_] = slot
        request = {"id": id_, "method": method, "params": params}
        try:
            try:
                assert self.process.stdin is not None
                with self._writing:
                    if incarnation is not None and incarnation != self.incarnation:
                        raise _Stale
                    self.process.stdin.write(json.dumps(request, separators=(",", ":")) + "\n")
                    self.process.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                raise self._fault(f"it stopped reading before the {method!r} request{self._exit_note()}") from None
            wait = self.reply_timeout if timeout is None else timeout
            try:
                line = slot.get(timeout=wait)
            except queue.Empty:
                self.process.kill()
                raise self._fault(f"no reply to {method!r} within {wait:g}s") from None
        finally:
            with self._routing:
                self._waiting.pop(id_, None)
        if line is None:
            raise self._fault(f"it closed its stdout before replying to {method!r}{self._exit_note()}")
        if isinstance(line, Exception):
            self.process.kill()
            raise self._fault(f"its reply to {method!r} is not valid UTF-8: {line}")
        text, reply = line
        if reply is _NOT_JSON:
            raise self._fault(f"its reply to {method!r} is not JSON: {text[:200]!r}")
        if not isinstance(reply, dict) or type(reply.get("id")) is not int or reply["id"] != id_:
            raise self._fault(f"its reply to {method!r} (request id {id_}) has the wrong id: {text[:200]!r}")
        if "fault" in reply:
            fault = reply["fault"]
            message = fault.get("message") if isinstance(fault, dict) else fault
            if isinstance(fault, dict) and fault.get("code") == "session-lost" and "session" in params:
                raise SessionLost(f"session {params['session']}: {message}")
            reply_fault = self._fault(f"it reported a fault on {method!r}: {message}")
            reply_fault.reported = message
            raise reply_fault
        if "result" not in reply:
            raise self._fault(f'its reply to {method!r} has neither "result" nor "fault": {text[:200]!r}')
        return reply["result"]

    def _route(self, text: str | Exception | None) -> None:
        """Hand a line, with its JSON, (or the end of stdout) to the call waiting for
        its id, else to every waiting call."""
        line: _Line = text if not isinstance(text, str) else (text, _parsed(text))
        id_ = line[1].get("id") if isinstance(line, tuple) and isinstance(line[1], dict) else None
        with self._routing:
            if not isinstance(line, tuple):
                self._ended = line
            slot = self._waiting.get(id_) if type(id_) is int else None
            for waiting in [slot] if slot is not None else list(self._waiting.values()):
                waiting.put(line)

    def _fault(self, problem: str) -> AdapterFault:
        return AdapterFault(self._described(problem))

    def _described(self, problem: str) -> str:
        tail = self.stderr_tail()
        text = f"adapter {self.command!r} failed: {problem}"
        if tail:
            text += "\nits last stderr lines:\n" + "\n".join(f"  | {line}" for line in tail)
        return text

    def _exit_note(self) -> str:
        try:
            code = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        return f" (it exited with status {code})"

    def _pump_stdout(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        try:
            for line in process.stdout:
                self._route(line)
        except UnicodeDecodeError as exc:
            self._route(exc)
            return
        self._route(None)

    def _pump_stderr(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        try:
            for line in process.stderr:
                self._stderr.append(line.rstrip("\n"))
        except UnicodeDecodeError:
            self._stderr.append("(the rest of stderr is not valid UTF-8)")


def _check_hello(result: Any) -> dict[str, Any]:
    """A hello result the harness can work with: a version it speaks, a machines
    object, and no feature of a later version than the one it answered."""
    if not isinstance(result, dict):
        raise AdapterFault(f"its hello reply is not an object: {result!r}")
    protocol = result.get("protocol")
    if type(protocol) is not int or protocol not in PROTOCOL_VERSIONS:
        raise AdapterFault(f"it speaks protocol {protocol!r}; this harness speaks {_speaks()}")
    machines = result.get("machines")
    if not isinstance(machines, dict):
        raise AdapterFault(f"its hello's machines are not an object: {machines!r}")
    # An adapter that answered an older version announces only what that version
    # has: a later feature would be silently left unchecked, so it is refused.
    later = [f"the {name} machine" for name, spec in MACHINES.items() if name in machines and spec.since > protocol]
    if result.get("sessions") is True and protocol < SESSIONS_SINCE:
        later.append('sessions ("sessions": true)')
    if later:
        raise AdapterFault(
            f"it answered protocol {protocol} but announces {' and '.join(later)}, which protocol {protocol} does"
            f' not have: answer the version that has them, "protocol": {PROTOCOL_VERSION}'
            " (specs/adapter-protocol.md, section 6)"
        )
    databases = result.get("databases", {})
    if databases and protocol < DATABASES_SINCE:
        raise AdapterFault(
            f"it answered protocol {protocol} but announces databases, which protocol {DATABASES_SINCE} brought:"
            f' answer "protocol": {PROTOCOL_VERSION} (specs/adapter-protocol.md, section 6)'
        )
    if not isinstance(databases, dict) or not all(
        machine in machines and isinstance(dsn, str) and dsn for machine, dsn in databases.items()
    ):
        raise AdapterFault(
            f"its hello's databases must map machines it offers to connection strings, not {databases!r}"
        )
    attach = result.get("attach", [])
    if not isinstance(attach, list) or not all(isinstance(machine, str) and machine in databases for machine in attach):
        raise AdapterFault(
            f"its hello's attach must list machines whose databases it announces, not {attach!r}"
            ' (specs/adapter-protocol.md, section 5, "Restarts")'
        )
    name = result.get("implementation")
    return {**result, "implementation": name if isinstance(name, str) else "unnamed adapter"}


def _check_machine(machines: dict[str, Any], machine: str) -> frozenset[str]:
    """The operations a hello's `machines` offers of `machine`, checked."""
    if machine not in machines:
        raise AdapterFault(f"it does not offer the {machine!r} machine (machines: {machines!r})")
    operations = machines[machine]
    if not isinstance(operations, list) or not all(isinstance(op, str) for op in operations):
        raise AdapterFault(f"its {machine!r} operations are not a list of names: {operations!r}")
    unknown = set(operations) - MACHINES[machine].operations
    if unknown:
        raise AdapterFault(f"it offers operations the model does not have: {sorted(unknown)}")
    missing = MACHINES[machine].core - set(operations)
    if missing:
        raise AdapterFault(f"it lacks mandatory operations: {sorted(missing)}")
    return frozenset(operations)


if not TYPE_CHECKING:  # at run time only: type checkers are sent to serving.py

    def __getattr__(name: str) -> Any:
        """`serve` and `stdout_for_protocol`, which adapters written before they moved import from here."""
        if name in ("serve", "stdout_for_protocol"):
            from leaseproof.conformance.boundary import serving

            return getattr(serving, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
