"""What a provisioned PostgreSQL server is (`Server`), and what every way of getting one
shares: where its notices go (`Log`), the failure that sends `postgres_server()` on to the
next way (`SourceUnavailable`), and whether a server answers yet (`try_version`).

The lowest module of the harness's provisioning: provision.py, container.py, embedded.py,
leftovers.py and databases.py import it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import psycopg
from psycopg.conninfo import make_conninfo

__all__ = ["STARTUP_DEADLINE", "Log", "Server", "SourceUnavailable", "quiet", "try_version"]

# How long a started server (a container's, the embedded one) has to accept connections.
STARTUP_DEADLINE = 30.0

Log = Callable[[str], object]  # what it returns is ignored (so `err.write` will do)


@attrs.frozen
class Server:
    """A running server and how to reach its maintenance database: as a superuser, or
    (a server named by DSN) as the role named, which may at least create databases."""

    dsn: str
    source: str
    description: str
    # Stops the server ("fast": a clean shutdown; "immediate": a crash, recovered at the
    # next start) and starts it again on the same data; only for a server leaseproof
    # itself started (the embedded one), None for one it was given.
    restart: Callable[[str], None] | None = attrs.field(default=None, eq=False, repr=False)
    # Whether its role may mark a database a test database (ALTER DATABASE ... SET
    # leaseproof.test_hooks), which the bundled implementation's pinned clock needs: a
    # superuser, or a role granted SET on the parameter. Only a named server's role may not.
    marks_test_databases: bool = True

    def database_dsn(self, name: str) -> str:
        """The same server and credentials, database `name`."""
        return make_conninfo(self.dsn, dbname=name)


class SourceUnavailable(Exception):
    """One source could not be used; the message is a one-line reason."""

    def __init__(self, reason: str, *, where: str = "", log_tail: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.where = where
        self.log_tail = log_tail


def try_version(dsn: str) -> str | None:
    """server_version if the server accepts a connection now, else None."""
    try:
        with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error:
        return None
    return row[0] if row else "?"


def quiet(_message: str) -> None:
    pass
