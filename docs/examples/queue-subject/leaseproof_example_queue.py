"""A lease queue on PostgreSQL, and the adapter through which `leaseproof guarantees` judges it.

The queue (`Queue`) is what a service would ship: one table, a fetch that skips rows other
fetches hold, and a holder fenced by its attempt number and its lease. Every change is one
`UPDATE` whose `WHERE` says when it may happen, so a holder whose lease ran out, or whose job
was rescued and fetched again, changes nothing.

The adapter (`ExampleQueue`) is the part a queue's author writes for leaseproof: it meets
`leaseproof.conformance.queues.protocol.QueueAdapter` (docs/queues.md, "Judging your own
queue"), driving the queue only through `Queue`'s methods and reading its rows. The queue
reads the time with `now()`, so the adapter moves it with leaseproof's search-path clock.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

from leaseproof.conformance.queues.protocol import Held
from leaseproof.conformance.queues.subjects import clock
from leaseproof.model.queue import Answer, Capability, Seen

SCHEMA = """
CREATE TABLE IF NOT EXISTS example_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'claimed', 'finished', 'failed')),
    attempt integer NOT NULL DEFAULT 0,
    lease_until timestamptz,
    CHECK ((status = 'claimed') = (lease_until IS NOT NULL))
)
"""


class Queue:
    """The queue: a client on one connection (autocommit: each call is one transaction)."""

    def __init__(self, dsn: str, lease_seconds: int) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.lease = dt.timedelta(seconds=lease_seconds)

    def install(self) -> None:
        self.conn.execute(SCHEMA)

    def enqueue(self) -> int:
        row = self.conn.execute("INSERT INTO example_jobs DEFAULT VALUES RETURNING id").fetchone()
        assert row is not None
        return int(row[0])

    def fetch(self) -> tuple[int, int] | None:
        """The oldest pending job, claimed: (its id, the attempt that holds it)."""
        row = self.conn.execute(
            """
            UPDATE example_jobs SET status = 'claimed', attempt = attempt + 1, lease_until = now() + %s
            WHERE id = (SELECT id FROM example_jobs WHERE status = 'pending' ORDER BY id
                        FOR UPDATE SKIP LOCKED LIMIT 1)
              AND status = 'pending'
            RETURNING id, attempt
            """,
            (self.lease,),
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def heartbeat(self, job: int, attempt: int) -> bool:
        """Extend the lease of `attempt`, if it still holds `job` and its lease is live."""
        return self._held(job, attempt, "lease_until = now() + %s", (self.lease,))

    def complete(self, job: int, attempt: int, outcome: str) -> bool:
        """Settle `job` as `outcome` ("finished" or "failed"), if `attempt` still holds it, live."""
        return self._held(job, attempt, "status = %s, lease_until = NULL", (outcome,))

    def rescue(self) -> int:
        """Return every job whose lease ran out to pending; how many."""
        done = self.conn.execute(
            "UPDATE example_jobs SET status = 'pending', lease_until = NULL"
            " WHERE status = 'claimed' AND lease_until < now()"
        )
        return done.rowcount

    def _held(self, job: int, attempt: int, assignments: str, values: tuple[Any, ...]) -> bool:
        done = self.conn.execute(
            f"UPDATE example_jobs SET {assignments} "  # the assignments: this module's own text
            "WHERE id = %s AND attempt = %s AND status = 'claimed' AND lease_until >= now()",
            (*values, job, attempt),
        )
        return done.rowcount == 1

    def close(self) -> None:
        self.conn.close()


class _Acts:
    queue: Queue

    def fetch(self) -> Held | None:
        got = self.queue.fetch()
        # The handle is plain data (job and attempt), so any client, on any thread, can act as it.
        return None if got is None else Held(str(got[0]), got)

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        job, attempt = handle
        return Answer.APPLIED if self.queue.complete(job, attempt, outcome) else Answer.REFUSED

    def rescue(self) -> None:
        self.queue.rescue()

    def close(self) -> None:
        self.queue.close()


class _Session(_Acts):
    def __init__(self, queue: Queue) -> None:
        self.queue = queue


class ExampleQueue(_Acts):
    """The adapter: `ExampleQueue(dsn)` on a scratch database of its own."""

    name = "example-queue"
    version = "1.0.0"
    capabilities = frozenset({Capability.HEARTBEAT, Capability.DEADLINE, Capability.RESCUE, Capability.FAIL})
    queue_class: type[Queue] = Queue  # the queue judged (a variant of it, in leaseproof's own tests)

    def __init__(self, dsn: str) -> None:
        clock.install(dsn)
        self.dsn = clock.conninfo(dsn)  # every connection reads the pinned clock's now()
        self.queue = self.queue_class(self.dsn, 30)
        self.queue.install()

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.queue.lease = dt.timedelta(seconds=lease_seconds)
        clock.start_over(self.queue.conn, start, "TRUNCATE example_jobs RESTART IDENTITY")

    def enqueue(self) -> str:
        return str(self.queue.enqueue())

    def heartbeat(self, handle: Any) -> Answer:
        job, attempt = handle
        return Answer.APPLIED if self.queue.heartbeat(job, attempt) else Answer.REFUSED

    def advance(self, seconds: int) -> None:
        clock.advance(self.queue.conn, seconds)

    def rows(self) -> dict[str, Seen]:
        found = self.queue.conn.execute("SELECT id, status FROM example_jobs").fetchall()
        return {str(job): Seen(status) for job, status in found}

    def session(self) -> _Session:
        """Another client: its own connection, for the races."""
        return _Session(self.queue_class(self.dsn, int(self.queue.lease.total_seconds())))
