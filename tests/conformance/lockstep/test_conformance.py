"""The conformance machine itself: it passes the bundled implementation and
kills every shipped mutant — by its fixed scenarios, and independently by
its randomized search alone."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from leaseproof.conformance.boundary.protocols import ALL_OPERATIONS, CORE_OPERATIONS
from leaseproof.conformance.lockstep.delivery import Coverage, NonConformance, RunAborted, machine_for
from leaseproof.conformance.lockstep.delivery_scenarios import SCENARIOS, run_scenarios
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS, Mutant

# The randomized search must find each mutant within this many programs.
# Runs are seeded, so they are reproducible; the figure is a budget, and
# every mutant currently dies well inside it (see the test's report).
SEARCH_BUDGET = 1000
SEED = 20261129


def test_bundled_implementation_conforms(adapter: PostgresDeliveryAdapter) -> None:
    verdict = run_conformance(adapter, Run(max_examples=40, seed=SEED))
    assert verdict.conforms, f"{verdict.failure}\n{verdict.counterexample}"
    assert verdict.coverage.scenarios == len(SCENARIOS)
    assert verdict.coverage.generated >= 40
    assert 0 < verdict.coverage.examples <= verdict.coverage.generated


def test_a_run_lets_go_of_its_adapter_and_its_programs(delivery_dsn: str) -> None:
    # Hypothesis keeps every state machine class it ran for the life of the
    # process; a run's bound class must not keep its adapter (connections and
    # all) or its trie of programs sent reachable through it, or a process
    # that runs many (a mutation run's worker) grows with every run.
    adapter = PostgresDeliveryAdapter(delivery_dsn)
    watched = weakref.ref(adapter)
    try:
        verdict = run_conformance(adapter, Run(max_examples=5, seed=SEED, scenarios=False))
    finally:
        adapter.close()
    assert verdict.conforms, verdict.failure
    del adapter
    gc.collect()
    assert watched() is None, [type(r).__qualname__ for r in gc.get_referrers(watched())]


def test_scenarios_reach_every_outcome_variant_transition_and_rule(adapter: PostgresDeliveryAdapter) -> None:
    coverage = Coverage()
    run_scenarios(machine_for(adapter, coverage))
    assert coverage.missing_outcomes() == []
    assert coverage.missing_transitions() == []
    assert coverage.missing_behaviours() == []


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mu: mu.name)
def test_scenarios_kill_each_mutant(delivery_dsn: str, mutant: Mutant) -> None:
    adapter = mutant.adapter(delivery_dsn)
    try:
        # A disagreement, or the implementation raising (an aborted run).
        with pytest.raises((NonConformance, RunAborted)) as failure:
            run_scenarios(machine_for(adapter))
    finally:
        adapter.close()
    assert any(note.startswith("in the fixed scenario") for note in failure.value.__notes__)


@pytest.mark.evidence
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mu: mu.name)
def test_random_search_alone_kills_each_mutant(delivery_dsn: str, mutant: Mutant) -> None:
    adapter = mutant.adapter(delivery_dsn)
    try:
        verdict = run_conformance(adapter, Run(max_examples=SEARCH_BUDGET, seed=SEED, shrink=False, scenarios=False))
    finally:
        adapter.close()
    assert not verdict.conforms, f"{mutant.name} survived {SEARCH_BUDGET} generated programs"
    print(f"{mutant.name}: killed in example {verdict.coverage.first_failure} after {verdict.seconds:.1f}s")


# The seed of the test below: each of eleven seeds measured found the mutant within ten
# programs and shrank it to the same five lines; this one after 163 programs sent in all
# (6 s here), the file's SEED after 429 (20 s), the others between 202 and 510.
SHORT_SEED = 4


def test_a_failure_is_reported_as_a_short_replayable_program(delivery_dsn: str) -> None:
    mutant = by_name(MUTANTS, "lease-target-unbound")
    adapter = mutant.adapter(delivery_dsn)
    try:
        verdict = run_conformance(adapter, Run(max_examples=SEARCH_BUDGET, seed=SHORT_SEED, scenarios=False))
    finally:
        adapter.close()
    program = verdict.counterexample.splitlines()
    assert program[0] == "state = DeliveryConformance()" and program[1].startswith("state.setup(swarm=")
    assert program[-1] == "state.teardown()"
    assert len(program) <= 8, verdict.counterexample  # shrunk: claim, then act with a forged target
    assert "foreign-target" in verdict.counterexample
    assert "outcome mismatch" in verdict.failure and "model:" in verdict.failure


class _CoreOnly:
    """The bundled adapter, offering only the mandatory operations, and recording what it is sent."""

    operations = CORE_OPERATIONS

    def __init__(self, inner: PostgresDeliveryAdapter) -> None:
        self.inner, self.name = inner, "core-only"
        self.sent: set[str] = set()

    def reset(self, start: Any) -> None:
        self.inner.reset(start)

    def execute(self, command: Any) -> Any:
        self.sent.add(type(command).__name__)
        return self.inner.execute(command)

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def close(self) -> None:
        self.inner.close()


def test_operations_an_adapter_does_not_offer_are_never_sent(adapter: PostgresDeliveryAdapter) -> None:
    core_only = _CoreOnly(adapter)
    verdict = run_conformance(core_only, Run(max_examples=20, seed=SEED))
    assert verdict.conforms, verdict.failure
    assert core_only.sent == set(CORE_OPERATIONS)
    assert set(verdict.coverage.skipped) == set(ALL_OPERATIONS - CORE_OPERATIONS)
    assert all(op in CORE_OPERATIONS for op, _ in verdict.coverage.missing_outcomes())


class _Recorder:
    """The bundled adapter, keeping every answer it gives, in order."""

    def __init__(self, inner: PostgresDeliveryAdapter) -> None:
        self.inner, self.name = inner, "recorder"
        self.answers: list[Any] = []

    def reset(self, start: Any) -> None:
        self.inner.reset(start)

    def execute(self, command: Any) -> Any:
        self.answers.append(self.inner.execute(command))
        return self.answers[-1]

    def snapshot(self) -> Any:
        self.answers.append(self.inner.snapshot())
        return self.answers[-1]

    def close(self) -> None:
        pass


class _Canned:
    """No implementation at all: it gives, call by call, the answers a recorder kept."""

    name = "canned answers"

    def __init__(self, answers: list[Any]) -> None:
        self.answers, self.at = answers, 0

    def reset(self, start: Any) -> None:
        pass

    def execute(self, command: Any) -> Any:
        return self._next()

    def snapshot(self) -> Any:
        return self._next()

    def _next(self) -> Any:
        self.at += 1
        return self.answers[min(self.at, len(self.answers)) - 1]

    def close(self) -> None:
        pass


def test_answers_recorded_under_one_seed_do_not_pass_under_another(adapter: PostgresDeliveryAdapter) -> None:
    """Why every front end draws a fresh seed unless told one: with the seed they
    were recorded under, canned answers pass; with any other, they do not."""
    recorder = _Recorder(adapter)
    assert run_conformance(recorder, Run(max_examples=10, seed=SEED)).conforms
    assert run_conformance(_Canned(recorder.answers), Run(max_examples=10, seed=SEED)).conforms
    verdict = run_conformance(_Canned(recorder.answers), Run(max_examples=10, seed=SEED + 1, shrink=False))
    assert not verdict.conforms and not verdict.fault
