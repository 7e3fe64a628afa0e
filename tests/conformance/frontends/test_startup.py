"""The command line's start: `--help` and `--version` import the command table alone,
a command imports its own modules and no other command's, a command's `--help` imports
no database driver, no Hypothesis and no implementation, the names its help reads from
`frontends/catalogue.py` are those of their sources, and every help states its exit
statuses. (How long starting takes is measured by `python -m
leaseproof.conformance.frontends.bench`, not asserted here.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

import pytest
from helpers import leaseproof

from leaseproof.conformance.frontends.cli import COMMANDS
from leaseproof.conformance.frontends.commands.running import ALL_MUTANTS

# Run `main(ARGV)` in a fresh interpreter and print which modules it had imported.
_PROBE = """
import json, sys
from leaseproof.conformance.frontends import cli
try:
    status = cli.main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
sys.stdout.flush()
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
sys.exit(status)
"""
HEAVY = ("psycopg", "hypothesis", "attrs", "leaseproof.model", "leaseproof.impl")


def _imported_by(*argv: str) -> tuple[int, str, set[str]]:
    run = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    text, _, modules = run.stdout.rpartition("\nMODULES ")
    return run.returncode, text + run.stderr, set(json.loads(modules))


def _loaded(modules: set[str], prefix: str) -> set[str]:
    return {m for m in modules if m == prefix or m.startswith(prefix + ".")}


@pytest.mark.parametrize("argv", [["--help"], ["--version"], []])
def test_the_top_level_imports_no_command_and_no_database_driver(argv: list[str]) -> None:
    status, text, modules = _imported_by(*argv)
    assert status == (2 if not argv else 0), text
    for heavy in HEAVY:
        assert not _loaded(modules, heavy), f"leaseproof {' '.join(argv)} imported {sorted(_loaded(modules, heavy))}"
    assert not _loaded(modules, "leaseproof.conformance.frontends.commands")


def test_the_top_level_help_lists_every_command_and_the_exit_statuses() -> None:
    run = leaseproof("--help", timeout=60)
    assert run.returncode == 0, run.stderr
    for name, (_, help_line) in COMMANDS.items():
        assert re.search(rf"^    {re.escape(name)}\b", run.stdout, re.M), name
        assert " ".join(help_line.split()[:4]) in " ".join(run.stdout.split()), name
    assert "130 interrupted" in " ".join(run.stdout.split())


def test_version_is_the_installed_distribution() -> None:
    run = leaseproof("--version", timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"leaseproof {metadata.version('leaseproof')}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_imports_its_own_module_alone_and_its_help_states_the_exit_statuses(name: str) -> None:
    status, text, modules = _imported_by(name, "--help")
    assert status == 0, text
    assert "exit status" in text and "130 interrupted" in " ".join(text.split()), text
    commands = _loaded(modules, "leaseproof.conformance.frontends.commands") - {
        "leaseproof.conformance.frontends.commands",
        "leaseproof.conformance.frontends.commands.common",
    }
    own = COMMANDS[name][0]
    assert commands <= {own}, f"{name} --help imported other commands: {sorted(commands - {own})}"
    assert own in modules
    for heavy in ("psycopg", "hypothesis", "leaseproof.impl", "leaseproof.conformance.lockstep"):
        assert not _loaded(modules, heavy), f"{name} --help imported {sorted(_loaded(modules, heavy))}"


def test_the_catalogue_the_helps_read_is_what_it_names() -> None:
    from leaseproof.conformance.concurrent import nemesis
    from leaseproof.conformance.concurrent.linearizability import DEFAULT_BUDGET
    from leaseproof.conformance.evidence import killmatrix, score, throughput
    from leaseproof.conformance.frontends import catalogue
    from leaseproof.conformance.frontends.commands.running import SEQUENTIAL_MUTANTS
    from leaseproof.conformance.lockstep import core
    from leaseproof.conformance.lockstep.verify import MACHINES
    from leaseproof.conformance.queues import subjects
    from leaseproof.impl.mutants.faults import FAULT_MUTANTS, NETWORK_MUTANTS, RESTART_MUTANTS
    from leaseproof.impl.mutants.race import RACE_MUTANTS
    from leaseproof.impl.mutants.service import SERVICE_MUTANTS

    assert tuple(MACHINES) == catalogue.MACHINES
    assert tuple(mu.name for mu in SEQUENTIAL_MUTANTS) == catalogue.SEQUENTIAL_MUTANTS
    assert tuple(mu.name for mu in RACE_MUTANTS) == catalogue.RACE_MUTANTS
    assert tuple(mu.name for mu in FAULT_MUTANTS) == catalogue.FAULT_MUTANTS
    assert tuple(mu.name for mu in SERVICE_MUTANTS) == catalogue.SERVICE_MUTANTS
    assert tuple(mu.name for mu in RESTART_MUTANTS) == catalogue.RESTART_MUTANTS
    assert tuple(mu.name for mu in NETWORK_MUTANTS) == catalogue.NETWORK_MUTANTS
    assert tuple(mu.name for mu in ALL_MUTANTS) == catalogue.ALL_MUTANTS
    assert (catalogue.CHECKER_BUDGET, catalogue.SHRINK_ATTEMPTS) == (DEFAULT_BUDGET, core.SHRINK_ATTEMPTS)
    assert catalogue.SHRINK_SECONDS == core.SHRINK_SECONDS
    assert (catalogue.KILL_MATRIX_SEED, catalogue.MUTANT_KINDS) == (killmatrix.SEED, killmatrix.KINDS)
    assert (catalogue.SCORE_SEEDS, catalogue.MIN_SCORE) == (score.SEEDS, score.MIN_SCORE)
    assert score.Budget().examples == catalogue.SCORE_EXAMPLES
    assert catalogue.NEMESIS_FAULTS == nemesis.FAULTS
    assert tuple(subjects.SUBJECTS) == catalogue.QUEUE_SUBJECTS
    assert tuple(throughput.SUBJECTS) == catalogue.THROUGHPUT_SUBJECTS


def test_help_never_breaks_a_mutant_name_across_lines() -> None:
    run = leaseproof("stress", "--help", timeout=60)
    assert run.returncode == 0, run.stderr
    for mutant in ALL_MUTANTS:
        assert re.search(rf"(^|[\s,:]){re.escape(mutant.name)}([,\s]|$)", run.stdout, re.M), mutant.name


def test_an_unknown_command_is_a_usage_error_naming_the_choices() -> None:
    run = leaseproof("frobnicate", timeout=60)
    assert run.returncode == 2 and "invalid choice: 'frobnicate'" in run.stderr and "verify" in run.stderr
