"""graphile-worker (Node.js), driven through its public API by `node/graphile.mjs`, as a lease queue.

graphile-worker is pinned in `node/package-lock.json` and installed on first use (`nodejs.py`).
It has no call that takes one job. A fetch starts a worker pool of one worker (`runTaskList`)
whose task handler holds the job; the pool shuts down at once, so it takes no other job. The
holder is that pool: its id is the job's `locked_by`. A completion resolves the handler (or
rejects it), then waits for the pool's shutdown, which waits for graphile's write.

- install: `runMigrations`, through a connection on the search-path clock (`clock.py`);
- enqueue: `addJob(task, {}, {maxAttempts: 1000})`, so that a failure or a rescue returns the job
  to the queue;
- fetch: as above; nothing is handed out if the pool's one getJob found nothing;
- complete: resolve the holder's handler (finished). graphile-worker answers nothing: the rows
  decide. A holder that completed already has no second completion (refused);
- rescue: graphile's own stale-lock reset (locks older than its fixed 4 hours), run on demand by a
  pool whose reset timer fires at once (`minResetLockedInterval: 1`);
- rows: `graphile_worker._private_jobs` (locked claimed, unlocked pending, out of attempts
  failed); a success deletes the row, so a job whose success graphile reported and whose row is
  gone is finished.

graphile-worker's lock lasts a fixed 4 hours, which no option changes. This adapter runs the
profile's clock 480 times faster: a profile second is 8 minutes, so the profile's 30-second lease
is graphile's 4 hours, and the profile's instants just before, at and just after a deadline are
graphile's.

Capabilities: rescue. No heartbeat, no deadline (its completion deletes the job by id, whatever
the lock), no permanent failure (a failure is retried with backoff).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from leaseproof.conformance.queues.protocol import Held
from leaseproof.conformance.queues.subjects import clock
from leaseproof.conformance.queues.subjects.nodejs import NodeQueue, NodeSession, Unavailable
from leaseproof.model.queue import Answer, Capability, Seen

GRAPHILE_LEASE = 4 * 3600  # seconds: graphile-worker's stale-lock age
__all__ = ["GraphileQueue", "Unavailable"]


class _Session(NodeSession):
    def fetch(self) -> Held | None:
        got = self.child.call("fetch")
        return None if got is None else Held(str(got["job"]), str(got["holder"]))

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        answer = self.child.call("complete", holder=handle, outcome=outcome)
        return Answer.REFUSED if answer == "refused" else None

    def rescue(self) -> None:
        self.child.call("rescue")


class GraphileQueue(NodeQueue, _Session):
    name = "graphile-worker"
    script = "graphile.mjs"
    session_class = _Session
    capabilities = frozenset({Capability.RESCUE})

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.scale = GRAPHILE_LEASE // 30

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.scale = GRAPHILE_LEASE // lease_seconds
        self.child.call("forget")  # every held job let go (a failure, fenced by its pool), then forgotten
        with self.sql.transaction():
            self.sql.execute("DELETE FROM graphile_worker._private_jobs")
            clock.pin(self.sql, start)

    def enqueue(self) -> str:
        return str(self.child.call("enqueue"))

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds * self.scale)

    def rows(self) -> dict[str, Seen]:
        return {job: Seen(status) for job, status in self.child.call("rows").items()}
