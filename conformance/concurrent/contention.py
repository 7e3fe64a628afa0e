"""Contention schedules derived from a locking statement of the delivery store.

A lock matters only while another transaction wants the same thing. For one
statement of the store that locks (a row lock, SKIP LOCKED, an advisory
lock), every operation of a small catalogue that runs it is parked right
after it, holding what it took, on a fixed scene; each operation of the
catalogue then runs beside it on another connection, and the parked one is
let go. Two things are judged:

- some serial order of the model gives both outcomes and the final state
  (`Race.judgement`); a fault (a deadlock the server broke, a foreign key a
  lost lock let through) fails the schedule too;
- claims and sweeps do not wait where the spec says they do not: a claim
  waits only for a change of its community's state (the community row a
  fence or deletion holds), a sweep only for that or for another sweep
  (sweeps take turns). specs/delivery.md: "claimers never block each
  other"; the reaper skips rows others hold.

Pairs the spec names as known disagreements are not run: a claim beside a
deletion or a read (specs/delivery.md, "Concurrency").

The schedules are mechanical: nothing here names a mutant. `leaseproof
mutants --generated` runs, for each race mutant of the delivery store, the
schedules of the statement it changes (the check "contention");
tests/conformance/concurrent/test_contention.py runs every locking
statement's schedules against the bundled store, which must pass them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from leaseproof.conformance.concurrent.schedules import (
    CLAIM,
    D1,
    D2,
    LEASE,
    M1,
    ONE_ROW,
    R1,
    SECOND,
    W1,
    C,
    Forced,
    Race,
    delivery_races,
    new,
)
from leaseproof.conformance.lockstep import world as w
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.hooks.gate import Schedule
from leaseproof.impl.mutants.generated.sql import Statement, try_advisory_lock
from leaseproof.model import delivery as d

D3 = w.delivery_id(w.FRESH, "R1", "long", "T1")
D4 = w.delivery_id(w.FRESH, "R1", "wide", "T1")

# The scene: d1 claimed and expired (its holder's lease L1), d2 claimed and live
# (L2), d3 pending; community A active, its workflow W1, run R1 and message M1.
SCENE = (
    ONE_ROW,
    CLAIM,
    d.AdvanceClock((LEASE + 1) * SECOND),
    d.CommitDeliveries(C, R1, "s2", [new(D2, "T1", "s2")]),
    CLAIM,
    d.CommitDeliveries(C, R1, w.STEPS["long"], [new(D3, "T1", "long")]),
)

_COMMUNITY_CHANGES = frozenset({"fence", "quiesce", "delete community"})
_DELETIONS = frozenset({"delete community", "delete run", "delete workflow", "delete message"})


def catalogue(expired: d.Lease, live: d.Lease) -> dict[str, Any]:
    """The operations a schedule parks and runs beside, by name."""
    return {
        "claim": CLAIM,
        "keyed claim": d.Claim(C, w.TARGETS["T1"], LEASE, request_key=w.REQUEST_KEY),
        "reap": d.Reap(),
        "finish": d.Finish(live, d.Status.FINISHED),
        "renew": d.Renew(live, LEASE),
        "finish expired": d.Finish(expired, d.Status.FAILED),
        "retry": ONE_ROW,
        "commit": d.CommitDeliveries(C, R1, w.STEPS["wide"], [new(D4, "T1", "wide")]),
        "fence": d.SetCommunityState(C, d.CommunityState.FENCED),
        "quiesce": d.SetCommunityState(C, d.CommunityState.QUIESCING),
        "delete community": d.DeleteCommunity(C),
        "delete run": d.DeleteRun(C, R1),
        "delete workflow": d.DeleteWorkflow(C, W1),
        "delete message": d.DeleteEvent(C, M1),
        "create run": d.CreateRun(C, W1, w.RUNS["R2"]),
        "read": d.GetDelivery(C, D1),
    }


_ANY_LEASE = d.Lease(C, D1, w.TARGETS["T1"], 1, w.START)
NAMES = tuple(catalogue(_ANY_LEASE, _ANY_LEASE))


def excluded(parked: str, beside: str) -> bool:
    """A pair the spec names as a known disagreement (a claim beside a deletion or a read)."""
    pair = {parked, beside}
    return bool(pair & {"claim", "keyed claim"}) and bool(pair & (_DELETIONS | {"read"}))


def may_wait(parked: str, beside: str) -> bool:
    """Whether `beside` may wait for `parked`: always, unless it is a claim or a sweep
    (a keyed claim waits for another claim under its key, too)."""
    if beside == "claim":
        return parked in _COMMUNITY_CHANGES
    if beside == "keyed claim":
        return parked in _COMMUNITY_CHANGES | {"keyed claim"}
    if beside == "reap":
        return parked in _COMMUNITY_CHANGES | {"reap"}
    return True


def locking_statements(store_class: type[PostgresDeliveryStore]) -> dict[str, str]:
    """The store's named statements that lock something (a row-locking clause or a
    blocking advisory lock, as the mutation operators' parser reads them), by attribute."""
    found = {}
    for attribute in dir(store_class):
        value = getattr(store_class, attribute)
        if attribute.startswith("SQL_") and isinstance(value, str):
            statement = Statement(value)
            if statement.locking_clauses or any(try_advisory_lock(statement)):
                found[attribute] = value
    return found


@attrs.frozen
class Verdict:
    parked: str  # the catalogue's name of the parked operation
    beside: str
    statement: str  # the locking statement the schedule is derived from
    where: str  # where the parked one waits: "after" the statement, "before commit" of its transaction
    ok: bool
    why: str
    fault: bool = False  # the implementation raised (a deadlock, a foreign key), rather than answered


WHERE = ("after", "before commit")


def schedules(
    dsn: str, store_class: type[PostgresDeliveryStore], attribute: str, *, stop_at_first: bool = False
) -> Iterator[Verdict]:
    """Every schedule of `attribute` (a locking statement of `store_class`), judged.

    First each operation that runs the statement is parked, after it and then
    before its transaction commits, while each operation runs beside it (one
    that does not run the statement is skipped). Then each operation is parked
    before it commits, holding everything it took, while each operation that
    runs the statement runs beside it: where the statement waits shows there."""
    sql = getattr(store_class, attribute)
    reachers: list[str] = []
    for parked in NAMES:
        for where in WHERE:
            for beside in NAMES:
                if excluded(parked, beside):
                    continue
                verdict = _one(dsn, store_class, attribute, parked, beside, where, sql)
                if verdict is None:
                    break
                if parked not in reachers:
                    reachers.append(parked)
                yield verdict
                if stop_at_first and not verdict.ok:
                    return
            if parked not in reachers:
                break
    for parked in NAMES:
        for beside in reachers:
            if excluded(parked, beside):
                continue
            verdict = _one(dsn, store_class, attribute, parked, beside, "before commit", None)
            if verdict is None:
                break  # the parked one commits no transaction
            yield verdict
            if stop_at_first and not verdict.ok:
                return


def _one(
    dsn: str,
    store_class: type[PostgresDeliveryStore],
    attribute: str,
    parked: str,
    beside: str,
    where: str,
    sql: str | None,
) -> Verdict | None:
    """One schedule: `parked` waits `where` (after `sql`, or before the COMMIT of a
    transaction that ran `sql`, or of any if None) while `beside` runs. None if it
    never got there."""
    with Schedule(dsn) as schedule, delivery_races(dsn, schedule) as make:
        race: Race = make(store_class)
        outcomes = race.setup(*SCENE)
        expired, live = outcomes[1].lease, outcomes[4].lease
        ops = catalogue(expired, live)
        one, two = race.client("parked"), race.client("beside")
        if where == "after":
            point = one.gate.pause_after(sql, label=attribute)
        else:
            point = one.gate.pause_before_commit(ran=sql, label=attribute if sql else None)
        race.start(one, ops[parked])
        try:
            point.wait_parked()
        except AssertionError:
            race.result(one)  # it ended without getting there: no schedule here
            return None
        race.start(two, ops[beside])
        try:
            waited = two.wait_blocked_or_finished()
        finally:
            point.release()
        try:
            race.result(one)
            race.result(two)
        except Exception as fault:  # noqa: BLE001 - a deadlock, a foreign key: the schedule failed
            return Verdict(parked, beside, attribute, where, False, f"{type(fault).__name__}: {fault}", fault=True)
        if waited == "blocked" and not may_wait(parked, beside):
            return Verdict(parked, beside, attribute, where, False, f"{beside} waited for {parked}, which it must not")
        judgement = race.judgement(Forced())
        return Verdict(parked, beside, attribute, where, judgement.linearizable, judgement.why)
