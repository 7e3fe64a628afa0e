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

The conventions an adapter keeps (docs/queues.md, "Judging your own queue"):

- **Made as `Class(dsn)`** on an empty database of its own, into which it installs the
  queue's schema. A queue that cannot run here raises `SubjectUnavailable`, saying what to
  install; a library is imported inside the adapter, not at the top of its module.
- **A handle works from any client and any thread.** The races hand a holder's handle to
  another client (`session()`) running on another thread: a handle is data (a job id and
  an attempt, a lease, a worker's id), not a connection or a pool bound to one client.
- **Every fetch is a new holder.** A queue that heartbeats or completes by worker gets a
  new worker (or queue manager) for each fetch, so two fetches never share a holder.
- **Nothing runs out of attempts.** A queue that skips jobs that used up their attempts
  is set up with a limit no run reaches (graphile-worker's adapter enqueues with 1,000),
  so a rescue or a failure returns a job to pending as the profile expects.
- **`complete` answers what the queue said**: `Answer.APPLIED`, `Answer.CREDITED` (told the
  completion was recorded before) or `Answer.REFUSED`; None when the queue's API says
  nothing, and the rows decide what it did.
- **A queue without a "fetch one job now" call** is fetched from as its worker would:
  a worker (or a pool of one) that takes one job, holds it in its handler until the
  adapter completes it, and is shut down once it has one (graphile_queue.py); a fetch
  that finds nothing returns None.
- **The lease boundary**: a lease is live while `lease_until >= now`, and a rescue takes
  a job whose `lease_until < now`. The generated programs move the clock by whole
  seconds, the lease's length among them, so they do land on the instant a lease ends.
  A queue whose lease is over at that instant (it takes a job over at
  `lease_until <= now`, or renews only while `lease_until > now`) declares
  `Capability.ENDS_AT_EXPIRY` and is judged by that boundary, its rows read by it too.
- **The clock** is the database's: `reset(start, ...)` pins it at `start` and
  `advance` moves it. A queue that reads `now()`, `transaction_timestamp()`,
  `statement_timestamp()` or `clock_timestamp()` is moved by the search-path clock
  (`subjects/clock.py`, as the example subject does); one whose SQL says
  `CURRENT_TIMESTAMP` or the other time keywords asks for them to be made over at the
  wire with a class attribute `clock_keywords = True`; one that stamps times with the
  client's clock is given the database's (`clock.now`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol, runtime_checkable

import attrs

from leaseproof.model.queue import Answer, Capability, Seen


class SubjectUnavailable(Exception):
    """The queue cannot run here (its library is not installed, a tool it needs is missing): an
    adapter's constructor raises it, saying how to install what is missing."""


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
