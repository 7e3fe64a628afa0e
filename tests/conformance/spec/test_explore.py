"""The bounded exhaustive exploration of both models, and `leaseproof explore`.

The default bounds must reach every declared rule, outcome and transition of
each machine with no violation. Deliberately broken models (a decide wrapper
around the real one) must be caught, with the shortest path to the bug,
computed here by hand, and that path must make a trace that replays.
No database here.
"""

from __future__ import annotations

import datetime as dt
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from leaseproof.conformance.frontends import cli
from leaseproof.conformance.frontends.exits import EXIT_NONCONFORMING
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.spec import bounds as spec_bounds
from leaseproof.conformance.spec import explore as ex
from leaseproof.conformance.traces import trace
from leaseproof.model import delivery as dm
from leaseproof.model import lifecycle as lm
from leaseproof.model.rules import Decision

SMALL = spec_bounds.DeliveryBounds(communities=1, targets=1, clock_steps=2)  # every rule, in about 200 states


@pytest.fixture(scope="module")
def delivery() -> ex.Exploration:
    return ex.explore(ex.DELIVERY_EXPLORATION)


@pytest.fixture(scope="module")
def lifecycle() -> ex.Exploration:
    return ex.explore(ex.LIFECYCLE_EXPLORATION)


def _variants_reached(result: ex.Exploration) -> set[tuple[str, str]]:
    return {(operation, variant) for operation, _, variant in result.coverage}


@pytest.mark.parametrize("machine", ["delivery", "lifecycle"])
def test_the_default_bounds_reach_every_rule_and_break_no_invariant(
    machine: str, request: pytest.FixtureRequest
) -> None:
    result: ex.Exploration = request.getfixturevalue(machine)
    spec = ex.SPECS[machine]
    variants = dm.OUTCOME_VARIANTS if machine == "delivery" else lm.OUTCOME_VARIANTS
    assert result.holds, [(v.message, [spec.describe(c) for c in v.path]) for v in result.violations]
    assert result.never_reached == ()
    assert result.never_moved == ()
    assert {(op.__name__, v) for op, vs in variants.items() for v in vs} <= _variants_reached(result)
    declared = {(op.__name__, r.guard) for op, rules in spec.rules.items() for r in rules}
    assert {(op, guard) for op, guard, _ in result.coverage} == declared
    # Non-trivial: tens of thousands of states, a constraint that bites, long shortest paths.
    assert result.states > 25_000
    assert result.transitions > 10 * result.states
    assert 0 < result.unexpanded < result.states
    assert result.depth >= 15


def test_the_delivery_bounds_are_the_documented_world() -> None:
    bounds = ex.DELIVERY_EXPLORATION.bounds()  # what `explore` uses unless told otherwise
    assert bounds == spec_bounds.DeliveryBounds(
        communities=2, targets=2, deliveries=2, clock_steps=2, generation=3, lease_seconds=30
    )
    # A commits to and is claimed from by T1 and T2; B, its neighbour, by T1.
    alphabet = ex.delivery_commands(dm.initial_state(w.START), bounds)
    claims = {
        (w.name_of(c.community_id), w.name_of(c.target_pubkey))
        for c in alphabet
        if isinstance(c, dm.Claim) and c.delivery_id is None and c.expected is None
    }
    assert claims == {("A", "T1"), ("A", "T2"), ("B", "T1")}
    assert not any(isinstance(c, dm.Reap | dm.AdvanceClock) for c in alphabet)  # no lease is out yet


def test_the_search_is_deterministic_and_every_step_agrees() -> None:
    first = ex.explore(ex.DELIVERY_EXPLORATION, SMALL)
    again = ex.explore(ex.DELIVERY_EXPLORATION, SMALL, every_step=True)
    assert first.holds and again.holds
    assert first.never_reached == () and first.never_moved == ()
    for field in ("states", "transitions", "depth", "unexpanded", "coverage", "moves"):
        assert getattr(first, field) == getattr(again, field), field


def test_a_bound_out_of_range_is_refused() -> None:
    with pytest.raises(spec_bounds.BoundsError, match="--communities must be from 1 to 2, got 3"):
        spec_bounds.DeliveryBounds(communities=3)
    with pytest.raises(spec_bounds.BoundsError, match="--runs"):
        spec_bounds.LifecycleBounds(runs=0)


def test_the_clock_stops_at_its_bound() -> None:
    result = ex.explore(ex.DELIVERY_EXPLORATION, attrs.evolve(SMALL, clock_steps=1))
    # Two lease lengths are needed to expire a claim: with one, no reap ever returns a row.
    assert result.never_moved == (("claimed", "pending"),)
    assert result.coverage.get(("Reap", "sweep", "Reaped"), 0) > 0
    assert result.holds


# -- broken models ---------------------------------------------------------------


def _broken(spec: ex.ExplorationSpec, bug: Callable[[Any, Any, Decision[Any]], Decision[Any]]) -> ex.ExplorationSpec:
    """The spec with `bug(state, command, decision)` rewriting the real decision."""
    real = spec.decide

    def decide(state: Any, command: Any) -> Decision[Any]:
        return bug(state, command, real(state, command))

    return attrs.evolve(spec, decide=decide)


def _claim_keeps_the_generation(state: Any, command: Any, decision: Decision[Any]) -> Decision[Any]:
    if decision.rule.guard != "oldest-pending":
        return decision
    claimed = decision.outcome.delivery
    row = attrs.evolve(claimed, lease_generation=claimed.lease_generation - 1)
    lease = attrs.evolve(decision.outcome.lease, lease_generation=row.lease_generation)
    return Decision(decision.state.with_delivery(row), dm.Claimed(lease, row), decision.rule)


def _reap_keeps_the_generation(state: Any, command: Any, decision: Decision[Any]) -> Decision[Any]:
    if not isinstance(command, dm.Reap):
        return decision
    after = decision.state
    for key, row in after.deliveries.items():
        if state.deliveries[key] != row:
            after = after.with_delivery(attrs.evolve(row, lease_generation=row.lease_generation - 1))
    return Decision(after, decision.outcome, decision.rule)


def _workflow_publishes_an_event(state: Any, command: Any, decision: Decision[Any]) -> Decision[Any]:
    if not (isinstance(command, dm.CreateWorkflow) and decision.rule.guard == "new"):
        return decision
    published = attrs.evolve(decision.state, events=decision.state.events | {(command.community_id, w.MESSAGES["M1"])})
    return Decision(published, decision.outcome, decision.rule)


# Create A, W1, R1, M1; commit; claim. Then two lease lengths, and the sweep.
SETUP = ["CreateCommunity", "CreateWorkflow", "CreateRun", "PublishEvent", "CommitDeliveries"]


@pytest.mark.parametrize(
    ("bug", "kind", "path"),
    [
        (
            _claim_keeps_the_generation,
            "delivery <id> of community <id>: generation N impossible while claimed",
            [*SETUP, "Claim"],
        ),
        (
            _claim_keeps_the_generation,
            "Claim/oldest-pending: delivery <id> of community <id>: generation went N -> N on pending -> claimed",
            [*SETUP, "Claim"],
        ),
        (
            _reap_keeps_the_generation,
            "Reap/sweep: delivery <id> of community <id>: generation went N -> N on claimed -> pending",
            [*SETUP, "Claim", "AdvanceClock", "AdvanceClock", "Reap"],
        ),
        (
            _workflow_publishes_an_event,
            "CreateWorkflow/new: changed events, which its rule does not declare",
            ["CreateCommunity", "CreateWorkflow"],
        ),
    ],
)
def test_a_broken_delivery_model_is_caught_on_a_shortest_path(bug: Any, kind: str, path: list[str]) -> None:
    result = ex.explore(_broken(ex.DELIVERY_EXPLORATION, bug), SMALL)
    assert not result.holds
    found = {v.kind: v for v in result.violations}
    assert kind in found, sorted(found)
    assert [type(c).__name__ for c in found[kind].path] == path
    assert result.violations[0].path == min((v.path for v in result.violations), key=len)


def test_an_undeclared_transition_is_caught() -> None:
    """Finish that answers Settled but leaves the row pending-and-reclaimable would move claimed -> pending."""

    def finish_returns_to_pending(state: Any, command: Any, decision: Decision[Any]) -> Decision[Any]:
        if not (isinstance(command, dm.Finish) and decision.rule.guard == "held"):
            return decision
        row = state.deliveries[(command.lease.community_id, command.lease.delivery_id)]
        pending = attrs.evolve(row, status=dm.Status.PENDING, lease_until=None, claimed_at=None)
        return Decision(state.with_delivery(pending), decision.outcome, decision.rule)

    result = ex.explore(_broken(ex.DELIVERY_EXPLORATION, finish_returns_to_pending), SMALL)
    kinds = {v.kind: v for v in result.violations}
    kind = "Finish/held: delivery (A, RN/sN/TN) moved claimed -> pending, not a transition this rule makes"
    assert kind in kinds, sorted(kinds)
    assert [type(c).__name__ for c in kinds[kind].path] == [*SETUP, "Claim", "Finish"]


def test_a_command_declared_safe_to_resend_that_is_not_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared wrong on purpose: a claim's resend is not safe. The search finds it on a
    shortest path (here the resend misses: the one row is taken, and a claim's resend
    does not say it had claimed); with the model's own declarations it finds nothing
    (the default-bounds test above)."""
    monkeypatch.setitem(dm.RESENDS, dm.Claim, attrs.evolve(dm.RESENDS[dm.Claim], safe=True))
    result = ex.explore(ex.DELIVERY_EXPLORATION, SMALL)
    kinds = {v.kind: v for v in result.violations}
    claim = f"Claim/oldest-pending: a resend after Claimed answered ClaimMiss, not Claimed ({dm.RESENDS[dm.Claim].why})"
    assert claim in kinds and all(kind.startswith("Claim/oldest-pending: a resend") for kind in kinds), sorted(kinds)
    assert [type(c).__name__ for c in kinds[claim].path] == [*SETUP, "Claim"]


def _settled_twice() -> tuple[Any, Any, Any]:
    """The state after a Settled finish, the finish, and its outcome."""
    state = dm.initial_state(w.START)
    a, w1 = w.COMMUNITIES["A"], w.WORKFLOWS["W1"]
    for command in (
        dm.CreateCommunity(a),
        dm.CreateWorkflow(a, w1),
        dm.CreateRun(a, w1, w.RUNS["R1"]),
        dm.PublishEvent(a, w.MESSAGES["M1"]),
        ex._commit("A", "s1", [(w.FRESH, "T1")]),
    ):
        state, _ = dm.step(state, command)
    state, claimed = dm.step(state, dm.Claim(w.COMMUNITIES["A"], w.TARGETS["T1"], 30))
    finish = dm.Finish(claimed.lease, dm.Status.FINISHED)
    after, settled = dm.step(state, finish)
    assert settled == dm.Settled(dm.Status.FINISHED)
    return after, finish, settled


def test_a_finish_resend_must_say_the_terminal_it_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    after, finish, settled = _settled_twice()
    real = dm.decide

    def forgets(state: Any, command: Any) -> Decision[Any]:
        decision = real(state, command)
        if isinstance(command, dm.Finish) and decision.rule.guard == "same-holder-settled":
            return Decision(decision.state, dm.AlreadyTerminal(dm.Status.FAILED), decision.rule)
        return decision

    monkeypatch.setattr(dm, "decide", forgets)
    assert dm.resend_violations(after, finish, settled) == [
        "a resend after Settled(finished) answered AlreadyTerminal(failed), not AlreadyTerminal(finished) "
        f"({dm.RESENDS[dm.Finish].why})"
    ]


def test_a_model_that_raises_is_a_violation_with_its_path() -> None:
    def renew_crashes(state: Any, command: Any, decision: Decision[Any]) -> Decision[Any]:
        if isinstance(command, dm.Renew) and decision.rule.guard == "held":
            raise KeyError("lease")
        return decision

    result = ex.explore(_broken(ex.DELIVERY_EXPLORATION, renew_crashes), SMALL)
    [violation] = result.violations
    assert violation.message == "Renew: the model raised KeyError: 'lease'"
    assert [type(c).__name__ for c in violation.path] == [*SETUP, "Claim", "Renew"]


class ModelAdapter:
    """An adapter that is a model (the real one, or a broken decide): what `replay` drives."""

    def __init__(self, machine: str, decide: Any = None) -> None:
        self.spec = trace.SPECS[machine]
        self.decide = decide
        self.name = f"the {machine} model"

    def reset(self, start: dt.datetime) -> None:
        self.state = self.spec.initial_state(start)

    def execute(self, command: Any) -> Any:
        if self.decide is None:
            self.state, outcome = self.spec.step(self.state, command)
        else:
            decision = self.decide(self.state, command)
            self.state, outcome = decision.state, decision.outcome
        return outcome

    def snapshot(self) -> Any:
        return self.state

    def close(self) -> None:
        pass  # nothing held


def test_a_violation_writes_a_trace_that_replays(tmp_path: Path) -> None:
    broken = _broken(ex.DELIVERY_EXPLORATION, _claim_keeps_the_generation)
    result = ex.explore(broken, SMALL)
    violation = result.violations[0]
    path = tmp_path / "claim.jsonl"
    ex.write_counterexample(broken, violation, path)
    recorded = trace.read(path)
    assert recorded.machine == "delivery" and recorded.start == w.START
    assert [step.command for step in recorded.steps] == list(violation.path)
    assert trace.check(recorded) is None  # the real model's own account
    assert trace.replay(recorded, ModelAdapter("delivery")) is None
    # Replayed against the broken model, the trace diverges at its last step: the claim.
    divergence = trace.replay(recorded, ModelAdapter("delivery", broken.decide))
    assert divergence is not None and divergence.step == len(violation.path) == 6
    assert isinstance(divergence.command, dm.Claim)


def test_a_broken_lifecycle_model_is_caught_and_its_trace_replays(tmp_path: Path) -> None:
    """Resume ignores a later revision with the same content (the seed's identical re-save)."""
    resume = next(r for r in lm.RULES[lm.ResumeRun] if r.guard == "resume")

    def resume_any_revision(state: Any, command: Any, decision: Decision[Any]) -> Decision[Any]:
        if decision.rule.guard != "revised":
            return decision
        run = state.runs[command.run_id]
        executed = state.executed.set(run.run_id, state.executed[run.run_id] + run.record.actions)
        return Decision(attrs.evolve(state, executed=executed), lm.Resumed(run.record.actions), resume)

    broken = _broken(ex.LIFECYCLE_EXPLORATION, resume_any_revision)
    result = ex.explore(broken, spec_bounds.LifecycleBounds(runs=1, clock_steps=0))
    [violation] = result.violations
    assert violation.kind == "ResumeRun/resume: run N resumed a revision that is no longer current"
    # Create A; grant alice; save e1; load r1's cache; fire on r1; save e2 (e1's content again); resume.
    names = ["CreateCommunity", "SetAuthority", "SaveDefinition", "RefreshCache", "Fire", "SaveDefinition", "ResumeRun"]
    assert [type(c).__name__ for c in violation.path] == names
    assert "event_id=e2" in ex.describe_lifecycle(violation.path[5])
    path = tmp_path / "resume.jsonl"
    ex.write_counterexample(broken, violation, path)
    recorded = trace.read(path)
    assert recorded.machine == "lifecycle" and len(recorded.steps) == 7
    assert trace.replay(recorded, ModelAdapter("lifecycle")) is None
    divergence = trace.replay(recorded, ModelAdapter("lifecycle", broken.decide))
    assert divergence is not None and divergence.step == 7


# -- the command line ------------------------------------------------------------


def _explore(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseproof.conformance.frontends.cli", "explore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_explore_prints_the_summary_and_exits_0() -> None:
    run = _explore("--machine", "delivery", "--communities", "1", "--targets", "1", "--clock-steps", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "exploring the delivery machine within communities=1 targets=1 deliveries=2 clock-steps=2" in out
    assert "states: 268 distinct" in out and "transitions: " in out and "depth: " in out
    assert "  Finish             same-holder-settled    AlreadyTerminal(failed)" in out
    assert "never reached: none\n" in out
    assert "invariants: hold in every explored state\n" in out


def test_explore_with_a_bound_the_machine_has_not_exits_2() -> None:
    for args, message in (
        (["--communities", "3"], "--communities must be from 1 to 2, got 3"),
        (["--machine", "lifecycle", "--targets", "1"], "--targets is not a bound of the lifecycle machine"),
        (["--runs", "x"], "argument --runs: 'x' is not an integer"),
    ):
        run = _explore(*args)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        assert message in run.stderr
        assert "states:" not in run.stdout


def test_explore_exits_1_with_the_shortest_path_and_a_trace(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(ex.SPECS, "delivery", _broken(ex.DELIVERY_EXPLORATION, _workflow_publishes_an_event))
    out_file = tmp_path / "bug.jsonl"
    args = ["explore", "--machine", "delivery", "--communities", "1", "--targets", "1", "--trace-out", str(out_file)]
    assert cli.main(args) == EXIT_NONCONFORMING
    out = capsys.readouterr().out
    assert "invariants: VIOLATED" in out
    assert "1. CreateWorkflow/new: changed events, which its rule does not declare\n" in out
    assert "shortest path, 2 step(s):\n     1. CreateCommunity(community_id=A)\n     2. CreateWorkflow(" in out
    assert (
        f"trace: {out_file} (the first path above, 2 steps; run it on an implementation with: leaseproof replay" in out
    )
    assert [type(s.command).__name__ for s in trace.read(out_file).steps] == ["CreateCommunity", "CreateWorkflow"]
    # The command it prints to explore again meets the same violation (the trace's replay runs
    # the path on an implementation, which shows nothing of a broken model).
    (again,) = (line.removeprefix("explore again with: ") for line in out.splitlines() if "explore again" in line)
    assert again.startswith("leaseproof explore --machine delivery --communities 1 --targets 1 ")
    assert cli.main([*shlex.split(again)[1:], "--trace-out", str(tmp_path / "again.jsonl")]) == EXIT_NONCONFORMING
    assert "1. CreateWorkflow/new: changed events, which its rule does not declare\n" in capsys.readouterr().out
