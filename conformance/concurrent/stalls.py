"""Who waited for a stalled tenant: the liveness half of a stall.

A stall (`history.Stall`, struck by `faults.Staller`) holds one tenant's rows
locked, as a client stuck mid-transaction does. A write to one of those rows
may wait for it; nothing else should. A sweep passes over what it finds held
(the seeds: one tenant can never hold up the sweep of the others), and an
operation of another tenant has no row of the stalled one to wait for. So an
operation that must not wait, and was in flight from before the stall's
`patient` tick until after its `letting_go` tick, WAIT_BOUND seconds later,
when the stall began to let its locks go, waited for it: a finding, though
every outcome may be linearizable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from leaseproof.conformance.concurrent.history import History, Operation, Stall
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc

# An operation in flight this long, up to the end of a stall, waited for it: a healthy one
# answers in milliseconds, and a loaded machine's slowest, in the bundled nemesis, in 0.55 s.
WAIT_BOUND = 1.5


def holding(state: Any) -> list[Any]:
    """The tenants with a delivery claimed in `state`, in id order: where a stalled client,
    which is a lease holder stuck mid-transaction, stalls (none for the lifecycle)."""
    deliveries = getattr(state, "deliveries", None) or {}
    return sorted({key[0] for key, row in deliveries.items() if row.status is d.Status.CLAIMED})


def tenant_of(command: Any) -> Any | None:
    """The tenant whose rows the command is about (None: the fleet's, or none in particular)."""
    if isinstance(command, d.Renew | d.Finish):
        return command.lease.community_id
    if isinstance(command, lc.SaveDefinition):
        return command.event.community_id
    return getattr(command, "community_id", None)


def must_not_wait(command: Any, stalled: Any) -> bool:
    """Whether the command has no business waiting for the tenant `stalled`'s locks: a
    sweep, or an operation of another tenant."""
    if isinstance(command, d.Reap):
        return True
    tenant = tenant_of(command)
    return tenant is not None and tenant != stalled


@attrs.frozen
class Waited:
    """An operation that waited for a stall it must not wait for."""

    operation: Operation
    stall: Stall


def waited(history: History) -> Sequence[Waited]:
    """The operations of `history` that waited for a stall they must not wait for."""
    return [
        Waited(op, stall)
        for stall in history.stalls
        if stall.by == "stall"  # the contention injector's holds are there to be waited for
        for op in history.operations
        if op.invoked < stall.patient
        and op.returned is not None
        and op.returned > stall.letting_go
        and must_not_wait(op.command, stall.key)
    ]
