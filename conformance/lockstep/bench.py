"""How close `verify` runs to the speed of its own SQL.

`python -m leaseproof.conformance.lockstep.bench` runs, on one server, `verify`'s lockstep
(the fixed scenarios and a seeded number of programs against the bundled implementation,
forked as verify runs it: `ForkedAdapter`), a *bare replay* of exactly the SQL that run
sends (every statement with its parameters, every BEGIN, COMMIT and ROLLBACK, on as many
connections, in order, through psycopg with nothing else to do), and the same lockstep in
this process. The replay is the floor, what the database and the driver alone cost; the
ratio floor / lockstep says how close verify comes to it. The SQL is recorded from the
in-process run (the forked one sends the same programs in the same order). The three are
interleaved round by round (each first in turn), each on a fresh database cloned from one
migrated template, and each figure is the median of the rounds'. The seed is fixed and the
bundled implementation deterministic on its pinned clock, so every round runs the same programs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import psycopg
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.provision import postgres_server
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.store import returns_rows
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.migrate import migrate

# One entry of the log: (connection number, what, statement, parameters).
# `what` is "execute", "BEGIN", "COMMIT" or "ROLLBACK" for a transaction's
# edges, or "pipeline" and "end pipeline" around statements sent pipelined.
Entry = tuple[int, str, Any, Any]


class _Recorder:
    """A connection factory that logs every statement its connections send."""

    def __init__(self) -> None:
        self.log: list[Entry] = []
        self.connections = 0

    def __call__(self, dsn: str) -> Any:
        self.connections += 1
        return _RecordingConnection(connect(dsn), self.connections - 1, self.log)


class _RecordingConnection:
    """A psycopg connection that logs what the stores and adapters send:
    `execute` (on the connection or on a cursor of it), the edges of
    `transaction()`, and `pipeline()` blocks. Every other attribute is the
    real connection's.
    """

    def __init__(self, conn: psycopg.Connection[Any], number: int, log: list[Entry]) -> None:
        self._conn, self._number, self._log = conn, number, log

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self._log.append((self._number, "execute", query, params))
        return self._conn.execute(query, params, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> _RecordingCursor:
        return _RecordingCursor(self._conn.cursor(*args, **kwargs), self._number, self._log)

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[Any]:
        self._log.append((self._number, "pipeline", None, None))
        try:
            with self._conn.pipeline() as pipeline:
                yield pipeline
        finally:
            self._log.append((self._number, "end pipeline", None, None))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        self._log.append((self._number, "BEGIN", None, None))
        try:
            with self._conn.transaction() as tx:
                yield tx
        except BaseException:
            self._log.append((self._number, "ROLLBACK", None, None))
            raise
        self._log.append((self._number, "COMMIT", None, None))

    def __enter__(self) -> _RecordingConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _RecordingCursor:
    """A cursor whose `execute` is logged; the rest is the real cursor's."""

    def __init__(self, cursor: Any, number: int, log: list[Entry]) -> None:
        self._cursor, self._number, self._log = cursor, number, log

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> _RecordingCursor:
        self._log.append((self._number, "execute", query, params))
        self._cursor.execute(query, params, **kwargs)
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


ADAPTERS: dict[str, Callable[..., Any]] = {
    "delivery": lambda dsn, connect: PostgresDeliveryAdapter(dsn, connect=connect),
    "lifecycle": lambda dsn, connect: PostgresLifecycleAdapter(dsn, connect=connect),
}


def _lockstep(
    machine: str, dsn: str, examples: int, seed: int, factory: Callable[[str], Any] = connect, forked: bool = True
) -> float:
    """Seconds of one verify lockstep run (scenarios and `examples` programs); fails unless it conforms.
    `forked`: the implementation checked in a process of its own, as `leaseproof verify` does."""

    def build() -> Any:
        return ADAPTERS[machine](dsn, factory)

    adapter = ForkedAdapter(build, machine) if forked else build()
    if isinstance(factory, _Recorder):
        factory.log.clear()  # the adapter's own set-up (migrate on a migrated database) is not the run
    try:
        started = time.perf_counter()
        verdict = run_conformance(adapter, Run(machine=machine, max_examples=examples, seed=seed))
        seconds = time.perf_counter() - started
    finally:
        adapter.close()
    if not verdict.conforms:
        raise RuntimeError(f"the bundled {machine} implementation did not conform: {verdict.failure or verdict.fault}")
    return seconds


def _replay(log: Sequence[Entry], connections: int, dsn: str) -> float:
    """Seconds to send `log` again, as it was sent, on `connections` plain connections."""
    conns = [connect(dsn) for _ in range(connections)]
    pipelines: dict[int, contextlib.ExitStack] = {}
    try:
        started = time.perf_counter()
        for number, what, query, params in log:
            conn = conns[number]
            if what == "pipeline":
                pipelines[number] = contextlib.ExitStack()
                pipelines[number].enter_context(conn.pipeline())
            elif what == "end pipeline":
                pipelines.pop(number).close()
            elif what != "execute":
                conn.execute(what)
            else:
                _send(conn, query, params, pipelined=number in pipelines)
        return time.perf_counter() - started
    finally:
        for conn in conns:
            conn.close()


def _send(conn: psycopg.Connection[Any], query: Any, params: Any, *, pipelined: bool) -> None:
    """One recorded statement, its every result read as the run read it."""
    try:
        cursor = conn.cursor()
        cursor.execute(query, params)
        if pipelined:
            return  # read at the pipeline's end, as in the run
        while True:
            if returns_rows(cursor):  # as the snapshot reads its results
                cursor.fetchall()
            if not cursor.nextset():
                break
    except psycopg.Error:
        pass  # as in the run: the transaction it was in rolls back next


@attrs.frozen
class Round:
    lockstep: float  # verify's lockstep, the implementation in a process of its own (ForkedAdapter)
    replay: float
    in_process: float  # the same lockstep with the implementation in this process

    @property
    def speedup(self) -> float:
        """How much faster the forked lockstep ran than the in-process one."""
        return self.in_process / self.lockstep

    @property
    def ratio(self) -> float:
        return self.replay / self.lockstep


@attrs.frozen
class Result:
    machine: str
    examples: int
    seed: int
    statements: int  # statements and transaction edges the lockstep sent
    rounds: tuple[Round, ...]

    @property
    def ratio(self) -> float:
        """The median of the rounds' ratios: the share of verify's time that is its SQL."""
        return statistics.median(r.ratio for r in self.rounds)


def measure(
    server: Server, machine: str, *, examples: int, rounds: int, seed: int, say: Callable[[str], None] = lambda _: None
) -> Result:
    """Record one lockstep run's SQL, then `rounds` interleaved rounds of lockstep and replay."""
    with scratch_database(server, prefix="lp_bench_template") as template_dsn:
        with connect(template_dsn) as conn:
            migrate(conn)
        template = str(conninfo_to_dict(template_dsn)["dbname"])
        recorder = _Recorder()
        with scratch_database(server, template=template) as dsn:
            _lockstep(machine, dsn, examples, seed, recorder, forked=False)  # the log is this process's
        log = recorder.log
        say(f"{machine}: recorded {len(log):,} statements on {recorder.connections} connections")
        results = []
        for number in range(rounds):
            times: dict[str, float] = {}
            kinds = ("lockstep", "replay", "in process")
            for what in kinds[number % 3 :] + kinds[: number % 3]:  # each goes first in turn
                with scratch_database(server, template=template) as dsn:
                    if what == "replay":
                        times[what] = _replay(log, recorder.connections, dsn)
                    else:
                        times[what] = _lockstep(machine, dsn, examples, seed, forked=what == "lockstep")
            result = Round(times["lockstep"], times["replay"], times["in process"])
            say(
                f"  round {number + 1}: lockstep {result.lockstep:.2f}s, replay {result.replay:.2f}s,"
                f" ratio {result.ratio:.2f}; in process {result.in_process:.2f}s (forked is {result.speedup:.2f}x)"
            )
            results.append(result)
    return Result(machine, examples, seed, len(log), tuple(results))


def table(results: Sequence[Result]) -> str:
    header = (
        "machine",
        "programs",
        "statements",
        "lockstep s",
        "replay s",
        "replay / lockstep",
        "in process s",
        "speed-up",
    )
    lines = ["  ".join(f"{h:>18}" for h in header)]
    for r in results:
        cells = (
            r.machine,
            f"{r.examples:,}",
            f"{r.statements:,}",
            f"{statistics.median(x.lockstep for x in r.rounds):.2f}",
            f"{statistics.median(x.replay for x in r.rounds):.2f}",
            f"{r.ratio:.2f}",
            f"{statistics.median(x.in_process for x in r.rounds):.2f}",
            f"{statistics.median(x.speedup for x in r.rounds):.2f}",
        )
        lines.append("  ".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leaseproof.conformance.lockstep.bench",
        description="Time verify's lockstep against a bare replay of the SQL it sends, interleaved; print the ratio.",
    )
    parser.add_argument("--machine", choices=sorted(ADAPTERS), help="one machine (default: both)")
    parser.add_argument("--examples", type=int, default=100, help="generated programs per run (default: 100)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    parser.add_argument("--seed", type=int, default=1, help="the programs' seed (default: 1)")
    parser.add_argument("--dsn", help="PostgreSQL server (default: LEASEPROOF_DSN, else Docker, else embedded)")
    args = parser.parse_args(argv)
    if args.examples < 1 or args.rounds < 1:
        parser.error("--examples and --rounds must be positive")
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    machines = [args.machine] if args.machine else sorted(ADAPTERS)
    with postgres_server(args.dsn, log=say) as server:
        say(f"server: {server.description}")
        results = [
            measure(server, machine, examples=args.examples, rounds=args.rounds, seed=args.seed, say=say)
            for machine in machines
        ]
    print(table(results))
    print("ratio: the median over the rounds of (bare replay seconds / lockstep seconds); 1.0 is the floor")
    print("speed-up: the median of (the lockstep in process / forked, as verify runs it); both check the same programs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
