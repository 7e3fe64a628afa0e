"""What stress, verify and replay say when they are given something they cannot use: one
line that says why, exit 2, never the command's whole usage or a traceback, and never an
adapter blamed for a file that is not a trace. `leaseproof`'s `main`, in this process."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from helpers import REPO

from leaseproof.conformance.boundary.protocols import ALL_OPERATIONS
from leaseproof.conformance.frontends.cli import main
from leaseproof.conformance.harness.server import Server

CORPUS_TRACE = REPO / "conformance" / "traces" / "corpus" / "reconcile-unfenced.jsonl"

# An adapter of protocol 3 whose hello announces no sessions (it serves one request at a time).
NO_SESSIONS = f"""
import json, sys
for line in sys.stdin:
    request = json.loads(line)
    if request["method"] == "hello":
        machines = {{"delivery": {sorted(ALL_OPERATIONS)!r}}}
        result = {{"protocol": 3, "implementation": "one at a time", "machines": machines}}
    else:
        result = None
    print(json.dumps({{"id": request["id"], "result": result}}), flush=True)
    if request["method"] == "close":
        break
"""


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "usage:" not in err and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("command", [("stress",), ("verify",), ("replay", str(CORPUS_TRACE))], ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("given", "needs"),
    [
        (["--adapter-cmd"], "--adapter-cmd needs the command that starts the adapter"),
        (["--adapter-cmd", "-x"], "write that one as --adapter-cmd=VALUE"),
        (["--adapter"], "--adapter needs MODULE:FACTORY"),
        (["--adapter-cmd", "./adapter", "--adapter", "a:b"], "argument --adapter: not allowed with argument"),
    ],
    ids=["no value", "dash-led value", "no factory", "both"],
)
def test_an_adapter_option_argparse_refuses_is_one_line_that_says_why(
    command: tuple[str, ...], given: list[str], needs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main([*command, *given])
    assert stopped.value.code == 2
    line = _one_line(capsys)
    assert line.startswith(f"leaseproof {command[0]}: error: ") and needs in line, line


def test_other_usage_errors_keep_argparse_s_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["stress", "--workers", "0"])
    assert "usage: leaseproof stress" in capsys.readouterr().err


def test_stress_says_why_it_cannot_use_an_adapter_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "one_at_a_time.py"
    script.write_text(NO_SESSIONS)
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    cases = [
        (["--adapter-cmd", ""], "the adapter command is empty"),
        (["--adapter-cmd", "no-such-adapter-program"], "could not start the adapter 'no-such-adapter-program'"),
        (["--adapter-cmd", command], "cannot be run concurrently: it announced no sessions"),
        (["--adapter-cmd", command, "--mutant", "claim-read-then-update"], "--mutant applies to the bundled"),
    ]
    for given, why in cases:
        assert main(["stress", "--duration", "1", *given]) == 2, given
        line = _one_line(capsys)
        assert line.startswith("leaseproof: ") and why in line, (given, line)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe\x00 not text", "not UTF-8 text"),
        (b'{"format": 1, "kind": "leaseproof-history", "machine": "delivery"}\n', "the header must be"),
        # Its clock moves past the last instant the model knows: the model cannot take the step.
        (
            b'{"trace": 1, "machine": "delivery", "start": "9998-12-31T00:00:00.000000Z", "name": "far"}\n'
            b'{"step": 1, "command": {"type": "AdvanceClock", "by": 31536000000000}, "outcome": {"type": "Ok"}}\n',
            "step 1, AdvanceClock",
        ),
    ],
    ids=["not UTF-8", "a history", "the model cannot step it"],
)
def test_replay_of_a_file_that_is_no_trace_names_the_file_not_the_adapter(
    content: bytes, why: str, pg_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_bytes(content)
    assert main(["replay", str(path), "--dsn", pg_server.dsn]) == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith(f"leaseproof: {path}") and why in line, line
    assert "adapter" not in line and "FAULT" not in out
