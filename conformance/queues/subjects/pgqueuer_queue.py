"""PgQueuer, driven through its public API (`pgqueuer.queries.Queries` on its psycopg driver), as a lease queue.

- install: `Queries.install()`, through a connection on the search-path clock (`clock.py`);
- enqueue: `queries.enqueue("noop", None, execute_after=-1 s)`: due a second before it was enqueued,
  since PgQueuer takes a job only once `execute_after < now()`, and the pinned clock does not move;
- fetch: `queries.dequeue(batch_size=1, ..., queue_manager_id=<new>, heartbeat_timeout=lease)`, as a
  new queue manager each time; a dequeue also takes over a picked job whose heartbeat is older than
  its timeout: PgQueuer's rescue is inside the fetch (takeover);
- heartbeat: `queries.update_heartbeat([job id])`: applied iff the job is then picked;
- complete: `queries.log_jobs([(job, "successful" | "exception", None)])`, what its worker logs for
  a job that returned or raised; the API answers nothing, the rows decide;
- rows: the queue table by id (queued pending, picked claimed, failed failed), and for a job no
  longer there its latest log entry (successful finished, exception failed).
Capabilities: heartbeat, takeover. No deadline (nothing refused until another dequeue takes the job), no rescue.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.metadata
import uuid
from typing import Any

import psycopg

from leaseproof.conformance.queues.protocol import Held
from leaseproof.conformance.queues.subjects import clock
from leaseproof.model.queue import Answer, Capability, Seen

ENTRYPOINT = "noop"
_QUEUED = {"queued": "pending", "picked": "claimed", "failed": "failed"}
_LOGGED = {"successful": "finished", "exception": "failed"}
_ROWS = f"""
    SELECT id, status::text FROM pgqueuer
    UNION ALL
    SELECT DISTINCT ON (job_id) job_id, status::text FROM pgqueuer_log
    WHERE status IN ({", ".join(repr(s) for s in _LOGGED)}) AND job_id NOT IN (SELECT id FROM pgqueuer)
    ORDER BY 1, 2
"""


class _Client:
    """One `Queries` on its own connection and event loop."""

    def __init__(self, dsn: str, lease_seconds: int) -> None:
        from pgqueuer import PsycopgDriver  # type: ignore[import-not-found, unused-ignore]
        from pgqueuer.queries import EntrypointExecutionParameter, Queries  # type: ignore[import-not-found, unused-ignore]

        self.lease_seconds = lease_seconds
        self.loop = asyncio.new_event_loop()
        self.conn = self.run(psycopg.AsyncConnection.connect(dsn, autocommit=True))
        self.queries = Queries(PsycopgDriver(self.conn))
        self.entrypoints: dict[Any, Any] = {ENTRYPOINT: EntrypointExecutionParameter(concurrency_limit=0)}

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def fetch(self) -> Held | None:
        manager: Any = uuid.uuid4()  # a new queue manager: a new holder
        jobs = self.run(
            self.queries.dequeue(
                batch_size=1,
                entrypoints=self.entrypoints,
                queue_manager_id=manager,
                global_concurrency_limit=None,
                heartbeat_timeout=dt.timedelta(seconds=self.lease_seconds),
            )
        )
        return Held(str(jobs[0].id), jobs[0]) if jobs else None

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        self.run(self.queries.log_jobs([(handle, "successful" if outcome == "finished" else "exception", None)]))
        return None  # PgQueuer says nothing: the rows decide

    def rescue(self) -> None:
        raise NotImplementedError("PgQueuer has no rescue on demand: a dequeue takes over stale jobs")

    def close(self) -> None:
        try:
            self.run(self.conn.close())
        finally:
            self.loop.close()


class PgQueuerQueue(_Client):
    name = "pgqueuer"
    capabilities = frozenset({Capability.HEARTBEAT, Capability.TAKEOVER, Capability.FAIL})

    def __init__(self, dsn: str) -> None:
        self.version = importlib.metadata.version("pgqueuer")
        clock.install(dsn)
        self.dsn = clock.conninfo(dsn)
        super().__init__(self.dsn, 30)
        self.run(self.queries.install())
        self.sql = psycopg.connect(self.dsn, autocommit=True)

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.lease_seconds = lease_seconds
        clock.start_over(self.sql, start, "TRUNCATE pgqueuer, pgqueuer_log RESTART IDENTITY")

    def enqueue(self) -> str:
        ids = self.run(self.queries.enqueue(ENTRYPOINT, None, execute_after=dt.timedelta(seconds=-1)))
        return str(ids[0])

    def heartbeat(self, handle: Any) -> Answer:
        self.run(self.queries.update_heartbeat([handle.id]))
        row = self.sql.execute("SELECT status::text FROM pgqueuer WHERE id = %s", (handle.id,)).fetchone()
        return Answer.APPLIED if row == ("picked",) else Answer.REFUSED

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds)

    def rows(self) -> dict[str, Seen]:
        found = self.sql.execute(_ROWS).fetchall()
        return {str(job): Seen(_QUEUED.get(status) or _LOGGED[status]) for job, status in found}

    def session(self) -> _Client:
        return _Client(self.dsn, self.lease_seconds)

    def close(self) -> None:
        try:
            self.sql.close()
        finally:
            super().close()
