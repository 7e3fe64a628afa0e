"""The search-path clock (conformance/queues/subjects/clock.py) on a real server: once pinned, every
time function it covers answers the pinned instant, unqualified in client SQL, inside a plpgsql
function and in its dynamic SQL (as pgmq reads `clock_timestamp()`), and moves with `advance`;
unpinned, each reads the real time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import psycopg
import pytest

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
