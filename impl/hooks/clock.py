"""The pinned clock: tests set and move the database's clock, which production only reads.

Every statement reads `lp_now()`, the transaction time unless `lp_clock`
holds a pinned instant (impl/migrations/). `PinnedClock` writes that row;
the bundled stores never do.

A pinned clock is honoured, and `lp_clock` may be written at all, only in a
*test database*: one whose owner marked it with a database-level setting
(`mark_test_database`, migration 0004). In any other database `lp_now()` is
the transaction time whatever `lp_clock` holds, and no role, not even the
owner, can write it. A session's `SET` does not mark a database; only the
database's owner or a superuser can.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from psycopg.rows import tuple_row

# The database-level setting (pg_db_role_setting, setrole 0) that marks a test database.
TEST_HOOKS_SETTING = "leaseproof.test_hooks"

_MARK = f"""
    DO $$ BEGIN
        IF NOT lp_test_hooks() THEN
            EXECUTE format('ALTER DATABASE %I SET {TEST_HOOKS_SETTING} = on', current_database());
        END IF;
    END $$
"""


def mark_test_database(conn: psycopg.Connection[Any]) -> None:
    """Mark the connection's (migrated) database as a test database, for good: its pinned
    clock is honoured and its tombstones may be reset. Only a superuser (or, from PostgreSQL 15 on, a role
    granted SET on the parameter) can, not even the database's owner;
    anyone else gets `InsufficientPrivilege`. Nothing changes if it is marked already."""
    conn.execute(_MARK)


def is_test_database(conn: psycopg.Connection[Any]) -> bool:
    """Whether the connection's database is marked a test database."""
    with conn.cursor(row_factory=tuple_row) as cursor:
        row = cursor.execute("SELECT lp_test_hooks()").fetchone()
    return bool(row and row[0])


class PinnedClock:
    """Test control of the DB clock: pins `lp_now()` through the same function production reads.
    Its database must be a test database (`mark_test_database`), and its role the database's owner."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def pin(self, at: dt.datetime) -> None:
        self.conn.execute(
            "INSERT INTO lp_clock (pinned_at) VALUES (%s)"
            " ON CONFLICT (singleton) DO UPDATE SET pinned_at = excluded.pinned_at",
            (at,),
        )

    def advance(self, by: dt.timedelta) -> None:
        updated = self.conn.execute("UPDATE lp_clock SET pinned_at = pinned_at + %s RETURNING 1", (by,)).fetchone()
        if updated is None:
            raise RuntimeError("the clock is not pinned: call pin() first")

    def unpin(self) -> None:
        self.conn.execute("DELETE FROM lp_clock")
