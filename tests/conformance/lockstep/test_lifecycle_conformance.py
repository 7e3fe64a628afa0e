"""The lifecycle conformance machine: it passes the bundled implementation and
kills every lifecycle mutant, by its fixed scenarios and by its search alone."""

from __future__ import annotations

import pytest

from leaseproof.conformance.lockstep.core import Coverage, NonConformance, RunAborted
from leaseproof.conformance.lockstep.delivery_scenarios import run_scenarios
from leaseproof.conformance.lockstep.lifecycle import lifecycle_machine_for
from leaseproof.conformance.lockstep.lifecycle_scenarios import LIFECYCLE_SCENARIOS
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS, LifecycleMutant

SEARCH_BUDGET = 1000  # the latest kill was admission-ignores-hash, at program 577 (`leaseproof mutants` shows each)
SEED = 20261129


def test_bundled_lifecycle_conforms(lifecycle_adapter: PostgresLifecycleAdapter) -> None:
    verdict = run_conformance(lifecycle_adapter, Run(machine="lifecycle", max_examples=40, seed=SEED))
    assert verdict.conforms, f"{verdict.failure}\n{verdict.counterexample}"
    assert verdict.coverage.scenarios == len(LIFECYCLE_SCENARIOS)


def test_lifecycle_scenarios_reach_every_outcome_variant_and_rule(lifecycle_adapter: PostgresLifecycleAdapter) -> None:
    coverage = Coverage()
    run_scenarios(lifecycle_machine_for(lifecycle_adapter, coverage), LIFECYCLE_SCENARIOS)
    assert coverage.missing_outcomes() == []
    assert coverage.missing_behaviours() == []


@pytest.mark.parametrize("mutant", LIFECYCLE_MUTANTS, ids=lambda mu: mu.name)
def test_lifecycle_scenarios_kill_each_mutant(delivery_dsn: str, mutant: LifecycleMutant) -> None:
    adapter = mutant.adapter(delivery_dsn)
    try:
        with pytest.raises((NonConformance, RunAborted)) as failure:
            run_scenarios(lifecycle_machine_for(adapter), LIFECYCLE_SCENARIOS)
    finally:
        adapter.close()
    assert any(note.startswith("in the fixed scenario") for note in failure.value.__notes__)


@pytest.mark.evidence
@pytest.mark.parametrize("mutant", LIFECYCLE_MUTANTS, ids=lambda mu: mu.name)
def test_lifecycle_search_alone_kills_each_mutant(delivery_dsn: str, mutant: LifecycleMutant) -> None:
    adapter = mutant.adapter(delivery_dsn)
    try:
        verdict = run_conformance(
            adapter, Run(machine="lifecycle", max_examples=SEARCH_BUDGET, seed=SEED, shrink=False, scenarios=False)
        )
    finally:
        adapter.close()
    assert not verdict.conforms, f"{mutant.name} survived {SEARCH_BUDGET} generated programs"
    print(f"{mutant.name}: killed in example {verdict.coverage.first_failure} after {verdict.seconds:.1f}s")
