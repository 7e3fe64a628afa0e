"""The linearizability checker's view of each machine: step, footprint, keys, restrict, describe.

Both machines partition by community. What each operation can touch is
read off the command (and, for a reap, off the epoch's start state); the
global fields (the clock, and for the lifecycle the run counter, replica
caches and executed actions) belong to every partition.
"""

from __future__ import annotations

import datetime as dt
import enum
import itertools
import math
import uuid
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import attrs

from leaseproof.conformance.concurrent.history import DROPPED, Indeterminate, Operation, Stall
from leaseproof.conformance.concurrent.linearizability import FORGOTTEN, Ambiguous, Spec
from leaseproof.conformance.lockstep import world as w
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc
from leaseproof.model.frozenmap import FrozenMap
from leaseproof.model.rules import Decision

# -- describing values briefly ---------------------------------------------------------


def short(value: Any) -> str:
    """A value in a few characters: world names where known, else a short prefix."""
    if isinstance(value, uuid.UUID):
        name = w.name_of(value)
        return value.hex[:6] + "…" if name == repr(value) else name
    if isinstance(value, bytes):
        return w.name_of(value)
    if isinstance(value, dt.datetime):
        text = value.strftime("%H:%M:%S") + (f".{value.microsecond:06d}" if value.microsecond else "")
        return text if value.date() == w.START.date() else f"{value.date().isoformat()} {text}"
    if isinstance(value, dt.timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return "/".join(value) if all(isinstance(v, str) for v in value) else f"{len(value)} items"
    if attrs.has(type(value)):
        return type(value).__name__
    return str(value)


def generic(value: Any) -> str:
    """`Name(field, field, …)` with every field described briefly."""
    fields = ", ".join(short(getattr(value, f.name)) for f in attrs.fields(type(value)))
    return f"{type(value).__name__}({fields})" if fields else type(value).__name__


def _lease(lease: d.Lease) -> str:
    return f"{short(lease.community_id)}/{short(lease.delivery_id)} gen {lease.lease_generation}"


_DELIVERY_COMMANDS: dict[type, Any] = {
    d.CreateRun: lambda c: f"CreateRun({short(c.community_id)}, {short(c.run_id)} of {short(c.workflow_id)})",
    d.CommitDeliveries: lambda c: (
        f"Commit({short(c.community_id)}, {short(c.run_id)}/{c.step_id}, "
        + "+".join(short(n.binding.target_pubkey) for n in c.deliveries)
        + ")"
    ),
    d.Claim: lambda c: (
        f"Claim({short(c.community_id)}, {short(c.target_pubkey)}, {c.lease_seconds}s"
        + (f", {short(c.delivery_id)}" if c.delivery_id else "")
        + (", expected" if c.expected else "")
        + ")"
    ),
    d.Renew: lambda c: f"Renew({_lease(c.lease)}, {c.lease_seconds}s)",
    d.Finish: lambda c: f"Finish({_lease(c.lease)}, {c.outcome.value})",
    d.GetDelivery: lambda c: f"Get({short(c.community_id)}/{short(c.delivery_id)})",
}
_DELIVERY_OUTCOMES: dict[type, Any] = {
    d.Claimed: lambda o: (
        f"Claimed({short(o.lease.delivery_id)} gen {o.lease.lease_generation}, until {short(o.lease.lease_until)})"
    ),
    d.Renewed: lambda o: f"Renewed(until {short(o.lease_until)})",
    d.Committed: lambda o: f"Committed({len(o.created)} new" + (", retry" if o.identity_existed else "") + ")",
    d.Found: lambda o: f"Found({short(o.delivery.id)} {o.delivery.status.value} gen {o.delivery.lease_generation})",
}


def _describer(table: dict[type, Any]) -> Any:
    return lambda value: table.get(type(value), generic)(value)


# -- delivery --------------------------------------------------------------------------


def _delivery_footprint(start: d.DeliverySystem, c: Any) -> frozenset[uuid.UUID] | None:
    if isinstance(c, d.AdvanceClock):
        return None
    if isinstance(c, d.Renew | d.Finish):
        return frozenset({c.lease.community_id})
    if isinstance(c, d.Reap):
        # Within an epoch the clock does not move (clock advances sit alone
        # between barriers), and a claim or renew always sets lease_until
        # past now, so no expired claim can appear during the epoch: a reap
        # can only touch communities that hold one at the epoch's start.
        return _facts(start).expired
    return frozenset({c.community_id})


@attrs.frozen
class _Facts:
    """What the checker asks of one state again and again: its rows by
    community, its keys, and the communities holding an expired claim."""

    rows: dict[uuid.UUID, dict[str, list[Any]]]
    keys: frozenset[uuid.UUID]
    expired: frozenset[uuid.UUID]


_TABLES = ("workflows", "runs", "events", "deliveries", "retired")  # keyed by (community, …)
_MAPS = ("runs", "deliveries")
_known: dict[int, tuple[d.DeliverySystem, _Facts]] = {}


def _facts(s: d.DeliverySystem) -> _Facts:
    """The facts of a state, kept for the last few states by identity (hashing
    a large state costs as much as reading it): the checker asks about each
    epoch's start and barrier states once per partition."""
    hit = _known.get(id(s))
    if hit is not None and hit[0] is s:
        return hit[1]
    rows: dict[uuid.UUID, dict[str, list[Any]]] = {}
    expired = set()
    for table in _TABLES:
        entries = getattr(s, table)
        for row in entries.items() if table in _MAPS else entries:
            community = row[0][0] if table in _MAPS else row[0]
            rows.setdefault(community, {}).setdefault(table, []).append(row)
    for (community, _), delivery in s.deliveries.items():
        if delivery.status is d.Status.CLAIMED and delivery.lease_until < s.now:  # type: ignore[operator]  # claimed rows have one
            expired.add(community)
    facts = _Facts(rows, frozenset(s.communities) | frozenset(rows), frozenset(expired))
    if len(_known) >= 4:
        del _known[next(iter(_known))]
    _known[id(s)] = (s, facts)
    return facts


def _delivery_keys(s: d.DeliverySystem) -> frozenset[uuid.UUID]:
    return _facts(s).keys


def _delivery_restrict(s: d.DeliverySystem, keys: AbstractSet[uuid.UUID]) -> d.DeliverySystem:
    by_community = _facts(s).rows
    parts = [by_community[k] for k in keys if k in by_community]

    def rows(table: str) -> list[Any]:
        return [row for part in parts for row in part.get(table, ())]

    return d.DeliverySystem(
        now=s.now,
        communities=FrozenMap((k, v) for k in keys if (v := s.communities.get(k)) is not None),
        workflows=frozenset(rows("workflows")),
        runs=FrozenMap(rows("runs")),
        events=frozenset(rows("events")),
        deliveries=FrozenMap(rows("deliveries")),
        retired=frozenset(rows("retired")),
    )


def _behaviour(decide: Callable[[Any, Any], Decision[Any]], variant: Callable[[Any], str]) -> Any:
    def behaviour(state: Any, command: Any) -> tuple[str, str, str]:
        decision = decide(state, command)
        return type(command).__name__, decision.rule.guard, variant(decision.outcome)

    return behaviour


# -- what SKIP LOCKED lets a claim pass over ------------------------------------------
#
# A claim takes the first of its candidates that no other transaction holds locked (the
# seeds: claimers never block), and it reads them in two moments: its statement's
# snapshot, taken as it starts, lists the candidates; its lock, later in its call, takes
# the first of them still free. Two things follow that no single step of the model does.
#
# - A candidate that became pending after the snapshot is not among those it lists: a
#   delivery that an operation overlapping the claim committed. The claim passes over
#   it, though it may be the oldest (the clock does not always move between commits,
#   and the id then decides), and misses if the snapshot's candidates were all taken by
#   the time it locked: another claim took the oldest one, and the producer's delivery
#   is not listed (tests/conformance/concurrent/test_interleavings.py forces it). Nor is
#   a claim that a sweep overlapping the claim returned to pending. Which sweep reaped a
#   row is not in the history (a sweep answers a count), so a claim may pass over any
#   reaped candidate (pending at a generation above 0) while a sweep overlaps it, unless
#   a sweep returned before it began: that one reaped what had expired (the clock does
#   not move within a round), and a claim that skips what it reaped is wrong (the race
#   mutant `sweeps-overlap`).
# - A candidate another transaction holds is skipped. Whoever holds one is, as a rule,
#   about to commit what the model explains (a claim takes it, a deletion removes it),
#   so the skip fits some order. But a transaction whose connection was lost may have
#   rolled back instead: the row it held was pending all along, and a claim that passed
#   over it took a younger row, or missed. So a claim that overlaps such an operation of
#   its community may have passed over as many candidates as those operations could
#   hold: one for each claim of its target (a claim locks the one row it takes), any
#   number for a deletion (it locks every row it deletes).
# - A stalled tenant (`Stall`: a connection of the harness's own that holds the tenant's
#   rows locked, as a client stuck mid-transaction does) may hold any of them: a claim of
#   that tenant that overlaps it may pass over any number of candidates, and a sweep that
#   overlaps it may leave any of the tenant's expired leases unreaped (`Swept`): which ones
#   it found held, its count alone does not say, so each choice is a step of its own.
#
# The allowance says what a claim may have passed over, and nothing more: a claim whose
# every candidate was listed and free, and still missed or took the wrong one, is judged
# as the model's step judges it.


@attrs.frozen
class Passed:
    """What one claim may have passed over. `unlisted`: ids of deliveries that overlapping
    commits created, which its snapshot may not list; `reaped`: whether a reaped candidate
    may be unlisted too; `holders`: what overlapping operations that committed may have
    held locked when it looked (`holds`); `held`: how many more of the listed candidates,
    oldest first, it may have found held by a transaction that then rolled back (None: any)."""

    unlisted: frozenset[uuid.UUID] = frozenset()
    reaped: bool = False
    held: int | None = 0
    holders: frozenset[Holder] = frozenset()

    def listed(self, candidate: d.Delivery) -> bool:
        return candidate.id not in self.unlisted and not (self.reaped and candidate.lease_generation > 0)

    def free(self, candidate: d.Delivery) -> bool:
        """Listed, and held by none of the operations that overlapped the claim."""
        return self.listed(candidate) and not holds(self.holders, candidate)


# What an operation may hold locked while it runs, as (kind, community, which): a row
# ("row", community, delivery id) or every row a deletion removes ("run", "workflow",
# "event": the deliveries it names; "community": all of them).
Holder = tuple[str, uuid.UUID, Any]


def holds(holders: AbstractSet[Holder], row: d.Delivery) -> bool:
    """Whether one of `holders` may hold `row` locked."""
    community, binding = row.key[0], row.binding
    return any(
        (kind, cid, which) in holders
        for kind, cid, which in (
            ("row", community, row.id),
            ("run", community, binding.run_id),
            ("workflow", community, binding.workflow_id),
            ("event", community, binding.message_event_id),
            ("community", community, None),
        )
    )


def _holders(op: Operation) -> frozenset[Holder]:
    """What `op` may hold locked while it runs, if it commits: the row a claim took, the
    row of the lease a renew or a finish names, the rows a deletion removes. (Reads take
    no lock; a commit locks no delivery it does not insert; a sweep's rows are the
    `reaped` rule's.)"""
    c, seen = op.command, op.outcome
    if isinstance(c, d.Claim) and isinstance(seen, d.Claimed):
        return frozenset({("row", seen.lease.community_id, seen.lease.delivery_id)})
    if isinstance(c, d.Renew | d.Finish):
        return frozenset({("row", c.lease.community_id, c.lease.delivery_id)})
    if isinstance(c, d.DeleteRun):
        return frozenset({("run", c.community_id, c.run_id)})
    if isinstance(c, d.DeleteWorkflow):
        return frozenset({("workflow", c.community_id, c.workflow_id)})
    if isinstance(c, d.DeleteEvent):
        return frozenset({("event", c.community_id, c.event_id)})
    if isinstance(c, d.DeleteCommunity):
        return frozenset({("community", c.community_id, None)})
    return frozenset()


def _may_have_rolled_back(op: Operation) -> bool:
    """Its outcome is unknown because its connection was lost, not because its answer was
    dropped after it ran (`DROPPED`) or forgotten by the shrinker (`FORGOTTEN`)."""
    return isinstance(op.outcome, Indeterminate) and op.outcome.reason not in (DROPPED, FORGOTTEN)


_HOLD_EVERY_ROW = (d.DeleteRun, d.DeleteWorkflow, d.DeleteEvent)


def _overlaps(op: Operation, x: Operation) -> bool:
    """`op` was in flight at some moment while `x` ran (an `x` that never returned runs on)."""
    return (x.returned is None or op.invoked < x.returned) and (op.returned is None or op.returned > x.invoked)


@attrs.frozen
class Swept:
    """What one sweep may have left unreaped: the expired leases of these stalled tenants,
    and those that overlapping operations may have held locked (`holds`)."""

    stalled: frozenset[uuid.UUID] = frozenset()
    holders: frozenset[Holder] = frozenset()

    def left(self, row: d.Delivery) -> bool:
        return row.key[0] in self.stalled or holds(self.holders, row)


SUBSETS_LIMIT = 1024  # the choices of held leases a sweep is tried with, at most


def _delivery_allowances(ops: Sequence[Operation], stalls: Sequence[Stall] = ()) -> dict[int, Passed | Swept]:
    """For each answered claim and each sweep, what it may have passed over: rows that
    overlapping operations held locked (skip locked: it passes over them, as a correct
    implementation does), candidates that overlapping commits or sweeps made after its
    snapshot, candidates an operation that may have rolled back held, and a stalled
    tenant's rows."""
    allowed: dict[int, Passed | Swept] = {}
    for x in ops:
        claim = x.command
        if not isinstance(claim, d.Claim | d.Reap):
            continue
        during = [op for op in ops if op is not x and _overlaps(op, x)]
        holders = frozenset().union(*(_holders(op) for op in during if not _may_have_rolled_back(op)))
        if isinstance(claim, d.Reap):
            swept = Swept(frozenset(st.key for st in stalls if st.overlaps(x)), holders)
            if swept != Swept():
                allowed[x.id] = swept
            continue
        if x.returned is None:
            continue
        mine = (claim.community_id, claim.target_pubkey)
        unlisted = frozenset(
            new.id
            for op in during
            if isinstance(op.command, d.CommitDeliveries) and op.command.community_id == claim.community_id
            for new in op.command.deliveries
            if new.binding.target_pubkey == claim.target_pubkey
        )
        reaped = any(isinstance(op.command, d.Reap) for op in during) and not any(
            isinstance(op.command, d.Reap) and op.precedes(x) for op in ops
        )
        cut = [op.command for op in during if _may_have_rolled_back(op)]
        held: int | None = sum(isinstance(o, d.Claim) and (o.community_id, o.target_pubkey) == mine for o in cut)
        if any(isinstance(o, _HOLD_EVERY_ROW) and o.community_id == claim.community_id for o in cut):
            held = None
        if any(st.key == claim.community_id and st.overlaps(x) for st in stalls):
            held = None
        passed = Passed(unlisted, reaped, held, frozenset(h for h in holders if h[1] == claim.community_id))
        if passed != Passed():
            allowed[x.id] = passed
    return allowed


def _delivery_step_allowed(
    s: d.DeliverySystem, c: Any, seen: Any, allowance: Passed | Swept
) -> Sequence[tuple[d.DeliverySystem, Any]]:
    if isinstance(allowance, Swept):
        return _swept(s, c, seen, allowance)
    return (_passed(s, c, seen, allowance),)


def _swept(s: d.DeliverySystem, c: Any, seen: Any, swept: Swept) -> list[tuple[d.DeliverySystem, Any]]:
    """The model's sweep, then the same sweep having left each choice of the stalled tenants'
    expired leases as they were (only those its recorded count allows, if it has one)."""
    after, outcome = d.step(s, c)
    steps = [(after, outcome)]
    if outcome == seen or not isinstance(outcome, d.Reaped):
        return steps
    held = [
        row
        for row in s.deliveries.values()
        if swept.left(row) and after.deliveries.get(row.key) != row  # the sweep reaped it
    ]
    # How many it left: as its count says, if it answered; any number, if not.
    wanted = [outcome.count - seen.count] if isinstance(seen, d.Reaped) else range(1, len(held) + 1)
    sizes = [size for size in wanted if 0 < size <= len(held)]
    if sum(math.comb(len(held), size) for size in sizes) > SUBSETS_LIMIT:
        raise Ambiguous(f"a sweep may have left any of {len(held)} held leases, too many choices to try")
    for size in sizes:
        for left in itertools.combinations(held, size):
            state = after
            for row in left:
                state = state.with_delivery(row)
            steps.append((state, d.Reaped(outcome.count - size)))
    return steps


def _passed(s: d.DeliverySystem, c: Any, seen: Any, passed: Passed) -> tuple[d.DeliverySystem, Any]:
    """The model's claim, or the same claim having passed over what `passed` allows, if
    that is what the implementation answered: a miss, or a candidate other than the
    oldest, when every candidate before it (all of them, for a miss) is one its snapshot
    may not list, or one of at most `passed.held` listed ones."""
    decision = d.decide(s, c)
    after, outcome = decision.state, decision.outcome
    if outcome == seen or decision.rule.guard != "oldest-pending":
        return after, outcome
    order = d.claim_order(s, c)
    took = seen.lease.delivery_id if isinstance(seen, d.Claimed) else None
    ids = [candidate.id for candidate in order]
    if (took is not None and took not in ids) or not isinstance(seen, d.Claimed | d.ClaimMiss):
        return after, outcome
    before = order[: ids.index(took)] if took is not None else order
    if passed.held is None or sum(passed.free(candidate) for candidate in before) <= passed.held:
        return (s, seen) if took is None else d.step(s, attrs.evolve(c, delivery_id=took))
    return after, outcome


DELIVERY = Spec(
    name="delivery",
    step=d.step,
    behaviour=_behaviour(d.decide, d.variant),
    footprint=_delivery_footprint,
    keys=_delivery_keys,
    restrict=_delivery_restrict,
    describe_command=_describer(_DELIVERY_COMMANDS),
    describe_outcome=_describer(_DELIVERY_OUTCOMES),
    describe_key=short,
    allowances=_delivery_allowances,
    step_allowed=_delivery_step_allowed,
)


# -- lifecycle -------------------------------------------------------------------------

# Run ids are global and replica caches span communities,
# so whatever fires, resumes or reloads a cache touches everything.
_LIFECYCLE_GLOBAL = (lc.Fire, lc.ResumeRun, lc.RefreshCache, d.AdvanceClock)


def _lifecycle_footprint(start: lc.LifecycleSystem, c: Any) -> frozenset[uuid.UUID] | None:
    if isinstance(c, _LIFECYCLE_GLOBAL):
        return None
    if isinstance(c, lc.SaveDefinition):
        return frozenset({c.event.community_id})
    return frozenset({c.community_id})


def _lifecycle_keys(s: lc.LifecycleSystem) -> frozenset[uuid.UUID]:
    return frozenset(
        {*s.communities, *(a[0] for a in s.authority), *(k[0] for k in s.heads), *(k[0] for k in s.runtime)}
        | {k[0] for k in s.cutoffs}
    )


def _lifecycle_restrict(s: lc.LifecycleSystem, keys: AbstractSet[uuid.UUID]) -> lc.LifecycleSystem:
    def mine(key: Any, _: Any) -> bool:
        return key[0] not in keys

    return attrs.evolve(
        s,  # runs, caches and executed are global: kept whole
        communities=FrozenMap((k, v) for k in keys if (v := s.communities.get(k)) is not None),
        authority=frozenset(a for a in s.authority if a[0] in keys),
        heads=s.heads.remove_where(mine),
        runtime=s.runtime.remove_where(mine),
        cutoffs=s.cutoffs.remove_where(mine),
    )


_LIFECYCLE_COMMANDS: dict[type, Any] = {
    lc.SaveDefinition: lambda c: (
        f"Save({short(c.event.community_id)}/{short(c.event.workflow_id)}, {short(c.event.author)}, "
        f"{short(c.event.created_at)}" + (", disabled" if not c.event.definition.is_enabled else "") + ")"
    ),
    lc.DeleteDefinition: lambda c: (
        f"Delete({short(c.community_id)}/{short(c.workflow_id)}, {short(c.author)}, {short(c.created_at)})"
    ),
    lc.Fire: lambda c: f"Fire({c.replica}, {c.door}, {short(c.community_id)}/{short(c.workflow_id)})",
}
_LIFECYCLE_OUTCOMES: dict[type, Any] = {
    lc.Admitted: lambda o: f"Admitted(run {o.run_id}, revision {short(o.record.revision)})",
}


def _lifecycle_step_seen(s: lc.LifecycleSystem, c: Any, seen: Any) -> tuple[lc.LifecycleSystem, Any]:
    """The model's step, adopting the run id the implementation reported.

    An implementation takes run ids from a sequence when it inserts, not
    when it commits, so concurrent admissions commit out of id order: the
    id is the implementation's choice, only its freshness is specified. The
    search states carry the implementation's ids, so barrier states compare
    as read.
    """
    after, outcome = lc.step(s, c)
    if not isinstance(outcome, lc.Admitted):
        return after, outcome
    if isinstance(seen, Indeterminate):
        raise Ambiguous(f"{c!r} may have admitted a run whose id was never reported")
    if not isinstance(seen, lc.Admitted) or seen.run_id in s.runs or seen.run_id == outcome.run_id:
        return after, outcome  # compares as it stands
    chosen, model = seen.run_id, outcome.run_id
    run = attrs.evolve(after.runs[model], run_id=chosen)
    return (
        attrs.evolve(
            after,
            runs=after.runs.remove_where(lambda k, _: k == model).set(chosen, run),
            executed=after.executed.remove_where(lambda k, _: k == model).set(chosen, after.executed[model]),
        ),
        attrs.evolve(outcome, run_id=chosen),
    )


LIFECYCLE = Spec(
    name="lifecycle",
    step=lc.step,
    behaviour=_behaviour(lc.decide, lc.variant),
    footprint=_lifecycle_footprint,
    keys=_lifecycle_keys,
    restrict=_lifecycle_restrict,
    describe_command=_describer(_LIFECYCLE_COMMANDS),
    describe_outcome=_describer(_LIFECYCLE_OUTCOMES),
    describe_key=short,
    step_seen=_lifecycle_step_seen,
)

SPECS: dict[str, Spec] = {"delivery": DELIVERY, "lifecycle": LIFECYCLE}
