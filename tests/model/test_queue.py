"""The lease-queue profile judges each act: every guarantee it names is reported when an act or a
row breaks it, and only then (each case both ways)."""

from __future__ import annotations

import datetime as dt

import pytest

from leaseproof.model.frozenmap import FrozenMap
from leaseproof.model.queue import (
    MEANING,
    NEEDS,
    Advance,
    Answer,
    Capability,
    Complete,
    Enqueue,
    Fetch,
    Guarantee,
    Heartbeat,
    QueueState,
    Rescue,
    Seen,
    applicable,
    holder,
    initial,
    judge,
    needs,
    reference_answer,
)

START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
LEASE = 30


def rows(**statuses: str | None) -> FrozenMap[str, Seen]:
    return FrozenMap((job, Seen(status)) for job, status in statuses.items())


def follow(*acts: tuple[object, Answer, FrozenMap[str, Seen]], deadline: bool = True) -> QueueState:
    """The state after acts that break nothing (asserted)."""
    s = initial(START, LEASE)
    for act, answer, seen in acts:
        s, found, unexplained = judge(s, act, answer, seen, deadline)  # type: ignore[arg-type]
        assert (found, unexplained) == ([], []), (act, found, unexplained)
    return s


def claimed() -> QueueState:
    """j1 enqueued and fetched (attempt 1), its lease until START + 30s."""
    return follow(
        (Enqueue("j1"), Answer.REFUSED, rows(j1="pending")), (Fetch("j1"), Answer.REFUSED, rows(j1="claimed"))
    )


def broken(s: QueueState, act: object, answer: Answer, seen: FrozenMap[str, Seen], deadline: bool = True) -> set[str]:
    _, found, _ = judge(s, act, answer, seen, deadline)  # type: ignore[arg-type]
    return {v.guarantee.value for v in found}


def test_every_guarantee_has_a_meaning_and_its_needs() -> None:
    assert set(MEANING) == set(Guarantee) == set(NEEDS)
    assert needs(Guarantee.NO_STALE_HEARTBEAT) == "heartbeat and rescue or heartbeat and takeover"
    assert needs(Guarantee.TERMINAL_ONCE) == "nothing"
    assert applicable(Guarantee.NO_STALE_COMPLETION, frozenset({Capability.TAKEOVER}))
    assert not applicable(Guarantee.EXPIRED_CANNOT_RENEW, frozenset({Capability.HEARTBEAT}))


def test_a_holder_is_live_then_expired_then_stale_and_without_a_deadline_live_until_taken() -> None:
    s = claimed()
    assert holder(s, "j1", 1) == "live"
    s = follow((Enqueue("j1"), Answer.REFUSED, rows(j1="pending")), (Fetch("j1"), Answer.REFUSED, rows(j1="claimed")),
               (Advance(LEASE), Answer.REFUSED, rows(j1="claimed")))  # fmt: skip
    assert holder(s, "j1", 1) == "live"  # at its deadline: still live
    s = follow((Enqueue("j1"), Answer.REFUSED, rows(j1="pending")), (Fetch("j1"), Answer.REFUSED, rows(j1="claimed")),
               (Advance(LEASE + 1), Answer.REFUSED, rows(j1="claimed")))  # fmt: skip
    assert holder(s, "j1", 1) == "expired"
    assert holder(s, "j1", 1, deadline=False) == "live"
    assert reference_answer(s, Complete("j1", 1, "finished")) is Answer.REFUSED
    assert reference_answer(s, Complete("j1", 1, "finished"), deadline=False) is Answer.APPLIED
    s, _, _ = judge(s, Rescue(), Answer.REFUSED, rows(j1="pending"))
    assert holder(s, "j1", 1) == "stale"


def test_a_fetch_of_a_live_lease_is_a_double_claim_and_of_an_expired_one_a_takeover() -> None:
    assert broken(claimed(), Fetch("j1"), Answer.REFUSED, rows(j1="claimed")) == {"no-double-claim"}
    expired, _, _ = judge(claimed(), Advance(LEASE + 1), Answer.REFUSED, rows(j1="claimed"))
    after, found, _ = judge(expired, Fetch("j1"), Answer.REFUSED, rows(j1="claimed"))
    assert found == [] and holder(after, "j1", 1) == "stale" and holder(after, "j1", 2) == "live"
    assert broken(claimed(), Fetch("j9"), Answer.REFUSED, rows(j1="claimed", j9="claimed")) == {"no-double-claim"}


def test_a_stale_holder_credited_or_applied_breaks_no_stale_completion_and_refused_does_not() -> None:
    expired, _, _ = judge(claimed(), Advance(LEASE + 1), Answer.REFUSED, rows(j1="claimed"))
    rescued, _, _ = judge(expired, Rescue(), Answer.REFUSED, rows(j1="pending"))
    again, _, _ = judge(rescued, Fetch("j1"), Answer.REFUSED, rows(j1="claimed"))
    stale = Complete("j1", 1, "finished")
    assert broken(again, stale, Answer.APPLIED, rows(j1="finished")) >= {"no-stale-completion"}
    assert broken(again, stale, Answer.CREDITED, rows(j1="claimed")) == {"no-stale-completion"}
    assert broken(again, stale, Answer.REFUSED, rows(j1="claimed")) == set()
    assert broken(again, Heartbeat("j1", 1), Answer.APPLIED, rows(j1="claimed")) == {"no-stale-heartbeat"}
    assert broken(again, Heartbeat("j1", 1), Answer.REFUSED, rows(j1="claimed")) == set()
    assert broken(again, Complete("j1", 2, "failed"), Answer.APPLIED, rows(j1="failed")) == set()


def test_an_expired_holder_may_not_act_unless_the_queue_has_no_deadline() -> None:
    expired, _, _ = judge(claimed(), Advance(LEASE + 1), Answer.REFUSED, rows(j1="claimed"))
    assert broken(expired, Heartbeat("j1", 1), Answer.APPLIED, rows(j1="claimed")) == {"expired-cannot-renew"}
    assert broken(expired, Complete("j1", 1, "finished"), Answer.APPLIED, rows(j1="finished")) == {
        "expired-cannot-complete"
    }
    assert broken(expired, Complete("j1", 1, "finished"), Answer.REFUSED, rows(j1="claimed")) == set()
    assert broken(expired, Complete("j1", 1, "finished"), Answer.APPLIED, rows(j1="finished"), deadline=False) == set()


def test_a_live_holder_must_be_served() -> None:
    assert broken(claimed(), Heartbeat("j1", 1), Answer.REFUSED, rows(j1="claimed")) == {"live-holder-served"}
    assert broken(claimed(), Complete("j1", 1, "failed"), Answer.CREDITED, rows(j1="claimed")) == {"live-holder-served"}
    assert broken(claimed(), Complete("j1", 1, "failed"), Answer.APPLIED, rows(j1="failed")) == set()


def test_a_terminal_job_never_changes_and_a_repeated_completion_may_only_be_a_no_op() -> None:
    done, _, _ = judge(claimed(), Complete("j1", 1, "finished"), Answer.APPLIED, rows(j1="finished"))
    assert broken(done, Complete("j1", 1, "failed"), Answer.APPLIED, rows(j1="failed")) == {"terminal-once"}
    assert broken(done, Complete("j1", 1, "failed"), Answer.CREDITED, rows(j1="finished")) == set()
    assert broken(done, Complete("j1", 1, "finished"), Answer.REFUSED, rows(j1="finished")) == set()
    assert broken(done, Rescue(), Answer.REFUSED, rows(j1="pending")) == {"terminal-once"}
    assert broken(done, Fetch("j1"), Answer.REFUSED, rows(j1="claimed")) == {"terminal-once"}


def test_a_rescue_takes_every_expired_lease_and_no_live_one() -> None:
    two = follow(
        (Enqueue("j1"), Answer.REFUSED, rows(j1="pending")),
        (Enqueue("j2"), Answer.REFUSED, rows(j1="pending", j2="pending")),
        (Fetch("j1"), Answer.REFUSED, rows(j1="claimed", j2="pending")),
        (Advance(LEASE // 2), Answer.REFUSED, rows(j1="claimed", j2="pending")),
        (Fetch("j2"), Answer.REFUSED, rows(j1="claimed", j2="claimed")),
        (Advance(LEASE // 2 + 1), Answer.REFUSED, rows(j1="claimed", j2="claimed")),
    )  # j1 expired, j2 live
    assert broken(two, Rescue(), Answer.REFUSED, rows(j1="pending", j2="claimed")) == set()
    assert broken(two, Rescue(), Answer.REFUSED, rows(j1="failed", j2="claimed")) == set()  # gave up on it
    assert broken(two, Rescue(), Answer.REFUSED, rows(j1="claimed", j2="claimed")) == {"rescue-takes-expired"}
    assert "rescue-only-expired" in broken(two, Rescue(), Answer.REFUSED, rows(j1="pending", j2="pending"))


def test_a_row_that_disappears_is_lost_and_one_nobody_explains_is_a_divergence() -> None:
    assert broken(claimed(), Advance(1), Answer.REFUSED, rows()) == {"nothing-lost"}
    _, found, unexplained = judge(claimed(), Advance(1), Answer.REFUSED, rows(j1="pending"))
    assert found == [] and [d.why for d in unexplained] == ["j1 should be claimed (attempt 1); its row says pending"]
    expired, _, _ = judge(claimed(), Advance(LEASE + 1), Answer.REFUSED, rows(j1="claimed"))
    after, found, unexplained = judge(expired, Advance(1), Answer.REFUSED, rows(j1="pending"))  # rescued by time
    assert (found, unexplained) == ([], []) and after.jobs["j1"].status == "pending"


def test_a_row_status_outside_the_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="status"):
        Seen("doing")


def test_a_queue_whose_lease_ends_at_its_expiry_instant_is_judged_by_that_convention() -> None:
    """At the instant a lease expires (`lease_until == now`) the profile holds it live, so a fetch
    that takes the job over then is a double claim; a queue that declares `ENDS_AT_EXPIRY` (its lease
    over at that instant, as pgmq's and absurd's are) is judged by its own boundary: the takeover is
    allowed, and a rescue must take the job."""
    at_expiry = (Advance(LEASE), Answer.REFUSED, rows(j1="claimed"))
    s = follow((Enqueue("j1"), Answer.REFUSED, rows(j1="pending")), (Fetch("j1"), Answer.REFUSED, rows(j1="claimed")),
               at_expiry)  # fmt: skip
    assert broken(s, Fetch("j1"), Answer.REFUSED, rows(j1="claimed")) == {"no-double-claim"}
    ends = initial(START, LEASE, ends_at_expiry=True)
    for act, answer, seen in ((Enqueue("j1"), Answer.REFUSED, rows(j1="pending")),
                              (Fetch("j1"), Answer.REFUSED, rows(j1="claimed")), at_expiry):  # fmt: skip
        ends, found, unexplained = judge(ends, act, answer, seen)
        assert (found, unexplained) == ([], [])
    assert holder(ends, "j1", 1) == "expired"
    assert broken(ends, Fetch("j1"), Answer.REFUSED, rows(j1="claimed")) == set()
    assert broken(ends, Rescue(), Answer.REFUSED, rows(j1="claimed")) == {"rescue-takes-expired"}
    assert broken(s, Rescue(), Answer.REFUSED, rows(j1="pending")) == {"rescue-only-expired"}
