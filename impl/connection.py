"""How the bundled stores connect to PostgreSQL: a session with every wait bounded by the
server (`Waits`), autocommit, UTC and dict rows (`connect`). Below the stores and the test
hooks alike, which both open such connections."""

from __future__ import annotations

from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row


@attrs.frozen
class Waits:
    """How long a store call may wait, in seconds, each bound enforced by the server
    (one client stalled inside a transaction must not stop every other):

    - `lock`: for a row or advisory lock another client holds (lock_timeout);
    - `statement`: for any one statement (statement_timeout);
    - `idle_in_transaction`: how long a client of the store may sit inside an
      open transaction before the server ends its session and releases its
      locks (idle_in_transaction_session_timeout): the bound on how long a
      stalled client can hold up the others.

    A call that waits past `lock` or `statement` raises `Unavailable`. impl/roles.sql
    sets the same defaults on the roles themselves, so that a session that is not
    the store's (a console) has them too.
    """

    lock: float = 5.0
    statement: float = 30.0
    idle_in_transaction: float = 60.0

    def settings(self) -> str:
        """The SET statements that apply these bounds to a session (in milliseconds)."""
        return "; ".join(
            f"SET {name} = {round(seconds * 1000)}"
            for name, seconds in (
                ("lock_timeout", self.lock),
                ("statement_timeout", self.statement),
                ("idle_in_transaction_session_timeout", self.idle_in_transaction),
            )
        )


WAITS = Waits()


def connect(dsn: str, waits: Waits = WAITS) -> psycopg.Connection[dict[str, Any]]:
    """A connection as the store expects it: autocommit, UTC, dict rows, bounded waits
    (one round trip sets them all)."""
    conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
    conn.execute(f"SET TIME ZONE 'UTC'; {waits.settings()}".encode())
    return conn
