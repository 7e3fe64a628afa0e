"""The search itself: swarm testing, collision-biased values, bounded and
deterministic shrinking, and failure reports a reader can act on."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep import delivery as dm
from leaseproof.conformance.lockstep import lifecycle as lm
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.core import NonConformance, ShrinkBound
from leaseproof.conformance.lockstep.swarm import (
    EveryRule,
    Swarm,
    independent_programs,
    swarm,
    values,
    weighted,
    without_local_constants,
)
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS
from leaseproof.model import delivery as m

# -- swarm testing ---------------------------------------------------------------------


def test_the_machines_turn_off_hypothesis_rule_level_swarm(adapter: PostgresDeliveryAdapter) -> None:
    """Their own swarm switches the rules; Hypothesis's lazily drawn flags would
    otherwise sit inside the first step that asks, where deleting it redraws them."""
    machine = dm.machine_for(adapter)()
    flags = find(machine._rules_strategy.enabled_rules_strategy, lambda _: True)
    assert isinstance(flags, EveryRule)


def test_a_swarm_shrinks_to_everything_enabled_and_sometimes_leaves_features_out() -> None:
    strategy = swarm(("a", "b", "c"), key="test swarm")
    assert find(strategy, lambda s: True) == Swarm()
    assert find(strategy, lambda s: "b" in s.off) == Swarm(frozenset({"b"}))


@given(st.data())
@settings(max_examples=50)
def test_values_come_only_from_the_features_a_program_leaves_on(data: st.DataObject) -> None:
    shared = swarm(("rare",), key="test values")
    program = data.draw(shared)
    value = data.draw(values(shared, weighted(["common"], ["odd"], 2, "rare")))
    assert value == "common" or program.on("rare")


def test_a_family_left_out_entirely_falls_back_to_every_value() -> None:
    shared = st.just(Swarm(frozenset({"only"})))
    assert find(values(shared, [("x", "only")]), lambda v: True) == "x"


def test_every_feature_of_each_machine_is_used_by_a_rule_or_a_value() -> None:
    """A feature no rule or value names would be drawn and switch nothing."""
    for module in (dm, lm):
        assert module.__file__ is not None
        source = Path(module.__file__).read_text(encoding="utf-8")
        for feature in module.FEATURES:
            assert source.count(f'"{feature}"') >= 2, f"{module.__name__}: {feature} switches nothing"


# -- collisions with the state ---------------------------------------------------------


def _state_with(*deliveries: m.Delivery, retired: frozenset[m.CommunityKey] = frozenset()) -> m.DeliverySystem:
    from leaseproof.model.frozenmap import FrozenMap

    return m.DeliverySystem(now=w.START, deliveries=FrozenMap((d.key, d) for d in deliveries), retired=retired)


def test_a_commit_can_reuse_a_retired_id_or_a_live_row_s_id() -> None:
    a = w.COMMUNITIES["A"]
    binding = w.binding("A", "W1", "R1", "s1", "T1", "D1", "M1", "event:E1")
    live = m.Delivery(w.DELIVERIES["d2"], binding, m.Status.PENDING, 0, None, None, None, w.START)
    state = _state_with(live, retired=frozenset({(a, w.DELIVERIES["d1"]), (w.COMMUNITIES["B"], w.DELIVERIES["d2"])}))
    assert dm._colliding_id("retired", "A", "R2", "s1", "T1", state) == w.DELIVERIES["d1"]
    assert dm._colliding_id("taken", "A", "R2", "s1", "T1", state) == w.DELIVERIES["d2"]
    # The live row's own identity is not a collision; with none, the producer's fresh id.
    assert dm._colliding_id("taken", "A", "R1", "s1", "T1", state) == w.delivery_id(w.FRESH, "R1", "s1", "T1")
    assert dm._colliding_id("retired", "B", "R2", "s2", "T1", state) == w.DELIVERIES["d2"]


def test_a_cause_forgery_keeps_or_changes_the_kind_as_named() -> None:
    binding = w.binding("A", "W1", "R1", "s1", "T1", "D1", "M1", "schedule:S1")
    same = dm._forge_binding(binding, "cause")
    other = dm._forge_binding(binding, "cause-kind")
    assert same.cause.kind == "schedule" and same.cause != binding.cause
    assert other.cause.kind != "schedule"


def test_step_ids_probe_the_value_rules() -> None:
    """Each odd step id is valid by the spec's rules, and probes one of them."""
    from leaseproof.model.binding import STEP_ID_MAX_CHARS, require_step_id

    for name in ("long", "padded", "tabbed", "nbsp", "wide", "astral"):
        require_step_id("step_id", w.STEPS[name])  # valid: never refused at construction
    assert len(w.STEPS["astral"]) == STEP_ID_MAX_CHARS < len(w.STEPS["astral"].encode("utf-16-le")) // 2
    assert len(w.STEPS["wide"].encode()) == 2 * STEP_ID_MAX_CHARS
    assert w.STEPS["nbsp"].strip() == "" and w.STEPS["nbsp"].strip(" \t\n\r\f\v") != ""


def test_tenant_actions_may_land_where_a_lease_is_held(adapter: PostgresDeliveryAdapter) -> None:
    """ "holding": the community of the standing claim whose deadline comes first."""
    machine = dm.machine_for(adapter)()
    machine.setup()
    machine.claim(community="B", agent="recipient", delivery=None, expected=None, seconds=5)
    machine.claim(community="A", agent="recipient", delivery=None, expected=None, seconds=30)
    machine.tenant(community=dm.HOLDING, action="fence")
    assert machine.model.communities[w.COMMUNITIES["B"]] is m.CommunityState.FENCED
    assert machine.model.communities[w.COMMUNITIES["A"]] is m.CommunityState.ACTIVE


def test_a_commit_may_name_an_identity_one_field_from_a_live_delivery(adapter: PostgresDeliveryAdapter) -> None:
    machine = dm.machine_for(adapter)()
    machine.setup()
    recipient = ("fresh", "T1", "M1", "D1", "event:E1")
    for beside, run, step in (("step", "R2", "s2"), ("run", "R2", "s2"), ("target", "R2", "s2")):
        newest = max(
            (d for key, d in machine.model.deliveries.items() if key[0] == w.COMMUNITIES["A"]),
            key=lambda d: (d.created_at, d.id),
        ).binding
        machine.commit(community="A", run=run, step=step, recipients=[recipient], wrong_workflow=False, beside=beside)
        command = machine.commands[-1]
        assert isinstance(command, m.CommitDeliveries)
        (delivery,) = command.deliveries
        expected = {
            "step": (newest.run_id, w.STEPS["s2"], newest.target_pubkey),
            "run": (w.RUNS["R2"], newest.step_id, newest.target_pubkey),
            "target": (newest.run_id, newest.step_id, w.TARGETS["T1"]),
        }[beside]
        assert (command.run_id, command.step_id, delivery.binding.target_pubkey) == expected, beside


def test_the_fleet_takes_the_oldest_pending_delivery_of_an_active_community(adapter: PostgresDeliveryAdapter) -> None:
    machine = dm.machine_for(adapter)()
    machine.setup()
    machine.tenant(community="A", action="fence")
    machine.claim_next()
    claim = machine.commands[-1]
    assert isinstance(claim, m.Claim) and claim.community_id == w.COMMUNITIES["B"]  # A is fenced
    taken = machine.model.deliveries[(claim.community_id, machine.issued[-1].delivery_id)]
    oldest = min(
        (d for key, d in machine.model.deliveries.items() if key[0] == w.COMMUNITIES["B"]),
        key=lambda d: (d.created_at, d.id),
    )
    assert taken.id == oldest.id and claim.target_pubkey == taken.binding.target_pubkey
    assert taken.status is m.Status.CLAIMED and claim.expected is None and claim.delivery_id is None
    machine.claim_next()  # B's second pending delivery
    sent = len(machine.commands)
    machine.claim_next()  # nothing pending in an active community: nothing sent
    assert len(machine.commands) == sent


def test_a_former_holder_acts_after_its_lease_stopped_holding(adapter: PostgresDeliveryAdapter) -> None:
    """ "former": the holder last issued a lease that no longer holds (settled here)."""
    machine = dm.machine_for(adapter)()
    machine.setup()
    assert not machine._holders()
    machine.claim_next()
    first = machine.issued[-1]
    machine.holder_finishes(which="oldest", forgery="held", outcome="finished")
    assert machine._holders()  # none stands, but a former holder remains
    machine.holder_finishes(which="former", forgery="older-generation", outcome="failed")
    finish = machine.commands[-1]
    assert isinstance(finish, m.Finish) and finish.lease.delivery_id == first.delivery_id
    assert finish.lease.lease_generation == first.lease_generation - 1


def test_a_woken_claim_always_presents_a_binding(adapter: PostgresDeliveryAdapter) -> None:
    machine = dm.machine_for(adapter)()
    machine.setup()
    for how in dm.WOKEN:  # the exact binding, and each single-field forgery
        machine.claim_woken(community="B", agent="recipient", delivery=None, expected=how, seconds=30)
        claim = machine.commands[-1]
        assert isinstance(claim, m.Claim) and claim.expected is not None, how
    assert "exact" in dm.WOKEN and None not in dm.WOKEN


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_the_woken_claims_bindings_are_never_absent(data: st.DataObject) -> None:
    assert data.draw(dm.woken_bindings) in dm.WOKEN


def test_verify_draws_every_program_afresh(pg_server: Server) -> None:
    """Without Hypothesis's mutator, which follows each program with copies of
    it, a seed's programs are nearly all distinct (about 190 of 300 were)."""
    with independent_programs() as hooked:
        assert hooked  # the installed Hypothesis has the hook this relies on
    programs: list[list[Any]] = []
    verdict = run_conformance(
        _Model(), Run(max_examples=100, seed=1, scenarios=False, on_example=lambda c: programs.append(c.last_commands))
    )
    assert verdict.conforms, verdict.failure
    distinct = {tuple(map(repr, program)) for program in programs}
    assert len(distinct) >= 90, len(distinct)


class _Model:
    """The delivery model as the adapter: it conforms by construction, and needs no database."""

    name = "the delivery model"

    def reset(self, start: Any) -> None:
        self.state = m.initial_state(start)

    def execute(self, command: Any) -> Any:
        self.state, outcome = m.step(self.state, command)
        return outcome

    def snapshot(self) -> Any:
        return self.state

    def close(self) -> None:
        pass


# -- programs already sent ---------------------------------------------------------------


class _Recording(PostgresDeliveryAdapter):
    """The bundled adapter, noting the commands sent after each reset."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.sent: list[list[object]] = []

    def reset(self, start):  # type: ignore[no-untyped-def]
        self.sent.append([])
        return super().reset(start)

    def execute(self, command):  # type: ignore[no-untyped-def]
        self.sent[-1].append(command)
        return super().execute(command)


def test_a_program_that_repeats_one_already_sent_is_not_sent_again(delivery_dsn: str) -> None:
    adapter = _Recording(delivery_dsn)
    try:
        verdict = run_conformance(adapter, Run(max_examples=40, seed=1, scenarios=False))
    finally:
        adapter.close()
    assert verdict.conforms, verdict.failure
    coverage, sent = verdict.coverage, [tuple(program) for program in adapter.sent]
    assert coverage.generated >= 40 and len(sent) == coverage.examples
    assert coverage.examples < coverage.generated  # Hypothesis does repeat programs (2 of 40 on seed 1)
    assert len(set(sent)) == len(sent)  # each program sent once
    # and none sent that only repeats a prefix of one sent before it
    for i, program in enumerate(sent):
        assert not any(earlier[: len(program)] == program for earlier in sent[:i]), i
    assert coverage.steps == sum(map(len, sent))


def test_a_program_that_leaves_one_sent_before_is_sent_from_a_reset(delivery_dsn: str) -> None:
    """The steps it shares with an earlier program are held, then sent after the
    reset with the step that leaves it, and every one of them checked."""
    adapter = _Recording(delivery_dsn)
    machine = dm.machine_for(adapter)
    try:
        first = machine()
        first.setup()
        first.tenant(community="A", action="fence")
        first.teardown()  # it passed: only now is it one of the programs sent
        second = machine()
        second.setup()
        assert len(adapter.sent) == 1  # the set-up repeats the first program's: held
        second.tenant(community="A", action="quiesce")
    finally:
        adapter.close()
    assert len(adapter.sent) == 2 and adapter.sent[1][:-1] == adapter.sent[0][:-1]
    assert adapter.sent[1][-1] == m.SetCommunityState(w.COMMUNITIES["A"], m.CommunityState.QUIESCING)


class _WrongOnFence(_Recording):
    """Answers a fence with an outcome a fence never has: a program that fences fails."""

    def execute(self, command: m.Command) -> m.Outcome:
        outcome = super().execute(command)  # type: ignore[no-untyped-call]  # _Recording's is untyped
        if isinstance(command, m.SetCommunityState) and command.state == m.CommunityState.FENCED:
            return m.Committed(created=(), identity_existed=False)  # not what a fence answers
        return outcome


def test_a_program_that_failed_is_not_one_sent_before(delivery_dsn: str) -> None:
    """A program the implementation failed does not join the programs sent: its repeat
    (as a shrink tries it) is sent again, and fails again, at the program's end."""
    adapter = _WrongOnFence(delivery_dsn)
    machine = dm.machine_for(adapter)
    try:
        for _ in range(2):
            program = machine()
            program.setup()
            program.tenant(community="A", action="fence")  # the model's outcome: no failure yet
            with pytest.raises(NonConformance, match="outcome mismatch"):
                program.teardown()
    finally:
        adapter.close()
    assert len(adapter.sent) == 2 and adapter.sent[0] == adapter.sent[1]
    assert machine.programs == {}


# -- shrinking -------------------------------------------------------------------------


def test_shrinking_stops_at_its_attempt_budget_and_says_so(delivery_dsn: str) -> None:
    adapter = by_name(MUTANTS, "reconcile-unfenced").adapter(delivery_dsn)
    try:
        verdict = run_conformance(
            adapter, Run(max_examples=300, seed=3, scenarios=False, shrink_bound=ShrinkBound(attempts=5))
        )
    finally:
        adapter.close()
    assert not verdict.conforms
    assert verdict.shrink_stopped.startswith("after 5 attempts, its budget")
    attempts = verdict.coverage.generated - verdict.coverage.failed_at
    assert attempts <= 5 + 2  # and the final replay, and the one in flight
    assert "state.teardown()" in verdict.counterexample


def test_shrinking_stops_at_its_time_bound_and_says_the_program_may_differ(delivery_dsn: str) -> None:
    adapter = by_name(MUTANTS, "claim-newest-first").adapter(delivery_dsn)  # found by the search at once
    try:
        verdict = run_conformance(
            adapter, Run(max_examples=300, seed=3, scenarios=False, shrink_bound=ShrinkBound(seconds=1e-9))
        )
    finally:
        adapter.close()
    assert "time bound" in verdict.shrink_stopped and "rerun may print another program" in verdict.shrink_stopped
    assert "state.teardown()" in verdict.counterexample
    # It stopped where it said: the engine ran one program past the failure (the
    # failing one again, as its shrinking begins), not a shrink that went on.
    assert verdict.coverage.generated - verdict.coverage.failed_at <= 2, verdict.coverage


def _counterexample(mutant: str, seed: int, server: Server) -> str:
    command = [sys.executable, "-m", "leaseproof.conformance.frontends.cli", "verify", "--mutant", mutant]
    command += ["--dsn", server.dsn]
    command += ["--no-scenarios", "--seed", str(seed), "--trace-out", os.devnull]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    return run.stdout[run.stdout.index("minimal counterexample") : run.stdout.index("trace:")]


def test_the_same_seed_prints_the_same_counterexample_in_two_processes(pg_server: Server) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two processes at once, each on its own database
        first, second = pool.map(lambda _: _counterexample("claim-scope-unchecked", 4, pg_server), range(2))
    assert first == second
    assert len(re.findall(r"^  state\.", first, re.MULTILINE)) >= 3  # shrunk, but a program


# -- reports ---------------------------------------------------------------------------


def test_a_mismatch_report_shows_the_clock_and_the_rows_in_claim_order_with_their_ids(delivery_dsn: str) -> None:
    adapter = by_name(MUTANTS, "claim-newest-first").adapter(delivery_dsn)
    try:
        verdict = run_conformance(adapter, Run(max_examples=1, seed=2))
    finally:
        adapter.close()
    failure = verdict.failure
    assert "clock at the step: T+" in failure
    assert "rows the step touched, oldest first by (created_at, id):" in failure
    ids = re.findall(r"\(id ([0-9a-f-]{36})\)", failure)
    assert len(ids) >= 2 and ids == sorted(ids)  # same instant: the id decides, and is shown
    for label in ("before:", "model after:", "implementation:"):
        assert label in failure


def test_the_programs_remembered_are_bounded(delivery_dsn: str) -> None:
    """Past its bound the trie stops growing; programs are still sent and checked."""
    adapter = _Recording(delivery_dsn)
    machine = dm.machine_for(adapter)
    machine.steps_remembered = 3
    try:
        for action in ("fence", "quiesce", "quiesce"):
            program = machine()
            program.setup()
            program.tenant(community="A", action=action)
            program.tenant(community="B", action="fence")
            program.teardown()  # it passed: its steps join the trie, up to the bound
    finally:
        adapter.close()

    def steps(trie: dict[Any, Any]) -> int:
        return sum(1 + steps(child) for child in trie.values())

    assert steps(machine.programs) == machine.remembered[0] == 3  # set-up, fence A, fence B; then full
    # the third program repeats the second, whose steps past the set-up came after the
    # trie was full: it is sent again (a repeat of the first would not be)
    assert len(adapter.sent) == 3 and adapter.sent[2] == adapter.sent[1] != adapter.sent[0]


def test_a_seed_draws_the_same_programs_whatever_modules_are_loaded(
    pg_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hypothesis draws some values from the constants of the "local" modules loaded
    so far (outside site-packages: an editable install's own, a conftest a test
    wrote), a pool that grows as modules load. verify turns that off: with no
    such constants and with many, one seed sends the same programs."""
    with without_local_constants() as hooked:
        assert hooked  # the installed Hypothesis has the hook this relies on
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    def programs() -> list[str]:
        sent: list[list[Any]] = []  # each program's commands, filled as it runs
        verdict = run_conformance(
            _Model(), Run(max_examples=40, seed=5, scenarios=False, on_example=lambda c: sent.append(c.last_commands))
        )
        assert verdict.conforms, verdict.failure
        return [repr(commands) for commands in sent]

    drawn = []
    for pool in (Constants(), Constants(integers=set(range(-5, 400)), strings={"A", "T1", "s1", " "})):
        monkeypatch.setattr(providers, "_get_local_constants", lambda pool=pool: pool)
        providers.CONSTANTS_CACHE.cache.clear()
        drawn.append(programs())
    providers.CONSTANTS_CACHE.cache.clear()
    assert drawn[0] == drawn[1]
