"""The throughput benchmark's peers: procrastinate and PgQueuer, driven through their public APIs.

Each `*_round` function is handed the DSN of an empty database of its own. It
installs the library's schema there with the library's own installer (not
timed), then starts `workers` worker processes (multiprocessing, "spawn":
each imports the library itself and opens its own connections) and times them
from the moment all of them are ready until the last is done, as the store's
and the floor's rounds are timed (`throughput.py`). The jobs are
spread over the processes, `jobs // workers` each (the first `jobs % workers`
processes take one more), and each process runs its share of *cycles* in two
phases:

- phase A: it enqueues its share one job per call, each call its own commit
  (as a producer would); then it waits at a barrier for the other processes;
- phase B: it runs the library's worker, which claims and completes jobs with
  a no-op task until the queue is empty, and exits.

A cycle is therefore one public enqueue call plus one claim and one completion
by the library's worker machinery; which process completes which job is the
libraries' business. The time includes the worker's own start and shutdown
(the library's), not the processes'. After the processes have exited the round
checks, with psycopg on the library's own tables, that exactly `jobs` jobs were
enqueued and all completed; if not, or if a process failed or outlived
`PROCESS_TIMEOUT`, it raises `RuntimeError`.

procrastinate (its defaults, except where said):

- connector `PsycopgConnector(conninfo=dsn)`: a psycopg_pool
  `AsyncConnectionPool` per process at the pool's default size (4
  connections), which procrastinate opens with a liveness check on every
  checkout; schema by `app.schema_manager.apply_schema_async()`;
- the task: `async def noop() -> None`, registered by `app.task(name="noop")`,
  default queue, no lock, no retry;
- enqueue: `await task.defer_async()`, one job per call (one
  `procrastinate_defer_jobs_v1` statement, committed as the pool's connection
  is given back);
- worker: `app.run_worker_async(concurrency=1, wait=False)`: one job at a time
  per process (claim = one `procrastinate_fetch_job_v2` call, completion = one
  `procrastinate_finish_job_v1` call); `wait=False` makes the worker return as
  soon as a fetch finds no job, so its polling interval
  (`fetch_job_polling_interval`, default 5 s) never comes into play and is left
  at its default; `listen_notify` is left on (the worker LISTENs, which does
  not matter for a queue that is full when it starts); `delete_jobs` is left at
  "never", so completed jobs stay in `procrastinate_jobs` with status
  `succeeded`, which is what the check counts.

PgQueuer (its defaults, except where said):

- driver `AsyncpgDriver` over one asyncpg connection per process (the driver
  PgQueuer's documentation starts with), used for enqueueing, dequeueing,
  completion logging and LISTEN alike; schema by `Queries.install()` (durability
  "durable", the default), through its psycopg driver;
- enqueue: `await queries.enqueue("noop", None)`, one job per call, one
  autocommitted statement;
- worker: `QueueManager` with one entrypoint, `async def noop(job) -> None`
  registered by `manager.entrypoint("noop")` (its defaults: no concurrency limit), run by
  `QueueManager.run(mode=QueueExecutionMode.drain)`, the library's public stop
  condition: the worker shuts down once it finds no queued job and has no job
  in flight. Dequeue batch size 10 (the default; the subject `pgqueuer-1` sets
  `batch_size=1`, one job a dequeue as every other subject), so a process claims up to 10
  jobs per dequeue and runs them as concurrent asyncio tasks
  (`max_concurrent_tasks` unlimited, the default); completions are buffered
  and written in batches (the buffer holds up to the batch size, 10, and is
  also flushed every 0.1 s and on shutdown): a completed job is deleted from
  the `pgqueuer` table and logged in `pgqueuer_log` as `successful`, so the
  check counts `pgqueuer_log` (each job once `queued`, once `picked`, once
  `successful`, nothing else) and an empty queue table. New jobs are found
  through LISTEN/NOTIFY (every change of the queue table notifies);
  `dequeue_timeout`, the fallback poll when no notification comes, is set to
  `PGQUEUER_DEQUEUE_TIMEOUT` (0.01 s) instead of the default 30 s, so that a
  worker waiting for its last in-flight jobs never idles on it. Heartbeat and
  log aggregation intervals are the defaults.
- Its psycopg driver is not used for the workers: its notification watcher
  holds the one connection's lock while it waits (up to 1 s, fixed) for a
  notification, so at the end of a round, when notifications stop, each of a
  worker's last queries waits about 1 s (3-4 s a round, measured); the asyncpg
  driver listens without blocking queries.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import psycopg
import psycopg.conninfo

from leaseproof.conformance.evidence.timed import Clock, run_timed, shares

PROCESS_TIMEOUT = 120.0  # seconds: every worker process must have exited this long after the round's start
PGQUEUER_DEQUEUE_TIMEOUT = timedelta(seconds=0.01)
PGQUEUER_BATCH = 10  # its default dequeue batch; the `pgqueuer-1` subject takes one job a dequeue
TASK_NAME = "noop"  # the no-op task (procrastinate) or entrypoint (PgQueuer)
LIBRARIES = ("procrastinate", "pgqueuer")

ProcessBody = Callable[[str, int, Clock], None]


def versions() -> dict[str, str]:
    """The installed version of each peer library, or "not installed"."""
    found: dict[str, str] = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def procrastinate_round(dsn: str, workers: int, jobs: int) -> float:
    """Seconds for `workers` procrastinate processes to enqueue and complete `jobs` jobs (see the module's doc)."""
    expected = {"succeeded": jobs}
    return _round("procrastinate", dsn, workers, jobs, _procrastinate_install, _procrastinate_process,
                  _procrastinate_counts, expected)  # fmt: skip


def pgqueuer_round(dsn: str, workers: int, jobs: int) -> float:
    """Seconds for `workers` PgQueuer processes to enqueue and complete `jobs` jobs (see the module's doc)."""
    expected = {"left in queue": 0, "log: queued": jobs, "log: picked": jobs, "log: successful": jobs}
    return _round("pgqueuer", dsn, workers, jobs, _pgqueuer_install, _pgqueuer_process, _pgqueuer_counts, expected)


def pgqueuer_one_round(dsn: str, workers: int, jobs: int) -> float:
    """As `pgqueuer_round`, each dequeue taking one job (`batch_size=1`), as every other subject does."""
    expected = {"left in queue": 0, "log: queued": jobs, "log: picked": jobs, "log: successful": jobs}
    return _round("pgqueuer", dsn, workers, jobs, _pgqueuer_install, _pgqueuer_one_process, _pgqueuer_counts, expected)


def _round(
    library: str,
    dsn: str,
    workers: int,
    jobs: int,
    install: Callable[[str], Coroutine[Any, Any, None]],
    body: ProcessBody,
    counts: Callable[[str], dict[str, int]],
    expected: dict[str, int],
) -> float:
    """Install the library's schema, run the timed processes, and check that every job was done."""
    asyncio.run(install(dsn))
    elapsed = run_timed(
        body, [(dsn, share) for share in shares(workers, jobs)], timeout=PROCESS_TIMEOUT, state=lambda: counts(dsn)
    )
    found = counts(dsn)
    if found != expected:
        raise RuntimeError(f"{library}: expected {expected}; its tables have {found}")
    return elapsed


def _query_counts(dsn: str, query: str) -> dict[str, int]:
    with psycopg.connect(dsn) as connection:
        rows = connection.execute(query.encode()).fetchall()
    return {str(key): int(count) for key, count in rows}


# The libraries are imported where they are used: this module imports without
# leaseproof[bench]. Their imports carry `type: ignore[import-not-found]` (and
# `unused-ignore`, for when they are installed), and the task functions are
# registered by calling the libraries' decorators rather than decorating, so
# that `mypy` passes with or without the extra.


# procrastinate


async def _procrastinate_install(dsn: str) -> None:
    import procrastinate  # type: ignore[import-not-found, unused-ignore]

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


def _procrastinate_counts(dsn: str) -> dict[str, int]:
    return _query_counts(dsn, "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY status")


def _procrastinate_process(dsn: str, share: int, clock: Clock) -> None:
    asyncio.run(_procrastinate_cycles(dsn, share, clock))


async def _procrastinate_cycles(dsn: str, share: int, clock: Clock) -> None:
    import procrastinate  # type: ignore[import-not-found, unused-ignore]

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def noop() -> None:
        return None

    task = app.task(name=TASK_NAME)(noop)
    async with app.open_async():
        await clock.await_ready()
        for _ in range(share):
            await task.defer_async()
        await clock.await_wait()
        await app.run_worker_async(concurrency=1, wait=False)
        clock.done()


# PgQueuer


async def _pgqueuer_install(dsn: str) -> None:
    from pgqueuer import PsycopgDriver, Queries  # type: ignore[import-not-found, unused-ignore]

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        await Queries(PsycopgDriver(connection)).install()


def _pgqueuer_counts(dsn: str) -> dict[str, int]:
    return _query_counts(
        dsn,
        "SELECT 'left in queue', count(*) FROM pgqueuer"
        " UNION ALL SELECT 'log: ' || status::text, count(DISTINCT job_id) FROM pgqueuer_log GROUP BY status",
    )


def _pgqueuer_process(dsn: str, share: int, clock: Clock) -> None:
    asyncio.run(_pgqueuer_cycles(dsn, share, clock, PGQUEUER_BATCH))


def _pgqueuer_one_process(dsn: str, share: int, clock: Clock) -> None:
    asyncio.run(_pgqueuer_cycles(dsn, share, clock, 1))


async def _pgqueuer_cycles(dsn: str, share: int, clock: Clock, batch_size: int) -> None:
    import asyncpg  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from pgqueuer import AsyncpgDriver, Queries, QueueManager  # type: ignore[import-not-found, unused-ignore]
    from pgqueuer.types import QueueExecutionMode  # type: ignore[import-not-found, unused-ignore]

    connection = await asyncpg.connect(**_asyncpg_dsn(dsn))
    try:
        queries = Queries(AsyncpgDriver(connection))
        await clock.await_ready()
        for _ in range(share):
            await queries.enqueue(TASK_NAME, None)
        await clock.await_wait()

        manager = QueueManager(queries)

        async def noop(job: object) -> None:
            return None

        manager.entrypoint(TASK_NAME)(noop)
        await manager.run(
            dequeue_timeout=PGQUEUER_DEQUEUE_TIMEOUT, batch_size=batch_size, mode=QueueExecutionMode.drain
        )
        clock.done()
    finally:
        await connection.close()


def _asyncpg_dsn(dsn: str) -> dict[str, Any]:
    """asyncpg's connect() keywords for a libpq DSN (it parses URLs only, and no socket-directory host)."""
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    keywords: dict[str, Any] = {"database": parts.get("dbname"), "user": parts.get("user")}
    if parts.get("host"):
        keywords["host"] = parts["host"]
    if parts.get("port"):
        keywords["port"] = int(str(parts["port"]))
    if parts.get("password"):
        keywords["password"] = parts["password"]
    return keywords
