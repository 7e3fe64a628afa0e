"""Faults for any implementation driven by `leaseproof stress`: its sessions' database
backends ended while they work.

The nemesis's counterpart for an adapter known only through its sessions: in a seeded
fraction of rounds the `Terminator` ends one busy backend of the adapter's database
(running a statement or inside a transaction) with `pg_terminate_backend`, as a cut
connection or a failover would; the session's command is judged as indeterminate and
the session replaced. An operation spread over several transactions is caught when a
cut lands between its parts. Idle backends are left alone, so the barrier's reads are
never cut, and the terminator waits until the ended backend has exited. A cut is aimed
at a seeded point of a typical round (the mean length of the unfaulted rounds): looking
at once would almost always cut a round's first statement. docs/stress.md says more.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from leaseproof.conformance.boundary.protocols import Restartable
from leaseproof.conformance.concurrent.history import Recorder, Stall
from leaseproof.conformance.concurrent.stalls import WAIT_BOUND, holding
from leaseproof.conformance.harness.proxy import FaultProxy
from leaseproof.conformance.lockstep import world as w

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
    """A fault injector could not do its work (its own connection failed, a backend did not
    exit, a killed adapter did not come back)."""


@attrs.frozen
class Cut:
    """One round's fault: the share of a typical round to wait before striking (`at`), which
    of the candidates to strike (`pick`, a share of their list), and, in a mix, which
    injector strikes (`kind`)."""

    at: float
    pick: float
    kind: str = ""


@attrs.define
class FaultCounts:
    rounds_faulted: int = 0  # rounds in which a fault was due
    ended: int = 0  # faults that landed: backends ended, processes killed or paused
    missed: int = 0  # rounds whose fault was due but found nothing to strike before the round ended


class RoundFault:
    """A fault aimed at a point of a round, in a `rate` fraction of rounds.

    `during_round(done, cut)` runs in a thread of its own while a round's branches
    run; `done` is set when they have all ended. A subclass says how to strike
    (`strike`: whether it did; False to look again a moment later). `recorder` is the
    history being recorded (the runner sets it before each program), for a fault that is
    part of what the history is judged by (a stall)."""

    kind = "fault"
    recorder: Recorder | None = None

    def __init__(self, rate: float, seed: int) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"the fraction of rounds to fault must be in (0, 1], not {rate}")
        self.rate = rate
        self.rng = random.Random(seed ^ 0x7E2A)
        self.counts = FaultCounts()
        self.typical = 0.0  # seconds: the running mean of the rounds observed

    def due(self) -> Cut | None:
        """This round's fault, if it is faulted: drawn before the round starts, so the seed alone
        decides them."""
        faulted, at, pick = self.rng.random() < self.rate, self.rng.random(), self.rng.random()
        return Cut(at, pick, self.kind) if faulted else None

    def observe(self, seconds: float) -> None:
        """A round took `seconds` (any round, faulted or not): where the next faults are aimed."""
        self.typical = seconds if not self.typical else 0.8 * self.typical + 0.2 * seconds

    def during_round(self, done: threading.Event, cut: Cut) -> bool:
        """Wait until the point `cut` aims at, then strike, looking again until it can; give
        up when `done`. Whether it struck."""
        self.counts.rounds_faulted += 1
        done.wait(cut.at * self.typical)
        while not done.is_set():
            if self.strike(cut):
                self.counts.ended += 1
                return True
            done.wait(POLL_SECONDS)
        self.counts.missed += 1
        return False

    def strike(self, cut: Cut) -> bool:
        raise NotImplementedError

    def record_into(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def before_round(self, cut: Cut) -> None:
        """The round `cut` faults is about to start (for a fault already in place as it does)."""

    def schedule(self) -> Any:
        """What the fault forced in each round of the last run, for a replay to force again;
        None: nothing a replay can force (where a cut lands is the clock's)."""
        return None

    def close(self) -> None:
        """Release what the injector holds."""


INJECTOR = "leaseproof-fault-injector"  # the application name of the injectors' own connections


def connect_injector(dsn: str) -> psycopg.Connection[dict[str, Any]]:
    """A connection of an injector to the implementation's database (named INJECTOR, so that
    no injector counts it as the implementation's)."""
    try:
        conn = psycopg.connect(
            dsn, autocommit=True, row_factory=dict_row, connect_timeout=10, application_name=INJECTOR
        )
    except psycopg.Error as exc:
        raise FaultError(f"cannot connect to the implementation's database ({exc})") from exc
    conn.execute("SET statement_timeout = '10s'")
    return conn


def _wait_exit(conn: psycopg.Connection[dict[str, Any]], pid: int) -> None:
    """Until the backend `pid` has rolled back and left: no row of it in pg_stat_activity
    (removed after its transaction was aborted) or pg_locks. Polled, not
    `pg_terminate_backend(pid, timeout)`, which looks again only every 100 ms."""
    deadline = time.monotonic() + EXIT_WAIT_MS / 1000
    while (row := conn.execute(_ALIVE, (pid, pid)).fetchone()) is not None and row["alive"]:
        if time.monotonic() > deadline:
            raise FaultError(f"backend {pid} did not exit within {EXIT_WAIT_MS} ms of being ended")
        time.sleep(POLL_SECONDS)


class Terminator(RoundFault):
    """Ends one busy backend of the database `dsn` in a `rate` fraction of rounds."""

    kind = "terminate"

    def __init__(self, dsn: str, rate: float, seed: int) -> None:
        super().__init__(rate, seed)
        self.dsn = dsn
        self.conn = connect_injector(dsn)

    def strike(self, cut: Cut) -> bool:
        """End a busy backend, if one is, and wait until it has exited."""
        busy = [row["pid"] for row in self.conn.execute(_BUSY).fetchall()]
        if not busy:
            return False
        pid = busy[min(int(cut.pick * len(busy)), len(busy) - 1)]
        sent = self.conn.execute("SELECT pg_terminate_backend(%s) AS sent", (pid,)).fetchone()
        if sent is None or not sent["sent"]:
            return False  # it ended on its own just now
        _wait_exit(self.conn, pid)
        return True

    def close(self) -> None:
        self.conn.close()


# The implementation's backends in its database: every client but the injectors'.
_THEIRS = """
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
      AND application_name IS DISTINCT FROM %s
"""


class Killer(RoundFault):
    """Kills the adapter's process (SIGKILL) in a `rate` fraction of rounds, and starts it
    again (`SubprocessAdapter.restart`: a new hello, then `attach` to the database it
    announced): at the point of the round `cut` aims at, or, if the round ended before
    it, at the round's end (before its barrier reads the state). What its sessions were
    doing is lost, and judged as indeterminate; what it committed must still be there,
    and nothing it kept only in its process may matter to what it answers after.

    A killed client's backends outlive it for a moment: one in the middle of a statement
    finishes it (and, in autocommit, commits) before it notices its client is gone, and
    holds its row locks until then. So before the process is started again, the killer
    waits until no backend of the database `dsn` is left but the injectors' (ending any
    still there after EXIT_WAIT_MS), and the operations cut by the kill end then: after
    it, nothing of theirs can happen."""

    kind = "kill"

    def __init__(self, adapter: Restartable, dsn: str, rate: float, seed: int) -> None:
        super().__init__(rate, seed)
        self.adapter = adapter
        self.conn = connect_injector(dsn)

    def _settle(self) -> None:
        """Until the killed process's backends are gone."""
        deadline = time.monotonic() + EXIT_WAIT_MS / 1000
        while pids := [row["pid"] for row in self.conn.execute(_THEIRS, (INJECTOR,)).fetchall()]:
            if time.monotonic() > deadline:
                for pid in pids:
                    self.conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    _wait_exit(self.conn, pid)
                return
            time.sleep(POLL_SECONDS)

    def close(self) -> None:
        self.conn.close()

    def during_round(self, done: threading.Event, cut: Cut) -> bool:
        self.counts.rounds_faulted += 1
        done.wait(cut.at * self.typical)
        self.strike(cut)
        self.counts.ended += 1
        return True

    def strike(self, cut: Cut) -> bool:
        try:
            self.adapter.restart(settle=self._settle)
        except Exception as exc:  # the restart's own failure is the injector's
            raise FaultError(
                f"the adapter did not come back after it was killed (does its database live on a server that died"
                f" with its process? give it one that outlives it): {exc}"
            ) from exc
        return True


PAUSE_SECONDS = 0.5  # how long a paused adapter process stays stopped


class Pauser(RoundFault):
    """Stops the adapter's process (SIGSTOP) in a `rate` fraction of rounds while the round
    runs, for PAUSE_SECONDS, then lets it go on (SIGCONT): a process that stalls (a long
    collection, a swapped-out host, a debugger) with its transactions open and its locks
    held. Nothing is lost; what it answers after is judged as ever."""

    kind = "pause"

    def __init__(self, pid: Callable[[], int], rate: float, seed: int) -> None:
        super().__init__(rate, seed)
        self.pid = pid  # the process's id now (a restart changes it)

    def strike(self, cut: Cut) -> bool:
        pid = self.pid()
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        try:
            time.sleep(PAUSE_SECONDS)  # the fault itself: a stop of a set length, on the real clock
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return True


# The columns that name a tenant, as far as the harness can tell without knowing the schema:
# every uuid column of an ordinary or partitioned table outside the system schemas, but one
# that is its table's whole primary key (the tenants' own table: its row is not what a
# client working on the tenant's rows holds).
_TENANT_COLUMNS = """
    SELECT n.nspname AS schema, c.relname AS table, a.attname AS column
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid = 'uuid'::regtype
      AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
      AND NOT EXISTS (
          SELECT 1 FROM pg_index i
          WHERE i.indrelid = c.oid AND i.indisprimary AND i.indnatts = 1 AND i.indkey[0] = a.attnum)
    ORDER BY 1, 2, 3
"""
STALLED_TENANTS = tuple(w.COMMUNITIES[name] for name in w.LIVE_COMMUNITIES)  # those stress's programs use
STALL_SECONDS = 2.0  # how long a stalled tenant's rows stay held, at most (more than WAIT_BOUND)


class Staller(RoundFault):
    """Stalls a tenant in a `rate` fraction of rounds: before the round starts, a connection
    of the injector's own takes a row lock (FOR NO KEY UPDATE, as an UPDATE of the row does)
    on every row of the database `dsn` that names the tenant (`_TENANT_COLUMNS`), skipping
    those it finds locked, so it never waits and never deadlocks with the implementation;
    it holds them while the round runs, for STALL_SECONDS (less if the round ends first), as
    a client stuck mid-transaction does, then rolls back. The tenant is one of those holding
    a lease at the round's start (a stalled client is a lease holder), else of `tenants`
    (by default the communities stress's programs use); which one, the seed's.

    The stall is recorded in the history (`Stall`): while it lasts, a claim of the tenant
    may pass over its rows and a sweep may leave its expired leases (the checker's
    allowances), and a write to one of them waits; a sweep, or another tenant's operation,
    that waited for it is a finding of its own (conformance/concurrent/stalls.py)."""

    kind = "stall"

    def __init__(self, dsn: str, rate: float, seed: int, tenants: Sequence[Any] = STALLED_TENANTS) -> None:
        super().__init__(rate, seed)
        if not tenants:
            raise ValueError("a stall needs tenants to stall")
        self.tenants = list(tenants)
        self.conn = connect_injector(dsn)
        self.columns = [(r["schema"], r["table"], r["column"]) for r in self.conn.execute(_TENANT_COLUMNS)]
        self.rows = 0  # rows held, over every stall
        self._held: tuple[Any, int] | None = None  # the tenant held, and the tick taken before

    def before_round(self, cut: Cut) -> None:
        if self.recorder is None or not self.columns:
            return
        tenants = holding(self.recorder.last_state) or self.tenants
        tenant = tenants[min(int(cut.pick * len(tenants)), len(tenants) - 1)]
        began = self.recorder.tick()
        # One statement per column, sent at once: the locks are in place before the round starts.
        locks = sql.SQL("; ").join(
            sql.SQL("SELECT 1 FROM {}.{} WHERE {} = {} FOR NO KEY UPDATE SKIP LOCKED").format(
                sql.Identifier(schema), sql.Identifier(table), sql.Identifier(column), sql.Literal(tenant)
            )
            for schema, table, column in self.columns
        )
        try:
            self.conn.execute("BEGIN")
            cursor = self.conn.execute(locks)
            while True:
                self.rows += len(cursor.fetchall())
                if not cursor.nextset():
                    break
        except psycopg.Error as exc:
            raise FaultError(f"could not stall a tenant: {exc}") from exc
        self._held = (tenant, began)

    def during_round(self, done: threading.Event, cut: Cut) -> bool:
        self.counts.rounds_faulted += 1
        if self._held is None or self.recorder is None:
            self.counts.missed += 1
            return False
        (tenant, began), self._held = self._held, None
        done.wait(STALL_SECONDS - WAIT_BOUND)  # the fault itself: locks held, on the real clock
        patient = self.recorder.tick()
        done.wait(WAIT_BOUND)
        letting_go = self.recorder.tick()  # before the locks go: what they held answers after it
        try:
            self.conn.execute("ROLLBACK")
        except psycopg.Error as exc:
            raise FaultError(f"could not end a tenant's stall: {exc}") from exc
        self.recorder.stalled(Stall(tenant, began, patient, letting_go, self.recorder.tick()))
        self.counts.ended += 1
        return True

    def close(self) -> None:
        self.conn.close()


# The proxy's faults (conformance/harness/proxy.py), by the name the nemesis gives each, and
# what the proxy counts when one fires.
NETWORK_FAULTS = ("lose-answer", "reset", "delay", "blackhole")
_FIRED = {"lose-answer": "lose-answer", "reset": "reset", "delay": "delayed", "blackhole": "blackholed"}
DELAY_SECONDS, DELAY_FOR = 0.2, 1.0  # answers this late, for this long
BLACKHOLE_SECONDS = 0.5


def arm(proxy: FaultProxy, kind: str) -> None:
    """Arm the proxy's fault `kind`, one of NETWORK_FAULTS."""
    if kind == "lose-answer":
        proxy.lose_next_answer()
    elif kind == "reset":
        proxy.reset_next_request()
    elif kind == "delay":
        proxy.delay(DELAY_SECONDS, DELAY_FOR)
    elif kind == "blackhole":
        proxy.blackhole(BLACKHOLE_SECONDS)
    else:
        raise ValueError(f"no network fault {kind!r}: the network faults are {', '.join(NETWORK_FAULTS)}")


class Network(RoundFault):
    """One of the proxy's faults between the implementation and its server (`kind`, one of
    NETWORK_FAULTS), armed at the point of the round `cut` aims at; it lands when the proxy
    meets a request or an answer to act on before the round ends, and whatever is left of it
    is disarmed then, so that the barrier's reads pass untouched."""

    def __init__(self, proxy: FaultProxy, kind: str, rate: float, seed: int) -> None:
        if kind not in NETWORK_FAULTS:
            raise ValueError(f"no network fault {kind!r}: the network faults are {', '.join(NETWORK_FAULTS)}")
        super().__init__(rate, seed)
        self.proxy = proxy
        self.kind = kind

    def during_round(self, done: threading.Event, cut: Cut) -> bool:
        self.counts.rounds_faulted += 1
        done.wait(cut.at * self.typical)
        fired = _FIRED[self.kind]
        before = self.proxy.counts[fired]
        if not done.is_set():
            arm(self.proxy, self.kind)
            while not done.is_set() and self.proxy.counts[fired] == before:
                done.wait(POLL_SECONDS)
            if self.kind in ("delay", "blackhole"):
                done.wait()  # the window runs on until the round ends
            self.proxy.disarm()
        if self.proxy.counts[fired] > before:
            self.counts.ended += 1
            return True
        self.counts.missed += 1
        return False


class Mix(RoundFault):
    """Several injectors, one fault a round at most: in a `rate` fraction of rounds, one of
    them, drawn by the seed, strikes. Its counts are the sum; `each` keeps them by kind."""

    kind = "mix"

    def __init__(self, injectors: Sequence[RoundFault], rate: float, seed: int) -> None:
        if not injectors:
            raise ValueError("a mix of no faults")
        super().__init__(rate, seed)
        self.injectors = {injector.kind: injector for injector in injectors}

    @property
    def each(self) -> dict[str, FaultCounts]:
        return {kind: injector.counts for kind, injector in self.injectors.items()}

    def due(self) -> Cut | None:
        cut = super().due()
        kind = self.rng.choice(sorted(self.injectors))
        return None if cut is None else attrs.evolve(cut, kind=kind)

    def observe(self, seconds: float) -> None:
        super().observe(seconds)
        for injector in self.injectors.values():
            injector.observe(seconds)

    def record_into(self, recorder: Recorder) -> None:
        for injector in self.injectors.values():
            injector.record_into(recorder)

    def before_round(self, cut: Cut) -> None:
        self.injectors[cut.kind].before_round(cut)

    def during_round(self, done: threading.Event, cut: Cut) -> bool:
        self.counts.rounds_faulted += 1
        struck = self.injectors[cut.kind].during_round(done, cut)
        if struck:
            self.counts.ended += 1
        else:
            self.counts.missed += 1
        return struck

    def close(self) -> None:
        for injector in self.injectors.values():
            injector.close()
