"""Shared fixtures: one PostgreSQL server per test session, a fresh database per test.

The server comes from `postgres_server()`: LEASEPROOF_DSN if set, else Docker,
else the embedded binaries.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.provision import postgres_server
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.migrate import migrate

pytest_plugins = ["pytester"]

# The processes the tests start may cache their bytecode, whatever the machine's environment says.
# Many of them are pytest runs (pytester), and pytest rewrites the asserts of every module of a
# distribution that declares a pytest plugin, leaseproof's whole package among them, and keeps the
# result only where bytecode may be written: with PYTHONDONTWRITEBYTECODE set, each such run spent
# over a second of CPU rewriting the package again. Nothing a test asserts depends on it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown, and unused, without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than the machine has cores. The tests spend much of their time
    waiting on PostgreSQL and on the processes they start; measured on the 2-core machine
    (2026-12-08, the whole suite once each), 3 workers took 460 s where 2 took 530 s."""
    return (os.cpu_count() or 1) + 1


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    """The session's server; stopped (unless it was named by DSN) at the end."""
    with postgres_server() as server:
        yield server


@pytest.fixture
def scratch_dsn(pg_server: Server) -> Iterator[str]:
    """DSN of a fresh, empty database on `pg_server`, dropped after the test."""
    with scratch_database(pg_server) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def delivery_template(pg_server: Server) -> Iterator[str]:
    """Name of a database with every migration applied, cloned by `delivery_dsn`."""
    with scratch_database(pg_server, prefix="lp_template") as dsn:
        with connect(dsn) as conn:
            migrate(conn)
        name = conninfo_to_dict(dsn)["dbname"]
        assert isinstance(name, str), dsn
        yield name


@pytest.fixture
def delivery_dsn(pg_server: Server, delivery_template: str) -> Iterator[str]:
    """DSN of a fresh, migrated database, dropped after the test."""
    with scratch_database(pg_server, template=delivery_template) as dsn:
        yield dsn


@pytest.fixture
def adapter(delivery_dsn: str) -> Iterator[PostgresDeliveryAdapter]:
    """The bundled implementation behind the adapter boundary, on a fresh database."""
    bundled = PostgresDeliveryAdapter(delivery_dsn)
    yield bundled
    bundled.close()


@pytest.fixture
def lifecycle_adapter(delivery_dsn: str) -> Iterator[PostgresLifecycleAdapter]:
    """The bundled lifecycle implementation (two replica engines) on a fresh database."""
    bundled = PostgresLifecycleAdapter(delivery_dsn)
    yield bundled
    bundled.close()
