"""The lease-queue profile: what every PostgreSQL job queue shares with the delivery machine.

A job is enqueued; a worker fetches (claims) it under a lease; the holder may heartbeat
(renew) and completes it (finished or failed); a rescuer returns jobs whose lease ran
out. This module is that part of the delivery machine, for one tenant and one target,
with the named *guarantees* a queue gives or does not (specs/guarantees.md). A holder is
the attempt that fetched the job (attempt k is its k-th fetch); its lease is live while
`lease_until >= now`, and a rescue takes jobs whose `lease_until < now` (for a queue that
declares `Capability.ENDS_AT_EXPIRY`, live while `lease_until > now`).

`judge(state, act, effect, seen)` is the whole profile. It asks for what took effect,
not for the delivery machine's exact answers: `effect` is what the queue's answer and
rows say the act did, `seen` every job's row after it; each rule they break is a
`Violation` of one named guarantee. What queues may differ in (fetch order, priorities,
what a rescue does to a job out of attempts) is not judged.
"""

from __future__ import annotations

import datetime as dt
import enum

import attrs

from leaseproof.model.frozenmap import FrozenMap


class Guarantee(enum.Enum):
    """The named guarantees, in the order the matrix prints them."""

    NO_DOUBLE_CLAIM = "no-double-claim"
    NO_STALE_COMPLETION = "no-stale-completion"
    NO_STALE_HEARTBEAT = "no-stale-heartbeat"
    EXPIRED_CANNOT_RENEW = "expired-cannot-renew"
    EXPIRED_CANNOT_COMPLETE = "expired-cannot-complete"
    LIVE_HOLDER_SERVED = "live-holder-served"
    TERMINAL_ONCE = "terminal-once"
    RESCUE_ONLY_EXPIRED = "rescue-only-expired"
    RESCUE_TAKES_EXPIRED = "rescue-takes-expired"
    NOTHING_LOST = "nothing-lost"
    COMPLETION_RACING_RESCUE = "completion-racing-rescue"


# What each guarantee says, for the matrix and the spec page.
MEANING = {
    Guarantee.NO_DOUBLE_CLAIM: "a fetch never hands out a job another holder's live lease holds",
    Guarantee.NO_STALE_COMPLETION: "a holder whose job was rescued (and maybe fetched again) cannot complete it",
    Guarantee.NO_STALE_HEARTBEAT: "a holder whose job was rescued cannot extend the lease of the job",
    Guarantee.EXPIRED_CANNOT_RENEW: "a holder whose lease ran out cannot renew it, even before any rescue",
    Guarantee.EXPIRED_CANNOT_COMPLETE: "a holder whose lease ran out cannot complete, even before any rescue",
    Guarantee.LIVE_HOLDER_SERVED: "a holder with a live lease can renew and complete",
    Guarantee.TERMINAL_ONCE: "a finished or failed job never changes again (not fetched, re-queued, flipped or lost)",
    Guarantee.RESCUE_ONLY_EXPIRED: "a rescue never takes a job whose lease is live",
    Guarantee.RESCUE_TAKES_EXPIRED: "a rescue takes every job whose lease ran out (none is left behind live ones)",
    Guarantee.NOTHING_LOST: "every enqueued job is there until it is terminal, and is completed once the queue drains",
    Guarantee.COMPLETION_RACING_RESCUE: (
        "a completion racing a rescue of the same expired job ends in exactly one state, "
        "agreeing with what each was told"
    ),
}


class Capability(enum.Enum):
    """What a queue's public API offers; a guarantee that needs one it lacks is not applicable."""

    HEARTBEAT = "heartbeat"  # a holder can renew its lease
    DEADLINE = "deadline"  # a lease ends by time alone: the queue knows when a holder's lease ran out
    RESCUE = "rescue"  # a rescue of expired leases can be run on demand
    TAKEOVER = "takeover"  # a fetch takes over a job whose lease ran out (a rescue inside the fetch)
    FAIL = "fail"  # a holder can fail a job for good (without it, a failure is retried: only "finished" is sent)
    # Not a call but the queue's convention, declared: a lease is over at the instant it expires (live
    # while `lease_until > now`, as pgmq's visibility timeout and absurd's claim are), where the profile
    # otherwise holds it live through that instant (`lease_until >= now`). The profile judges the
    # queue's boundary by it, so that which side owns the instant is never a violation.
    ENDS_AT_EXPIRY = "ends-at-expiry"


_ALWAYS: tuple[frozenset[Capability], ...] = (frozenset(),)
_STALE = (frozenset({Capability.RESCUE}), frozenset({Capability.TAKEOVER}))  # a holder can be made stale
# What each guarantee needs: any one of the sets (all of its capabilities).
NEEDS: dict[Guarantee, tuple[frozenset[Capability], ...]] = {
    Guarantee.NO_DOUBLE_CLAIM: _ALWAYS,
    Guarantee.NO_STALE_COMPLETION: _STALE,
    Guarantee.NO_STALE_HEARTBEAT: tuple(stale | {Capability.HEARTBEAT} for stale in _STALE),
    Guarantee.EXPIRED_CANNOT_RENEW: (frozenset({Capability.DEADLINE, Capability.HEARTBEAT}),),
    Guarantee.EXPIRED_CANNOT_COMPLETE: (frozenset({Capability.DEADLINE}),),
    Guarantee.LIVE_HOLDER_SERVED: _ALWAYS,
    Guarantee.TERMINAL_ONCE: _ALWAYS,
    Guarantee.RESCUE_ONLY_EXPIRED: (frozenset({Capability.RESCUE}),),
    Guarantee.RESCUE_TAKES_EXPIRED: (frozenset({Capability.RESCUE}),),
    Guarantee.NOTHING_LOST: _ALWAYS,
    Guarantee.COMPLETION_RACING_RESCUE: (frozenset({Capability.RESCUE}),),
}


def applicable(guarantee: Guarantee, capabilities: frozenset[Capability]) -> bool:
    """Whether a queue with `capabilities` can be judged on `guarantee`."""
    return any(needed <= capabilities for needed in NEEDS[guarantee])


def needs(guarantee: Guarantee) -> str:
    """What `guarantee` needs, in words ("heartbeat and deadline", "rescue or takeover")."""
    return " or ".join(" and ".join(sorted(c.value for c in needed)) for needed in NEEDS[guarantee]) or "nothing"


class Answer(enum.Enum):
    """What a heartbeat or a completion did, by the queue's answer or, where its API says
    nothing, by its rows."""

    APPLIED = "applied"  # it took effect now
    CREDITED = "credited"  # a completion: the queue says this holder's completion was recorded before
    REFUSED = "refused"  # nothing


TERMINAL = frozenset({"finished", "failed"})
STATUSES = frozenset({"pending", "claimed", *TERMINAL})


@attrs.frozen
class Seen:
    """A job's row as the queue persisted it: its status (None: no row, lost)."""

    status: str | None

    def __attrs_post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"a job's status is one of {sorted(STATUSES)} or None, not {self.status!r}")


@attrs.frozen
class Job:
    """A job as the profile knows it."""

    status: str = "pending"
    attempt: int = 0  # fetches so far; the holder of attempt k holds it while claimed at k
    lease_until: dt.datetime | None = None

    def live(self, now: dt.datetime, ends_at_expiry: bool = False) -> bool:
        """Claimed, its lease not run out at `now` (`ends_at_expiry`: over at its last instant)."""
        if self.status != "claimed" or self.lease_until is None:
            return False
        return self.lease_until > now if ends_at_expiry else self.lease_until >= now


@attrs.frozen
class QueueState:
    now: dt.datetime
    lease: dt.timedelta  # every lease is this long, from the fetch or the last heartbeat
    jobs: FrozenMap[str, Job] = FrozenMap()
    ends_at_expiry: bool = False  # the queue declared `Capability.ENDS_AT_EXPIRY`

    def live(self, job: Job) -> bool:
        """Whether `job`'s lease is live now, by the queue's convention."""
        return job.live(self.now, self.ends_at_expiry)

    def with_job(self, key: str, job: Job) -> QueueState:
        return attrs.evolve(self, jobs=self.jobs.set(key, job))


# The acts. A holder is (job, attempt).


@attrs.frozen
class Enqueue:
    job: str  # the queue's id of the job it created


@attrs.frozen
class Fetch:
    job: str | None  # what the fetch handed out; None: nothing


@attrs.frozen
class Heartbeat:
    job: str
    attempt: int


@attrs.frozen
class Complete:
    job: str
    attempt: int
    outcome: str  # "finished" or "failed"


@attrs.frozen
class Rescue:
    pass


@attrs.frozen
class Advance:
    seconds: int


Act = Enqueue | Fetch | Heartbeat | Complete | Rescue | Advance


@attrs.frozen
class Violation:
    """A guarantee the queue broke, and how."""

    guarantee: Guarantee
    why: str


@attrs.frozen
class Divergence:
    """The queue's rows say something the profile cannot explain by any guarantee (a job the
    profile has pending is claimed, say): the run cannot go on, and proves nothing either way."""

    why: str


def initial(now: dt.datetime, lease_seconds: int, ends_at_expiry: bool = False) -> QueueState:
    return QueueState(now, dt.timedelta(seconds=lease_seconds), ends_at_expiry=ends_at_expiry)


def holder(s: QueueState, job: str, attempt: int, deadline: bool = True) -> str:
    """What holder (job, attempt) is in state `s`: "live", "expired" (the job is still claimed
    at its attempt, the lease ran out), "stale" (the job was rescued, or fetched again,
    since), or "settled" (it completed the job). Without a deadline (`Capability.DEADLINE`)
    a holder whose time ran out holds on, live, until a rescue or a fetch takes the job."""
    j = s.jobs[job]
    if j.attempt != attempt or j.status == "pending":
        return "stale"
    if j.status in TERMINAL:
        return "settled"
    return "live" if s.live(j) or not deadline else "expired"


def reference_answer(s: QueueState, act: Heartbeat | Complete, deadline: bool = True) -> Answer:
    """What the reference queue answers a holder's act: applied for a live holder, credited
    for a settled holder's completion again, refused for everyone else."""
    who = holder(s, act.job, act.attempt, deadline)
    if who == "live":
        return Answer.APPLIED
    return Answer.CREDITED if who == "settled" and isinstance(act, Complete) else Answer.REFUSED


Judged = tuple[QueueState, list[Violation], list[Divergence]]


def judge(s: QueueState, act: Act, answer: Answer, seen: FrozenMap[str, Seen], deadline: bool = True) -> Judged:
    """The profile's next state after `act`, the guarantees it broke, and what the rows
    showed that no rule explains.

    `answer`: for a heartbeat or a completion, what it did (`Answer`); not read for the
    other acts. `seen`: every job's row after the act. `deadline`: whether the queue has
    `Capability.DEADLINE` (see `holder`)."""
    found: list[Violation] = []
    before = s
    if isinstance(act, Advance):
        s = attrs.evolve(s, now=s.now + dt.timedelta(seconds=act.seconds))
    elif isinstance(act, Enqueue):
        s = s.with_job(act.job, Job())
    elif isinstance(act, Fetch) and act.job is not None:
        s, found = _fetch(s, act.job)
    elif isinstance(act, Heartbeat | Complete):
        s, found = _holder_act(s, act, answer, deadline)
    elif isinstance(act, Rescue):
        found = _rescue(s, seen)
    after, rows_found, unexplained = _rows(before, s, seen)
    return after, found + rows_found, unexplained


def _rescue(s: QueueState, seen: FrozenMap[str, Seen]) -> list[Violation]:
    found = []
    for key, j in s.jobs.items():
        row = seen.get(key, Seen(None))
        if j.status != "claimed":
            continue
        if s.live(j) and row.status in {"pending", "failed"}:
            why = f"the rescue took {key} (now {row.status}) while attempt {j.attempt} held a live lease"
            found.append(Violation(Guarantee.RESCUE_ONLY_EXPIRED, why))
        elif not s.live(j) and row.status == "claimed":
            why = f"the rescue left {key} claimed by attempt {j.attempt}, whose lease ran out"
            found.append(Violation(Guarantee.RESCUE_TAKES_EXPIRED, why))
    return found


def _fetch(s: QueueState, key: str) -> tuple[QueueState, list[Violation]]:
    if key not in s.jobs:
        return s, [Violation(Guarantee.NO_DOUBLE_CLAIM, f"the fetch handed out {key}, a job never enqueued")]
    j, found = s.jobs[key], []
    if s.live(j):
        found.append(
            Violation(Guarantee.NO_DOUBLE_CLAIM, f"{key} was fetched while attempt {j.attempt} held a live lease")
        )
    elif j.status in TERMINAL:
        found.append(Violation(Guarantee.TERMINAL_ONCE, f"{key} was fetched after it was {j.status}"))
    return s.with_job(key, Job("claimed", j.attempt + 1, s.now + s.lease)), found


def _holder_act(
    s: QueueState, act: Heartbeat | Complete, answer: Answer, deadline: bool
) -> tuple[QueueState, list[Violation]]:
    who = holder(s, act.job, act.attempt, deadline)
    name = "heartbeat" if isinstance(act, Heartbeat) else f"completion ({act.outcome})"
    j = s.jobs[act.job]
    if who == "live":
        if answer is not Answer.APPLIED:
            why = f"the {name} of {act.job} by its live holder (attempt {act.attempt}) was {answer.value}, not applied"
            return s, [Violation(Guarantee.LIVE_HOLDER_SERVED, why)]
        if isinstance(act, Heartbeat):
            return s.with_job(act.job, attrs.evolve(j, lease_until=s.now + s.lease)), []
        return s.with_job(act.job, Job(act.outcome, j.attempt, None)), []
    if who == "settled":  # the same holder again: credited, or refused; applied only as a no-op
        if isinstance(act, Complete) and answer is Answer.APPLIED and act.outcome != j.status:
            return s, [
                Violation(Guarantee.TERMINAL_ONCE, f"{act.job}, {j.status}, took a second completion ({act.outcome})")
            ]
        return s, []
    if answer is Answer.REFUSED:
        return s, []
    told = "took effect" if answer is Answer.APPLIED else "was told it was recorded"
    if who == "expired":
        guarantee = Guarantee.EXPIRED_CANNOT_RENEW if isinstance(act, Heartbeat) else Guarantee.EXPIRED_CANNOT_COMPLETE
        return s, [
            Violation(guarantee, f"the {name} of {act.job} by attempt {act.attempt}, whose lease ran out, {told}")
        ]
    guarantee = Guarantee.NO_STALE_HEARTBEAT if isinstance(act, Heartbeat) else Guarantee.NO_STALE_COMPLETION
    state = f"held by attempt {j.attempt}" if j.status == "claimed" else f"{j.status} at attempt {j.attempt}"
    why = f"the {name} of {act.job} by attempt {act.attempt} {told} after the job was rescued or taken over ({state})"
    return s, [Violation(guarantee, why)]


def _rows(before: QueueState, s: QueueState, seen: FrozenMap[str, Seen]) -> Judged:
    """What every job's row must show after any act. A job whose lease ran out may be
    rescued by the queue at any time (back to pending, or failed if the queue gives up on
    it), and the profile follows; a terminal job never changes; nothing disappears."""
    found: list[Violation] = []
    unexplained: list[Divergence] = []
    for key, j in s.jobs.items():
        row = seen.get(key, Seen(None))
        if row.status == j.status:
            continue
        if row.status is None:
            found.append(Violation(Guarantee.NOTHING_LOST, f"{key} ({j.status}) has no row"))
        elif key in before.jobs and before.jobs[key].status in TERMINAL:
            found.append(Violation(Guarantee.TERMINAL_ONCE, f"{key} was {j.status} and its row now says {row.status}"))
        elif j.status == "claimed" and not s.live(j) and row.status in {"pending", "failed"}:
            s = s.with_job(key, Job(row.status, j.attempt, None))
        else:
            unexplained.append(
                Divergence(f"{key} should be {j.status} (attempt {j.attempt}); its row says {row.status}")
            )
    return s, found, unexplained
