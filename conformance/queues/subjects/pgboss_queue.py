"""pg-boss (Node.js), driven through its public API by `node/pgboss.mjs`, as a lease queue.

One child process runs one `PgBoss` (a pool; sessions' requests run at once on it) on the search-path clock.

- install: `boss.start()` (pg-boss's migrations) and `createQueue`;
- enqueue: `boss.send(queue, {}, {expireInSeconds: lease, retryLimit: 1000, retryDelay: 0,
  startAfter: a second before now})`: pg-boss hands a job out only once `start_after < now()`,
  and under a pinned clock a job due at the instant it was sent never would be;
- fetch: `boss.fetch(queue, {batchSize: 1})`; complete: `boss.complete(queue, id)`, applied iff it
  says it affected the job;
- rescue: `boss.expire()`: every active job past `started_on + expire_in` goes back (`retry`);
- rows: `pgboss.job` of the queue: created, retry pending; active claimed; completed finished; failed, cancelled failed.
Capabilities: rescue. It is pg-boss 10 (12 needs Node.js 22): no heartbeat; no deadline (`complete`
matches the id and `state = 'active'`); no permanent failure (`fail()` retries while retries are left).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from leaseproof.conformance.queues.protocol import Held
from leaseproof.conformance.queues.subjects import clock
from leaseproof.conformance.queues.subjects.nodejs import NodeQueue, NodeSession, Unavailable
from leaseproof.model.queue import Answer, Capability, Seen

QUEUE = "leaseproof"
_STATUS = {
    "created": "pending", "retry": "pending", "active": "claimed",
    "completed": "finished", "failed": "failed", "cancelled": "failed",
}  # fmt: skip
__all__ = ["PgBossQueue", "Unavailable"]


class _Session(NodeSession):
    def fetch(self) -> Held | None:
        job = self.child.call("fetch")
        return None if job is None else Held(str(job), str(job))

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        return Answer.APPLIED if self.child.call("complete", job=handle) == 1 else Answer.REFUSED

    def rescue(self) -> None:
        self.child.call("expire")


class PgBossQueue(NodeQueue, _Session):
    name = "pg-boss"
    script = "pgboss.mjs"
    session_class = _Session
    capabilities = frozenset({Capability.RESCUE})

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.lease_seconds = 30

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.lease_seconds = lease_seconds
        clock.start_over(self.sql, start, "DELETE FROM pgboss.job WHERE name = %s", (QUEUE,))

    def enqueue(self) -> str:
        due = clock.now(self.sql) - dt.timedelta(seconds=1)
        return str(self.child.call("enqueue", lease=self.lease_seconds, start_after=due.isoformat()))

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds)

    def rows(self) -> dict[str, Seen]:
        found = self.sql.execute("SELECT id::text, state::text FROM pgboss.job WHERE name = %s", (QUEUE,)).fetchall()
        return {job: Seen(_STATUS[state]) for job, state in found}
