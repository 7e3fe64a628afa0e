"""How many deliveries a second the bundled store moves, against the bare floor and two peers.

`leaseproof throughput` runs `--jobs` jobs of each subject with `--workers`
processes, each on its own connection: every process enqueues its share, one
job a commit, then claims and finishes until nothing is left; the figure is
jobs a second over both phases. `floor` is the least a lease queue on
PostgreSQL can do (three bare statements a job), `store` the bundled store
through `execute()`, and the peers are `throughput_peers.py`'s. Each round runs
every subject on a fresh database, in an order that rotates from round to
round; the table gives each subject's median and its ratio to the floor's.
Nothing here asserts a speed: it measures (docs/throughput.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import attrs
import psycopg

from leaseproof.conformance.concurrent.nemesis import RUN, TARGET, binding, set_up_community
from leaseproof.conformance.evidence import throughput_peers as peers
from leaseproof.conformance.evidence.timed import Clock, run_timed, shares
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.provision import postgres_server
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.migrate import migrate
from leaseproof.model import delivery as m

COMMUNITY = uuid.UUID(int=0xC0)  # the store's jobs' community: `set_up_community` makes what they name
LEASE_SECONDS = 30
ROUND_LIMIT = 600.0  # seconds a round's workers may take before the round is called broken

_FLOOR_SCHEMA = """
    CREATE TABLE floor_jobs (
        id bigserial PRIMARY KEY,
        status text NOT NULL DEFAULT 'pending',
        generation int NOT NULL DEFAULT 0,
        lease_until timestamptz
    );
    CREATE INDEX floor_jobs_pending ON floor_jobs (id) WHERE status = 'pending'
"""
_FLOOR_ENQUEUE = "INSERT INTO floor_jobs DEFAULT VALUES"
_FLOOR_CLAIM = """
    UPDATE floor_jobs SET status = 'claimed', generation = generation + 1,
        lease_until = now() + make_interval(secs => %s)
    WHERE id = (SELECT id FROM floor_jobs WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING id, generation
"""
_FLOOR_FINISH = "UPDATE floor_jobs SET status = 'finished', lease_until = NULL WHERE id = %s AND generation = %s"


# -- the workers (module level: spawned processes import them) -------------------------------


def _floor_worker(dsn: str, share: int, clock: Clock) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        clock.ready()
        for _ in range(share):
            conn.execute(_FLOOR_ENQUEUE)
        clock.wait()
        while (row := conn.execute(_FLOOR_CLAIM, (LEASE_SECONDS,)).fetchone()) is not None:
            if conn.execute(_FLOOR_FINISH, row).rowcount != 1:
                raise RuntimeError(f"the floor's finish of job {row[0]} matched no row")
        clock.done()


def _store_worker(dsn: str, share: int, index: int, clock: Clock) -> None:
    with connect(dsn) as conn:
        store = PostgresDeliveryStore(conn)
        clock.ready()
        for i in range(share):
            delivery = uuid.uuid5(COMMUNITY, f"{index}/{i}")
            new = m.NewDelivery(delivery, binding(COMMUNITY, f"s{index}-{i}"))
            committed = store.execute(m.CommitDeliveries(COMMUNITY, RUN, f"s{index}-{i}", [new]))
            if committed != m.Committed((delivery,), False):
                raise RuntimeError(f"commit of {delivery} answered {committed}")
        clock.wait()
        while isinstance(claimed := store.execute(m.Claim(COMMUNITY, TARGET, LEASE_SECONDS)), m.Claimed):
            settled = store.execute(m.Finish(claimed.lease, m.Status.FINISHED))
            if settled != m.Settled(m.Status.FINISHED):
                raise RuntimeError(f"finish of {claimed.lease.delivery_id} answered {settled}")
        clock.done()


def floor_round(dsn: str, workers: int, jobs: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_FLOOR_SCHEMA)
    args = [(dsn, share) for share in shares(workers, jobs)]
    return _timed_round(_floor_worker, args, lambda: _floor_counts(dsn), jobs, "the floor's jobs")


def _floor_counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM floor_jobs GROUP BY status").fetchall()
    return dict(rows)


def store_round(dsn: str, workers: int, jobs: int) -> float:
    with connect(dsn) as conn:
        migrate(conn)
        set_up_community(PostgresDeliveryStore(conn), COMMUNITY)
    args = [(dsn, share, i) for i, share in enumerate(shares(workers, jobs))]
    return _timed_round(_store_worker, args, lambda: _store_counts(dsn), jobs, "the store's deliveries")


def _timed_round(
    worker: Callable[..., None],
    args: Sequence[tuple[Any, ...]],
    counts: Callable[[], dict[str, int]],
    jobs: int,
    what: str,
) -> float:
    """The seconds `worker`'s processes took, once `counts` (`what`, by status) says every one of `jobs` finished."""
    elapsed = run_timed(worker, args, timeout=ROUND_LIMIT, state=counts)
    found = counts()
    if found != {"finished": jobs}:
        raise RuntimeError(f"{what} by status: {found}, expected {jobs} finished")
    return elapsed


def _store_counts(dsn: str) -> dict[str, int]:
    with connect(dsn) as conn:
        rows = conn.execute("SELECT status::text AS status, count(*) AS n FROM workflow_agent_deliveries GROUP BY 1")
        return {r["status"]: r["n"] for r in rows}


SUBJECTS: dict[str, Callable[[str, int, int], float]] = {
    "floor": floor_round,
    "store": store_round,
    "procrastinate": peers.procrastinate_round,
    "pgqueuer": peers.pgqueuer_round,
    "pgqueuer-1": peers.pgqueuer_one_round,
}
PEERS = ("procrastinate", "pgqueuer", "pgqueuer-1")
# Each peer subject's library (pgqueuer-1 is PgQueuer taking one job a dequeue), and every
# distribution it needs (the PgQueuer workers run on its asyncpg driver).
LIBRARY = {"procrastinate": "procrastinate", "pgqueuer": "pgqueuer", "pgqueuer-1": "pgqueuer"}
REQUIRES = {
    "procrastinate": ("procrastinate",),
    "pgqueuer": ("pgqueuer", "asyncpg"),
    "pgqueuer-1": ("pgqueuer", "asyncpg"),
}


def lacking(subject: str) -> list[str]:
    """The distributions `subject` needs that are not installed."""
    found = []
    for name in REQUIRES.get(subject, ()):
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found.append(name)
    return found


LABELS = {"pgqueuer": "pgqueuer (batches of 10)", "pgqueuer-1": "pgqueuer (one job a dequeue)"}


@attrs.frozen
class Result:
    subject: str
    seconds: tuple[float, ...]  # one per round
    jobs: int

    @property
    def rate(self) -> float:
        return self.jobs / statistics.median(self.seconds)


def rotations(subjects: Sequence[str], rounds: int) -> Iterator[list[str]]:
    """Each round's order: the subjects rotated by one more each round (interleaved)."""
    for r in range(rounds):
        k = r % len(subjects)
        yield [*subjects[k:], *subjects[:k]]


def measure(
    new_database: Callable[[], Any],
    subjects: Sequence[str],
    workers: int,
    jobs: int,
    rounds: int,
    say: Callable[[str], None],
) -> dict[str, Result]:
    seconds: dict[str, list[float]] = {s: [] for s in subjects}
    for r, order in enumerate(rotations(subjects, rounds), 1):
        for subject in order:
            with new_database() as dsn:
                took = SUBJECTS[subject](dsn, workers, jobs)
            seconds[subject].append(took)
            say(f"  round {r}/{rounds} {subject}: {jobs} jobs in {took:.2f}s ({jobs / took:,.0f}/s)")
    return {s: Result(s, tuple(v), jobs) for s, v in seconds.items()}


def table(results: dict[str, Result], workers: int) -> list[str]:
    floor = results.get("floor")
    versions = peers.versions()
    lines = [
        "| subject | version | workers | jobs/s (median) | × floor | seconds per round |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for name, result in results.items():
        ratio = f"{result.rate / floor.rate:.2f}" if floor is not None else "-"
        rounds = ", ".join(f"{s:.2f}" for s in result.seconds)
        version = versions.get(LIBRARY.get(name, ""), "this checkout")
        lines.append(f"| {LABELS.get(name, name)} | {version} | {workers} | {result.rate:,.0f} | {ratio} | {rounds} |")
    store = results.get("store")
    if store is not None:
        lines += [f"store / {peer}: {store.rate / results[peer].rate:.2f}" for peer in PEERS if peer in results]
    return lines


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    named = [s for s in args.subjects.split(",") if s] if args.subjects is not None else None
    subjects = named if named is not None else list(SUBJECTS)
    unknown = sorted(set(subjects) - set(SUBJECTS))
    if unknown or not subjects or args.workers < 1 or args.jobs < args.workers or args.rounds < 1:
        problem = (
            f"unknown subjects {unknown}"
            if unknown
            else "--workers and --rounds must be positive, --jobs at least --workers, and a subject named"
        )
        err.write(f"leaseproof: {problem}\n")
        return 2
    missing = {s: lacking(s) for s in subjects if lacking(s)}
    why = "; ".join(f"{s} needs {', '.join(names)}" for s, names in missing.items())
    if missing and named is not None:
        err.write(f"leaseproof: not installed: {why} (pip install -e '.[bench]')\n")
        return 2
    left_out = ""
    if missing:  # the default set: measure what can be, and say in one line what was left out
        subjects = [s for s in subjects if s not in missing]
        left_out = (
            f"leaseproof: not measuring {', '.join(missing)}: not installed ({why}; the bench extra installs them)\n"
        )

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    with postgres_server(args.dsn, log=lambda line: err.write(line + "\n")) as server:
        err.write(left_out)  # after the server: a DSN that does not parse is the one line said
        say(f"throughput: {', '.join(subjects)}; {args.workers} workers, {args.jobs} jobs, {args.rounds} rounds")
        try:
            results = measure(
                lambda: scratch_database(server, prefix="lp_bench"), subjects, args.workers, args.jobs, args.rounds, say
            )
        except RuntimeError as exc:
            err.write(f"leaseproof: {exc}\n")
            return 1
    out.write("\n".join(table(results, args.workers)) + "\n")
    return 0
