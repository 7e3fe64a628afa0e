"""What a queue offers to be judged by the lease-queue profile (`leaseproof.model.queue`).

An adapter drives one queue through its public API, on a database of its own:
it enqueues, fetches as a worker, heartbeats and completes as the holder that
fetched, runs the queue's rescue, moves the queue's clock, and reads every
job's row. A holder's `handle` is whatever the adapter needs to act as that
holder again later (a lease, a job object, a worker's id): the profile never
looks inside it, and keeps using old handles after the job moved on; that is how
stale holders are made.

Everything a queue does differently and legitimately is the adapter's to
declare: the capabilities it has (`model.queue.Capability`; a guarantee that
needs one it lacks is not applicable), and how its rows map to the profile's
statuses (`Seen`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol, runtime_checkable

import attrs

from leaseproof.model.queue import Answer, Capability, Seen


@attrs.frozen
class Held:
    """What a fetch handed out: the job (the queue's id for it, as text) and the holder's handle."""

    job: str
    handle: Any


@runtime_checkable
class QueueSession(Protocol):
    """Another client of the same queue, on its own connection (for the races)."""

    def complete(self, handle: Any, outcome: str) -> Answer | None: ...

    def rescue(self) -> None: ...

    def fetch(self) -> Held | None: ...

    def close(self) -> None: ...


@runtime_checkable
class QueueAdapter(Protocol):
    """One queue, driven through its public API."""

    @property
    def name(self) -> str:
        """The subject's name in the matrix."""

    @property
    def version(self) -> str:
        """The library's version (or the checkout's, for the bundled store)."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What of the queue's contract it has (a heartbeat, a rescue, ...)."""

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        """An empty queue whose clock reads `start`; every lease (from a fetch or a
        heartbeat) lasts `lease_seconds`."""

    def enqueue(self) -> str:
        """Enqueue one job, its own commit; its id."""

    def fetch(self) -> Held | None:
        """Fetch one job as a new worker; None if the queue hands out nothing."""

    def heartbeat(self, handle: Any) -> Answer:
        """Renew the lease of the holder `handle` (with `Capability.HEARTBEAT`)."""

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        """Complete as holder `handle` ("finished" or "failed"); None if the queue's API
        does not say what it did (the rows decide)."""

    def rescue(self) -> None:
        """Run the queue's rescue of expired leases once (with `Capability.RESCUE`)."""

    def advance(self, seconds: int) -> None:
        """Move the queue's clock forward."""

    def rows(self) -> dict[str, Seen]:
        """Every job's row, by job id."""

    def session(self) -> QueueSession:
        """Another client of the same queue."""

    def close(self) -> None: ...
