"""Service mutants: bugs that show when the store runs as a service runs it, under faults.

Each is one way a lease queue fails its users in production, stated as the clause of the
nemesis's audit that catches it (`conformance/concurrent/nemesis.py`): a delivery lost, one
settled twice, a stale holder's finish accepted, one generation handed to two claims, a
reaper held up by one tenant's stall; the sixth clause, a delivery nobody will process,
is the fault mutant's (`faults.py`: claim-then-deadline). The kill matrix runs the nemesis
against each (`leaseproof mutants --kind service`), and against the bundled store on the
same seeds, which must pass. Several are also visible to the lockstep or to
stress; what these mutants are for is the evidence that the nemesis's audit catches what
it claims to.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from leaseproof.impl.delivery.service import DeliveryService
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.migrate import Patch
from leaseproof.impl.mutants.delivery import Mutant, edits
from leaseproof.model import delivery as m

Store = PostgresDeliveryStore


class ReapDeletes(Store):
    """The sweep deletes an expired delivery instead of returning it to pending: lost."""

    FUNCTIONS = edits(
        Patch(
            "lp_sweep",
            """UPDATE workflow_agent_deliveries d
        SET status = 'pending', lease_generation = d.lease_generation + 1,
            lease_until = NULL, claimed_at = NULL, claim_key = NULL
        FROM due""",
            """DELETE FROM workflow_agent_deliveries d
        USING due""",
        )
    )


class FinishRetrySettlesAgain(Store):
    """A finish that finds its own holder's terminal already recorded (a retry whose first
    attempt committed) answers Settled again, where the model answers AlreadyTerminal: the
    caller counts the delivery settled twice."""

    FUNCTIONS = edits(
        Patch(
            "lp_finish",
            "outcome := CASE WHEN FOUND THEN 'AlreadyTerminal' ELSE 'LeaseLost' END;",
            "outcome := CASE WHEN FOUND THEN 'Settled' ELSE 'LeaseLost' END;",
        )
    )


class FinishIgnoresGeneration(Store):
    """A finish settles the row whatever its generation: a holder whose lease was reaped and
    taken by another settles the new holder's delivery."""

    FUNCTIONS = edits(
        Patch(
            "lp_finish",
            "          AND d.lease_generation = p_generation\n          AND d.status = 'claimed'",
            "          AND d.status = 'claimed'",
        )
    )


class GenerationNeverMoves(Store):
    """Neither a claim nor the sweep moves the generation past 1: the claim after a reap
    hands out the generation the reaped holder had."""

    FUNCTIONS = edits(
        Patch(
            "lp_claim",
            "lease_generation = d.lease_generation + 1",
            "lease_generation = greatest(d.lease_generation, 1)",
        ),
        Patch("lp_sweep", "lease_generation = d.lease_generation + 1", "lease_generation = d.lease_generation"),
    )


class SweepWaitsForLocks(Store):
    """The sweep waits, without a bound, for an expired row another session holds locked,
    where the bundled one skips it and reports it: one stalled tenant holds up the reaping
    of every tenant for as long as the stall lasts."""

    FUNCTIONS = edits(
        Patch("lp_sweep", "FOR UPDATE OF d SKIP LOCKED", "FOR UPDATE OF d"),
        Patch(
            "lp_sweep",
            "    PERFORM lp_require_fleet();",
            "    PERFORM lp_require_fleet(), set_config('lock_timeout', '0', true);",
        ),
    )


class ResendsClaimUnderANewKey(DeliveryService):
    """The client makes a claim's request key per attempt, not per claim: a claim whose
    answer was lost after it committed is sent again under another key, which takes the
    next pending delivery. The first stays claimed by nobody until its lease runs out (a
    delivery held up by one lease, a worker's lease wasted). The store is the bundled
    one; no lockstep or stress run sends anything twice, so only a lost answer shows it."""

    def execute(self, command: m.Command) -> m.Outcome:
        if not isinstance(command, m.Claim) or command.request_key is None:
            return super().execute(command)
        attempts = itertools.count()

        def attempt(store: Any) -> Any:
            return store.execute(attrs.evolve(command, request_key=f"{command.request_key}/{next(attempts)}"))

        return self._call("Claim", command, attempt)


SERVICE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("reap-deletes", "lost: the sweep deletes an expired delivery instead of returning it", ReapDeletes),
    Mutant(
        "finish-retry-settles-again",
        "settled twice: a finish retried after its first attempt committed answers Settled again",
        FinishRetrySettlesAgain,
    ),
    Mutant(
        "finish-ignores-generation",
        "stale accepted: a reaped holder's finish settles the next holder's delivery",
        FinishIgnoresGeneration,
    ),
    Mutant(
        "generation-never-moves",
        "one generation claimed twice: neither claim nor reap moves the generation past 1",
        GenerationNeverMoves,
    ),
    Mutant(
        "sweep-waits-for-locks",
        "not live: the sweep waits for one stalled tenant's locked rows and reaps nobody meanwhile",
        SweepWaitsForLocks,
    ),
    Mutant(
        "resend-claim-new-key",
        "orphaned lease: a claim whose answer was lost is sent again under a new request key",
        PostgresDeliveryStore,
        ResendsClaimUnderANewKey,
    ),
)
