"""`impl/roles.sql`, `impl/grants.sql` and `impl/tenants.sql`, run as their headers say, make
roles whose privileges are enough for every operation of the stores, and no more.

The three steps run for real (`production.provision`): `roles.sql` with psql as a superuser
(the owner, the api group, the application role, the reaper, the database), the migrations
as the owner, `grants.sql` with psql; then `tenants.sql` binds a tenant role. Both machines
are then checked in lockstep (their fixed scenarios and a seeded batch of programs) with
every store call sent as the application role, and the model's Reap as the reaper: a grant
the scripts left out is a permission error, which the lockstep reports as a fault, and the
test fails. What reads tables goes through a superuser's connection: the conformance
harness's snapshots, its reset and its pinned clock (the application role holds no
privilege on any table). Roles are cluster-wide: each is named uniquely and dropped
afterwards, with the database.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from production import Production, provision, run_script
from psycopg import errors, sql

from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery import adapter as delivery_adapter
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter, reset_database
from leaseproof.impl.delivery.store import PostgresDeliveryStore, read_consistently
from leaseproof.impl.errors import Forbidden
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.impl.lifecycle import adapter as lifecycle_adapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc
from leaseproof.model.errors import Refused

TENANT = uuid.UUID(int=0xA)


@pytest.fixture(scope="module")
def production(pg_server: Server) -> Iterator[Production]:
    with provision(pg_server, {TENANT: "tenant"}, prefix="lpr") as made:
        yield made


class _Hooks:
    """The harness's side, on a superuser's connection: the reset, the pinned clock (marking a
    database a test database sets a custom parameter, which from PostgreSQL 15 on only a
    superuser, or a role granted SET on it, may, not even the database's owner), and the
    snapshots, which read every table."""

    def __init__(self, superuser_dsn: str) -> None:
        self.conn = connect(superuser_dsn)
        self.clock = PinnedClock(self.conn)

    def reset(self, start: dt.datetime) -> None:
        reset_database(self.conn, start)


class _AppDelivery(PostgresDeliveryAdapter):
    """The bundled delivery store on the application role's connection; the sweep on the reaper's."""

    def __init__(self, production: Production) -> None:
        super().__init__(production.app)
        self.hooks = _Hooks(production.superuser)
        self.clock = self.hooks.clock
        self.reaper = PostgresDeliveryStore(connect(production.reaper))
        self.reader = PostgresDeliveryStore(self.hooks.conn)
        self.name = f"postgres:PostgresDeliveryStore as {production.names.app} (Reap as {production.names.reaper})"

    def execute(self, command: m.Command) -> m.Outcome:
        if isinstance(command, m.Reap):
            try:
                return self.reaper.execute(command)
            except Refused as refused:
                return refused.rejection
        return super().execute(command)

    def reset(self, start: dt.datetime) -> None:
        self.hooks.reset(start)

    def snapshot(self) -> m.DeliverySystem:
        return self.reader.snapshot()

    def close(self) -> None:
        super().close()
        self.reaper.conn.close()
        self.hooks.conn.close()


class _AppLifecycle(PostgresLifecycleAdapter):
    """The bundled lifecycle (store, replicas, resumer) on the application role's connections."""

    def __init__(self, production: Production) -> None:
        super().__init__(production.app)
        self.hooks = _Hooks(production.superuser)
        self.clock = self.client.clock = self.hooks.clock
        self.name = f"postgres:LifecycleStore+ReplicaEngine+RunResumer as {production.names.app}"

    def reset(self, start: dt.datetime) -> None:
        self.hooks.reset(start)
        for engine in self.engines.values():
            engine.cache = type(engine.cache)(loaded_at=start)

    def snapshot(self) -> lc.LifecycleSystem:
        conn = self.conn
        self.conn = self.hooks.conn  # the parent reads its tables on self.conn
        try:
            return super().snapshot()
        finally:
            self.conn = conn

    def close(self) -> None:
        super().close()
        self.hooks.conn.close()


@pytest.fixture
def no_migrations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapters migrate on construction; the application role may not (nor need it)."""

    def refuse(conn: Any) -> list[str]:
        return []

    monkeypatch.setattr(delivery_adapter, "migrate", refuse)
    monkeypatch.setattr(lifecycle_adapter, "migrate", refuse)


@pytest.mark.usefixtures("no_migrations")
@pytest.mark.parametrize("machine", ["delivery", "lifecycle"])
def test_every_store_call_runs_as_the_application_role(production: Production, machine: str) -> None:
    adapter = _AppDelivery(production) if machine == "delivery" else _AppLifecycle(production)
    try:
        with psycopg.connect(production.app) as conn:
            assert conn.execute("SELECT current_user, session_user").fetchone() == (production.names.app,) * 2
        verdict = run_conformance(adapter, Run(machine=machine, max_examples=25, seed=20261205))
    finally:
        adapter.close()
    assert not verdict.fault, verdict.fault
    assert verdict.conforms, verdict.failure
    assert verdict.coverage.scenarios > 0 and verdict.coverage.examples > 0


def test_the_snapshots_read_what_the_application_role_may_not(production: Production) -> None:
    """Why the snapshots go through the superuser: the application role reads no table."""
    with connect(production.app) as conn, pytest.raises(errors.InsufficientPrivilege):
        read_consistently(conn, PostgresDeliveryStore.SNAPSHOT_QUERIES)


def test_the_sweep_is_the_reapers_alone(production: Production) -> None:
    with connect(production.app) as conn, pytest.raises(Forbidden):
        PostgresDeliveryStore(conn).sweep()
    with connect(production.tenant(TENANT)) as conn, pytest.raises(Forbidden):
        PostgresDeliveryStore(conn).sweep()
    with connect(production.reaper) as conn:
        assert PostgresDeliveryStore(conn).sweep().reaped == 0
        with pytest.raises(Forbidden):
            PostgresDeliveryStore(conn).execute(m.CreateCommunity(uuid.UUID(int=0x5EED)))


def test_the_roles_own_nothing_and_hold_no_privilege_on_a_table(production: Production) -> None:
    names = production.names
    with psycopg.connect(production.superuser, autocommit=True) as conn:
        for role in (names.app, names.api, names.reaper, *names.tenants):
            owned = conn.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = %s", (role,)
            ).fetchone()
            assert owned == (0,), role
            held = conn.execute(
                "SELECT c.relname, p.privilege FROM pg_class c, unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE',"
                " 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p (privilege)"
                " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')"
                " AND has_table_privilege(%s, c.oid, p.privilege)",
                (role,),
            ).fetchall()
            assert held == [], (role, held)
            sequences = conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'S'"
                " AND (has_sequence_privilege(%s, oid, 'USAGE') OR has_sequence_privilege(%s, oid, 'UPDATE'))",
                (role, role),
            ).fetchall()
            assert sequences == [], (role, sequences)
            database = conn.execute(
                "SELECT has_database_privilege(%s, current_database(), 'CREATE'),"
                " has_database_privilege(%s, current_database(), 'TEMP'),"
                " has_schema_privilege(%s, 'public', 'CREATE')",
                (role, role, role),
            ).fetchone()
            assert database == (False, False, False), role
        for role in (names.app, names.api, names.reaper, *names.tenants, "public"):
            advisory = conn.execute(
                "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace"
                " AND proname ~ '^pg_(try_)?advisory_'"
                " AND has_function_privilege(%s, oid, 'EXECUTE')",  # 'public' names PUBLIC here
                (role,),
            ).fetchone()
            assert advisory == (0,), role
        # The role-wide defaults of every login role: bounded waits.
        for role in (names.app, names.reaper, *names.tenants):
            settings = conn.execute(
                "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
                " WHERE r.rolname = %s AND s.setdatabase = 0",
                (role,),
            ).fetchone()
            assert settings is not None and sorted(settings[0]) == [
                "idle_in_transaction_session_timeout=60s",
                "lock_timeout=5s",
                "statement_timeout=30s",
            ], role
    for dsn in (production.app, production.reaper, production.tenant(TENANT)):
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),"
                " current_setting('idle_in_transaction_session_timeout')"
            ).fetchone()
            assert row == ("5s", "30s", "1min"), dsn


def test_the_application_role_cannot_move_the_clock_or_empty_a_table(production: Production) -> None:
    with psycopg.connect(production.app, autocommit=True) as conn:
        for statement in (
            "INSERT INTO lp_clock (pinned_at) VALUES (now() - interval '1 hour')",
            "UPDATE lp_clock SET pinned_at = now()",
            "DELETE FROM lp_schema_migrations",
            "TRUNCATE workflow_agent_deliveries",
            "DELETE FROM communities",
            "CREATE TABLE lp_mine (x int)",
            "CREATE TEMP TABLE communities (id uuid, state text)",
            "ALTER TABLE workflow_agent_deliveries DISABLE TRIGGER USER",
            "SELECT pg_advisory_lock(1)",
            f"ALTER DATABASE {production.names.database} SET leaseproof.test_hooks = on",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)
    # Not even the owner marks the database a test database (where the clock may be pinned).
    with psycopg.connect(production.owner, autocommit=True) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(f"ALTER DATABASE {production.names.database} SET leaseproof.test_hooks = on")


def test_tenants_sql_binds_a_role_to_a_community_and_runs_again(production: Production) -> None:
    """Run again for the same role and another community, it binds that one too, and makes no
    second role; an empty community is refused (it would make a fleet role)."""
    names = production.names
    role = names.tenants[0]
    other = uuid.UUID(int=0xA2)
    run_script(production.superuser, "tenants.sql", api=names.api, tenant=role, community=str(other))
    with psycopg.connect(production.superuser, autocommit=True) as conn:
        try:
            scope = conn.execute(
                "SELECT community_id FROM lp_role_scope WHERE role_name = %s ORDER BY 1", (role,)
            ).fetchall()
            assert scope == [(TENANT,), (other,)]
            with pytest.raises(AssertionError, match="invalid input syntax for type uuid"):
                run_script(production.superuser, "tenants.sql", api=names.api, tenant=role, community="")
            assert conn.execute(
                "SELECT count(*) FROM lp_role_scope WHERE role_name = %s AND community_id IS NULL", (role,)
            ).fetchone() == (0,)
        finally:
            conn.execute("DELETE FROM lp_role_scope WHERE role_name = %s AND community_id = %s", (role, other))


def test_the_scripts_run_again_change_nothing(production: Production) -> None:
    """grants.sql is idempotent (so a deployment may run it after every migration)."""
    names = production.names
    with psycopg.connect(production.superuser, autocommit=True) as conn:

        def privileges() -> Any:
            return conn.execute(
                sql.SQL(
                    "SELECT (SELECT string_agg(format('%s %s', oid::regprocedure, proacl), ' ' ORDER BY oid)"
                    " FROM pg_proc WHERE proacl IS NOT NULL),"
                    " (SELECT string_agg(format('%s %s', oid::regclass, relacl), ' ' ORDER BY oid)"
                    " FROM pg_class WHERE relacl IS NOT NULL),"
                    " (SELECT string_agg(format('%s %s', role_name, community_id), ' '"
                    " ORDER BY role_name, community_id)"
                    " FROM lp_role_scope)"
                )
            ).fetchone()

        before = privileges()
        run_script(
            production.superuser, "grants.sql", owner=names.owner, api=names.api, app=names.app, reaper=names.reaper
        )
        assert privileges() == before
