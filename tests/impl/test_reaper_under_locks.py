"""One session must not stop the reaper for every tenant (issue 40, 4).

A production database made by the scripts (impl/roles.sql, the migrations, impl/grants.sql,
impl/tenants.sql), marked a test database so that its clock is pinned. Three communities
each hold an expired lease: A (tenant A's own role), B (tenant B's) and C (served by the
application role alone). Sessions of tenant A, their three timeouts SET to 0, take every lock
they can and stall, holding them: an open transaction of the operation functions (the
community's fence shared, row locks on a claimed and on a deleted row, a step's, a request
key's and a coordinate's turn), a change of the community's state or its deletion in flight
(the fence exclusive), a change queued behind them, and each lock they cannot take (LOCK
TABLE in every mode, the advisory-lock functions, SELECT ... FOR UPDATE) is tried and
refused. Meanwhile the reaper sweeps, on a session of its own whose waits are not bounded at
all (lock_timeout, statement_timeout = 0): had it waited for anything, it would not finish.
It finishes within the bound, every other community's expired lease is reaped, and A is
reported (skipped, or its locked row left), not waited on; once the stalls end, the next
sweep reaps A's. The reaper's sessions cannot be signalled by the application's roles.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import psycopg
import pytest
from production import Production, provision

from leaseproof.conformance.harness.server import Server
from leaseproof.impl.connection import Waits, connect
from leaseproof.impl.delivery.adapter import reset_database
from leaseproof.impl.delivery.store import PostgresDeliveryStore, Sweep
from leaseproof.impl.errors import Unavailable
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, EventCause

A, B, C = uuid.UUID(int=0xA), uuid.UUID(int=0xB), uuid.UUID(int=0xC)
WORKFLOW, RUN, OTHER_RUN = uuid.UUID(int=0x100), uuid.UUID(int=0x200), uuid.UUID(int=0x201)
TARGET, MESSAGE, DEFINITION, CAUSE = b"\x01" * 32, b"\x03" * 32, b"\x04" * 32, b"\x05" * 32
EXPIRED = {c: uuid.UUID(int=0xE0 + i) for i, c in enumerate((A, B, C))}
EXPIRED_OTHER_RUN = uuid.UUID(int=0xEA)  # A's second expired lease, on a run a stalled session deletes
PENDING = uuid.UUID(int=0xDA)  # A's pending delivery, which a stalled session claims
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
BOUND = 5.0  # seconds a sweep may take; it waits for nothing, so it takes milliseconds
UNBOUNDED = "SET lock_timeout = 0; SET statement_timeout = 0; SET idle_in_transaction_session_timeout = 0"

TABLES = (
    "admitted_runs",
    "channel_authority",
    "communities",
    "definition_cutoffs",
    "definition_heads",
    "definition_runtime",
    "events",
    "executed_actions",
    "lp_clock",
    "lp_reaper",
    "lp_role_scope",
    "lp_schema_migrations",
    "retired_delivery_ids",
    "workflow_agent_deliveries",
    "workflow_runs",
    "workflows",
)
LOCK_MODES = (
    "ACCESS SHARE",
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
)


@pytest.fixture(scope="module")
def production(pg_server: Server) -> Iterator[Production]:
    with provision(pg_server, {A: "ta", B: "tb"}, test_database=True, prefix="lpl") as made:
        yield made


def _binding(community: uuid.UUID, run: uuid.UUID, step: str) -> Binding:
    return Binding(community, WORKFLOW, run, step, TARGET, DEFINITION, MESSAGE, EventCause(CAUSE))


@pytest.fixture
def world(production: Production) -> Iterator[Production]:
    """Every community's lease expired: claimed for 30 s at T0, the clock at T0 + 60 s. Made
    through the store as the application role (the reset and the clock: the superuser's)."""
    with connect(production.superuser) as superuser:
        reset_database(superuser, T0)
    with connect(production.app) as conn:
        store = PostgresDeliveryStore(conn)
        for community in (A, B, C):
            for command in (
                m.CreateCommunity(community),
                m.CreateWorkflow(community, WORKFLOW),
                m.CreateRun(community, WORKFLOW, RUN),
                m.PublishEvent(community, MESSAGE),
            ):
                assert store.execute(command) == m.Ok()
            new = m.NewDelivery(EXPIRED[community], _binding(community, RUN, "s1"))
            store.execute(m.CommitDeliveries(community, RUN, "s1", [new]))
            assert isinstance(store.execute(m.Claim(community, TARGET, 30, delivery_id=EXPIRED[community])), m.Claimed)
        assert store.execute(m.CreateRun(A, WORKFLOW, OTHER_RUN)) == m.Ok()
        store.execute(
            m.CommitDeliveries(A, OTHER_RUN, "s1", [m.NewDelivery(EXPIRED_OTHER_RUN, _binding(A, OTHER_RUN, "s1"))])
        )
        assert isinstance(store.execute(m.Claim(A, TARGET, 30, delivery_id=EXPIRED_OTHER_RUN)), m.Claimed)
        store.execute(m.CommitDeliveries(A, RUN, "s2", [m.NewDelivery(PENDING, _binding(A, RUN, "s2"))]))
    with connect(production.superuser) as superuser:
        PinnedClock(superuser).advance(dt.timedelta(seconds=60))
    yield production


# -- the stalls --------------------------------------------------------------------------------------


class Stalls:
    """Sessions whose waits are unbounded (tenant A's, or the application role's), each stalled
    inside a transaction (or queued for a lock on a thread of its own), released (rolled back)
    at the end. A statement its role may not send (LP005: a community's state is the fleet's,
    once 0006 makes it so) is recorded in `refused`, and its session holds nothing."""

    def __init__(self, production: Production) -> None:
        self.production = production
        self.sessions: list[psycopg.Connection[Any]] = []
        self.threads: list[tuple[threading.Thread, psycopg.Connection[Any]]] = []
        self.refused: list[str] = []
        self.monitor = psycopg.connect(production.superuser, autocommit=True)

    def session(self, role: str = "tenant A") -> psycopg.Connection[Any]:
        dsn = self.production.tenant(A) if role == "tenant A" else self.production.app
        conn = psycopg.connect(dsn, autocommit=True)
        conn.execute(UNBOUNDED)
        self.sessions.append(conn)
        return conn

    def hold(self, *statements: str, role: str = "tenant A") -> psycopg.Connection[Any]:
        """A session that runs `statements` in a transaction it leaves open."""
        conn = self.session(role)
        conn.execute("BEGIN")
        for statement in statements:
            try:
                conn.execute(statement.encode())
            except psycopg.DatabaseError as exc:
                if exc.sqlstate != "LP005":
                    raise
                self.refused.append(statement)
                conn.execute("ROLLBACK")
                break
        return conn

    def queue(self, statement: str, role: str = "tenant A") -> psycopg.Connection[Any]:
        """A session whose transaction waits, on a thread, for a lock another session holds."""
        conn = self.session(role)
        conn.execute("BEGIN")
        ended: dict[str, str | None] = {}

        def run() -> None:
            try:
                conn.execute(statement.encode())
                ended["sqlstate"] = None
            except psycopg.DatabaseError as exc:
                ended["sqlstate"] = exc.sqlstate

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append((thread, conn))
        wait_blocked(self.monitor, conn.info.backend_pid, thread)
        if not thread.is_alive():
            assert ended.get("sqlstate") == "LP005", f"{statement} did not wait: {ended}"
            self.refused.append(statement)
        return conn

    def release(self) -> None:
        for thread, conn in self.threads:
            conn.cancel()
            thread.join(timeout=BOUND)
            assert not thread.is_alive(), "a queued session did not give up its wait when cancelled"
        for conn in self.sessions:
            if not conn.closed:
                conn.execute("ROLLBACK")
                conn.close()
        self.monitor.close()


def wait_blocked(monitor: psycopg.Connection[Any], pid: int, thread: threading.Thread, timeout: float = 30) -> None:
    """Until the backend `pid` waits for a lock another backend holds, or `thread`, which sent
    its statement, has ended (bounded)."""
    deadline = time.monotonic() + timeout
    while monitor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", (pid,)).fetchone() != (True,):
        if not thread.is_alive():
            return
        assert time.monotonic() < deadline, f"backend {pid} never waited for a lock"
        time.sleep(0.01)  # the poll interval of a condition, not a wait for time to pass


def _u(value: uuid.UUID) -> str:
    return f"'{value}'::uuid"


def _key(value: bytes) -> str:
    return f"'\\x{value.hex()}'::bytea"


CLAIM_PENDING = (
    f"SELECT outcome FROM lp_claim({_u(A)}, {_key(TARGET)}, 60, {_u(PENDING)}, false,"
    " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'stalled-key')"
)
DELETE_OTHER_RUN = f"SELECT outcome FROM lp_delete_run({_u(A)}, {_u(OTHER_RUN)})"
COMMIT_STEP = (
    f"SELECT outcome FROM lp_commit_deliveries({_u(A)}, {_u(RUN)}, 's9', ARRAY[gen_random_uuid()],"
    f" ARRAY[{_u(WORKFLOW)}], ARRAY[{_key(TARGET)}], ARRAY[{_key(DEFINITION)}], ARRAY[{_key(MESSAGE)}],"
    f" ARRAY['event'::delivery_cause_kind], ARRAY[{_key(CAUSE)}], ARRAY[NULL::timestamptz], ARRAY[NULL::uuid])"
)
AUTHOR, SAVE_EVENT = b"\x06" * 32, b"\x09" * 32
SAVE_DEFINITION = (
    f"SELECT outcome FROM lp_save_definition({_key(SAVE_EVENT)}, {_u(A)}, {_u(WORKFLOW)}, {_key(AUTHOR)},"
    f" {_u(WORKFLOW)}, '2026-01-01T00:00:00Z', ARRAY['a'], NULL)"
)
SET_AUTHORITY = f"SELECT outcome FROM lp_set_authority({_u(A)}, {_u(WORKFLOW)}, {_key(AUTHOR)}, true)"
FENCE = f"SELECT outcome FROM lp_set_community_state({_u(A)}, 'fenced')"
DELETE_COMMUNITY = f"SELECT outcome FROM lp_delete_community({_u(A)})"
DELETE_WORKFLOW = f"SELECT outcome FROM lp_delete_workflow({_u(A)}, {_u(uuid.UUID(int=0x999))})"


@attrs.frozen
class Scenario:
    """What the stalled sessions hold while the reaper sweeps: `exclusive` if they take (or
    queue for) A's fence exclusively, so that the sweep must skip A; `left`, the expired rows
    of A they lock, which the sweep must leave and report."""

    name: str
    stall: Callable[[Stalls], object]
    exclusive: bool
    left: tuple[uuid.UUID, ...] = ()


FUNCTIONS_OPEN = (CLAIM_PENDING, DELETE_OTHER_RUN, COMMIT_STEP, SET_AUTHORITY, SAVE_DEFINITION, DELETE_WORKFLOW)
SCENARIOS = (
    Scenario(
        "an open transaction of the functions (the fence shared, two rows locked, a step's, a request key's, "
        "a coordinate's and the deletions' turns)",
        lambda stalls: stalls.hold(*FUNCTIONS_OPEN),
        exclusive=False,
        left=(EXPIRED_OTHER_RUN,),
    ),
    # A tenant changing its own community's state: today it may (a flaw of 0006, see
    # test_attacks.py); once it may not, its call is refused and it holds nothing.
    Scenario("a change of the community's state in flight", lambda stalls: stalls.hold(FENCE), exclusive=True),
    Scenario("the community's deletion in flight", lambda stalls: stalls.hold(DELETE_COMMUNITY), exclusive=True),
    Scenario(
        "a change of state queued behind an open transaction",
        lambda stalls: (stalls.hold(CLAIM_PENDING), stalls.queue(FENCE)),
        exclusive=True,
    ),
    Scenario(
        "all of them at once: an open transaction, a deletion queued behind it, a change queued behind both",
        lambda stalls: (
            stalls.hold(CLAIM_PENDING, DELETE_OTHER_RUN, COMMIT_STEP, SAVE_DEFINITION),
            stalls.queue(DELETE_COMMUNITY),
            stalls.queue(FENCE),
        ),
        exclusive=True,
        left=(EXPIRED_OTHER_RUN,),
    ),
    # The same changes of A's state by the application role (a fleet role, which may), its
    # timeouts 0 too, while tenant A's open transaction holds its rows.
    Scenario(
        "the application role's change of A's state in flight",
        lambda stalls: stalls.hold(FENCE, role="app"),
        exclusive=True,
    ),
    Scenario(
        "the application role's deletion of A queued behind tenant A's open transaction",
        lambda stalls: (stalls.hold(*FUNCTIONS_OPEN), stalls.queue(DELETE_COMMUNITY, role="app")),
        exclusive=True,
        left=(EXPIRED_OTHER_RUN,),
    ),
)


def sweep_unbounded(production: Production) -> tuple[Sweep, float]:
    """One sweep as the reaper, on a session whose waits are not bounded (so a wait would
    never end), run on a thread the test gives BOUND seconds: (what it did, how long it took)."""
    conn = connect(production.reaper)
    conn.execute(UNBOUNDED)
    result: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            result["sweep"] = PostgresDeliveryStore(conn).sweep()
        except Exception as exc:  # noqa: BLE001 - handed to the test below
            result["error"] = exc
        result["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=BOUND)
    try:
        assert not thread.is_alive(), f"the sweep waited more than {BOUND} s: for a lock a stalled session holds"
        assert "error" not in result, result
        return result["sweep"], result["took"]
    finally:
        if thread.is_alive():
            conn.cancel()
            thread.join(timeout=BOUND)
        conn.close()


def _leases(production: Production) -> dict[uuid.UUID, tuple[str, int]]:
    """Every delivery's (status, generation), read by the superuser."""
    with psycopg.connect(production.superuser, autocommit=True) as conn:
        rows = conn.execute("SELECT id, status::text, lease_generation FROM workflow_agent_deliveries").fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_a_stalled_session_stops_the_reaper_for_no_one_else(world: Production, scenario: Scenario) -> None:
    stalls = Stalls(world)
    try:
        scenario.stall(stalls)
        swept, took = sweep_unbounded(world)
        leases = _leases(world)
    finally:
        stalls.release()
    assert took < BOUND
    for community in (B, C):  # every other community's expired lease, reaped
        assert leases[EXPIRED[community]] == ("pending", 2), (community, swept)
    if scenario.exclusive and not stalls.refused:  # A's fence held, or queued for, exclusively: skipped
        assert (swept.skipped, swept.left, swept.reaped) == ((A,), (), 2), swept
        assert leases[EXPIRED[A]] == ("claimed", 1)
    else:  # A's rows locked: left, and the rest of A's reaped
        assert swept.skipped == (), swept
        assert swept.left == tuple((A, d) for d in scenario.left), swept
        assert swept.reaped == 4 - len(scenario.left), swept
    # The stalls over, the next sweep takes what this one skipped or left.
    again, _ = sweep_unbounded(world)
    leases = _leases(world)
    assert again.skipped == () and again.left == (), again
    assert [d for d, (status, _) in leases.items() if status == "claimed"] == [], (again, leases)


def test_every_lock_a_tenant_cannot_take_is_refused_and_the_sweep_meets_none(world: Production) -> None:
    """LOCK TABLE in every mode on every table, every advisory-lock function, and row locks by
    SELECT ... FOR UPDATE / FOR SHARE: each refused (42501), the transaction then held open."""
    stalls = Stalls(world)
    tried = 0
    try:
        conn = stalls.session()
        conn.execute("BEGIN")
        attempts = [f"LOCK TABLE {table} IN {mode} MODE" for table in TABLES for mode in LOCK_MODES]
        attempts += [f"SELECT 1 FROM {table} FOR {strength}" for table in TABLES for strength in ("UPDATE", "SHARE")]
        fence = str(lp_fence_key(world, B))
        attempts += [
            f"SELECT pg_{kind}advisory_{scope}lock{shared}({arguments})"
            for kind in ("", "try_")
            for scope in ("", "xact_")
            for shared in ("", "_shared")
            for arguments in (fence, "1, 2")
        ]
        for attempt in attempts:
            conn.execute("SAVEPOINT attempt")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(attempt.encode())
            conn.execute("ROLLBACK TO SAVEPOINT attempt")
            tried += 1
        held = stalls.monitor.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype IN ('relation', 'advisory', 'tuple')"
            " AND relation IS DISTINCT FROM 'pg_locks'::regclass",
            (conn.info.backend_pid,),
        ).fetchone()
        assert held == (0,), held
        swept, took = sweep_unbounded(world)
    finally:
        stalls.release()
    assert tried == len(TABLES) * (len(LOCK_MODES) + 2) + 16
    assert swept.reaped == 4 and swept.skipped == () and swept.left == (), swept
    assert took < BOUND


def lp_fence_key(production: Production, community: uuid.UUID) -> int:
    with psycopg.connect(production.superuser, autocommit=True) as conn:
        row = conn.execute("SELECT lp_fence_key(%s)", (community,)).fetchone()
    assert row is not None
    return int(row[0])


def test_fencing_stays_live_for_every_other_community(world: Production) -> None:
    """While tenant A's session holds A's fence (shared, an open transaction of the
    functions), the application role fences B and C at once; fencing A itself waits for the
    stalled write, as a change of state must, within the application's bound (Unavailable)."""
    stalls = Stalls(world)
    try:
        stalls.hold(CLAIM_PENDING)
        with connect(world.app, Waits(lock=0.5, statement=5, idle_in_transaction=5)) as conn:
            store = PostgresDeliveryStore(conn)
            for community in (B, C):
                started = time.monotonic()
                assert store.execute(m.SetCommunityState(community, m.CommunityState.FENCED)) == m.Ok()
                assert time.monotonic() - started < BOUND
            started = time.monotonic()
            with pytest.raises(Unavailable):
                store.execute(m.SetCommunityState(A, m.CommunityState.FENCED))
            assert time.monotonic() - started < BOUND
    finally:
        stalls.release()


@pytest.mark.parametrize("signal", ["pg_cancel_backend", "pg_terminate_backend"])
def test_no_role_of_the_application_signals_the_reaper(world: Production, signal: str) -> None:
    with psycopg.connect(world.reaper, autocommit=True) as reaper:
        reaper.execute("BEGIN")
        reaper.execute("SELECT reaped FROM lp_sweep()")  # mid-sweep: its transaction open
        pid = reaper.info.backend_pid
        for dsn in (world.app, world.tenant(A), world.tenant(B)):
            with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT {signal}(%s)", (pid,))
        assert reaper.execute("SELECT 1").fetchone() == (1,)
        reaper.execute("ROLLBACK")
