"""chancy, driven through its public API (`Chancy`, `Worker`, an executor, the `Recovery` plugin), as a lease queue.

chancy's lease is its worker's heartbeat: a job is `running`, `taken_by` a worker, and is abandoned
once no row of `chancy_workers` for that worker has `last_seen >= now() - heartbeat_timeout`. Each
fetch claims the job under a fresh `claim_id`, and a worker's write of a job's outcome is fenced by
that claim.

- install: `chancy.migrate()` and `chancy.declare(Queue("leaseproof"))`, through connections on the
  search-path clock (`clock.py`);
- enqueue: `chancy.push(Job(func=..., queue="leaseproof", max_attempts=1000,
  scheduled_at=clock.now(conn)))`. chancy's `Job.scheduled_at` defaults to the client's clock
  (`datetime.now`), which the pinned clock does not move, so the job is due at the database clock's
  instant (a fetch takes it once `scheduled_at <= now()`). 1,000 attempts: nothing runs out;
- fetch: chancy has no "fetch one job now" call for a holder: a worker's queue loop calls
  `Worker.fetch_jobs(queue, conn, up_to=...)`. So a new `Worker(heartbeat_timeout=lease)`, announced
  first as a started worker does (`announce_worker(conn)`, its own transaction), then
  `fetch_jobs(queue, conn, up_to=1)`. The holder's handle is the fetched `QueuedJob` (its id and
  `claim_id`) and the worker's id: data;
- heartbeat: `Worker(worker_id=...).announce_worker(conn)`, the worker's heartbeat (it renews every
  job the worker holds; each worker holds one): applied iff the job is then `running`, taken by that
  worker under the handle's claim;
- complete: what the worker's executor does once the job function returned:
  `AsyncExecutor(worker, queue).on_job_completed(job=<fetched QueuedJob>, exc=None)` (it queues the
  update, `worker.queue_update`), then `worker.flush()`, which writes it (an UPDATE by id and
  `claim_id`). `flush` returns nothing: the rows decide. A failure (`exc` given) is retried while
  attempts remain: no `fail`;
- rescue: `Recovery.recover(worker, chancy, cursor)`, the plugin's sweep, on demand, by a worker whose
  `heartbeat_timeout` is the lease (the rescuer's own timeout is the one it applies);
- rows: `chancy_jobs` by id: pending and retrying pending, running claimed, succeeded finished, failed
  failed.

Capabilities: heartbeat, rescue. No deadline: a write is fenced by the claim alone, whatever the time, so
a holder whose heartbeat ran out keeps its job until a rescue. No fail: with attempts left a failure is
`retrying`, pending again.

Time sources: chancy's SQL reads `NOW()` (fetch, heartbeat, recovery), which the search-path clock moves.
The client's clock is read for `Job.scheduled_at`'s default (replaced here by the database clock's
instant) and for a completion's `completed_at` (written, never read by a lease decision).

Found: `Recovery.recover` is one READ COMMITTED statement whose `NOT EXISTS` reads `chancy_workers` as of
its start while `FOR UPDATE OF cj` rechecks only the job's own row: a sweep that began before another
sweep rescued a job and a new worker announced itself and fetched it takes that live lease
(rescue-only-expired, in 3 of about 5,000 rounds of two rescues racing a fetch; chancy runs Recovery
on its leader only, so it needs two workers that both believe they lead).
tests/conformance/queues/test_chancy_queue.py makes the interleaving certain.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.metadata
import logging
from typing import Any

import attrs
import psycopg

from leaseproof.conformance.queues.protocol import Held, SubjectUnavailable
from leaseproof.conformance.queues.subjects import clock
from leaseproof.model.queue import Answer, Capability, Seen

QUEUE = "leaseproof"
FUNC = "leaseproof.conformance.queues.subjects.chancy_queue.noop"
MAX_ATTEMPTS = 1000  # no run reaches it: a failure or a rescue returns the job to pending
_STATES = {
    "pending": "pending",
    "retrying": "pending",
    "running": "claimed",
    "succeeded": "finished",
    "failed": "failed",
}
_TABLES = "chancy_jobs, chancy_workers, chancy_queue_rate_limits"
_LOG = logging.getLogger("leaseproof.subjects.chancy")


async def noop() -> None:
    """The job's function (never run: the adapter completes the jobs it holds)."""


@attrs.frozen
class Handle:
    """A holder: the job as its worker fetched it (its id and claim) and that worker's id."""

    job: Any  # chancy.job.QueuedJob, a frozen dataclass
    worker_id: str


class ChancyClient:
    """One `Chancy` app on its own connection pool and event loop."""

    def __init__(self, dsn: str, lease_seconds: int) -> None:
        try:
            from chancy import Chancy, Queue  # type: ignore[import-not-found, import-untyped, unused-ignore]
        except ImportError as exc:
            raise SubjectUnavailable("chancy is not installed: pip install 'chancy==0.26.0'") from exc

        self.dsn = dsn
        self.lease_seconds = lease_seconds
        self.loop = asyncio.new_event_loop()
        self.chancy: Any = Chancy(
            dsn, no_default_plugins=True, min_connection_pool_size=1, max_connection_pool_size=2, log=_LOG
        )
        self.queue: Any = Queue(name=QUEUE)
        self.sql = psycopg.connect(dsn, autocommit=True)
        self.run(self.chancy.pool.open())

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def worker(self, worker_id: str | None = None) -> Any:
        from chancy.worker import Worker  # type: ignore[import-not-found, import-untyped, unused-ignore]

        return Worker(
            self.chancy, worker_id=worker_id, heartbeat_timeout=self.lease_seconds, register_signal_handlers=False
        )

    def fetch(self) -> Held | None:
        return self.run(self._fetch())  # type: ignore[no-any-return]

    async def _fetch(self) -> Held | None:
        worker = self.worker()  # a new worker for each fetch: a new holder
        async with self.chancy.pool.connection() as conn:
            await worker.announce_worker(conn)  # a started worker announces itself before it polls
        async with self.chancy.pool.connection() as conn:
            jobs = await worker.fetch_jobs(self.queue, conn, up_to=1)
        return Held(str(jobs[0].id), Handle(jobs[0], worker.worker_id)) if jobs else None

    def heartbeat(self, handle: Any) -> Answer:
        self.run(self._heartbeat(handle))
        row = self.sql.execute(
            "SELECT state, taken_by, claim_id FROM chancy_jobs WHERE id = %s", (handle.job.id,)
        ).fetchone()
        return Answer.APPLIED if row == ("running", handle.worker_id, handle.job.claim_id) else Answer.REFUSED

    async def _heartbeat(self, handle: Handle) -> None:
        async with self.chancy.pool.connection() as conn:
            await self.worker(handle.worker_id).announce_worker(conn)

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        self.run(self._complete(handle, outcome))
        return None  # flush() says nothing of what it wrote: the rows decide

    async def _complete(self, handle: Handle, outcome: str) -> None:
        from chancy.executors.asyncex import AsyncExecutor  # type: ignore[import-not-found, import-untyped, unused-ignore]

        worker = self.worker(handle.worker_id)
        executor = AsyncExecutor(worker, self.queue)
        failure = None if outcome == "finished" else RuntimeError("the holder failed the job")
        await executor.on_job_completed(job=handle.job, exc=failure)
        await worker.flush()

    def rescue(self) -> None:
        self.run(self._rescue())

    async def _rescue(self) -> None:
        from chancy.plugins.recovery import Recovery  # type: ignore[import-not-found, import-untyped, unused-ignore]
        from psycopg.rows import dict_row

        async with self.chancy.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cursor:
            await Recovery.recover(self.worker(), self.chancy, cursor)

    def close(self) -> None:
        try:
            self.run(self.chancy.pool.close())
        finally:
            self.loop.close()
            self.sql.close()


class ChancyQueue(ChancyClient):
    name = "chancy"
    capabilities = frozenset({Capability.HEARTBEAT, Capability.RESCUE})

    def __init__(self, dsn: str) -> None:
        try:
            self.version = importlib.metadata.version("chancy")
        except importlib.metadata.PackageNotFoundError as exc:
            raise SubjectUnavailable("chancy is not installed: pip install 'chancy==0.26.0'") from exc
        clock.install(dsn)
        super().__init__(clock.conninfo(dsn), 30)
        self.run(self._install())

    async def _install(self) -> None:
        await self.chancy.migrate()
        await self.chancy.declare(self.queue)

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.lease_seconds = lease_seconds
        clock.start_over(self.sql, start, f"TRUNCATE {_TABLES}")

    def enqueue(self) -> str:
        from chancy import Job  # type: ignore[import-not-found, import-untyped, unused-ignore]

        job = Job(func=FUNC, queue=QUEUE, max_attempts=MAX_ATTEMPTS, scheduled_at=clock.now(self.sql))
        return str(self.run(self.chancy.push(job)).identifier)

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds)

    def rows(self) -> dict[str, Seen]:
        found = self.sql.execute("SELECT id, state FROM chancy_jobs").fetchall()
        return {str(job): Seen(_STATES[state]) for job, state in found}

    def session(self) -> ChancyClient:
        return ChancyClient(self.dsn, self.lease_seconds)
