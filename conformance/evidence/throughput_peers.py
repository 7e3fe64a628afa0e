"""The throughput benchmark's peers: procrastinate and PgQueuer, driven through their public APIs.

Each `*_round` function gets the DSN of an empty database of its own, installs
the library's schema with the library's own installer (not timed), and times
`workers` spawned processes from the moment all are ready until the last is
done, as `throughput.py` times the store and the floor. Each process enqueues
its share one job per public call (each its own commit), waits at a barrier,
then runs the library's worker with a no-op task until the queue is empty. The
round then counts on the library's tables that every job was done, and raises
`RuntimeError` if not. The libraries run at their defaults except where said:
docs/throughput.md ("How the peers are driven") lists each setting, and why.
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
    """Seconds for `workers` procrastinate processes to enqueue and complete `jobs` jobs (docs/throughput.md)."""
    expected = {"succeeded": jobs}
    return _round("procrastinate", dsn, workers, jobs, _procrastinate_install, _procrastinate_process,
                  _procrastinate_counts, expected)  # fmt: skip


def pgqueuer_round(dsn: str, workers: int, jobs: int) -> float:
    """Seconds for `workers` PgQueuer processes to enqueue and complete `jobs` jobs (docs/throughput.md)."""
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
