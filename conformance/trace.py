"""Language-neutral traces: a program with the outcomes and states it must produce.

A trace file is JSON lines in the canonical encoding (`codec`):

    {"trace": 1, "machine": "delivery", "start": "2026-01-01T00:00:00.000000Z", "name": "..."}
    {"step": 1, "command": {...}, "outcome": {...}, "state": {...}}
    ...

The header pins the clock; each step gives a command, the outcome the model
returns for it and the model's full state after it. "state" may be omitted
(for example in a history recorded by another system), and then only the
outcome is checked.

`replay` drives any adapter through a trace and reports the first step
where the implementation diverges from the model. `check` runs the model
alone over a recorded history and reports the first step where the model
disagrees with what was recorded.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from leaseproof.conformance import codec
from leaseproof.conformance import world as w
from leaseproof.conformance.boundary import DeliveryAdapter
from leaseproof.conformance.delivery_machine import describe_state_difference
from leaseproof.model import delivery as m

TRACE_VERSION = 1


class TraceError(ValueError):
    """A trace file is malformed; names the line and the problem."""


@attrs.frozen
class Step:
    command: m.Command
    outcome: m.Outcome
    state: m.DeliverySystem | None


@attrs.frozen
class Trace:
    name: str
    start: dt.datetime
    steps: tuple[Step, ...]


@attrs.frozen
class Divergence:
    """The first step where two accounts of the machine part ways."""

    step: int  # 1-based
    command: m.Command
    expected: str  # whose account, and what it said
    actual: str
    difference: str
    context: tuple[str, ...] = ()  # the steps before it, described

    def report(self) -> str:
        lines = [f"first divergence at step {self.step}: {w.describe(self.command)}"]
        lines += [f"  {self.expected}", f"  {self.actual}"]
        if self.difference:
            lines += ["  " + line for line in self.difference.splitlines()]
        if self.context:
            lines.append("  the steps before it:")
            lines += [f"    {line}" for line in self.context]
        return "\n".join(lines)


def record(name: str, start: dt.datetime, commands: Iterable[m.Command]) -> Trace:
    """The trace of `commands` as the model runs them."""
    state = m.initial_state(start)
    steps = []
    for command in commands:
        state, outcome = m.step(state, command)
        steps.append(Step(command, outcome, state))
    return Trace(name, start, tuple(steps))


def write(trace: Trace, path: Path) -> None:
    lines = [{"trace": TRACE_VERSION, "machine": "delivery", "start": codec.encode(trace.start), "name": trace.name}]
    for number, step in enumerate(trace.steps, 1):
        line: dict[str, Any] = {"step": number, "command": codec.encode(step.command), "outcome": codec.encode(step.outcome)}
        if step.state is not None:
            line["state"] = codec.encode_state(step.state)
        lines.append(line)
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines), encoding="utf-8")


def read(path: Path) -> Trace:
    try:
        raw = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it: {exc.strerror}") from None
    entries = []
    for number, text in enumerate(raw, 1):
        if not text.strip():
            continue
        try:
            entries.append((number, json.loads(text)))
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{number}: not JSON ({exc.msg})") from None
    if not entries:
        raise TraceError(f"{path}: empty; a trace starts with a header line")
    number, header = entries[0]
    if not isinstance(header, dict) or header.get("trace") != TRACE_VERSION or header.get("machine") != "delivery":
        raise TraceError(f'{path}:{number}: the header must be {{"trace": {TRACE_VERSION}, "machine": "delivery", ...}}')
    try:
        start = codec.decode(header.get("start"), dt.datetime, "start")
        steps = []
        for number, entry in entries[1:]:
            if not isinstance(entry, dict) or "command" not in entry or "outcome" not in entry:
                raise TraceError(f'{path}:{number}: a step needs "command" and "outcome"')
            command = codec.decode(entry["command"], object, "command")
            if type(command) not in m.OUTCOME_VARIANTS:
                raise TraceError(f"{path}:{number}: {type(command).__name__} is not a delivery command")
            outcome = codec.decode(entry["outcome"], object, "outcome")
            state = codec.decode_state(entry["state"], "state") if "state" in entry else None
            steps.append(Step(command, outcome, state))
    except codec.DecodeError as exc:
        raise TraceError(f"{path}:{number}: {exc}") from None
    return Trace(str(header.get("name") or path.stem), start, tuple(steps))


def _context(trace: Trace, index: int, width: int = 5) -> tuple[str, ...]:
    first = max(0, index - width)
    return tuple(f"{n + 1}. {w.describe(s.command)}" for n, s in enumerate(trace.steps[first:index], first))


def replay(trace: Trace, adapter: DeliveryAdapter) -> Divergence | None:
    """Drive `adapter` through the trace against the model; the first divergence, if any."""
    adapter.reset(trace.start)
    state = m.initial_state(trace.start)
    for index, recorded in enumerate(trace.steps):
        state, expected = m.step(state, recorded.command)
        actual = adapter.execute(recorded.command)
        if actual != expected:
            return Divergence(
                index + 1,
                recorded.command,
                f"model:          {w.describe(expected)}",
                f"implementation: {w.describe(actual)}",
                "",
                _context(trace, index),
            )
        snapshot = adapter.snapshot()
        if snapshot != state:
            return Divergence(
                index + 1,
                recorded.command,
                "model:          (state below)",
                "implementation: a different state",
                describe_state_difference(state, snapshot),
                _context(trace, index),
            )
    return None


def check(trace: Trace) -> Divergence | None:
    """Run the model over a recorded history; the first step it disagrees with, if any."""
    state = m.initial_state(trace.start)
    for index, recorded in enumerate(trace.steps):
        state, expected = m.step(state, recorded.command)
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
                describe_state_difference(state, recorded.state),
                _context(trace, index),
            )
    return None
