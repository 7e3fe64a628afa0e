"""History files: a recorded concurrent history as JSON lines, written and read back.

`leaseproof stress` writes the history of a violation (and its failing piece) so that
`leaseproof check-history` can judge it again, here or elsewhere; the reader checks
every line and every tick, and names the file and line of the first problem.
"""

from __future__ import annotations

import json
import typing
import uuid
from pathlib import Path
from typing import Any

from leaseproof.conformance.boundary import codec
from leaseproof.conformance.concurrent.history import (
    STALL_KINDS,
    Barrier,
    History,
    Indeterminate,
    Operation,
    RefusedByTheDatabase,
    Stall,
)
from leaseproof.conformance.concurrent.linearizability import split_epochs
from leaseproof.model import delivery as delivery_model
from leaseproof.model import lifecycle as lifecycle_model

HISTORY_KIND = "leaseproof-history"
_STALL_TICKS = ("began", "patient", "letting_go", "ended")
HISTORY_FORMAT = 1


class HistoryFileError(ValueError):
    """A history file is malformed; names the line and the problem."""


def write_history(path: str | Path, history: History) -> None:
    """JSON lines: a header, the initial state, then operations and barriers in tick order."""
    lines: list[dict[str, Any]] = [
        {"kind": HISTORY_KIND, "format": HISTORY_FORMAT, "machine": history.machine},
        {"kind": "initial", "state": codec.encode_state(history.initial)},
    ]
    events: list[tuple[int, dict[str, Any]]] = []
    for op in history.operations:
        outcome = _encoded_outcome(op)
        record = {"kind": "operation", "id": op.id, "client": op.client, "command": codec.encode(op.command)}
        events.append((op.invoked, {**record, "outcome": outcome, "invoked": op.invoked, "returned": op.returned}))
    for barrier in history.barriers:
        state = None if barrier.state is None else codec.encode_state(barrier.state)
        events.append((barrier.at, {"kind": "barrier", "at": barrier.at, "state": state}))
    for stall in history.stalls:
        ticks = {name: getattr(stall, name) for name in _STALL_TICKS}
        by = {} if stall.by == "stall" else {"by": stall.by}
        events.append((stall.began, {"kind": "stall", "key": codec.encode(stall.key), **ticks, **by}))
    lines += [event for _, event in sorted(events, key=lambda e: e[0])]
    Path(path).write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))


def read_history(path: str | Path) -> History:
    """The history `write_history` wrote. Anything that keeps the file from being one
    (it cannot be read, is not UTF-8 JSON lines, a line is not what a history holds,
    or its ticks make no sense) raises `HistoryFileError`: one line naming the file
    (and the line) and the problem."""
    # Imported here: the traces' reader pulls in the lockstep machinery, which the checker never needs.
    from leaseproof.conformance.traces.trace import text_lines

    machine, initial, state_class = None, None, None
    commands: tuple[type, ...] = ()
    operations, barriers, stalls = [], [], []
    seen: dict[int, int] = {}  # operation id: the line that has it
    number = 0
    for number, text in enumerate(text_lines(Path(path), "a history is JSON lines", HistoryFileError), start=1):
        where = f"{path}:{number}"
        try:
            line = json.loads(text)
            kind = line.get("kind") if isinstance(line, dict) else None
            if number == 1:
                if kind != HISTORY_KIND or line.get("format") != HISTORY_FORMAT:
                    raise HistoryFileError(f"{where}: expected a {HISTORY_KIND} header of format {HISTORY_FORMAT}")
                machine = line.get("machine")
                if not isinstance(machine, str) or machine not in _MACHINES:
                    names = " or ".join(f'"{name}"' for name in _MACHINES)
                    raise HistoryFileError(f'{where}: the header\'s "machine" must be {names}, not {machine!r}')
                state_class, commands = _MACHINES[machine]
            elif number == 2:
                if kind != "initial":
                    raise HistoryFileError(f'{where}: expected the initial state ("kind": "initial")')
                initial = codec.decode_state(line["state"], "state", state_class)
            elif kind == "operation":
                outcome = _decoded_outcome(line["outcome"])
                command = codec.decode(line["command"], object, "command")
                if type(command) not in commands:
                    raise HistoryFileError(f"{where}: command: {type(command).__name__} is not a {machine} command")
                ident, client = _member(line, "id", int), _member(line, "client", str)
                invoked, returned = _member(line, "invoked", int), _member(line, "returned", int, nullable=True)
                if ident in seen:
                    raise HistoryFileError(f"{where}: operation id {ident} again (line {seen[ident]} has it)")
                seen[ident] = number
                operations.append(Operation(ident, client, command, outcome, invoked, returned))
            elif kind == "barrier":
                at = _member(line, "at", int)
                state = None if line["state"] is None else codec.decode_state(line["state"], "state", state_class)
                barriers.append(Barrier(at, state))
            elif kind == "stall":
                began, patient, letting_go, ended = (_member(line, name, int) for name in _STALL_TICKS)
                by = line.get("by", "stall")
                if by not in STALL_KINDS:
                    raise HistoryFileError(f"{where}: a stall by {by!r}: one of {', '.join(STALL_KINDS)}")
                key = codec.decode(line["key"], uuid.UUID, "key")
                stalls.append(Stall(key, began, patient, letting_go, ended, by=by))
            else:
                raise HistoryFileError(f"{where}: unexpected line of kind {kind!r}")
        except HistoryFileError:
            raise
        except json.JSONDecodeError as problem:
            raise HistoryFileError(f"{where}: not JSON ({problem.msg})") from None
        except RecursionError:
            raise HistoryFileError(f"{where}: not JSON this reader takes (nested too deeply)") from None
        except KeyError as problem:
            raise HistoryFileError(f"{where}: no member {problem}") from None
        except ValueError as problem:  # the codec's DecodeError among them
            raise HistoryFileError(f"{where}: {problem}") from None
        except (TypeError, AttributeError) as problem:  # a value the codec does not foresee
            raise HistoryFileError(f"{where}: not a value the model knows ({problem})") from None
    if number == 0:
        raise HistoryFileError(f"{path}: empty; a history starts with a {HISTORY_KIND} header line")
    if machine is None or initial is None:
        raise HistoryFileError(f"{path}: needs a header and an initial state")
    operations.sort(key=lambda op: op.id)
    history = History(machine, initial, tuple(operations), tuple(barriers), tuple(stalls))
    try:
        split_epochs(history)  # the ticks: each response after its call, no operation across a barrier, ...
    except ValueError as problem:
        raise HistoryFileError(f"{path}: {problem}") from None
    return history


# The machines a history can be of: the class of its states and its commands.
_MACHINES: dict[str, tuple[type, tuple[type, ...]]] = {
    "delivery": (delivery_model.DeliverySystem, typing.get_args(delivery_model.Command)),
    "lifecycle": (lifecycle_model.LifecycleSystem, typing.get_args(lifecycle_model.Command)),
}


def _member(line: dict[str, Any], name: str, kind: type, nullable: bool = False) -> Any:
    """`line[name]`, which must be a `kind` (not a bool), or null if `nullable`."""
    value = line[name]
    if (value is None and nullable) or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    wanted = f"{kind.__name__}{' or null' if nullable else ''}"
    raise ValueError(f"{name}: expected {wanted}, got {json.dumps(value)}")


def _encoded_outcome(op: Operation) -> Any:
    """An operation's outcome in a history file: the codec's encoding of a model value, or
    what only a history holds (an unknown outcome, a refusal by the database's guards)."""
    if isinstance(op.outcome, Indeterminate):
        return {"indeterminate": op.outcome.reason}
    if isinstance(op.outcome, RefusedByTheDatabase):
        return {"refused_by_the_database": op.outcome.constraint}
    return codec.encode(op.outcome)


def _decoded_outcome(raw: Any) -> Any:
    """The outcome `_encoded_outcome` wrote."""
    if isinstance(raw, dict) and set(raw) == {"indeterminate"}:
        return Indeterminate(raw["indeterminate"])
    if isinstance(raw, dict) and set(raw) == {"refused_by_the_database"}:
        constraint = raw["refused_by_the_database"]
        if not isinstance(constraint, str):
            raise ValueError(f"outcome.refused_by_the_database: expected a string, got {json.dumps(constraint)}")
        return RefusedByTheDatabase(constraint)
    return codec.decode(raw, object, "outcome")
