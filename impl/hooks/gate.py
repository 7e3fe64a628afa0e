"""The statement gate: deterministic interleavings of store operations, without sleeping.

A race is forced by holding one client's transaction open at a named point
while other clients run, then letting it go on. Three pieces:

- `Gate` wraps a connection as `leaseproof.impl.delivery.store.connect` returns it and
  is handed to a store's constructor in its place. The stores use only
  `execute(...)` (and `.fetchone()`/`.fetchall()`/iteration of its cursor)
  and `transaction()`; the gate passes both through, and can park the
  calling thread *before* or *after* a statement (matched by its exact SQL
  text, e.g. `store.SQL_FINISH`, or by a predicate on the text), or *before
  the COMMIT* of an outermost transaction (optionally only one in which a
  matching statement ran). Each armed point fires once.
- `Pause` is one armed point. The test waits until the client is parked
  there, runs other clients, then `release()`s it, or `rollback()`s it: the
  client raises `Aborted` at that point, inside its transaction, which
  therefore rolls back.
- `Client` runs one operation at a time on a background thread
  (`start(callable)`, `result()`), and `Schedule` owns the clients of one
  test and a separate monitor connection, from which a test can wait until
  a client's backend is blocked on a lock inside PostgreSQL
  (`pg_blocking_pids`), or until it finished.

Nothing here sleeps to let time pass: every wait is for a condition, and
fails after a generous timeout with a message naming what it awaited, so a
broken schedule fails instead of hanging. Test tooling for the bundled
stores; it lives in `impl/hooks/`, beside them, because it wraps their connections.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import psycopg

from leaseproof.impl.delivery.store import connect

TIMEOUT = 30.0  # seconds, for every wait of a test
_POLL = 0.005  # seconds between two checks of a polled condition
_PARKED_LIMIT = 300.0  # a parked client nobody releases gives up (and rolls back) after this

Match = str | Callable[[str], bool] | None


class Aborted(Exception):
    """Raised in a client at a pause point by `Pause.rollback()`: its transaction rolls back."""


class NotReached(Exception):
    """A client finished without reaching the point a schedule waited for: the schedule
    did not happen. Not an AssertionError, so that a test expected to fail on an
    assertion (a strict xfail) cannot pass because its schedule never took place."""


class ScheduleTimeout(Exception):
    """A wait of the schedule did not see its condition in time (not an AssertionError,
    for the reason `NotReached` gives)."""


def _label(match: Match) -> str:
    if match is None:
        return "any statement"
    if isinstance(match, str):
        text = " ".join(match.split())
        return repr(text if len(text) <= 72 else text[:69] + "...")
    return getattr(match, "__name__", repr(match))


def _matches(match: Match, sql: str) -> bool:
    if match is None:
        return True
    return sql == match if isinstance(match, str) else bool(match(sql))


class Pause:
    """One armed point of a gate; fires at most once."""

    def __init__(self, gate: Gate, kind: str, match: Match, label: str | None, parks: bool) -> None:
        self.gate, self.kind, self.match, self.parks = gate, kind, match, parks
        self.label = label or _label(match)
        self.fired = False
        self._parked = threading.Event()
        self._go = threading.Event()
        self._abort = False

    def __repr__(self) -> str:
        where = {"before": "before", "after": "after", "commit": "before the COMMIT of a transaction that ran"}
        return f"client {self.gate.name!r} {where[self.kind]} {self.label}"

    @property
    def parked(self) -> bool:
        """Parked now: reached and not yet released."""
        return self._parked.is_set() and not self._go.is_set()

    def wait_parked(self, timeout: float = TIMEOUT) -> Pause:
        """Block until the client is parked here; fail at once if it finished without getting here."""
        deadline = time.monotonic() + timeout
        while not self._parked.wait(_POLL):
            client = self.gate.client
            if client is not None and client.done:
                raise NotReached(f"{self}: the client finished without reaching this point ({client.describe()})")
            if time.monotonic() > deadline:
                raise ScheduleTimeout(f"timed out after {timeout:g}s waiting for {self} to park")
        return self

    def release(self) -> None:
        """Let the parked client go on."""
        self._go.set()

    def rollback(self) -> None:
        """Let the client go on by raising `Aborted` where it is parked: its transaction rolls back."""
        self._abort = True
        self._go.set()

    def _reach(self) -> None:
        """Called on the client's thread when this point fires."""
        if self.parks:
            self._parked.set()
            if not self._go.wait(_PARKED_LIMIT):
                raise Aborted(f"{self}: never released")
        if self._abort or not self.parks:
            raise Aborted(f"{self}: rolled back by the schedule")


class Gate:
    """A connection whose client can be parked at named points; otherwise the connection itself."""

    def __init__(self, conn: psycopg.Connection[Any], name: str = "client") -> None:
        self.conn, self.name = conn, name
        self.client: Client | None = None  # set by `Client`, so a wait can tell "finished" from "slow"
        self.pauses: list[Pause] = []  # every point ever armed, fired or not
        self._lock = threading.Lock()
        self._depth = 0
        self._ran: list[str] = []  # the statements of the current outermost transaction

    # -- arming (from the test's thread) ------------------------------------------

    def pause_before(self, match: Match, label: str | None = None) -> Pause:
        """Park before the next statement that `match`es (exact SQL text or predicate)."""
        return self._arm("before", match, label, parks=True)

    def pause_after(self, match: Match, label: str | None = None) -> Pause:
        """Park after the next statement that `match`es has returned."""
        return self._arm("after", match, label, parks=True)

    def pause_before_commit(self, ran: Match = None, label: str | None = None) -> Pause:
        """Park before the COMMIT of the next outermost transaction that ran a statement matching `ran`."""
        return self._arm("commit", ran, label, parks=True)

    def rollback_before_commit(self, ran: Match = None, label: str | None = None) -> Pause:
        """Without parking: abort the next such transaction where it would commit."""
        return self._arm("commit", ran, label, parks=False)

    def _arm(self, kind: str, match: Match, label: str | None, parks: bool) -> Pause:
        pause = Pause(self, kind, match, label, parks)
        with self._lock:
            self.pauses.append(pause)
        return pause

    def parked_at(self) -> Pause | None:
        return next((p for p in self.pauses if p.parked), None)

    def unstick(self) -> None:
        """Disarm every point that has not fired, and roll back a parked client."""
        with self._lock:
            for pause in self.pauses:
                pause.fired = True
        for pause in self.pauses:
            if not pause._go.is_set():
                pause.rollback()

    # -- the connection's surface (on the client's thread) ---------------------------

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> psycopg.Cursor[Any]:
        self._fire("before", lambda m: _matches(m, query))
        cursor = self.conn.execute(query, params, **kwargs)
        if self._depth:
            self._ran.append(query)
        self._fire("after", lambda m: _matches(m, query))
        return cursor

    def transaction(self, *args: Any, **kwargs: Any) -> _GatedTransaction:
        return _GatedTransaction(self, self.conn.transaction(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def as_connection(self) -> psycopg.Connection[dict[str, Any]]:
        """This gate, typed as the connection it stands in for (what a store is given)."""
        return cast("psycopg.Connection[dict[str, Any]]", self)

    def _fire(self, kind: str, matches: Callable[[Match], bool]) -> None:
        with self._lock:
            pause = next((p for p in self.pauses if not p.fired and p.kind == kind and matches(p.match)), None)
            if pause is not None:
                pause.fired = True
        if pause is not None:
            pause._reach()


class _GatedTransaction:
    """`conn.transaction()`, with the gate's commit point at the outermost exit."""

    def __init__(self, gate: Gate, inner: contextlib.AbstractContextManager[psycopg.Transaction]) -> None:
        self.gate, self.inner = gate, inner

    def __enter__(self) -> psycopg.Transaction:
        entered = self.inner.__enter__()
        self.gate._depth += 1
        if self.gate._depth == 1:
            self.gate._ran = []
        return entered

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        try:
            if exc_type is None and self.gate._depth == 1:
                ran = list(self.gate._ran)
                try:
                    self.gate._fire("commit", lambda m: m is None or any(_matches(m, sql) for sql in ran))
                except Aborted as aborted:
                    self.inner.__exit__(Aborted, aborted, aborted.__traceback__)
                    raise
            return bool(self.inner.__exit__(exc_type, exc, tb))
        finally:
            self.gate._depth -= 1


class Client:
    """One gated connection and the thread that runs its operations, one at a time."""

    def __init__(self, gate: Gate, schedule: Schedule) -> None:
        self.gate, self.schedule, self.name = gate, schedule, gate.name
        gate.client = self
        self.pid = gate.conn.info.backend_pid
        self._thread: threading.Thread | None = None
        self._value: Any = None
        self._error: BaseException | None = None

    def start(self, operation: Callable[[], Any]) -> Client:
        """Run `operation` on this client's thread; it must use this client's gate only."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"client {self.name!r} is still running its previous operation")
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(operation,), name=f"client {self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self, operation: Callable[[], Any]) -> None:
        try:
            self._value = operation()
        except BaseException as error:  # noqa: BLE001 - handed to the test by result()
            self._error = error

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def describe(self) -> str:
        if not self.done:
            return "still running"
        return f"raised {self._error!r}" if self._error is not None else f"returned {self._value!r}"

    def wait_finished(self, timeout: float = TIMEOUT) -> Client:
        if self._thread is None:
            raise RuntimeError(f"client {self.name!r} was never started")
        self._thread.join(timeout)
        if self._thread.is_alive():
            parked = self.gate.parked_at()
            where = f" (it is parked: {parked})" if parked else ""
            raise ScheduleTimeout(f"timed out after {timeout:g}s waiting for client {self.name!r} to finish{where}")
        return self

    def result(self, timeout: float = TIMEOUT) -> Any:
        """The operation's return value; its exception is re-raised here."""
        self.wait_finished(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def run(self, operation: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
        """`start` and `result`: one operation, to its end."""
        return self.start(operation).result(timeout)

    def blocked_by(self) -> list[int]:
        """The backends this client's backend now waits for, inside PostgreSQL."""
        row = self.schedule.monitor.execute("SELECT pg_blocking_pids(%s) AS pids", (self.pid,)).fetchone()
        return list(row["pids"])  # type: ignore[index]  # the statement always returns one row

    def wait_blocked(self, timeout: float = TIMEOUT) -> Client:
        """Until this client's backend waits for a lock; fail if it finishes instead."""
        if self.wait_blocked_or_finished(timeout) == "finished":
            raise AssertionError(f"client {self.name!r} finished instead of blocking on a lock ({self.describe()})")
        return self

    def wait_blocked_or_finished(self, timeout: float = TIMEOUT) -> str:
        """Until this client's backend waits for a lock ("blocked") or its operation ended ("finished")."""
        deadline = time.monotonic() + timeout
        while True:
            if self.done:
                return "finished"
            if self.blocked_by():
                return "blocked"
            if (parked := self.gate.parked_at()) is not None:
                raise AssertionError(f"{parked}: parked there instead of blocking on a lock or finishing")
            if time.monotonic() > deadline:
                raise ScheduleTimeout(
                    f"timed out after {timeout:g}s waiting for client {self.name!r} to block on a lock or finish"
                )
            time.sleep(_POLL)  # the poll interval of a condition, not a wait for time to pass


class Schedule:
    """The clients of one test on one database, and the monitor connection that watches them."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.monitor = connect(dsn)
        self.clients: list[Client] = []
        self._owned: list[psycopg.Connection[Any]] = []

    def client(self, name: str, conn: psycopg.Connection[Any] | None = None) -> Client:
        """A client behind a gate: on a new connection (autocommit, UTC, dict rows), or on
        `conn`, which its owner keeps (and closes); hand `client.gate` to a store in its place."""
        gate = Gate(conn if conn is not None else connect(self.dsn), name)
        client = Client(gate, self)
        self.clients.append(client)
        if conn is None:
            self._owned.append(gate.conn)
        return client

    def close(self) -> None:
        """Unstick every client (parked ones roll back), wait for them, close every connection."""
        for client in self.clients:
            client.gate.unstick()
        for client in self.clients:
            if client._thread is not None:
                client._thread.join(TIMEOUT)
        for conn in self._owned:
            conn.close()
        self.monitor.close()

    def __enter__(self) -> Schedule:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["TIMEOUT", "Aborted", "Client", "Gate", "NotReached", "Pause", "Schedule", "ScheduleTimeout"]
