"""procrastinate, driven through its public API (`App`, its `JobManager`), as a lease queue.

- install: `app.schema_manager.apply_schema_async()`, on the search-path clock (`clock.py`);
- enqueue: `task.defer_async()` of a no-op task, one job per call;
- fetch: `job_manager.fetch_job(queues=None, worker_id=...)` for a new `register_worker()`: the lease
  is the worker's heartbeat, so one worker per fetch makes it the holder's (job id, worker id);
- heartbeat: `job_manager.update_heartbeat(worker_id)`, which renews every job the worker holds:
  applied iff the job is then `doing` for that worker;
- complete: `job_manager.finish_job_by_id_async(id, SUCCEEDED | FAILED, delete_job=False)`: it
  raises when the job is neither `todo` nor `doing` (refused), else it applied;
- rescue: the documented pattern, on demand: `get_stalled_jobs(seconds_since_heartbeat=lease)`, then
  `retry_job(job, retry_at=now)` for each (a job finished in between raises, and is left);
- rows: `procrastinate_jobs` by id: todo pending, doing claimed, succeeded finished, failed failed.
Capabilities: heartbeat, rescue. No deadline: nothing refuses an old heartbeat's holder until a rescue.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.metadata
from typing import Any

import psycopg
import psycopg.errors

from leaseproof.conformance.queues.protocol import Held
from leaseproof.conformance.queues.subjects import clock
from leaseproof.model.queue import Answer, Capability, Seen

_STATUS = {"todo": "pending", "doing": "claimed", "succeeded": "finished", "failed": "failed"}
_TABLES = "procrastinate_jobs, procrastinate_workers, procrastinate_events, procrastinate_periodic_defers"


class _Client:
    """One procrastinate App on its own connector and event loop."""

    def __init__(self, dsn: str, lease_seconds: int) -> None:
        import procrastinate  # type: ignore[import-not-found, unused-ignore]

        self.jobs = procrastinate.jobs
        self.lease_seconds = lease_seconds
        self.loop = asyncio.new_event_loop()
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        self.task = self.app.task(name="noop", queue="leaseproof")(_noop)
        self.sql = psycopg.connect(dsn, autocommit=True)
        self.run(self.app.open_async())

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def fetch(self) -> Held | None:
        manager = self.app.job_manager
        worker = self.run(manager.register_worker())
        job = self.run(manager.fetch_job(queues=None, worker_id=worker))
        return None if job is None else Held(str(job.id), (job.id, worker))

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        status = self.jobs.Status.SUCCEEDED if outcome == "finished" else self.jobs.Status.FAILED
        try:
            self.run(self.app.job_manager.finish_job_by_id_async(handle[0], status, False))
        except Exception as exc:
            if _not_in_status(exc):
                return Answer.REFUSED
            raise
        return Answer.APPLIED

    def rescue(self) -> None:
        manager = self.app.job_manager
        stalled = self.run(manager.get_stalled_jobs(seconds_since_heartbeat=self.lease_seconds))
        at = clock.now(self.sql)
        for job in stalled:
            try:
                self.run(manager.retry_job(job, retry_at=at))
            except Exception as exc:
                if not _not_in_status(exc):  # else it finished between the read and the retry
                    raise

    def close(self) -> None:
        try:
            self.run(self.app.close_async())
        finally:
            self.loop.close()
            self.sql.close()


def _not_in_status(exc: BaseException) -> bool:
    """procrastinate's refusal of a finish or a retry: its function raises 'Job was not found
    or not in "doing" or "todo" status', or '... or has an invalid status to retry' (wrapped
    in its ConnectorException)."""
    cause = exc.__cause__
    return isinstance(cause, psycopg.errors.RaiseException) and str(cause).startswith("Job was not found or ")


async def _noop() -> None:
    return None


class ProcrastinateQueue(_Client):
    name = "procrastinate"
    capabilities = frozenset({Capability.HEARTBEAT, Capability.RESCUE, Capability.FAIL})

    def __init__(self, dsn: str) -> None:
        self.version = importlib.metadata.version("procrastinate")
        clock.install(dsn)
        self.dsn = clock.conninfo(dsn)
        super().__init__(self.dsn, 30)
        self.run(self.app.schema_manager.apply_schema_async())

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.lease_seconds = lease_seconds
        clock.start_over(self.sql, start, f"TRUNCATE {_TABLES} RESTART IDENTITY CASCADE")

    def enqueue(self) -> str:
        return str(self.run(self.task.defer_async()))

    def heartbeat(self, handle: Any) -> Answer:
        job_id, worker = handle
        self.run(self.app.job_manager.update_heartbeat(worker))
        row = self.sql.execute("SELECT status, worker_id FROM procrastinate_jobs WHERE id = %s", (job_id,)).fetchone()
        return Answer.APPLIED if row is not None and row == ("doing", worker) else Answer.REFUSED

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds)

    def rows(self) -> dict[str, Seen]:
        found = self.sql.execute("SELECT id, status::text FROM procrastinate_jobs").fetchall()
        return {str(job_id): Seen(_STATUS[status]) for job_id, status in found}

    def session(self) -> _Client:
        return _Client(self.dsn, self.lease_seconds)
