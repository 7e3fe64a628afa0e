"""graphile-worker (Node.js), driven through its public API by `node/graphile.mjs`, as a lease queue.

- install: `runMigrations`, through a connection on the search-path clock (`clock.py`);
- enqueue: `addJob(task, {}, {maxAttempts: 1000})`, so a failure or a rescue requeues the job;
- fetch: no call takes one job, so a pool of one worker (`runTaskList`) whose handler holds the
  job, shut down at once; the holder is that pool (the job's `locked_by`), if its getJob found one;
- complete: resolve (or reject) the handler, then await the pool's shutdown (graphile's write);
  graphile answers nothing, the rows decide; a holder that completed already is refused;
- rescue: graphile's stale-lock reset, run on demand (`minResetLockedInterval: 1`). Its lock
  lasts a fixed 4 hours, so the profile's clock runs 480 times faster here (30 s is 4 hours);
- rows: `graphile_worker._private_jobs`: locked claimed, unlocked pending, out of attempts
  failed; a job whose success graphile reported and whose row is gone is finished.

Capabilities: rescue. No heartbeat, no deadline (completion deletes by id, whatever the lock), no `fail` (retried).
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
        clock.start_over(self.sql, start, "DELETE FROM graphile_worker._private_jobs")

    def enqueue(self) -> str:
        return str(self.child.call("enqueue"))

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds * self.scale)

    def rows(self) -> dict[str, Seen]:
        return {job: Seen(status) for job, status in self.child.call("rows").items()}
