"""Fixed programs that run before the randomized search.

Each scenario is a short, named program in the conformance machine's own
rules: the exact interleavings the seeds' reviews found, and the corners a
random search reaches only rarely. Together they reach every outcome
variant and row transition of the model, so `verify` always exercises the
whole spec, whatever the random search then adds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis.stateful import MultipleResults

from leaseproof.conformance.boundary.protocols import takes_request_keys
from leaseproof.conformance.lockstep.delivery import DeliveryConformance
from leaseproof.model import delivery as m

Scenario = Callable[[DeliveryConformance], None]


def _lease(result: object) -> m.Lease:
    if isinstance(result, MultipleResults) or not isinstance(result, m.Lease):
        raise AssertionError(f"the scenario expected a claim to succeed, got {result!r}")
    return result


def stale_holder_finishes_after_newer_holder(s: DeliveryConformance) -> None:
    """Finding 1: gen-1 expires, is reaped, gen-2 claims and finishes; gen-1's
    finish (same or conflicting outcome) is LeaseLost, not AlreadyTerminal."""
    stale = _lease(s.claim("A", "recipient", None, None, 5))
    s.advance_clock("past-deadline")
    s.reap()
    newer = _lease(s.claim("A", "recipient", None, "exact", 30))
    s.finish(newer, "held", "failed")
    s.finish(stale, "held", "failed")
    s.finish(stale, "held", "finished")
    s.finish(newer, "held", "finished")  # the real holder's retry: AlreadyTerminal(failed)


def stale_holder_acts_while_newer_holds(s: DeliveryConformance) -> None:
    """A reaped holder renews and finishes while a newer holder of the same target
    holds a live lease: both LeaseLost, and the newer lease is untouched (a renew or
    a finish fenced by the holder's identity, not its generation, takes it over:
    procrastinate #1518's class)."""
    stale = _lease(s.claim("A", "recipient", None, None, 5))
    s.advance_clock("past-deadline")
    s.reap()
    newer = _lease(s.claim("A", "recipient", None, None, 30))
    s.renew(stale, "held", 30)
    s.finish(stale, "held", "finished")
    s.finish(newer, "held", "failed")


def expired_lease_behind_live_ones(s: DeliveryConformance) -> None:
    """Four claims of one target: the three oldest live, the youngest expired; a sweep
    reaps the youngest (one that picks its batch of claims before it filters out the
    live ones leaves it behind them, for as long as they stay live)."""
    s.commit("A", "R2", "s1", [("fresh", "T1", "M1", "D1", "event:E1")], False)
    s.commit("A", "R3", "s1", [("fresh", "T1", "M1", "D1", "event:E1")], False)
    s.commit("A", "R2", "s2", [("fresh", "T1", "M1", "D1", "event:E1")], False)
    older = [_lease(s.claim("A", "T1", None, None, 30)) for _ in range(3)]
    s.advance_clock("5s")
    youngest = _lease(s.claim("A", "T1", None, None, 5))
    s.advance_clock("past-deadline")  # the youngest's deadline comes first
    s.reap()
    s.finish(youngest, "held", "finished")
    for lease in older:
        s.finish(lease, "held", "finished")


def expired_holder_before_the_reaper(s: DeliveryConformance) -> None:
    """Finding 2: at its deadline a holder may still renew; one microsecond
    later it can neither renew nor finish, although nothing reaped it."""
    lease = _lease(s.claim("B", "T1", None, None, 5))
    s.advance_clock("deadline")
    s.reap()  # a lease at its exact deadline is not yet expired
    s.renew(lease, "held", 5)
    s.advance_clock("past-deadline")
    s.renew(lease, "held", 30)
    s.finish(lease, "held", "finished")
    s.reap()
    s.finish(lease, "held", "finished")


def foreign_expected_binding(s: DeliveryConformance) -> None:
    """Finding 3: an expected binding from another community or for another
    target is a miss, even when every other field matches a row."""
    for forgery in ("community", "target", "workflow", "run", "step", "definition", "message", "cause", "cause-kind"):
        s.claim("A", "recipient", None, forgery, 30)
    s.claim("A", "recipient", None, "exact", 30)


def rebuilt_lease_with_foreign_target(s: DeliveryConformance) -> None:
    """Finding 4: a lease rebuilt with the right id and generation but
    another target can neither renew, settle, nor be told the terminal."""
    lease = _lease(s.claim("A", "T1", None, None, 30))
    s.renew(lease, "foreign-target", 30)
    s.finish(lease, "foreign-target", "failed")
    s.finish(lease, "held", "finished")
    s.finish(lease, "held", "failed")  # the holder's retry: AlreadyTerminal(finished)
    s.finish(lease, "foreign-target", "finished")
    s.finish(lease, "newer-generation", "finished")
    s.finish(lease, "foreign-community", "finished")  # same delivery id, community B


def fenced_tenant(s: DeliveryConformance) -> None:
    """A fenced tenant refuses every write and the sweep skips it, while the
    healthy tenant is reaped in the same statement; deletion purges it."""
    held_b = _lease(s.claim("B", "T2", None, None, 1))
    held_a = _lease(s.claim("A", "T2", None, None, 1))
    s.advance_clock("5s")
    s.tenant("B", "fence")
    s.reap()
    s.claim("B", "T1", None, None, 30)
    s.commit("B", "R2", "s2", [("fresh", "T1", "M2", "D2", "webhook:H1")], False)
    s.renew(held_b, "held", 30)
    s.finish(held_b, "held", "finished")
    s.finish(held_a, "held", "finished")
    for action in ("create W2", "delete W1", "create R4", "delete R1", "create M3", "delete M1"):
        s.tenant("B", action)
    s.tenant("B", "quiesce")
    s.tenant("B", "delete R1")
    s.tenant("B", "delete")
    s.tenant("B", "activate")
    s.tenant("B", "delete")
    s.finish(held_b, "foreign-community", "finished")  # B -> Z: never created
    s.renew(held_b, "foreign-community", 30)
    s.claim("Z", "T1", None, None, 30)
    s.commit("Z", "R1", "s1", [("fresh", "T1", "M1", "D1", "event:E1")], False)
    for action in ("activate", "delete", "create W1", "delete W1", "create R1", "delete R1", "create M1", "delete M1"):
        s.tenant("Z", action)
    s.tenant("Z", "create")
    s.tenant("Z", "create")


def commits_and_cascades(s: DeliveryConformance) -> None:
    """Atomic steps, producer retries, reported identities, and the cascades
    that remove pending, claimed and terminal rows alike."""
    s.commit("A", "R2", "s1", [("fresh", "T1", "M1", "D1", "schedule:S1"), ("d1", "T2", "M2", "D2", "event:E2")], False)
    s.commit("A", "R2", "s1", [("fresh", "T1", "M1", "D1", "schedule:S1"), ("d2", "T2", "M2", "D2", "event:E2")], False)
    s.commit("A", "R3", "s1", [("fresh", "T1", "M1", "D1", "event:E1"), ("d1", "T2", "M1", "D1", "event:E1")], False)
    s.commit("A", "R3", "s1", [("fresh", "T1", "M3", "D1", "event:E1")], False)
    s.commit("A", "R4", "s1", [("fresh", "T1", "M1", "D1", "event:E1")], False)
    s.commit("A", "R3", "long", [("fresh", "T1", "M1", "D1", "event:E1")], True)
    s.tenant("A", "get d1")
    s.tenant("A", "get d2")
    done = _lease(s.claim("A", "T2", None, None, 30))
    s.finish(done, "held", "finished")
    failed = _lease(s.claim("A", "T1", None, None, 30))
    s.finish(failed, "held", "failed")
    s.claim("A", "T2", "d1", "exact", 30)
    s.tenant("A", "delete R1")
    s.tenant("A", "delete R1")
    s.tenant("A", "delete M2")
    s.tenant("A", "delete M2")
    s.tenant("A", "create M2")
    s.tenant("A", "create M2")
    s.tenant("A", "delete W1")
    s.tenant("A", "delete W1")
    s.tenant("A", "create R1")
    s.tenant("A", "create W1")
    s.tenant("A", "create W1")
    s.tenant("A", "create R1")
    s.tenant("A", "create R1")


def recreated_run_does_not_reuse_delivery_ids(s: DeliveryConformance) -> None:
    """Generations restart with each row, so a deleted delivery's id is
    retired: recreating its run and recommitting the step under the same id
    is refused, and the old lease governs nothing."""
    old = _lease(s.claim("A", "T1", None, None, 30))
    s.tenant("A", "delete R1")
    s.tenant("A", "create R1")
    s.commit("A", "R1", "s1", [("fresh", "T1", "M1", "D1", "event:E1")], False)
    s.commit("A", "R1", "s1", [("d1", "T1", "M1", "D1", "event:E1")], False)
    s.renew(old, "held", 30)
    s.finish(old, "held", "finished")


def claim_sent_again_with_its_request_key(s: DeliveryConformance) -> None:
    """A claim whose answer was lost, sent again with its request key, returns the
    same lease while it is held (not the next delivery); once it has expired, the
    same key claims anew; a finish clears the key."""
    if not takes_request_keys(s.adapter):
        return  # an adapter of protocol 2 or older has no request keys
    first = _lease(s.claim_keyed("A", "claim-1", "at the deadline", 5))  # still held there: the same lease
    s.claim_keyed("A", "claim-1", "at once", 5)
    s.advance_clock("past-deadline")
    s.claim_keyed("A", "claim-1", "no", 30)  # expired (not yet reaped): a new claim
    s.reap()
    s.finish(first, "held", "finished")  # the first holder lost it
    s.claim_keyed("A", "claim-1", "past the deadline", 30)


SCENARIOS: tuple[Scenario, ...] = (
    stale_holder_finishes_after_newer_holder,
    stale_holder_acts_while_newer_holds,
    expired_lease_behind_live_ones,
    expired_holder_before_the_reaper,
    foreign_expected_binding,
    rebuilt_lease_with_foreign_target,
    fenced_tenant,
    commits_and_cascades,
    recreated_run_does_not_reuse_delivery_ids,
    claim_sent_again_with_its_request_key,
)


def run_scenarios(machine: type[Any], scenarios: tuple[Callable[[Any], None], ...] = SCENARIOS) -> None:
    """Run every scenario on a fresh machine; the first failure propagates,
    annotated with the scenario's name."""
    coverage = machine.coverage
    examples, generated = coverage.examples, coverage.generated
    for scenario in scenarios:
        coverage.scenario = scenario.__name__
        state = machine()
        try:
            state.setup()
            scenario(state)
            state.settle()  # the implementation's failure, if any, is this scenario's
        except BaseException as exc:
            exc.add_note(f"in the fixed scenario {scenario.__name__}: {scenario.__doc__}")
            coverage.first_failure = 0  # 0: a fixed scenario, not a generated example
            raise
        finally:
            state.teardown()
            coverage.scenarios += 1
            coverage.examples, coverage.generated = examples, generated
            coverage.scenario = ""
