"""A controlled database clock for libraries that read `now()`: the search-path clock.

Real queues read the time from PostgreSQL (`now()`). To move a library's clock without
sleeping and without touching its SQL, its database gets a schema `lpclock` whose
`lpclock.now()` reads a one-row table (the time a test pinned), and its connections put
that schema before `pg_catalog` in their search path (`public, lpclock, pg_catalog`): an
unqualified `now()`, in client SQL or inside plpgsql functions, then resolves to it, while
new tables still go to `public`. Column defaults bind their function when the table is
created, so the library's schema is installed through a connection with this path too.
The same goes for `transaction_timestamp()`, `statement_timestamp()` and `clock_timestamp()`
(`TIME_FUNCTIONS`: pgmq reads the last), each answering the pinned time. A library that names
`pg_catalog.now()` or the client's clock is not moved by this (its adapter says so, or passes the
database's time). CURRENT_TIMESTAMP, LOCALTIMESTAMP and the other time keywords, which PostgreSQL
binds to pg_catalog itself, are moved by making the statements over at the wire (`keywords`), for
an adapter that asks for it. Test
tooling for the libraries under test only: the bundled store's clock is `lp_clock`
(impl/hooks/clock.py).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SEARCH_PATH = "public, lpclock, pg_catalog"
# The time functions a pinned clock answers for, an unqualified call of each resolving to lpclock's
# (with the volatility of pg_catalog's: clock_timestamp() is read anew each call, the rest once a
# statement); unpinned, each reads pg_catalog's.
TIME_FUNCTIONS = {
    "now": "STABLE",
    "transaction_timestamp": "STABLE",
    "statement_timestamp": "STABLE",
    "clock_timestamp": "VOLATILE",
}
_INSTALL = """
    CREATE SCHEMA IF NOT EXISTS lpclock;
    CREATE TABLE IF NOT EXISTS lpclock.pinned (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        at timestamptz NOT NULL
    );
""" + "".join(
    f"""
    CREATE OR REPLACE FUNCTION lpclock.{name}() RETURNS timestamptz LANGUAGE sql {volatility}
        AS $$ SELECT coalesce((SELECT at FROM lpclock.pinned), pg_catalog.{name}()) $$;"""
    for name, volatility in TIME_FUNCTIONS.items()
)


# The SQL keywords that read the time, which PostgreSQL binds to pg_catalog itself (no search path
# reaches them), each with an optional precision, and what `keywords` makes of them: the pinned time.
_KEYWORDS = re.compile(
    r"\b(current_timestamp|localtimestamp|current_date|current_time|localtime)\b(\s*\(\s*\d+\s*\))?", re.IGNORECASE
)
_AS = {
    "current_timestamp": "lpclock.now()",
    "localtimestamp": "lpclock.now()::timestamp",
    "current_date": "lpclock.now()::date",
    "current_time": "lpclock.now()::timetz",
    "localtime": "lpclock.now()::time",
}


def keywords(sql: str) -> str:
    """`sql` with every time keyword (CURRENT_TIMESTAMP, LOCALTIMESTAMP, CURRENT_DATE, CURRENT_TIME,
    LOCALTIME) read from the pinned clock instead, for a library whose SQL uses them: its
    clients connect through a proxy that makes every statement over with this (`FaultProxy.rewrite`;
    an adapter asks for it with `clock_keywords = True`), its schema's functions included, as
    they are installed. A keyword inside a quoted identifier would be made over too."""
    return _KEYWORDS.sub(lambda m: f"({_AS[m.group(1).lower()]})", sql)


def conninfo(dsn: str) -> str:
    """`dsn` with the search path that puts `lpclock.now()` before `pg_catalog.now()`."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c search_path={SEARCH_PATH.replace(' ', '')}".strip())


def install(dsn: str) -> None:
    """Create the clock in the database of `dsn` (unpinned: it reads the real time)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_INSTALL)


def pin(conn: psycopg.Connection[Any], at: dt.datetime) -> None:
    conn.execute(
        "INSERT INTO lpclock.pinned (at) VALUES (%s) ON CONFLICT (singleton) DO UPDATE SET at = excluded.at", (at,)
    )


def start_over(conn: psycopg.Connection[Any], at: dt.datetime, emptying: str, params: tuple[Any, ...] = ()) -> None:
    """What an adapter's `reset` does, in one transaction: `emptying` (the statement that clears the
    queue's rows), then the clock pinned at `at`, so no client sees the one without the other."""
    with conn.transaction():
        conn.execute(emptying, params)
        pin(conn, at)


def advance(conn: psycopg.Connection[Any], seconds: int) -> None:
    if (
        conn.execute("UPDATE lpclock.pinned SET at = at + make_interval(secs => %s) RETURNING 1", (seconds,)).fetchone()
        is None
    ):
        raise RuntimeError("the clock is not pinned")


def now(conn: psycopg.Connection[Any]) -> dt.datetime:
    row = conn.execute("SELECT lpclock.now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]
