"""Faults for any implementation driven by `leaseproof stress`: its sessions' database
backends ended while they work.

The nemesis (conformance/concurrent/nemesis.py) drives the bundled store as a
service would, on the real clock. This is its counterpart for an adapter
leaseproof knows only through its sessions: while a round's branches run,
the `Terminator` ends, in a seeded fraction of rounds, one backend of the
adapter's database that is busy at that moment (running a statement or
inside a transaction) with `pg_terminate_backend`, as a connection cut, a
killed pooler or a failover would. The server rolls the backend's open
transaction back; the session's command fails with a connection error, is
recorded as indeterminate (it may or may not have taken effect, judged as
the linearizability checker judges any indeterminate operation) and the
session is replaced.

An operation that is one transaction survives this by construction; one
that spreads its writes over several transactions, or keeps state outside
the database that a lost connection leaves behind, is caught when a cut
lands between its parts: the rows then show half of the operation, which no
order of the model's steps explains.

Only busy backends are ended: between rounds, when the harness reads the
adapter's state, the adapter's own connection is idle, so the barrier is
never cut. The terminator waits (bounded) until the ended backend has
exited, so no rolled-back or committed transaction of it is still in flight
when the round's barrier reads the state.

A cut is aimed at a point of its round drawn uniformly: the terminator waits
that share of a typical round (the running mean of the lengths its caller
`observe`s) before it looks for a busy backend. Looking at once instead would
almost always cut a round's first statement, and never the second
transaction of an operation spread over two, where atomicity bugs live.
Which rounds are faulted, where in them a cut is aimed and which busy backend
is chosen are the seed's; when the cut lands is also the real clock's, so two
runs of one seed differ in detail.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

# Backends of the adapter's database that are doing something: running a
# statement, or holding a transaction open between statements.
_BUSY = """
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
      AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')
    ORDER BY pid
"""
_ALIVE = """
    SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s)
        OR EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s) AS alive
"""
EXIT_WAIT_MS = 5000  # how long an ended backend may take to exit
POLL_SECONDS = 0.0005  # between looks for a busy backend while a round runs


class FaultError(Exception):
    """The terminator could not do its work (its own connection failed, a backend did not exit)."""


@attrs.frozen
class Cut:
    """One round's cut: the share of a typical round to wait before looking for a busy backend
    (`at`), and which of the busy backends to end (`pick`, a share of their list)."""

    at: float
    pick: float


@attrs.define
class FaultCounts:
    rounds_faulted: int = 0  # rounds in which a cut was due
    ended: int = 0  # backends ended
    missed: int = 0  # rounds whose cut was due but no backend was busy before the round ended


class Terminator:
    """Ends one busy backend of the database `dsn` in a `rate` fraction of rounds.

    `during_round(done)` runs in a thread of its own while a round's branches
    run; `done` is set when they have all ended."""

    def __init__(self, dsn: str, rate: float, seed: int) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"the fraction of rounds to fault must be in (0, 1], not {rate}")
        self.dsn, self.rate = dsn, rate
        self.rng = random.Random(seed ^ 0x7E2A)
        self.counts = FaultCounts()
        self.typical = 0.0  # seconds: the running mean of the rounds observed
        self.conn = self._connect()

    def _connect(self) -> psycopg.Connection[dict[str, Any]]:
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=10)
        except psycopg.Error as exc:
            raise FaultError(f"cannot connect to the database whose backends to end ({exc})") from exc
        conn.execute("SET statement_timeout = '10s'")
        return conn

    def due(self) -> Cut | None:
        """This round's cut, if it is faulted: drawn before the round starts, so the seed alone
        decides them."""
        faulted, at, pick = self.rng.random() < self.rate, self.rng.random(), self.rng.random()
        return Cut(at, pick) if faulted else None

    def observe(self, seconds: float) -> None:
        """A round took `seconds` (any round, cut or not): where the next cuts are aimed."""
        self.typical = seconds if not self.typical else 0.8 * self.typical + 0.2 * seconds

    def during_round(self, done: threading.Event, cut: Cut) -> bool:
        """Wait until the point `cut` aims at, then for a busy backend; end it, and wait until
        it has exited; give up when `done`. Whether a backend was ended."""
        self.counts.rounds_faulted += 1
        done.wait(cut.at * self.typical)
        while not done.is_set():
            busy = [row["pid"] for row in self.conn.execute(_BUSY).fetchall()]
            if busy:
                pid = busy[min(int(cut.pick * len(busy)), len(busy) - 1)]
                sent = self.conn.execute("SELECT pg_terminate_backend(%s) AS sent", (pid,)).fetchone()
                if sent is None or not sent["sent"]:
                    continue  # it ended on its own just now
                self._wait_exit(pid)
                self.counts.ended += 1
                return True
            done.wait(POLL_SECONDS)
        self.counts.missed += 1
        return False

    def _wait_exit(self, pid: int) -> None:
        """Until the backend `pid` has rolled back and left: no row of it in pg_stat_activity
        (removed after its transaction was aborted) or pg_locks. Polled, not
        `pg_terminate_backend(pid, timeout)`, which looks again only every 100 ms."""
        deadline = time.monotonic() + EXIT_WAIT_MS / 1000
        while (row := self.conn.execute(_ALIVE, (pid, pid)).fetchone()) is not None and row["alive"]:
            if time.monotonic() > deadline:
                raise FaultError(f"backend {pid} did not exit within {EXIT_WAIT_MS} ms of being ended")
            time.sleep(POLL_SECONDS)

    def close(self) -> None:
        self.conn.close()
