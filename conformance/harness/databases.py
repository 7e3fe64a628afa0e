"""Scratch databases on a server: `scratch_database()` creates one with a random name and
drops it however the caller's block ends; `databases_named()` and `drop_database()` find
and drop those a killed run left (`process_alive()` tells whether their maker still runs).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

import psycopg
from psycopg import sql

from leaseproof.conformance.harness.server import Server

__all__ = ["databases_named", "drop_database", "process_alive", "scratch_database"]


@contextlib.contextmanager
def scratch_database(server: Server, *, template: str | None = None, prefix: str = "lp") -> Iterator[str]:
    """CREATE DATABASE <prefix>_<random hex> [TEMPLATE template]; yields its dsn;
    on exit terminates its backends and DROPs it (always, even on error)."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    if len(name.encode()) > 63:
        # PostgreSQL would silently truncate it, and the yielded dsn would be wrong.
        raise ValueError(f"prefix {prefix!r} makes a database name longer than 63 bytes")
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    try:  # the drop covers the CREATE too: an interrupt right after it must not leave it behind
        with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(create)
        yield server.database_dsn(name)
    finally:
        drop_database(server, name)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def databases_named(server: Server, prefix: str) -> list[str]:
    """The server's databases whose names start with `prefix` and an underscore."""
    pattern = prefix.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "\\_%"
    with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY datname", (pattern,))
        return [name for (name,) in rows]


def drop_database(server: Server, name: str) -> None:
    """Terminate the database's backends and drop it (nothing if it is gone)."""
    with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
        # A leaked connection (e.g. from a failed test) would block the DROP.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        drop = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
        if conn.info.server_version >= 130000:
            # FORCE also covers backends that connected after the terminate.
            drop = sql.SQL("{} WITH (FORCE)").format(drop)
        conn.execute(drop)
