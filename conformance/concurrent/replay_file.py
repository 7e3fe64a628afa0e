"""Replay files: what `leaseproof stress --replay` needs to run a found race again.

A stress finding is a program that failed in some of its repetitions. The program is
not written out: it is the `index`-th program the seed draws (programs.py), drawn again
by the replay and checked against its `digest`, so a replay by another version of
leaseproof, whose generator draws differently, is refused rather than run on something
else. With `--contend`, the file holds the failing repetition's `schedule` too: in each
round, the locks the harness held and the order it let them go (contend.py), which the
replay takes and lets go again. Where a race did not need what was held, or nothing was,
its timing is the machine's: the replay runs the program `--repeats` times and reports in
how many the history was not linearizable.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from leaseproof.conformance.concurrent.contend import Held, Schedule
from leaseproof.conformance.concurrent.programs import Program

REPLAY_KIND = "leaseproof-stress-replay"
REPLAY_FORMAT = 1


class ReplayFileError(ValueError):
    """A replay file cannot be read, or is not one; names the file and the problem."""


@attrs.frozen
class ReplayFile:
    """A stress finding, to run again: which program of which seed, on how many clients, with
    what forced (None: nothing was: the run had no --contend)."""

    machine: str
    seed: int
    index: int
    digest: str
    workers: int
    rounds: int
    lose: float
    schedule: Schedule | None
    failed: int  # of `repeats` repetitions, in the run that found it
    repeats: int
    history: str  # the failing history's file, as it was written
    subject: str  # the implementation that failed, as its adapter names itself


def digest(program: Program) -> str:
    """A short fingerprint of a program: the same steps give the same digest."""
    return hashlib.sha256(repr(program).encode()).hexdigest()[:16]


def write_replay(path: str | Path, replay: ReplayFile) -> None:
    schedule = None if replay.schedule is None else [[held.to_json() for held in holds] for holds in replay.schedule]
    document = {
        "kind": REPLAY_KIND,
        "format": REPLAY_FORMAT,
        **attrs.asdict(replay, filter=lambda a, _: a.name != "schedule"),
        "schedule": schedule,
    }
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


_MEMBERS: dict[str, type | tuple[type, ...]] = {
    "machine": str,
    "seed": int,
    "index": int,
    "digest": str,
    "workers": int,
    "rounds": int,
    "lose": (int, float),
    "failed": int,
    "repeats": int,
    "history": str,
    "subject": str,
}


def read_replay(path: str | Path) -> ReplayFile:
    """The replay `write_replay` wrote; ReplayFileError naming the file and what is wrong."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReplayFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReplayFileError(f"{path}: not a JSON document ({exc})") from None
    if not isinstance(document, dict) or document.get("kind") != REPLAY_KIND:
        raise ReplayFileError(f'{path}: not a replay file (its "kind" is not "{REPLAY_KIND}")')
    if document.get("format") != REPLAY_FORMAT:
        raise ReplayFileError(f"{path}: format {document.get('format')!r}; this leaseproof reads {REPLAY_FORMAT}")
    values: dict[str, Any] = {}
    for name, kind in _MEMBERS.items():
        value = document.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ReplayFileError(f'{path}: "{name}" must be a {_named(kind)}, not {json.dumps(value)}')
        values[name] = value
    if values["machine"] not in ("delivery", "lifecycle"):
        raise ReplayFileError(f'{path}: "machine" must be "delivery" or "lifecycle", not {values["machine"]!r}')
    for name in ("index", "seed"):
        if values[name] < 0:
            raise ReplayFileError(f'{path}: "{name}" must not be negative')
    for name in ("workers", "rounds", "repeats"):
        if values[name] < 1:
            raise ReplayFileError(f'{path}: "{name}" must be at least 1')
    if not 0 <= values["lose"] < 1:
        raise ReplayFileError(f'{path}: "lose" is a fraction in [0, 1)')
    raw = document.get("schedule")
    schedule: Schedule | None = None
    if raw is not None:
        if not isinstance(raw, list) or not all(isinstance(holds, list) for holds in raw):
            raise ReplayFileError(f'{path}: "schedule" is a list of rounds, each a list of holds, or null')
        try:
            schedule = tuple(tuple(Held.from_json(held) for held in holds) for holds in raw)
        except ValueError as exc:
            raise ReplayFileError(f"{path}: schedule: {exc}") from None
    return ReplayFile(**values, schedule=schedule)


def _named(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    words = {"str": "string", "int": "integer", "float": "number"}
    return " or ".join(words[k.__name__] for k in kinds)
