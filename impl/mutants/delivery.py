"""Mutants of the PostgreSQL store: each reintroduces one known bug.

A conformance suite is only as good as the bugs it catches. Each mutant
differs from `PostgresDeliveryStore` in one named statement or method, and
says which review finding (or bug class) it stands for. The tests prove
that the conformance machine kills every one of them.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import attrs

from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.model import delivery as m
from leaseproof.model.errors import Refused


def _swap(sql: str, old: str, new: str) -> str:
    """`sql` with `old` replaced; refuses to build a mutant identical to the original."""
    if old not in sql:
        raise ValueError(f"mutant fragment not found in statement: {old!r}")
    return sql.replace(old, new)


_EXPIRY = "AND lease_until >= lp_now()"
_TARGET = "AND target_pubkey = %(target_pubkey)s"
_GENERATION = "AND lease_generation = %(lease_generation)s"
Store = PostgresDeliveryStore


class ReconcileUnfenced(Store):
    SQL_FINISH_RECONCILE = _swap(Store.SQL_FINISH_RECONCILE, _GENERATION, "")


class RenewIgnoresExpiry(Store):
    SQL_RENEW = _swap(Store.SQL_RENEW, _EXPIRY, "")


class FinishIgnoresExpiry(Store):
    SQL_FINISH = _swap(Store.SQL_FINISH, _EXPIRY, "")


class ClaimScopeUnchecked(Store):
    def claim(self, c: m.Claim) -> Any:
        # Scope by the request only; bind every other expected field.
        if c.expected is not None:
            c = attrs.evolve(
                c,
                expected=attrs.evolve(c.expected, community_id=c.community_id, target_pubkey=c.target_pubkey),
            )
        return super().claim(c)


class LeaseTargetUnbound(Store):
    SQL_RENEW = _swap(Store.SQL_RENEW, _TARGET, "")
    SQL_FINISH = _swap(Store.SQL_FINISH, _TARGET, "")
    SQL_FINISH_RECONCILE = _swap(Store.SQL_FINISH_RECONCILE, _TARGET, "")


class ReapIgnoresFence(Store):
    SQL_REAP = _swap(Store.SQL_REAP, "WHERE c.state = 'active'", "")


class ReapAtDeadline(Store):
    SQL_REAP = _swap(Store.SQL_REAP, "lease_until < lp_now()", "lease_until <= lp_now()")


class LeaseLostAtDeadline(Store):
    SQL_RENEW = _swap(Store.SQL_RENEW, _EXPIRY, "AND lease_until > lp_now()")
    SQL_FINISH = _swap(Store.SQL_FINISH, _EXPIRY, "AND lease_until > lp_now()")


class ClaimNewestFirst(Store):
    SQL_CLAIM = _swap(Store.SQL_CLAIM, "ORDER BY created_at, id", "ORDER BY created_at DESC, id DESC")


def _ignore(sql: str, *fragments: str) -> str:
    """Keep each fragment's parameter bound but make its comparison always true."""
    for fragment in fragments:
        sql = _swap(sql, fragment, f"AND ({fragment.removeprefix('AND ')} OR true)")
    return sql


class ClaimIgnoresCause(Store):
    SQL_CLAIM = _ignore(
        Store.SQL_CLAIM,
        "AND cause_kind = %(cause_kind)s::delivery_cause_kind",
        "AND cause_event_id IS NOT DISTINCT FROM %(cause_event_id)s::bytea",
        "AND cause_scheduled_for IS NOT DISTINCT FROM %(cause_scheduled_for)s::timestamptz",
        "AND cause_invocation_id IS NOT DISTINCT FROM %(cause_invocation_id)s::uuid",
    )


class ReapKeepsGeneration(Store):
    SQL_REAP = _swap(
        Store.SQL_REAP, "lease_generation = d.lease_generation + 1", "lease_generation = d.lease_generation"
    )


class ReconcileEchoesRequest(Store):
    """The retry is told the outcome it asked for, not the one recorded."""

    def finish(self, c: m.Finish) -> Any:
        outcome = super().finish(c)
        if isinstance(outcome, m.AlreadyTerminal):
            return m.AlreadyTerminal(c.outcome)
        return outcome


class WritesTrustFenceTrigger(Store):
    """Writes skip the explicit community-state check and rely on the trigger alone."""

    def _writable(self, community_id: Any) -> None:
        if self.conn.execute(self.SQL_COMMUNITY_STATE, {"community_id": community_id}).fetchone() is None:
            raise Refused(m.UnknownCommunity(community_id))

    # The one-statement operations check the fence themselves: the same skip there.
    SQL_CLAIM = _swap(Store.SQL_CLAIM, "(SELECT state = 'active' AND steady FROM fence)", "(SELECT steady FROM fence)")
    SQL_RENEW = _swap(Store.SQL_RENEW, "(SELECT state = 'active' FROM fence)", "EXISTS (SELECT FROM fence)")
    SQL_FINISH = _swap(Store.SQL_FINISH, "(SELECT state = 'active' FROM fence)", "EXISTS (SELECT FROM fence)")

    def _fenced(self, sql: str, params: dict[str, Any], community_id: Any) -> dict[str, Any]:
        row = self._statement(sql, params)
        if row["community_state"] is None:
            raise Refused(m.UnknownCommunity(community_id))
        return row


class CommitNotAtomic(Store):
    """Each target commits on its own: a failing target leaves the others."""

    def commit_deliveries(self, c: m.CommitDeliveries) -> Any:
        created: list[uuid.UUID] = []
        for new in c.deliveries:
            outcome = super().commit_deliveries(attrs.evolve(c, deliveries=(new,)))
            created.extend(outcome.created)
        return m.Committed(tuple(created), outcome.identity_existed)


class DeliveryIdsReused(Store):
    """A deleted delivery's id may name a new row, where its old lease still acts."""

    SQL_RETIRED_IDS = _swap(Store.SQL_RETIRED_IDS, "AND id = ANY(%(ids)s)", "AND id = ANY(%(ids)s) AND false")


# -- from the field: the bug classes public job queues shipped (specs/guarantees.md) --------

_LEASE_HELD_BY_STATE = """
        community_id = %(community_id)s AND id = %(delivery_id)s
        AND status = 'claimed'
    """


class FinishByState(Store):
    """A completion matched by the job's id and state alone (no attempt, holder or
    deadline): a stale holder completes the attempt of whoever claimed the job since."""

    SQL_FINISH = _swap(Store.SQL_FINISH, Store.LEASE_HELD, _LEASE_HELD_BY_STATE)


class HeartbeatById(Store):
    """A heartbeat matched by the job's id (and that it is claimed): a stale holder's
    heartbeat extends the new holder's lease, an expired holder's revives its own."""

    SQL_RENEW = _swap(Store.SQL_RENEW, Store.LEASE_HELD, _LEASE_HELD_BY_STATE)


class FinishByWorker(Store):
    """A completion fenced by the worker's identity (the target) instead of the attempt: a
    restarted worker that reuses its identity completes a newer attempt."""

    SQL_FINISH = _swap(Store.SQL_FINISH, _GENERATION, "")


class RescueBeyondScope(Store):
    """A rescue that takes every claimed job of a tenant that has one expired lease, live
    leases included (the expiry is checked for the tenant, not for each row)."""

    SQL_REAP = _swap(
        Store.SQL_REAP,
        "WHERE d.status = 'claimed' AND d.lease_until < lp_now()\n            FOR UPDATE OF d SKIP LOCKED",
        "WHERE d.status = 'claimed'\n            FOR UPDATE OF d SKIP LOCKED",
    )


RESCUE_BATCH = 3  # the starved rescue's batch


class RescueBatchStarved(Store):
    """A rescue that picks its batch (the oldest claims) before it skips the rows it must
    leave (live leases): while the batch's live leases are renewed, an expired lease behind
    them is never rescued."""

    SQL_REAP = _swap(
        Store.SQL_REAP,
        "WHERE d.status = 'claimed' AND d.lease_until < lp_now()\n            FOR UPDATE OF d SKIP LOCKED",
        "WHERE d.status = 'claimed' AND d.lease_until < lp_now()\n"
        "              AND (d.community_id, d.id) IN (SELECT b.community_id, b.id FROM workflow_agent_deliveries b\n"
        f"                   WHERE b.status = 'claimed' ORDER BY b.claimed_at, b.id LIMIT {RESCUE_BATCH})\n"
        "            FOR UPDATE OF d SKIP LOCKED",
    )


@attrs.frozen
class Mutant:
    name: str
    stands_for: str
    store: type[PostgresDeliveryStore]
    machine: ClassVar[str] = "delivery"

    def adapter(self, dsn: str) -> PostgresDeliveryAdapter:
        """The bundled delivery adapter running this mutant's store, on the database `dsn`."""
        return PostgresDeliveryAdapter(dsn, self.store)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "reconcile-unfenced", "review finding 1: finish's reconciliation read ignores the generation", ReconcileUnfenced
    ),
    Mutant("renew-ignores-expiry", "review finding 2: an expired, unreaped holder can renew", RenewIgnoresExpiry),
    Mutant("finish-ignores-expiry", "review finding 2: an expired, unreaped holder can settle", FinishIgnoresExpiry),
    Mutant(
        "claim-scope-unchecked",
        "review finding 3: expected binding's community/target not checked",
        ClaimScopeUnchecked,
    ),
    Mutant(
        "lease-target-unbound", "review finding 4: renew/finish/reconcile ignore the lease's target", LeaseTargetUnbound
    ),
    Mutant("reap-ignores-fence", "a fenced tenant aborts the fleet-wide sweep", ReapIgnoresFence),
    Mutant("reap-at-deadline", "off by one: reaps a lease at its exact deadline", ReapAtDeadline),
    Mutant("lease-lost-at-deadline", "off by one: a holder loses its lease at the exact deadline", LeaseLostAtDeadline),
    Mutant("claim-newest-first", "claim order: newest pending row wins", ClaimNewestFirst),
    Mutant("claim-ignores-cause", "a forged wake with another cause still claims", ClaimIgnoresCause),
    Mutant("reap-keeps-generation", "reap returns a row to pending without bumping the fence", ReapKeepsGeneration),
    Mutant(
        "reconcile-echoes-request",
        "a retry is told its requested outcome, not the recorded terminal",
        ReconcileEchoesRequest,
    ),
    Mutant(
        "writes-trust-fence-trigger",
        "a write that touches no row of a fenced tenant is not refused",
        WritesTrustFenceTrigger,
    ),
    Mutant("delivery-ids-reused", "a stale lease governs a new row that reuses a deleted row's id", DeliveryIdsReused),
    Mutant("commit-not-atomic", "a failing target leaves the other targets of its step committed", CommitNotAtomic),
    Mutant(
        "graphile-worker-169-finish-by-state",
        "graphile-worker #169: a completion matched by job id and state (ABA after a re-claim)",
        FinishByState,
    ),
    Mutant("pgqueuer-430-heartbeat-by-id", "PgQueuer #430/#431: a heartbeat matched by job id alone", HeartbeatById),
    Mutant(
        "procrastinate-1518-finish-by-worker",
        "procrastinate #1518: a completion fenced by worker identity, not attempt",
        FinishByWorker,
    ),
    Mutant(
        "oban-rescue-beyond-scope",
        "Oban's rescue may duplicate execution: a rescue that takes live leases",
        RescueBeyondScope,
    ),
    Mutant(
        "rescue-batch-starved",
        "a rescue batch starved by rows it skips: its batch is chosen before its filter",
        RescueBatchStarved,
    ),
)
