"""What `check-trace` and `check-history` say about a file that is no trace or history:
one line, `leaseproof: ` and the file once, what is wrong in words, exit status 2, no
traceback. The readers raise their own errors (`TraceError`, `HistoryFileError`), so
`replay` and every other caller get the same line."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import REPO, leaseproof

from leaseproof.conformance.concurrent.history_file import HistoryFileError, read_history
from leaseproof.conformance.frontends import cli

# Imported now, not when a run names them: `as_nobody` runs a command as a user who
# may not read the interpreter's own files.
from leaseproof.conformance.frontends.commands import check_history, check_trace  # noqa: F401
from leaseproof.conformance.traces.trace import TraceError
from leaseproof.conformance.traces.trace import read as read_trace

REAP = '{"command": {"type": "Reap"}, "outcome": {"type": "Reaped", "count": 0}}'
TRACE_HEADER = '{"trace": 1, "machine": "delivery", "start": "2026-01-01T00:00:00.000000Z"}'
HISTORY_HEADER = '{"format": 1, "kind": "leaseproof-history", "machine": "delivery"}'
STATE = {"type": "DeliverySystem", "now": "2026-01-01T00:00:00.000000Z", "communities": [], "workflows": [],
         "runs": [], "events": [], "deliveries": [], "retired": []}  # fmt: skip
INITIAL = json.dumps({"kind": "initial", "state": STATE})


def _operation(
    ident: int, invoked: int, returned: int | None, drop: str = "", override: dict[str, object] | None = None
) -> str:
    """An operation line of a Reap; `override` replaces members, `drop` names one left out."""
    outcome = {"type": "Reaped", "count": 0} if returned is not None else {"indeterminate": "no response"}
    line = {"kind": "operation", "id": ident, "client": "w1", "command": {"type": "Reap"}, "outcome": outcome}
    line = {**line, "invoked": invoked, "returned": returned, **(override or {})}
    return json.dumps({k: v for k, v in line.items() if k != drop})


# (name, how to make the file at a path, what follows the path in the message); "{n}" in
# the message is the command's noun ("trace" or "history").
Maker = Callable[[Path], object]
Case = tuple[str, Maker, str]
NOT_UTF8 = ": not UTF-8 text ({where}); a {n} is JSON lines"
MACHINES = '"delivery" or "lifecycle"'


def _text(content: str) -> Maker:
    return lambda path: path.write_text(content)


def _history(*operations: str) -> Maker:
    return _text("\n".join([HISTORY_HEADER, INITIAL, *operations]) + "\n")


COMMON: list[Case] = [
    (
        "not UTF-8",
        lambda p: p.write_bytes(b"\xff\xfe{}\n"),
        ":1" + NOT_UTF8.replace("{where}", "byte 0xff at offset 0"),
    ),
    (
        "Latin-1 on line 2",
        lambda p: p.write_bytes(b'{"a": 1}\n{"name": "caf\xe9"}\n'),
        ":2" + NOT_UTF8.replace("{where}", "byte 0xe9 at offset 22"),
    ),
    (
        "gzip",
        lambda p: p.write_bytes(b"\x1f\x8b\x08\x00" + bytes(16)),
        ":1" + NOT_UTF8.replace("{where}", "byte 0x8b at offset 1"),
    ),
    ("missing", lambda p: None, ": no such file"),
    ("a directory", lambda p: p.mkdir(), ": a directory, not a file"),
    ("under a file", lambda p: None, ": no such file (a part of its path is not a directory)"),
    ("not JSON", _text("hello\n"), ":1: not JSON (Expecting value)"),
    ("nested too deeply", _text("[" * 100_000 + "]" * 100_000), ":1: not JSON this reader takes (nested too deeply)"),
]
TRACE_FILES: list[Case] = [
    *COMMON,
    ("empty", _text(""), ": empty; a trace starts with a header line"),
    ("JSON, not a trace", _text("[1, 2]\n"), ':1: the header must be {"trace": 1, "machine": ' + MACHINES + ", ...}"),
    (
        "a history",
        _text(HISTORY_HEADER + "\n"),
        ':1: the header must be {"trace": 1, "machine": ' + MACHINES + ", ...}",
    ),
    (
        "a machine that is an object",
        _text('{"trace": 1, "machine": {}}\n'),
        f':1: the header\'s "machine" must be {MACHINES}, not {{}}',
    ),
    (
        "an object where a name is",
        _text(TRACE_HEADER + '\n{"command": {"type": {}}, "outcome": {}}\n'),
        ":2: not a value the model knows (unhashable type: 'dict')",
    ),
]
HISTORY_FILES: list[Case] = [
    *COMMON,
    ("empty", _text(""), ": empty; a history starts with a leaseproof-history header line"),
    ("JSON, not a history", _text("[1, 2]\n"), ":1: expected a leaseproof-history header of format 1"),
    ("a trace", _text(TRACE_HEADER + "\n"), ":1: expected a leaseproof-history header of format 1"),
    (
        "no machine",
        _text('{"format": 1, "kind": "leaseproof-history"}\n'),
        f':1: the header\'s "machine" must be {MACHINES}, not None',
    ),
    ("a header alone", _text(HISTORY_HEADER + "\n"), ": needs a header and an initial state"),
    (
        "no initial state",
        _text(f"{HISTORY_HEADER}\n{_operation(1, 1, 2)}\n"),
        ':2: expected the initial state ("kind": "initial")',
    ),
    (
        "another machine's state",
        _text(HISTORY_HEADER.replace("delivery", "lifecycle") + "\n" + INITIAL + "\n"),
        ':2: state: expected an object with "type": "LifecycleSystem", got \'DeliverySystem\'',
    ),
    (
        "an outcome for a command",
        _history(_operation(1, 1, 2, override={"command": {"type": "Ok"}})),
        ":3: command: Ok is not a delivery command",
    ),
    (
        "a tick that is text",
        _history(_operation(1, 1, 2, override={"invoked": "one"})),
        ':3: invoked: expected int, got "one"',
    ),
    ("no id", _history(_operation(1, 1, 2, drop="id")), ":3: no member 'id'"),
    ("an id twice", _history(_operation(7, 1, 2), _operation(7, 3, 4)), ":4: operation id 7 again (line 3 has it)"),
    (
        "an answer before its call",
        _history(_operation(1, 5, 2)),
        ": operation 1 (w1: Reap()): returned at tick 2, not after its invocation at 5",
    ),
    (
        "an object where a name is",
        _history(_operation(1, 1, 2, override={"command": {"type": {}}})),
        ":3: not a value the model knows (unhashable type: 'dict')",
    ),
]


def _path(tmp_path: Path, case: str, make: Maker) -> Path:
    if case == "under a file":
        (tmp_path / "plain").write_text("")
        return tmp_path / "plain" / "x.jsonl"
    path = tmp_path / "x.jsonl"
    make(path)
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _says_once(err: str, path: Path, rest: str) -> None:
    assert err == f"leaseproof: {path}{rest}\n", err
    assert err.count(str(path)) == 1, "the file is named more than once"


@pytest.mark.parametrize(("case", "make", "rest"), TRACE_FILES, ids=[c[0] for c in TRACE_FILES])
def test_check_trace_says_in_one_line_what_keeps_a_file_from_being_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, make: Maker, rest: str
) -> None:
    path = _path(tmp_path, case, make)
    with pytest.raises(TraceError):  # what replay catches, too
        read_trace(path)
    status, out, err = _run(capsys, "check-trace", str(path))
    assert (status, out) == (2, "")
    _says_once(err, path, rest.replace("{n}", "trace"))


@pytest.mark.parametrize(("case", "make", "rest"), HISTORY_FILES, ids=[c[0] for c in HISTORY_FILES])
def test_check_history_says_in_one_line_what_keeps_a_file_from_being_a_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, make: Maker, rest: str
) -> None:
    path = _path(tmp_path, case, make)
    with pytest.raises(HistoryFileError):
        read_history(path)
    status, out, err = _run(capsys, "check-history", str(path))
    assert (status, out) == (2, "")
    _says_once(err, path, rest.replace("{n}", "history"))


def test_a_well_formed_history_still_reads_and_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(f"{HISTORY_HEADER}\n{INITIAL}\n{_operation(1, 1, 2)}\n{_operation(2, 3, None)}\n")
    status, out, err = _run(capsys, "check-history", str(path))
    assert (status, err) == (0, "") and out.startswith(f"{path}: linearizable: 2 operations")


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """Run the body as a user who may not read what root may (root reads any file);
    for anyone else, the body runs as they are."""
    if os.geteuid() != 0:
        yield
        return
    nobody = pwd.getpwnam("nobody")
    os.setegid(nobody.pw_gid)
    os.seteuid(nobody.pw_uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.mark.parametrize("command", ["check-trace", "check-history"])
def test_a_file_that_may_not_be_read_is_permission_denied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    path = tmp_path / "secret.jsonl"
    path.write_text(TRACE_HEADER + "\n" if command == "check-trace" else HISTORY_HEADER + "\n")
    path.chmod(0)
    with as_nobody():
        if os.access(path, os.R_OK, effective_ids=True):
            pytest.skip("this user may read a file of mode 000")
        status, out, err = _run(capsys, command, str(path))
    assert (status, out) == (2, "")
    _says_once(err, path, ": permission denied")


@pytest.mark.parametrize("command", ["check-trace", "check-history"])
def test_a_real_run_on_bytes_that_are_not_utf8_prints_one_line_and_exits_2(tmp_path: Path, command: str) -> None:
    path = tmp_path / "recorded.jsonl"
    path.write_bytes(b"\xff\xfe\x00\x00")
    run = leaseproof(command, str(path))
    noun = "trace" if command == "check-trace" else "history"
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == f"leaseproof: {path}:1: not UTF-8 text (byte 0xff at offset 0); a {noun} is JSON lines\n"


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"\xff\xfe\n", ":1: not UTF-8 text (byte 0xff at offset 0); it lists trace names"), (None, ": no such file")],
    ids=["not utf-8", "missing"],
)
def test_replay_says_in_one_line_what_is_wrong_with_its_expect_fail_file(
    tmp_path: Path, content: bytes | None, why: str
) -> None:
    """The --expect-fail list is read as the traces are: one line, exit 2, before anything is sent."""
    listed = tmp_path / "known.txt"
    if content is not None:
        listed.write_bytes(content)
    trace = REPO / "conformance" / "traces" / "corpus" / "reconcile-unfenced.jsonl"
    run = leaseproof("replay", str(trace), "--expect-fail", str(listed), cwd=tmp_path, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith(f"leaseproof: --expect-fail {listed}{why}") and run.stdout == ""
