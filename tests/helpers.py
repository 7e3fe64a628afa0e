"""What the tests share, imported as `helpers` (pytest's pythonpath and mypy's mypy_path both hold tests/).

- Where the checkout's own files are: the tests read the specs, the corpus
  and the examples from the repository, not from the installed package.
- Reading the tables and headings of the Markdown specs, and drifting them,
  for the tests that keep them in sync with the models.
- Stepping a model with every step checked, for the tests of the models.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from leaseproof.model import delivery as m
from leaseproof.model.delivery import AdvanceClock, Ok, Rejection
from leaseproof.model.errors import InvalidValue

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"

# -- the spec pages ----------------------------------------------------------------------------------


class SpecFormatError(AssertionError):
    """The page does not contain a table in the expected shape."""


def cell(raw: str) -> str:
    return raw.strip().strip("`").strip()


def parse_table(text: str, header: str) -> list[list[str]]:
    """The body rows of the one table whose header line is exactly `header`."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == header]
    if len(starts) != 1:
        raise SpecFormatError(f"expected exactly one table headed {header!r}, found {len(starts)}")
    start = starts[0]
    width = header.count("|") - 1
    separator = lines[start + 1].strip() if start + 1 < len(lines) else ""
    if not re.fullmatch(rf"\|(\s*:?-{{3,}}:?\s*\|){{{width}}}", separator):
        raise SpecFormatError(f"the table headed {header!r} lacks a {width}-column separator line: {separator!r}")
    rows: list[list[str]] = []
    for number, line in enumerate(lines[start + 2 :], start=start + 3):
        stripped = line.strip()
        if not stripped.startswith("|"):
            break
        if not stripped.endswith("|"):
            raise SpecFormatError(f"line {number}: table row does not end with '|': {line!r}")
        cells = [cell(c) for c in stripped[1:-1].split("|")]
        if len(cells) != width:
            raise SpecFormatError(f"line {number}: expected {width} cells, found {len(cells)}: {line!r}")
        rows.append(cells)
    return rows


def headings(text: str) -> list[str]:
    """The first word of every Markdown heading outside fenced code blocks."""
    found = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"#{1,6}\s+`?([A-Za-z_]\w*)", line)
        if match:
            found.append(match.group(1))
    return found


def replace_once(text: str, old: str, new: str) -> str:
    """`text` with the one occurrence of `old` replaced: a drift whose fragment is not there once is a broken test."""
    assert text.count(old) == 1, f"the fragment must occur exactly once: {old!r}"
    return text.replace(old, new)


# -- the models ------------------------------------------------------------------------------------

S = TypeVar("S")


class Stepping(Generic[S]):
    """One model's `step`, with every step checked: the invariants hold, and a rejection leaves the state as it was.

    `observe(state, command, after, outcome)`, if given, sees each step first
    (to record it, or check more of it).
    """

    def __init__(
        self,
        step: Callable[[S, Any], tuple[S, Any]],
        state_violations: Callable[[S], list[str]],
        step_violations: Callable[[S, S, Any], list[str]],
        observe: Callable[[S, Any, S, Any], None] | None = None,
    ) -> None:
        self.step, self.state_violations, self.step_violations = step, state_violations, step_violations
        self.observe = observe

    def apply(self, state: S, command: Any) -> tuple[S, Any]:
        """One step, with the invariants and the rejection rule checked."""
        after, outcome = self.step(state, command)
        if self.observe is not None:
            self.observe(state, command, after, outcome)
        assert self.state_violations(after) == []
        assert self.step_violations(state, after, outcome) == []
        if isinstance(outcome, Rejection):
            assert after == state
        return after, outcome

    def must(self, state: S, command: Any, expected: Any) -> S:
        """Apply `command`, require exactly `expected` as outcome, return the new state."""
        after, outcome = self.apply(state, command)
        assert outcome == expected
        return after

    def unchanged(self, state: S, command: Any, expected: Any) -> S:
        """`command` yields exactly `expected` and leaves the state exactly as it was."""
        after, outcome = self.apply(state, command)
        assert outcome == expected
        assert after == state
        return after

    def tick(self, state: S, by: dt.timedelta) -> S:
        """Advance the model's clock by `by`."""
        return self.must(state, AdvanceClock(by), Ok())


def raises_invalid(field: str, make: Callable[[], Any]) -> InvalidValue:
    """`make()` raises InvalidValue, naming `field`."""
    with pytest.raises(InvalidValue) as caught:
        make()
    assert caught.value.field == field
    return caught.value


# An importable adapter module for tests that run the CLI or a pytest project
# in a folder of their own: `core_only(dsn)` is the bundled delivery adapter
# offering only the mandatory operations; `fails_to_reap(dsn)` raises on Reap.
ADAPTERS_MODULE = """
from leaseproof.conformance.boundary.protocols import CORE_OPERATIONS
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.model import delivery as m


def core_only(dsn):
    adapter = PostgresDeliveryAdapter(dsn)
    adapter.operations = CORE_OPERATIONS
    adapter.name = "core operations only"
    return adapter


class _FailsToReap(PostgresDeliveryAdapter):
    def execute(self, command):
        if isinstance(command, m.Reap):
            raise RuntimeError("the sweep crashed")
        return super().execute(command)


def fails_to_reap(dsn):
    return _FailsToReap(dsn)
"""


class ModelAdapter:
    """The model itself behind the adapter boundary: it conforms by construction."""

    name = "the model"

    def __init__(self) -> None:
        self.state: m.DeliverySystem | None = None

    def reset(self, start: dt.datetime) -> None:
        self.state = m.initial_state(start)

    def execute(self, command: m.Command) -> m.Outcome:
        if self.state is None:
            raise RuntimeError("execute before reset")
        self.state, outcome = m.step(self.state, command)
        return outcome

    def snapshot(self) -> m.DeliverySystem:
        if self.state is None:
            raise RuntimeError("snapshot before reset")
        return self.state

    def close(self) -> None:
        pass


# The delivery model, in memory, as the class `Model(dsn)` of an adapter script, whose own
# `Session(model)` its sessions are (the script imports threading and the model as `m`).
MODEL_CLASS = """
class Model:
    def __init__(self, dsn):
        self.dsn, self.state, self.lock = dsn, None, threading.Lock()

    def reset(self, start):
        self.state = m.initial_state(start)

    def execute(self, command):
        with self.lock:
            self.state, outcome = m.step(self.state, command)
            return outcome

    def snapshot(self):
        return self.state

    def session(self):
        return Session(self)

    def close(self):
        pass
"""


def write_adapters(folder: Path) -> None:
    """`folder/adapters.py`: ADAPTERS_MODULE, importable from there as `adapters`."""
    (folder / "adapters.py").write_text(ADAPTERS_MODULE)


def leaseproof(
    *args: str, cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`leaseproof ARGS` as a user runs it: a real process (in `cwd`, with `env` added to the
    environment), its output captured."""
    command = [sys.executable, "-m", "leaseproof.conformance.frontends.cli", *args]
    environment = None if env is None else {**os.environ, **env}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=environment)


_REPLAY = re.compile(r"replay it (?:from the rootdir )?with: (?P<command>.+)\)$", re.MULTILINE)


def run_as_printed(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`command` as a user pastes it into a shell in `cwd`, with this interpreter's scripts
    (the installed `leaseproof`) first on PATH."""
    scripts = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", "")}
    words = shlex.split(command)
    assert words[0] == "leaseproof", command
    return subprocess.run(words, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def printed_replay(output: str) -> str:
    found = _REPLAY.search(output)
    assert found, f"no replay command printed:\n{output}"
    return found["command"]
