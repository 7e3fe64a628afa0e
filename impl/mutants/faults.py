"""Fault mutants: an operation of the bundled store spread over two transactions.

One operation at a time, nothing comes between the two commits, so the sequential lockstep
cannot tell a fault mutant from the bundled store (its test proves it). What shows one is
a cut connection between the two (`conformance/concurrent/faults.py`: `stress
--terminate`, and the race rounds of `leaseproof guarantees` that cut a connection),
which leaves the first half committed as a real outage does. Under concurrency without
cuts, `leaseproof stress` meets it too when a tenant is fenced between the two commits
(the second is then refused after the first committed); the lease-queue profile, whose
one tenant is never fenced, sees it only in the rounds with a cut.
"""

from __future__ import annotations

import uuid
from typing import Any

from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.mutants.delivery import Mutant, _swap
from leaseproof.model import delivery as m

Store = PostgresDeliveryStore


class ClaimThenDeadline(Store):
    """A claim commits with a placeholder deadline (the longest lease there is), and a second
    transaction writes the lease's real one. A connection lost between the two leaves a
    job claimed, by a holder that never learned of it, until the placeholder runs out: no
    rescue takes it back in the meantime. (Queues that mark a job running first and
    record its timeout or worker in a later write have this shape.)"""

    SQL_SET_DEADLINE = """
        UPDATE workflow_agent_deliveries
        SET lease_until = lp_now() + make_interval(secs => %(lease_seconds)s)
        WHERE community_id = %(community_id)s AND id = %(delivery_id)s
          AND status = 'claimed' AND lease_generation = %(lease_generation)s
        RETURNING lease_until
    """

    SQL_CLAIM = _swap(
        Store.SQL_CLAIM,
        "lease_until = lp_now() + make_interval(secs => %(lease_seconds)s)",
        f"lease_until = lp_now() + make_interval(secs => {m.MAX_LEASE_SECONDS})",
    )

    def _fenced(self, sql: str, params: dict[str, Any], community_id: uuid.UUID) -> dict[str, Any]:
        row = super()._fenced(sql, params, community_id)
        if sql is not self.SQL_CLAIM or row["id"] is None:
            return row
        # A claim on its own commits before this; one under a request key shares its transaction.
        lease = {
            "community_id": row["community_id"],
            "delivery_id": row["id"],
            "lease_generation": row["lease_generation"],
        }
        deadline = self._one(self.SQL_SET_DEADLINE, {**lease, "lease_seconds": params["lease_seconds"]})
        return row if deadline is None else {**row, "lease_until": deadline["lease_until"]}


FAULT_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "claim-then-deadline",
        "a claim and its lease's deadline in two transactions: a cut between leaves a job no rescue takes",
        ClaimThenDeadline,
    ),
)
