"""Scratch databases (databases.py): each its own, dropped however the block ends, copied
from a template when asked, and never under a name PostgreSQL would truncate."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server


def _database_exists(server: Server, name: str) -> bool:
    with psycopg.connect(server.dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert row is not None
    return bool(row[0] == 1)


def _dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


def test_scratch_databases_are_isolated_and_dropped(pg_server: Server, scratch_dsn: str) -> None:
    with psycopg.connect(scratch_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE only_here (x int)")
        conn.execute("INSERT INTO only_here VALUES (1)")
    with scratch_database(pg_server) as other_dsn:
        other = _dbname(other_dsn)
        assert other != _dbname(scratch_dsn)
        assert _database_exists(pg_server, other)
        with psycopg.connect(other_dsn) as conn:
            row = conn.execute("SELECT to_regclass('only_here')").fetchone()
        assert row == (None,)
    assert not _database_exists(pg_server, other)


def test_scratch_database_is_dropped_on_error_despite_open_connections(pg_server: Server) -> None:
    lingering: psycopg.Connection | None = None
    try:
        with pytest.raises(RuntimeError, match="test body failed"), scratch_database(pg_server, prefix="lp_err") as dsn:
            name = _dbname(dsn)
            assert name.startswith("lp_err_")
            lingering = psycopg.connect(dsn)  # left open on purpose
            raise RuntimeError("test body failed")
        assert not _database_exists(pg_server, name)
    finally:
        if lingering is not None:
            lingering.close()


def test_scratch_database_copies_its_template(pg_server: Server) -> None:
    with scratch_database(pg_server, prefix="lp_tpl") as template_dsn:
        with psycopg.connect(template_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE seeded (x int)")
        with scratch_database(pg_server, template=_dbname(template_dsn)) as copy_dsn:
            with psycopg.connect(copy_dsn) as conn:
                row = conn.execute("SELECT to_regclass('seeded') IS NOT NULL").fetchone()
            assert row == (True,)


def test_scratch_database_refuses_a_name_postgres_would_truncate(pg_server: Server) -> None:
    with pytest.raises(ValueError, match="63 bytes"), scratch_database(pg_server, prefix="p" * 60):
        pytest.fail("a truncated database name was yielded")
