"""Mutants of the PostgreSQL store: each reintroduces one known bug.

A conformance suite is only as good as the bugs it catches. Each mutant is a
variant of `PostgresDeliveryStore` that differs from it in one place, and says
which review finding (or bug class) it stands for. Every operation of the
bundled store is one database function (`impl/migrations/0006_database_api.sql`),
so most mutants are edits of those functions (`FUNCTIONS`: `Patch`es, which the
adapters install in their test database, `impl/hooks/functions.py`); a bug that
lives in the client by nature (a commit split into one call per target) is an
override of the store's method. The tests prove that the conformance machine
kills every one of them.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import attrs

from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.service import DeliveryService
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.migrate import Addition, Patch, functions, patched
from leaseproof.model import delivery as m


def edits(*patches: Patch | Addition) -> tuple[Patch | Addition, ...]:
    """`patches` as a store class lists them (`FUNCTIONS`), checked now: each applies to the
    shipped functions (its text occurs exactly once, after the patches before it) and
    changes something, so a mutant that no longer differs from the bundled store fails
    at import, not as a survivor."""
    for patch in patches:
        if isinstance(patch, Patch) and patch.old == patch.new:
            raise ValueError(f"{patch.function}: a patch that changes nothing: {patch.old!r}")
    patched(patches)
    return patches


def every(function: str, old: str, new: str) -> Patch:
    """One patch that replaces every occurrence of `old` in the shipped `function`'s body
    (a `Patch` replaces one): its text runs from the first occurrence to the end of the
    last, which occurs once."""
    body = functions()[function].body
    if old not in body:
        raise ValueError(f"{function}: mutant fragment not found: {old!r}")
    span = body[body.index(old) : body.rindex(old) + len(old)]
    return Patch(function, span, span.replace(old, new))


# Fragments of the lease checks of lp_renew and lp_finish (their UPDATE's WHERE clause).
_EXPIRY = "AND d.lease_until >= e.t"
_HELD = """AND d.target_pubkey = p_target
          AND d.lease_generation = p_generation
          AND d.status = 'claimed'
          AND d.lease_until >= e.t"""
# lp_finish's reconciliation (a statement of its own, after a finish that settled nothing).
_RECONCILE_GENERATION = "AND d.lease_generation = p_generation\n      AND d.status IN ('finished', 'failed')"
_RECONCILE_TARGET = "AND d.target_pubkey = p_target\n      AND d.lease_generation = p_generation\n      AND d.status IN"
# The rows lp_sweep reaps.
_DUE = "AND d.status = 'claimed' AND d.lease_until < t\n        FOR UPDATE OF d SKIP LOCKED"
Store = PostgresDeliveryStore


class ReconcileUnfenced(Store):
    """Finish's reconciliation tells any holder of the delivery (whatever its generation)
    the recorded terminal."""

    FUNCTIONS = edits(Patch("lp_finish", _RECONCILE_GENERATION, "AND d.status IN ('finished', 'failed')"))


class RenewIgnoresExpiry(Store):
    FUNCTIONS = edits(Patch("lp_renew", _EXPIRY, ""))


class FinishIgnoresExpiry(Store):
    FUNCTIONS = edits(Patch("lp_finish", _EXPIRY, ""))


class ClaimScopeUnchecked(Store):
    """The claim scopes by the request only: an expected binding of another community or
    target (a foreign wake) is not a miss, and every other expected field is still bound."""

    FUNCTIONS = edits(
        Patch(
            "lp_claim",
            "IF p_expected AND (p_expected_community IS DISTINCT FROM p_community",
            "IF false AND (p_expected_community IS DISTINCT FROM p_community",
        )
    )


class LeaseTargetUnbound(Store):
    """Renew, finish and the reconciliation ignore the lease's target."""

    FUNCTIONS = edits(
        Patch("lp_renew", "AND d.target_pubkey = p_target", ""),
        Patch(
            "lp_finish", "AND d.target_pubkey = p_target\n          AND d.lease_generation", "AND d.lease_generation"
        ),
        Patch("lp_finish", _RECONCILE_TARGET, "AND d.lease_generation = p_generation\n      AND d.status IN"),
    )


class ReapIgnoresFence(Store):
    """The sweep reaps every community's expired leases, whatever its state: a fenced (or
    quiescing) tenant's leases are reaped. (Before migration 0006 the delivery table's
    fence trigger refused that write, and the whole sweep aborted with it; 0006 dropped
    the trigger, the function's own check being the fence.)"""

    FUNCTIONS = edits(Patch("lp_sweep", "AND c.state = 'active'\n          " + _DUE, _DUE))


class ReapAtDeadline(Store):
    FUNCTIONS = edits(every("lp_sweep", "lease_until < t", "lease_until <= t"))


class LeaseLostAtDeadline(Store):
    FUNCTIONS = edits(
        Patch("lp_renew", _EXPIRY, "AND d.lease_until > e.t"),
        Patch("lp_finish", _EXPIRY, "AND d.lease_until > e.t"),
    )


class ClaimNewestFirst(Store):
    FUNCTIONS = edits(Patch("lp_claim", "ORDER BY d.created_at, d.id", "ORDER BY d.created_at DESC, d.id DESC"))


def _ignored(function: str, *conditions: str) -> tuple[Patch, ...]:
    """Each `AND condition` of `function` kept (its argument still bound) but always true."""
    return tuple(Patch(function, f"AND {c}", f"AND ({c} OR true)") for c in conditions)


class ClaimIgnoresCause(Store):
    FUNCTIONS = edits(
        *_ignored(
            "lp_claim",
            "d.cause_kind = p_cause_kind",
            "d.cause_event_id IS NOT DISTINCT FROM p_cause_event",
            "d.cause_scheduled_for IS NOT DISTINCT FROM p_cause_time",
            "d.cause_invocation_id IS NOT DISTINCT FROM p_cause_invocation",
        )
    )


class ReapKeepsGeneration(Store):
    FUNCTIONS = edits(
        Patch("lp_sweep", "lease_generation = d.lease_generation + 1", "lease_generation = d.lease_generation")
    )


class ReconcileEchoesRequest(Store):
    """The retry is told the outcome it asked for, not the one recorded."""

    FUNCTIONS = edits(
        Patch(
            "lp_finish",
            "SELECT d.status INTO status FROM workflow_agent_deliveries d",
            "SELECT p_outcome INTO status FROM workflow_agent_deliveries d",
        )
    )


class WritesTrustFenceTrigger(Store):
    """Writes skip the function's own check of the community's state and rely on the
    tables' write-fence triggers alone: only an unknown community is refused. A write
    that touches no row of a fenced tenant (a deletion that finds nothing, a claim
    that misses) is not refused, nor, since migration 0006 dropped the delivery
    table's trigger (the functions' own check is its fence), is any write of a
    delivery (commit, claim, renew, finish); a row written to another table still
    meets its trigger, which refuses it."""

    FUNCTIONS = edits(
        Patch(
            "lp_refusal",
            "WHEN state IS NULL THEN 'UnknownCommunity' WHEN state <> 'active' THEN 'CommunityNotWritable' END",
            "WHEN state IS NULL THEN 'UnknownCommunity' END",
        ),
        every("lp_commit_deliveries", "e.state = 'active'", "e.state IS NOT NULL"),
        every("lp_claim", "e.state = 'active'", "e.state IS NOT NULL"),
        Patch("lp_renew", "WHERE e.state = 'active'", "WHERE e.state IS NOT NULL"),
        Patch("lp_finish", "WHERE e.state = 'active'", "WHERE e.state IS NOT NULL"),
    )


class CommitNotAtomic(Store):
    """Each target commits on its own: a failing target leaves the others."""

    def commit_deliveries(self, c: m.CommitDeliveries) -> Any:
        created: list[uuid.UUID] = []
        for new in c.deliveries:
            outcome = super().commit_deliveries(attrs.evolve(c, deliveries=(new,)))
            created.extend(outcome.created)
        return m.Committed(tuple(created), outcome.identity_existed)


class DeliveryIdsReused(Store):
    """A deleted delivery's id may name a new row, where its old lease still acts: the
    commit does not look its new ids up among the retired ones."""

    FUNCTIONS = edits(
        Patch(
            "lp_commit_deliveries",
            """
               OR (SELECT true FROM retired_delivery_ids r WHERE r.community_id = p_community AND r.id = u.id)
                   IS NOT NULL AS used""",
            " AS used",
        )
    )


# -- from the field: the bug classes public job queues shipped (specs/guarantees.md) --------


class FinishByState(Store):
    """A completion matched by the job's id and state alone (no attempt, holder or
    deadline): a stale holder completes the attempt of whoever claimed the job since."""

    FUNCTIONS = edits(Patch("lp_finish", _HELD, "AND d.status = 'claimed'"))


class HeartbeatById(Store):
    """A heartbeat matched by the job's id (and that it is claimed): a stale holder's
    heartbeat extends the new holder's lease, an expired holder's revives its own."""

    FUNCTIONS = edits(Patch("lp_renew", _HELD, "AND d.status = 'claimed'"))


class FinishByWorker(Store):
    """A completion fenced by the worker's identity (the target) instead of the attempt: a
    restarted worker that reuses its identity completes a newer attempt."""

    FUNCTIONS = edits(
        Patch("lp_finish", "AND d.lease_generation = p_generation\n          AND d.status = 'claimed'",
              "AND d.status = 'claimed'")
    )  # fmt: skip


class RescueBeyondScope(Store):
    """A rescue that takes every claimed job of a tenant that has one expired lease, live
    leases included (the expiry is checked for the tenant, not for each row)."""

    FUNCTIONS = edits(Patch("lp_sweep", _DUE, "AND d.status = 'claimed'\n        FOR UPDATE OF d SKIP LOCKED"))


RESCUE_BATCH = 3  # the starved rescue's batch


class RescueBatchStarved(Store):
    """A rescue that picks its batch (the oldest claims) before it skips the rows it must
    leave (live leases): while the batch's live leases are renewed, an expired lease behind
    them is never rescued."""

    FUNCTIONS = edits(
        Patch(
            "lp_sweep",
            _DUE,
            "AND d.status = 'claimed' AND d.lease_until < t\n"
            "          AND (d.community_id, d.id) IN (SELECT b.community_id, b.id FROM workflow_agent_deliveries b\n"
            f"               WHERE b.status = 'claimed' ORDER BY b.claimed_at, b.id LIMIT {RESCUE_BATCH})\n"
            "        FOR UPDATE OF d SKIP LOCKED",
        )
    )


@attrs.frozen
class Mutant:
    name: str
    stands_for: str
    store: type[PostgresDeliveryStore]
    # The client a service holds the store through (a service mutant's is a variant of it).
    service: type[DeliveryService] = DeliveryService
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
    Mutant("reap-ignores-fence", "the fleet-wide sweep ignores a tenant's fence and reaps it", ReapIgnoresFence),
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
        "writes skip their own check of the tenant's state: a fenced tenant's write that no trigger meets is not refused",
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
