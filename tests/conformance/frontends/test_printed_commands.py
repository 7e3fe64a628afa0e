"""Every command leaseproof prints for reproducing a failure reproduces it when run as
printed, in a fresh process: it names the implementation that failed (the mutant, the
adapter, the adapter command and its reply timeout), not only the trace.

(The pytest plugin's line is run as printed in
tests/conformance/frontends/test_pytest_plugin_runs.py.)"""

from __future__ import annotations

import io
import shlex
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from helpers import leaseproof, printed_replay, run_as_printed

from leaseproof.conformance.harness.server import Server


def test_verify_of_a_mutant_prints_a_replay_that_meets_the_mutant(tmp_path: Path) -> None:
    verify = leaseproof("verify", "--mutant", "reconcile-unfenced", "--seed", "1", cwd=tmp_path)
    assert verify.returncode == 1, verify.stdout + verify.stderr
    command = printed_replay(verify.stdout)
    assert "--mutant reconcile-unfenced" in command
    replayed = run_as_printed(command, tmp_path)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "0 passed, 1 failed" in replayed.stdout
    assert "implementation: AlreadyTerminal(status=failed)   <- not the model's" in replayed.stdout
    # The mutant is what fails: the same trace passes on the bundled implementation.
    trace = shlex.split(command)[2]
    assert leaseproof("replay", trace, cwd=tmp_path).returncode == 0


def test_verify_of_an_adapter_command_prints_a_replay_with_that_command(tmp_path: Path, pg_server: Server) -> None:
    adapter = (
        f"{shlex.quote(sys.executable)} -m leaseproof.conformance.boundary.serve"
        f" --dsn {shlex.quote(pg_server.dsn)} --mutant lease-target-unbound"
    )
    verify = leaseproof(
        "verify",
        "--adapter-cmd",
        adapter,
        "--reply-timeout",
        "45",
        "--seed",
        "1",
        "--machine",
        "delivery",
        cwd=tmp_path,
    )
    assert verify.returncode == 1, verify.stdout + verify.stderr
    command = printed_replay(verify.stdout)
    words = shlex.split(command)
    assert words[words.index("--adapter-cmd") + 1] == adapter
    assert words[words.index("--reply-timeout") + 1] == "45"
    replayed = run_as_printed(command, tmp_path)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "0 passed, 1 failed" in replayed.stdout


@pytest.mark.parametrize("flag", ["--adapter", "--adapter-cmd"])
def test_the_replay_command_quotes_what_a_shell_would_split(flag: str) -> None:
    from leaseproof.conformance.frontends.commands.common import REPLY_TIMEOUT, replay_command

    value = "./my adapter --flag 'x'"
    chosen = Namespace(
        mutant=None,
        adapter=value if flag == "--adapter" else None,
        adapter_cmd=value if flag == "--adapter-cmd" else None,
        reply_timeout=REPLY_TIMEOUT,
    )
    words = shlex.split(replay_command(Path("a trace.jsonl"), chosen))
    assert words == ["leaseproof", "replay", "a trace.jsonl", flag, value]


def test_stress_prints_a_check_of_the_piece_that_finds_it_not_linearizable(tmp_path: Path, pg_server: Server) -> None:
    stress = leaseproof(
        "stress", "--mutant", "claim-read-then-update", "--seed", "1", "--workers", "4", "--repeats", "1",
        "--duration", "60", "--dsn", pg_server.dsn, cwd=tmp_path,
    )  # fmt: skip
    assert stress.returncode == 1, stress.stdout + stress.stderr
    (line,) = [line for line in stress.stdout.splitlines() if line.startswith("piece: ")]
    command = line.rsplit("; ", 1)[1].removesuffix(")")
    assert command.startswith("leaseproof check-history "), line
    checked = run_as_printed(command, tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "not linearizable" in checked.stdout


def test_two_machines_failing_write_two_traces(tmp_path: Path) -> None:
    """A run in which both machines fail writes a trace for each: under one --trace-out, the
    second machine's goes beside the first's, not over it."""
    from leaseproof.conformance.frontends.commands.verify import _write_trace
    from leaseproof.conformance.lockstep.verify import Recorded

    written: set[Path] = set()
    args = Namespace(trace_out=tmp_path / "t.jsonl", mutant=None, adapter=None, adapter_cmd=None, reply_timeout=30)
    paths = []
    for machine in ("delivery", "lifecycle"):
        verdict = Namespace(recorded=Recorded(name="t", machine=machine, commands=()), seed=7)
        out = io.StringIO()
        _write_trace(verdict, args, out, io.StringIO(), written)  # type: ignore[arg-type]
        paths.append(Path(out.getvalue().split("trace: ", 1)[1].split(" (", 1)[0]))
    assert paths == [tmp_path / "t.jsonl", tmp_path / "t-lifecycle.jsonl"]
    assert all(path.is_file() for path in paths)
