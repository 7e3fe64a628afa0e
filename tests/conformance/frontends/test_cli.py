"""`leaseproof verify` as a user runs it: a real process, real exit codes."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from helpers import leaseproof, write_adapters

from leaseproof.conformance.frontends.cli import COMMANDS
from leaseproof.conformance.harness.server import Server


def _verify(*args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseproof.conformance.frontends.cli", "verify", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def test_console_script_is_installed() -> None:
    scripts = {e.name: e.value for e in metadata.entry_points(group="console_scripts")}
    assert scripts.get("leaseproof") == "leaseproof.conformance.frontends.cli:main"


def test_verify_passes_the_bundled_implementation_and_summarises(pg_server: Server) -> None:
    run = _verify("--dsn", pg_server.dsn, "--max-examples", "15", "--seed", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verdict: CONFORMS" in run.stdout
    assert "scenarios: 8" in run.stdout and "seed: 3" in run.stdout
    assert "never reached: none" in run.stdout  # the scenarios reach every variant
    for operation in ("Claim", "Renew", "Finish", "Reap", "CommitDeliveries"):
        assert f"\n  {operation} " in run.stdout
    assert "example 1/15" in run.stderr  # progress goes to stderr


def test_verify_fails_a_mutant_with_a_replayable_counterexample(pg_server: Server, tmp_path: Path) -> None:
    args = ("--dsn", pg_server.dsn, "--max-examples", "30", "--seed", "3", "--mutant", "lease-target-unbound")
    run = _verify(*args, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "verdict: DOES NOT CONFORM" in run.stdout
    assert "counterexample (a fixed scenario: every run checks it first, whatever the seed" in run.stdout
    assert "replay with --seed" not in run.stdout  # the seed plays no part in a fixed scenario
    assert "in the fixed scenario rebuilt_lease_with_foreign_target" in run.stdout
    assert "implementation: Renewed" in run.stdout or "implementation: Settled" in run.stdout
    trace = tmp_path / "leaseproof-delivery-counterexample-3.jsonl"
    assert f"trace: {trace.name} (the counterexample" in run.stdout and trace.is_file()


def test_bad_usage_exits_2() -> None:
    for args in (["--max-examples", "0"], ["--seed", "x"], ["--mutant", "no-such-mutant"]):
        run = _verify(*args, timeout=60)
        assert run.returncode == 2, (args, run.stderr)
        assert "error:" in run.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_commands_bad_flag_is_said_with_that_commands_usage(command: str) -> None:
    positional = {"path": ["corpus"], "replay": ["t.jsonl"], "check-trace": ["t.jsonl"], "check-history": ["h.jsonl"]}
    run = leaseproof(command, *positional.get(command, []), "--bogus-flag", timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(f"usage: leaseproof {command} "), run.stderr
    assert run.stderr.endswith(f"leaseproof {command}: error: unrecognized arguments: --bogus-flag\n"), run.stderr


def test_an_unreachable_server_exits_2_with_the_fix() -> None:
    run = _verify("--dsn", "host=127.0.0.1 port=1 user=nobody dbname=postgres connect_timeout=2", timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--dsn" in run.stderr and "LEASEPROOF_DSN" in run.stderr


def test_verify_covers_both_machines_by_default(pg_server: Server) -> None:
    run = _verify("--dsn", pg_server.dsn, "--max-examples", "10", "--seed", "5")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verifying the delivery machine" in run.stdout and "verifying the lifecycle machine" in run.stdout
    assert run.stdout.count("verdict: CONFORMS") == 2
    assert run.stdout.count("never reached: none") == 2


def test_verify_one_machine_and_a_lifecycle_mutant(pg_server: Server, tmp_path: Path) -> None:
    run = _verify("--dsn", pg_server.dsn, "--machine", "lifecycle", "--max-examples", "10", "--seed", "5")
    assert run.returncode == 0 and "delivery machine" not in run.stdout, run.stdout + run.stderr
    run = _verify("--dsn", pg_server.dsn, "--max-examples", "10", "--mutant", "cutoff-ignored", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "verifying the lifecycle machine" in run.stdout and "delivery machine" not in run.stdout
    assert "in the fixed scenario delayed_and_replayed_saves" in run.stdout
    run = _verify("--machine", "delivery", "--mutant", "cutoff-ignored", timeout=60)
    assert run.returncode == 2 and "does not fit" in run.stderr


def test_an_adapter_that_leaves_operations_out_conforms_only_on_a_subset(pg_server: Server, tmp_path: Path) -> None:
    write_adapters(tmp_path)
    args = ("--dsn", pg_server.dsn, "--max-examples", "5", "--seed", "3", "--adapter", "adapters:core_only")
    run = _verify(*args, cwd=tmp_path)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "verdict: CONFORMS ON A SUBSET" in run.stdout and "verdict: CONFORMS —" not in run.stdout
    headline = next(line for line in run.stdout.splitlines() if "ON A SUBSET" in line)
    for left_out in ("DeleteRun", "SetCommunityState", "GetDelivery"):
        assert left_out in headline
    # The summary's count and the subset verdict's are one count (Verdict.behaviours).
    checkable, declared = map(int, re.findall(r"(\d+) of the (\d+) behaviours the rules declare", headline)[0])
    summary = re.search(r"behaviours exercised: (\d+) of the (\d+) the rules declare", run.stdout)
    assert summary is not None and int(summary[2]) == checkable < declared, (summary, headline)
    assert int(summary[1]) <= checkable
    assert "--accept-subset" in run.stdout
    accepted = _verify(*args, "--accept-subset", cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "verdict: CONFORMS ON A SUBSET" in accepted.stdout and "accepted (--accept-subset)" in accepted.stdout


def test_of_two_machines_a_non_conformance_outranks_a_subset() -> None:
    from leaseproof.conformance.frontends.commands.common import worse
    from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_SUBSET, EXIT_USAGE

    assert worse(EXIT_SUBSET, EXIT_NONCONFORMING) == EXIT_NONCONFORMING
    assert worse(EXIT_CONFORMS, EXIT_SUBSET) == EXIT_SUBSET
    assert worse(EXIT_NONCONFORMING, EXIT_USAGE) == EXIT_USAGE


def test_verify_help_states_its_exit_statuses() -> None:
    run = _verify("--help")
    assert run.returncode == 0
    assert "3 conforms on a subset" in " ".join(run.stdout.split())


def test_stress_help_states_its_exit_statuses() -> None:
    run = leaseproof("stress", "--help", timeout=60)
    assert run.returncode == 0 and "exit status: 0 every history linearizable" in " ".join(run.stdout.split())


def test_the_summary_counts_the_behaviours_the_subset_verdict_counts() -> None:
    """One count: the summary's line and the subset verdict both read Verdict.behaviours."""
    import io

    from leaseproof.conformance.boundary.protocols import CORE_OPERATIONS
    from leaseproof.conformance.frontends.commands.verify import _summary
    from leaseproof.conformance.lockstep.core import Coverage
    from leaseproof.conformance.lockstep.delivery import DELIVERY
    from leaseproof.conformance.lockstep.verify import Verdict

    coverage = Coverage(spec=DELIVERY, offered=CORE_OPERATIONS)
    reached = coverage.checkable_behaviours()[0]
    coverage.behaviours[reached] += 3
    verdict = Verdict(True, coverage, 0.0, 1)
    behaviours = verdict.behaviours
    assert behaviours.declared == tuple(DELIVERY.behaviours())
    assert all(b[0] in CORE_OPERATIONS for b in behaviours.checkable)
    assert len(behaviours.checkable) < len(behaviours.declared)
    assert behaviours.exercised == 1 and reached not in behaviours.never
    assert verdict.subset().startswith(f"{len(behaviours.checkable)} of the {len(behaviours.declared)} behaviours")
    out = io.StringIO()
    _summary(verdict, out)
    assert f"behaviours exercised: 1 of the {len(behaviours.checkable)} the rules declare" in out.getvalue()
    never_line = next(line for line in out.getvalue().splitlines() if line.startswith("never reached: "))
    assert all(f"{op}/{guard}→{v}" in never_line for op, guard, v in behaviours.never)


def test_the_installed_script_finds_an_adapter_module_in_the_current_folder(pg_server: Server, tmp_path: Path) -> None:
    """`leaseproof --adapter adapters:core_only`, run by the console script (which, unlike
    `python -m`, does not put the current folder on sys.path), imports ./adapters.py."""
    script = Path(sys.executable).with_name("leaseproof")
    assert script.is_file(), f"no console script beside {sys.executable}"
    write_adapters(tmp_path)
    run = subprocess.run(
        [str(script), "verify", "--adapter", "adapters:core_only", "--dsn", pg_server.dsn, "--max-examples", "3",
         "--accept-subset", "--seed", "1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verifying the delivery machine against core operations only" in run.stdout
