"""Bounded waits and typed errors: a stalled client cannot stop the store.

Each test stalls a real client inside a transaction on a real server (a
second connection that takes a lock and then does nothing, as a worker
paused between its UPDATE and its COMMIT would) or cuts a store's connection
at a chosen point (the statement gate parks it there, and the server ends its
backend). A store call then ends within its bound, with an error that says
whether it took effect, and the database shows that it did what it says.
Nothing sleeps: each wait is for a condition, bounded.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from leaseproof.impl.connection import Waits, connect
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.store import PostgresDeliveryStore, Sweep
from leaseproof.impl.errors import ConnectionLost, Unavailable
from leaseproof.impl.hooks.gate import Client, Schedule
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc
from leaseproof.model.binding import Binding, EventCause
from leaseproof.model.errors import Refused

A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)
WORKFLOW, RUN, LATER = uuid.UUID(int=0x100), uuid.UUID(int=0x200), uuid.UUID(int=0x300)
TARGET, MESSAGE, DEFINITION = b"\x01" * 32, b"\x03" * 32, b"\x04" * 32
DELIVERY = {A: uuid.UUID(int=0xDA), B: uuid.UUID(int=0xDB)}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SHORT = Waits(lock=0.2, statement=5, idle_in_transaction=5)
_BOUND = 30.0  # seconds a call may take before the test calls it unbounded


@pytest.fixture
def world(delivery_dsn: str) -> Iterator[str]:
    """Communities A and B, each with one delivery claimed for 30 s, and the
    (pinned) clock 60 s on: both leases expired, waiting for the reaper."""
    adapter = PostgresDeliveryAdapter(delivery_dsn)
    try:
        adapter.reset(T0)
        for community in (A, B):
            for command in (
                m.CreateCommunity(community),
                m.CreateWorkflow(community, WORKFLOW),
                m.CreateRun(community, WORKFLOW, RUN),
                m.PublishEvent(community, MESSAGE),
            ):
                assert adapter.execute(command) == m.Ok()
            binding = Binding(community, WORKFLOW, RUN, "s1", TARGET, DEFINITION, MESSAGE, EventCause(b"\x05" * 32))
            adapter.execute(m.CommitDeliveries(community, RUN, "s1", [m.NewDelivery(DELIVERY[community], binding)]))
            assert isinstance(adapter.execute(m.Claim(community, TARGET, 30)), m.Claimed)
        adapter.execute(m.AdvanceClock(dt.timedelta(seconds=60)))
    finally:
        adapter.close()
    yield delivery_dsn


@pytest.fixture
def stalled(world: str) -> Iterator[psycopg.Connection[Any]]:
    """A client that opened a transaction and stopped; rolled back at the end."""
    conn = connect(world)
    conn.execute("BEGIN")
    yield conn
    if not conn.closed:
        conn.execute("ROLLBACK")
        conn.close()


@contextlib.contextmanager
def _bounded_store(world: str, waits: Waits = SHORT) -> Iterator[tuple[Client, PostgresDeliveryStore]]:
    """A store whose calls its own thread runs (the statement gate's Client), so a call
    that does not end within _BOUND (`runner.run(..., timeout=_BOUND)`) fails the test
    instead of hanging it."""
    conn = connect(world, waits)
    try:
        with Schedule(world) as schedule:
            runner = schedule.client("store", conn)
            yield runner, PostgresDeliveryStore(runner.gate.as_connection())
    finally:
        conn.close()


@pytest.fixture
def client(world: str) -> Iterator[tuple[Client, PostgresDeliveryStore]]:
    """A bounded store with short bounds."""
    with _bounded_store(world) as bounded:
        yield bounded


def _store(dsn: str, waits: Waits = SHORT) -> PostgresDeliveryStore:
    return PostgresDeliveryStore(connect(dsn, waits))


def _statuses(dsn: str) -> dict[uuid.UUID, tuple[str, int]]:
    with connect(dsn) as conn:
        rows = conn.execute("SELECT id, status, lease_generation FROM workflow_agent_deliveries").fetchall()
    return {row["id"]: (row["status"], row["lease_generation"]) for row in rows}


def _stall_a_state_change(stalled: psycopg.Connection[Any], community: uuid.UUID) -> None:
    """A client that changed `community`'s state inside its open transaction and stopped
    there: it holds the community's write fence exclusively until it ends."""
    row = stalled.execute("SELECT outcome FROM lp_set_community_state(%s, 'quiescing')", (community,)).fetchone()
    assert row == {"outcome": "Ok"}


def test_a_write_blocked_by_a_stalled_client_gives_up_writes_nothing_and_other_tenants_go_on(
    client: tuple[Client, PostgresDeliveryStore], stalled: psycopg.Connection[Any]
) -> None:
    runner, store = client
    _stall_a_state_change(stalled, A)
    with pytest.raises(Unavailable) as raised:
        runner.run(lambda: store.execute(m.CreateRun(A, WORKFLOW, LATER)), timeout=_BOUND)
    error = raised.value
    assert error.operation == "CreateRun" and "lock another client holds" in str(error)
    assert "did not take effect and may be retried" in str(error)
    # The other tenant is not held up, and the same connection goes on working.
    assert runner.run(lambda: store.execute(m.CreateRun(B, WORKFLOW, LATER)), timeout=_BOUND) == m.Ok()
    stalled.execute("ROLLBACK")
    assert runner.run(lambda: store.execute(m.CreateRun(A, WORKFLOW, LATER))) == m.Ok()  # it had written nothing


def test_the_reaper_skips_a_row_a_stalled_holder_locks_and_reaps_every_other_tenant_meanwhile(
    world: str, client: tuple[Client, PostgresDeliveryStore], stalled: psycopg.Connection[Any]
) -> None:
    runner, store = client
    before = _statuses(world)
    stalled.execute("SELECT 1 FROM workflow_agent_deliveries WHERE id = %s FOR UPDATE", (DELIVERY[A],))
    assert runner.run(lambda: store.execute(m.Reap()), timeout=_BOUND) == m.Reaped(1)
    after = _statuses(world)
    assert after[DELIVERY[A]] == before[DELIVERY[A]] == ("claimed", 1)  # skipped: left for the next sweep
    assert after[DELIVERY[B]] == ("pending", 2)  # the other tenant's expired lease is reaped meanwhile
    stalled.execute("ROLLBACK")
    assert runner.run(lambda: store.execute(m.Reap())) == m.Reaped(1)  # the next sweep takes the row it skipped
    assert _statuses(world)[DELIVERY[A]] == ("pending", 2)


def test_a_sweep_reports_the_expired_lease_it_left_and_the_next_one_takes_it(
    world: str, client: tuple[Client, PostgresDeliveryStore], stalled: psycopg.Connection[Any]
) -> None:
    runner, store = client
    stalled.execute("SELECT 1 FROM workflow_agent_deliveries WHERE id = %s FOR UPDATE", (DELIVERY[A],))
    assert runner.run(store.sweep, timeout=_BOUND) == Sweep(1, ((A, DELIVERY[A]),))
    stalled.execute("ROLLBACK")
    assert runner.run(store.sweep) == Sweep(1, ())
    assert runner.run(store.sweep) == Sweep(0, ())
    assert _statuses(world) == {DELIVERY[A]: ("pending", 2), DELIVERY[B]: ("pending", 2)}


def test_a_sweep_leaves_and_does_not_report_the_leases_of_a_community_that_is_not_writable(
    world: str, client: tuple[Client, PostgresDeliveryStore]
) -> None:
    runner, store = client
    assert runner.run(lambda: store.execute(m.SetCommunityState(B, m.CommunityState.FENCED))) == m.Ok()
    assert runner.run(store.sweep) == Sweep(1, ())  # A's reaped; B's stays claimed, as the model's Reap leaves it
    assert _statuses(world) == {DELIVERY[A]: ("pending", 2), DELIVERY[B]: ("claimed", 1)}


def test_the_reaper_skips_a_community_a_stalled_state_change_holds_and_takes_it_once_the_server_ends_it(
    world: str,
) -> None:
    stalled = connect(world, Waits(idle_in_transaction=0.3))
    pid = stalled.info.backend_pid
    stalled.execute("BEGIN")
    _stall_a_state_change(stalled, A)
    with contextlib.closing(stalled), _bounded_store(world, Waits()) as (runner, store):
        # The sweep does not wait for the stalled change: it reaps B and reports A skipped.
        assert runner.run(store.sweep, timeout=_BOUND) == Sweep(1, (), (A,))
        assert _statuses(world) == {DELIVERY[A]: ("claimed", 1), DELIVERY[B]: ("pending", 2)}
        with connect(world) as monitor:
            deadline = time.monotonic() + _BOUND
            while monitor.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                assert time.monotonic() < deadline, "the stalled session was not ended"
                time.sleep(0.05)  # the poll interval of a condition
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            stalled.execute("COMMIT")  # its session was ended: nothing it did commits
        assert stalled.broken
        assert runner.run(store.sweep, timeout=_BOUND) == Sweep(1, (), ())  # the next sweep takes A's
        assert _statuses(world) == {DELIVERY[A]: ("pending", 2), DELIVERY[B]: ("pending", 2)}


def _cut(world: str, at: Callable[[Any], Any]) -> tuple[ConnectionLost, Callable[[], bool]]:
    """Run CreateRun(A, LATER) on a gated store, end its backend where `at(gate)`
    parks it, and return what the call raised and whether the run exists now."""
    with Schedule(world) as schedule:
        client = schedule.client("cut")
        store = PostgresDeliveryStore(client.gate.as_connection())
        pause = at(client.gate)
        client.start(lambda: store.execute(m.CreateRun(A, WORKFLOW, LATER)))
        pause.wait_parked()
        terminated = schedule.monitor.execute("SELECT pg_terminate_backend(%s, 10000) AS done", (client.pid,))
        assert terminated.fetchone()["done"]  # type: ignore[index]  # one row
        pause.release()
        with pytest.raises(ConnectionLost) as raised:  # not a return: its connection was ended
            client.result()
    error = raised.value

    def exists() -> bool:
        with connect(world) as conn:
            return conn.execute("SELECT 1 FROM workflow_runs WHERE id = %s", (LATER,)).fetchone() is not None

    return error, exists


def test_a_connection_lost_as_a_call_is_sent_says_its_outcome_is_unknown(world: str) -> None:
    # A call is one statement, its own transaction: a connection found gone when the call
    # is sent cannot say whether the server ran it (here it had not).
    error, exists = _cut(world, lambda gate: gate.pause_before(PostgresDeliveryStore.SQL_CREATE_RUN))
    assert isinstance(error, ConnectionLost) and error.applied is None, error
    assert "while it was committing: it may or may not have taken effect" in str(error)
    assert not exists()


def test_a_connection_lost_while_committing_says_the_outcome_is_unknown(world: str) -> None:
    error, exists = _cut(world, lambda gate: gate.pause_before_commit())
    assert isinstance(error, ConnectionLost) and error.applied is None, error
    assert "while it was committing: it may or may not have taken effect" in str(error)
    assert isinstance(error, ConnectionError)  # what the conformance harness records as indeterminate
    assert not exists()  # here the COMMIT never reached the server; the error could not know that


def test_a_refusal_is_still_an_answer(world: str) -> None:
    store = _store(world)
    try:
        with pytest.raises(Refused):
            store.execute(m.CreateRun(A, WORKFLOW, RUN))  # it exists
    finally:
        store.conn.close()


def test_the_bounds_are_set_on_every_connection_of_the_store(world: str) -> None:
    with connect(world, Waits(lock=1.5, statement=7, idle_in_transaction=90)) as conn:
        got = {
            name: conn.execute(f"SHOW {name}").fetchone()[name]  # type: ignore[index]  # SHOW returns one row
            for name in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout", "TimeZone")
        }
    assert got == {
        "lock_timeout": "1500ms",
        "statement_timeout": "7s",
        "idle_in_transaction_session_timeout": "90s",
        "TimeZone": "UTC",
    }


# -- the lifecycle machine's writers and replicas: the same bounds, the same typed errors --


@pytest.fixture
def lifecycle(world: str) -> Iterator[tuple[Client, PostgresLifecycleAdapter]]:
    """The bundled lifecycle adapter with short bounds, its calls run on a Client's thread."""
    adapter = PostgresLifecycleAdapter(world, connect=lambda dsn: connect(dsn, SHORT))
    try:
        with Schedule(world) as schedule:
            yield schedule.client("lifecycle"), adapter
    finally:
        adapter.close()


def test_a_lifecycle_write_blocked_by_a_stalled_client_gives_up_with_unavailable(
    lifecycle: tuple[Client, PostgresLifecycleAdapter], stalled: psycopg.Connection[Any]
) -> None:
    runner, adapter = lifecycle
    _stall_a_state_change(stalled, A)
    grant = lc.SetAuthority(A, WORKFLOW, TARGET, True)
    with pytest.raises(Unavailable) as raised:
        runner.run(lambda: adapter.execute(grant), timeout=_BOUND)
    assert raised.value.operation == "SetAuthority" and "lock another client holds" in str(raised.value)
    assert runner.run(lambda: adapter.execute(lc.SetAuthority(B, WORKFLOW, TARGET, True)), timeout=_BOUND) == m.Ok()
    stalled.execute("ROLLBACK")
    assert runner.run(lambda: adapter.execute(grant)) == m.Ok()


def test_a_lifecycle_call_on_a_connection_the_server_ended_says_its_outcome_is_unknown(
    world: str, lifecycle: tuple[Client, PostgresLifecycleAdapter]
) -> None:
    runner, adapter = lifecycle
    with connect(world) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 10000)", (adapter.conn.info.backend_pid,))
    with pytest.raises(ConnectionLost) as raised:
        runner.run(lambda: adapter.execute(lc.SetAuthority(A, WORKFLOW, TARGET, True)), timeout=_BOUND)
    assert raised.value.applied is None and raised.value.operation == "SetAuthority"  # one statement, unknown
