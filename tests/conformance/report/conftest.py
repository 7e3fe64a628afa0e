"""Real inputs for the report pages, made once per session on the test server: a
shipped mutant's lockstep counterexample, a race mutant's non-linearizable stress
run, and a linearizable history of the bundled store.

Each fixture builds what the CLI would hand the report functions, the same way."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from leaseproof.conformance.concurrent.history import History
from leaseproof.conformance.concurrent.linearizability import CheckResult, check
from leaseproof.conformance.concurrent.models import SPECS
from leaseproof.conformance.concurrent.programs import GENERATORS
from leaseproof.conformance.concurrent.stress import Runner, StressReport, stress
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep.verify import Run, Verdict, run_conformance
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS
from leaseproof.impl.mutants.race import RACE_MUTANTS

SEED = 20261129
SEQUENTIAL_MUTANT = "reconcile-unfenced"  # review finding 1; dies in a fixed scenario
RACE_MUTANT = "claim-read-then-update"  # two claimers read one pending row and both claim it


@pytest.fixture(scope="session")
def report_dsn(pg_server: Server, delivery_template: str) -> Iterator[str]:
    """One migrated database for the session's report inputs."""
    with scratch_database(pg_server, template=delivery_template) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def counterexample(report_dsn: str) -> Verdict:
    """`leaseproof verify --mutant reconcile-unfenced --seed SEED`'s verdict, in process."""
    adapter = by_name(MUTANTS, SEQUENTIAL_MUTANT).adapter(report_dsn)
    try:
        verdict = run_conformance(adapter, Run(machine="delivery", max_examples=20, seed=SEED))
    finally:
        adapter.close()
    assert not verdict.conforms and verdict.recorded is not None, verdict.failure
    return verdict


@pytest.fixture(scope="session")
def race(report_dsn: str) -> StressReport:
    """`leaseproof stress --mutant claim-read-then-update` with four workers, stopped at the first finding."""
    adapter = by_name(RACE_MUTANTS, RACE_MUTANT).adapter(report_dsn)
    try:
        report = stress(adapter, machine="delivery", workers=4, duration=120, seed=SEED, repeats=1, max_programs=300)
    finally:
        adapter.close()
    assert report.finding is not None, f"{RACE_MUTANT} survived {report.progress.programs} programs"
    assert report.finding.result.violation is not None
    return report


@pytest.fixture(scope="session")
def linearizable(report_dsn: str) -> tuple[History, CheckResult]:
    """One seeded program of the bundled store, run by four workers, and its (passing) check."""
    adapter = PostgresDeliveryAdapter(report_dsn)
    runner = Runner(adapter, "delivery", 4)
    try:
        history = runner.run(GENERATORS["delivery"](random.Random(SEED), 4))
    finally:
        runner.close()
        adapter.close()
    result = check(history, SPECS["delivery"])
    assert result.linearizable, result.summary()
    return history, result
