"""The bundled delivery store as a lease queue: one community, one workflow run, one target.

Each job is one delivery committed as its own step; a fetch is an unkeyed
`Claim` of the target; a heartbeat is `Renew`, a completion `Finish`, a
rescue `Reap`, and the clock is the store's pinned test clock. A holder's
handle is its `Lease`. The store's answers say what each act did:
`Settled` applied, `AlreadyTerminal` credited (told its completion was
recorded before), `Renewed` applied, `LeaseLost` refused.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import uuid
from typing import Any

from leaseproof.conformance.queues.protocol import Held
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter, PostgresDeliverySession
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, EventCause
from leaseproof.model.queue import Answer, Capability, Seen

COMMUNITY, WORKFLOW, RUN = uuid.UUID(int=0xC0), uuid.UUID(int=0x100), uuid.UUID(int=0x200)
TARGET, MESSAGE, DEFINITION, CAUSE = b"\x07" * 32, b"\x03" * 32, b"\x04" * 32, b"\x05" * 32
_SET_UP = (
    m.CreateCommunity(COMMUNITY),
    m.CreateWorkflow(COMMUNITY, WORKFLOW),
    m.CreateRun(COMMUNITY, WORKFLOW, RUN),
    m.PublishEvent(COMMUNITY, MESSAGE),
)


def _version() -> str:
    try:
        return importlib.metadata.version("leaseproof")
    except importlib.metadata.PackageNotFoundError:
        return "this checkout"


class _Acts:
    """The acts a session of the store can run (shared by the adapter and its sessions)."""

    delivery: PostgresDeliverySession
    lease_seconds: int

    def fetch(self) -> Held | None:
        got = self.delivery.execute(m.Claim(COMMUNITY, TARGET, self.lease_seconds))
        if not isinstance(got, m.Claimed):
            return None
        return Held(job_name(got.lease.delivery_id), got.lease)

    def heartbeat(self, handle: Any) -> Answer:
        got = self.delivery.execute(m.Renew(handle, self.lease_seconds))
        return Answer.APPLIED if isinstance(got, m.Renewed) else Answer.REFUSED

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        got = self.delivery.execute(m.Finish(handle, m.Status(outcome)))
        if isinstance(got, m.Settled):
            return Answer.APPLIED
        return Answer.CREDITED if isinstance(got, m.AlreadyTerminal) else Answer.REFUSED

    def rescue(self) -> None:
        self.delivery.execute(m.Reap())

    def close(self) -> None:
        self.delivery.close()


def job_name(delivery_id: uuid.UUID) -> str:
    """A job's id in the matrix's traces: the number it was enqueued as."""
    return f"j{delivery_id.int}"


class BundledSession(_Acts):
    def __init__(self, adapter: BundledQueue) -> None:
        self.delivery = adapter.delivery.session()
        self.lease_seconds = adapter.lease_seconds


class BundledQueue(_Acts):
    """The store (or a variant of it: `store_class`) on the database at `dsn`."""

    capabilities = frozenset({Capability.HEARTBEAT, Capability.DEADLINE, Capability.RESCUE, Capability.FAIL})

    def __init__(
        self, dsn: str, store_class: type[PostgresDeliveryStore] = PostgresDeliveryStore, name: str = "leaseproof"
    ) -> None:
        self.delivery: PostgresDeliveryAdapter = PostgresDeliveryAdapter(dsn, store_class)
        self.name = name
        self.version = _version()
        self.lease_seconds = 30
        self._enqueued = 0

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.delivery.reset(start)
        self.lease_seconds, self._enqueued = lease_seconds, 0
        for command in _SET_UP:
            self.delivery.execute(command)

    def enqueue(self) -> str:
        self._enqueued += 1
        delivery_id = uuid.UUID(int=self._enqueued)
        binding = Binding(
            COMMUNITY, WORKFLOW, RUN, f"step-{self._enqueued}", TARGET, DEFINITION, MESSAGE, EventCause(CAUSE)
        )
        got = self.delivery.execute(
            m.CommitDeliveries(COMMUNITY, RUN, binding.step_id, [m.NewDelivery(delivery_id, binding)])
        )
        if got != m.Committed((delivery_id,), False):
            raise RuntimeError(f"the commit of job {self._enqueued} answered {got}")
        return job_name(delivery_id)

    def advance(self, seconds: int) -> None:
        self.delivery.execute(m.AdvanceClock(dt.timedelta(seconds=seconds)))

    def rows(self) -> dict[str, Seen]:
        deliveries = self.delivery.snapshot().deliveries.values()
        return {job_name(d.id): Seen(d.status.value) for d in deliveries}

    def session(self) -> BundledSession:
        return BundledSession(self)
