"""Language-neutral traces: a program with the outcomes and states it must produce.

A trace file is JSON lines in the canonical encoding (`codec`): a header
`{"trace": 1, "machine": ..., "start": ..., "name": ...}` that names the machine
and pins the clock, then one `{"step": n, "command": ..., "outcome": ...,
"state": ...}` a step, from the machine's initial state. "state" may be left out
(a history recorded by another system): then only the outcome is checked.

`replay` drives any adapter through a trace and reports the first step where
the implementation diverges from the model; `check` runs the model alone over a
recorded history and reports the first step where the model disagrees with it.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from leaseproof.conformance.boundary import codec
from leaseproof.conformance.boundary.protocols import SomeAdapter
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.core import MachineSpec
from leaseproof.conformance.lockstep.delivery import DELIVERY
from leaseproof.conformance.lockstep.lifecycle import LIFECYCLE

if TYPE_CHECKING:  # the lockstep's verdict, not imported to read or write a trace
    from leaseproof.conformance.lockstep.verify import Recorded

TRACE_VERSION = 1
# The machines a trace can be of, by the name its header carries.
SPECS: dict[str, MachineSpec] = {spec.name: spec for spec in (DELIVERY, LIFECYCLE)}


class TraceError(ValueError):
    """A trace file is malformed; names the line and the problem."""


@attrs.frozen
class Step:
    command: Any  # a command of the trace's machine
    outcome: Any
    state: Any | None  # that machine's state (DeliverySystem, LifecycleSystem)


@attrs.frozen
class Trace:
    name: str
    start: dt.datetime
    steps: tuple[Step, ...]
    machine: str = attrs.field(default="delivery", validator=attrs.validators.in_(SPECS))


@attrs.frozen
class Divergence:
    """The first step where two accounts of the machine part ways."""

    step: int  # 1-based
    command: Any
    expected: str  # whose account, and what it said
    actual: str
    difference: str
    context: tuple[str, ...] = ()  # the steps before it, described
    recorded: str = ""  # replay: what the trace recorded, a third account
    who: str = ""  # replay: which accounts disagree with the model

    def report(self) -> str:
        lines = [f"first divergence at step {self.step}: {w.describe(self.command)}"]
        lines += [f"  {self.who}"] if self.who else []
        lines += [f"  {self.expected}", f"  {self.actual}"] + ([f"  {self.recorded}"] if self.recorded else [])
        if self.difference:
            lines += ["  " + line for line in self.difference.splitlines()]
        if self.context:
            lines.append("  the steps before it:")
            lines += [f"    {line}" for line in self.context]
        return "\n".join(lines)


def record(name: str, start: dt.datetime, commands: Iterable[Any], machine: str = "delivery") -> Trace:
    """The trace of `commands` as the model of `machine` runs them."""
    spec = SPECS[machine]
    state = spec.initial_state(start)
    steps = []
    for command in commands:
        state, outcome = spec.step(state, command)
        steps.append(Step(command, outcome, state))
    return Trace(name, start, tuple(steps), machine)


def trace_of(recorded: Recorded | None) -> Trace | None:
    """The trace of a verdict's counterexample (`Verdict.recorded`), if it has one."""
    if recorded is None:
        return None
    return record(recorded.name, w.START, recorded.commands, machine=recorded.machine)


def write(trace: Trace, path: Path) -> None:
    header = {"trace": TRACE_VERSION, "machine": trace.machine, "start": codec.encode(trace.start), "name": trace.name}
    lines: list[dict[str, Any]] = [header]
    for number, step in enumerate(trace.steps, 1):
        line: dict[str, Any] = {
            "step": number,
            "command": codec.encode(step.command),
            "outcome": codec.encode(step.outcome),
        }
        if step.state is not None:
            line["state"] = codec.encode_state(step.state)
        lines.append(line)
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines), encoding="utf-8")


def read(path: Path) -> Trace:
    """The trace in file `path`; anything that keeps it from being one (the file
    cannot be read, is not UTF-8 JSON lines, or a line is not what a trace holds)
    raises `TraceError`, one line naming the file (and the line) and the problem."""
    entries = []
    for number, text in enumerate(text_lines(path, "a trace is JSON lines", TraceError), 1):
        if not text.strip():
            continue
        try:
            entries.append((number, json.loads(text)))
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{number}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise TraceError(f"{path}:{number}: not JSON this reader takes (nested too deeply)") from None
    if not entries:
        raise TraceError(f"{path}: empty; a trace starts with a header line")
    number, header = entries[0]
    machines = " or ".join(f'"{name}"' for name in SPECS)
    if not isinstance(header, dict) or header.get("trace") != TRACE_VERSION:
        raise TraceError(
            f'{path}:{number}: the header must be {{"trace": {TRACE_VERSION}, "machine": {machines}, ...}}'
        )
    # Every trace ever written names its machine, so a missing name is refused rather than guessed.
    machine = header.get("machine")
    if not isinstance(machine, str) or machine not in SPECS:
        raise TraceError(f'{path}:{number}: the header\'s "machine" must be {machines}, not {machine!r}')
    spec = SPECS[machine]
    try:
        start = codec.decode(header.get("start"), dt.datetime, "start")
        state_class = type(spec.initial_state(start))
        steps = []
        for number, entry in entries[1:]:
            if not isinstance(entry, dict) or "command" not in entry or "outcome" not in entry:
                raise TraceError(f'{path}:{number}: a step needs "command" and "outcome"')
            command = codec.decode(entry["command"], object, "command")
            if type(command) not in spec.variants:
                raise TraceError(f"{path}:{number}: {type(command).__name__} is not a {machine} command")
            outcome = codec.decode(entry["outcome"], object, "outcome")
            state = codec.decode_state(entry["state"], "state", state_class) if "state" in entry else None
            steps.append(Step(command, outcome, state))
    except TraceError:
        raise
    except codec.DecodeError as exc:
        raise TraceError(f"{path}:{number}: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        # The codec names what is wrong as a DecodeError; a value it does not foresee (an
        # object where it looks a name up, say) still makes the line malformed, not the run.
        raise TraceError(f"{path}:{number}: not a value the model knows ({exc})") from None
    return Trace(str(header.get("name") or path.stem), start, tuple(steps), machine)


def text_lines(path: Path, what: str, error: Callable[[str], Exception]) -> list[str]:
    """The lines of the UTF-8 text file `path`; `error` (one line naming the file and
    the problem, in words) if it cannot be read or is not UTF-8 text. `what` ends the
    message about bytes that are not UTF-8 ("a trace is JSON lines")."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: {unreadable(exc)}") from None
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); {what}"
        ) from None


# Why a file cannot be read, in words, by errno; others say what the system says.
_UNREADABLE = {
    errno.ENOENT: "no such file",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "a directory, not a file",
    errno.ENOTDIR: "no such file (a part of its path is not a directory)",
    errno.ELOOP: "too many levels of symbolic links",
    errno.ENAMETOOLONG: "the file name is too long",
}


def unreadable(exc: OSError) -> str:
    """Why reading a file failed, in words: "no such file", "permission denied", ..."""
    if exc.errno in _UNREADABLE:
        return _UNREADABLE[exc.errno]
    reason = exc.strerror or type(exc).__name__
    return f"cannot read it: {reason[:1].lower()}{reason[1:]}"


def _context(trace: Trace, index: int, width: int = 5) -> tuple[str, ...]:
    first = max(0, index - width)
    return tuple(f"{n + 1}. {w.describe(s.command)}" for n, s in enumerate(trace.steps[first:index], first))


def replay(trace: Trace, adapter: SomeAdapter) -> Divergence | None:
    """Drive `adapter` (an implementation of the trace's machine) through the trace;
    the first step where the model, the implementation and what the trace
    recorded (its outcomes, and its states where it has them) do not all agree.

    Raises `TraceError` if the adapter's snapshots are another machine's states.
    """
    spec = SPECS[trace.machine]
    adapter.reset(trace.start)
    state = spec.initial_state(trace.start)
    for index, recorded in enumerate(trace.steps):
        state, expected = spec.step(state, recorded.command)
        actual = adapter.execute(recorded.command)
        if actual != expected or recorded.outcome != expected:
            return Divergence(
                index + 1,
                recorded.command,
                f"model:          {w.describe(expected)}",
                f"implementation: {w.describe(actual)}{_differs(actual, expected)}",
                "",
                _context(trace, index),
                recorded=f"recorded:       {w.describe(recorded.outcome)}{_differs(recorded.outcome, expected)}",
                who=_who(actual != expected, recorded.outcome != expected),
            )
        snapshot = adapter.snapshot()
        if type(snapshot) is not type(state):
            raise TraceError(
                f"{trace.name}: a {trace.machine} trace, but {adapter.name} answers with a "
                f"{type(snapshot).__name__} snapshot: "
                f"replay it against an implementation of the {trace.machine} machine"
            )
        stale = recorded.state is not None and recorded.state != state
        if snapshot != state or stale:
            differences = []
            if snapshot != state:
                differences += ["the implementation's state, against the model's:", spec.difference(state, snapshot)]
            if stale:
                differences += ["the recorded state, against the model's:", spec.difference(state, recorded.state)]
            return Divergence(
                index + 1,
                recorded.command,
                "model:          (state below)",
                "implementation: " + ("a different state" if snapshot != state else "the model's state"),
                "\n".join(differences),
                _context(trace, index),
                recorded="recorded:       "
                + ("no state" if recorded.state is None else "a different state" if stale else "the model's state"),
                who=_who(snapshot != state, stale),
            )
    return None


def _differs(value: Any, expected: Any) -> str:
    return "   <- not the model's" if value != expected else ""


def _who(implementation: bool, recorded: bool) -> str:
    """Which accounts disagree with the model."""
    if implementation and recorded:
        return "the implementation and the trace's record both disagree with the model"
    if recorded:
        return "the trace's record disagrees with the model: the trace is wrong, or was recorded against another model"
    return "the implementation disagrees with the model"


def check(trace: Trace) -> Divergence | None:
    """Run the trace's model over a recorded history; the first step it disagrees with, if any."""
    spec = SPECS[trace.machine]
    state = spec.initial_state(trace.start)
    for index, recorded in enumerate(trace.steps):
        state, expected = spec.step(state, recorded.command)
        if recorded.outcome != expected:
            return Divergence(
                index + 1,
                recorded.command,
                f"recorded: {w.describe(recorded.outcome)}",
                f"model:    {w.describe(expected)}",
                "",
                _context(trace, index),
            )
        if recorded.state is not None and recorded.state != state:
            return Divergence(
                index + 1,
                recorded.command,
                "recorded: (state below)",
                "model:    a different state",
                spec.difference(state, recorded.state),
                _context(trace, index),
            )
    return None
