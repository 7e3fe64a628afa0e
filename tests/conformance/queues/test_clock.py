"""The search-path clock (conformance/queues/subjects/clock.py) on a real server: once pinned, every
time function it covers answers the pinned instant, unqualified in client SQL, inside a plpgsql
function and in its dynamic SQL (as pgmq reads `clock_timestamp()`), and moves with `advance`;
unpinned, each reads the real time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import psycopg
import pytest

from leaseproof.conformance.harness.proxy import FaultProxy
from leaseproof.conformance.queues.subjects import clock

START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
CALLS = ["now()", "transaction_timestamp()", "statement_timestamp()", "clock_timestamp()"]

# A library's function as pgmq writes its own: no search path of its own, the time read statically
# and in a statement it builds.
_FUNCTION = """
CREATE FUNCTION library_times() RETURNS timestamptz[] LANGUAGE plpgsql AS $$
DECLARE
    dynamic timestamptz[];
BEGIN
    EXECUTE format('SELECT ARRAY[%s]', %L) INTO dynamic;
    RETURN ARRAY[now(), transaction_timestamp(), statement_timestamp(), clock_timestamp()] || dynamic;
END
$$
"""


@pytest.fixture
def conn(scratch_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    clock.install(scratch_dsn)
    with psycopg.connect(clock.conninfo(scratch_dsn), autocommit=True) as c:
        c.execute(_FUNCTION.replace("%L", "'" + ", ".join(CALLS) + "'"))
        yield c


def _times(conn: psycopg.Connection[tuple[object, ...]]) -> list[dt.datetime]:
    direct = conn.execute(f"SELECT {', '.join(CALLS)}").fetchone()
    inside = conn.execute("SELECT library_times()").fetchone()
    assert direct is not None and inside is not None and isinstance(inside[0], list)
    return [*direct, *inside[0]]


def test_every_time_function_answers_the_pinned_instant_and_moves_with_it(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    clock.pin(conn, START)
    assert _times(conn) == [START] * 12
    clock.advance(conn, 31)
    assert _times(conn) == [START + dt.timedelta(seconds=31)] * 12
    assert clock.now(conn) == START + dt.timedelta(seconds=31)


def test_unpinned_each_reads_the_real_time(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    row = conn.execute("SELECT pg_catalog.now()").fetchone()
    assert row is not None
    for at in _times(conn):
        assert abs((at - row[0]).total_seconds()) < 60, at  # type: ignore[operator]
    with pytest.raises(RuntimeError, match="the clock is not pinned"):
        clock.advance(conn, 1)


def test_the_time_keywords_are_made_over_to_read_the_pinned_clock() -> None:
    made = clock.keywords("SELECT CURRENT_TIMESTAMP, current_timestamp(3), LocalTimestamp, current_date, localtime(2)")
    assert made == (
        "SELECT (lpclock.now()), (lpclock.now()), (lpclock.now()::timestamp), (lpclock.now()::date), "
        "(lpclock.now()::time)"
    )
    assert clock.keywords("SELECT current_timestamps, x.current_time_zone FROM t") == (
        "SELECT current_timestamps, x.current_time_zone FROM t"
    )


_KEYWORD_FUNCTION = """
CREATE FUNCTION library_keywords() RETURNS timestamptz[] LANGUAGE sql AS $$
    SELECT ARRAY[CURRENT_TIMESTAMP, LOCALTIMESTAMP::timestamptz, CURRENT_DATE::timestamptz]
$$
"""


def test_through_the_rewriting_proxy_the_keywords_read_the_pinned_clock(scratch_dsn: str) -> None:
    """A library whose SQL says CURRENT_TIMESTAMP, LOCALTIMESTAMP or CURRENT_DATE, in its statements
    and in a function it installs, reads the pinned instant when its clients connect through the
    proxy that makes them over; straight to the server it reads the real time."""
    clock.install(scratch_dsn)
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)  # midnight: CURRENT_DATE is the same instant
    with FaultProxy(scratch_dsn) as proxy:
        proxy.rewrite = clock.keywords
        with psycopg.connect(clock.conninfo(proxy.dsn_through(scratch_dsn)), autocommit=True) as conn:
            conn.execute("SET timezone = 'UTC'")  # CURRENT_DATE's midnight is then `at`
            conn.execute(_KEYWORD_FUNCTION)
            clock.pin(conn, at)
            row = conn.execute("SELECT CURRENT_TIMESTAMP, LOCALTIMESTAMP::timestamptz, library_keywords()").fetchone()
            assert row is not None and row[0] == row[1] == at and row[2] == [at, at, at], row
    with psycopg.connect(clock.conninfo(scratch_dsn), autocommit=True) as straight:
        row = straight.execute("SELECT CURRENT_TIMESTAMP").fetchone()
        assert row is not None and row[0] != at
