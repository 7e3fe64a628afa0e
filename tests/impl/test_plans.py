"""Every statement of the delivery functions reads a bounded number of rows, however
many deliveries the community already holds.

A plan the server made once and keeps (the functions force generic plans) can
be right for every answer and still read every delivery of a community on each
call: a claim whose retry branch joined the table to its request-key rows read
all of them (about 1,500 buffers a claim after 3,000 jobs). No lockstep or
stress run sees that, since the answers are right. This test does: with
`HISTORY` settled deliveries in the community, it runs each delivery operation
under auto_explain (nested statements, analyzed) and requires that no scan of
any statement returns more than `BOUND` rows.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterator

import pytest

from leaseproof.conformance.concurrent.nemesis import RUN, binding, set_up_community
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.hooks.clock import PinnedClock, mark_test_database
from leaseproof.model import delivery as m

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
COMMUNITY, TARGET = uuid.UUID(int=0xA), b"\x01" * 32
HISTORY = 200  # settled deliveries in the community before the operations are explained
BOUND = 3  # rows a scan of one operation's statements may return

# One plan node's figures, as EXPLAIN ANALYZE prints them on PostgreSQL 15 ("rows=12 loops=1")
# and 18 ("rows=12.00 loops=1").
_NODE = re.compile(
    r"->\s+(?P<node>[A-Za-z ]*Scan[A-Za-z ]*?) (?:using \S+ )?on (?P<table>\S+).*"
    r"actual time=\S+ rows=(?P<rows>[\d.]+) loops=(?P<loops>\d+)"
)


def _commit(store: PostgresDeliveryStore, step: str) -> uuid.UUID:
    delivery = uuid.uuid5(COMMUNITY, step)
    committed = store.execute(
        m.CommitDeliveries(COMMUNITY, RUN, step, [m.NewDelivery(delivery, binding(COMMUNITY, step, TARGET))])
    )
    assert committed == m.Committed((delivery,), False)
    return delivery


@pytest.fixture
def explained(delivery_dsn: str) -> Iterator[tuple[PostgresDeliveryStore, list[str], PinnedClock]]:
    """A store whose community holds HISTORY settled deliveries, and the plans its calls
    print from then on (every nested statement, analyzed)."""
    with connect(delivery_dsn) as conn:
        store = PostgresDeliveryStore(conn)
        clock = PinnedClock(conn)
        mark_test_database(conn)
        clock.pin(START)
        set_up_community(store, COMMUNITY)
        for i in range(HISTORY):
            _commit(store, f"history-{i}")
            claimed = store.execute(m.Claim(COMMUNITY, TARGET, 30, request_key=f"key-{i}"))
            assert isinstance(claimed, m.Claimed)
            assert store.execute(m.Finish(claimed.lease, m.Status.FINISHED)) == m.Settled(m.Status.FINISHED)
        plans: list[str] = []
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        conn.execute(
            "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
            " SET auto_explain.log_analyze = on;"
            " SET auto_explain.log_level = notice; SET client_min_messages = notice"
        )
        yield store, plans, clock


def _scans(plans: list[str]) -> list[tuple[str, str, float]]:
    hits = (_NODE.search(line) for plan in plans for line in plan.splitlines())
    return [(hit["node"], hit["table"], float(hit["rows"]) * int(hit["loops"])) for hit in hits if hit]


def test_no_delivery_operation_reads_the_communitys_history(
    explained: tuple[PostgresDeliveryStore, list[str], PinnedClock],
) -> None:
    store, plans, clock = explained
    delivery = _commit(store, "new")
    retried = store.execute(
        m.CommitDeliveries(COMMUNITY, RUN, "new", [m.NewDelivery(delivery, binding(COMMUNITY, "new", TARGET))])
    )
    assert retried == m.Committed((), True)
    claimed = store.execute(m.Claim(COMMUNITY, TARGET, 30, request_key="the-key"))
    assert isinstance(claimed, m.Claimed)
    assert store.execute(m.Claim(COMMUNITY, TARGET, 30, request_key="the-key")) == claimed
    assert store.execute(m.Claim(COMMUNITY, TARGET, 30)) == m.ClaimMiss()
    assert isinstance(store.execute(m.Renew(claimed.lease, 30)), m.Renewed)
    assert isinstance(store.execute(m.GetDelivery(COMMUNITY, delivery)), m.Found)
    assert store.execute(m.Finish(claimed.lease, m.Status.FINISHED)) == m.Settled(m.Status.FINISHED)
    assert store.execute(m.Finish(claimed.lease, m.Status.FINISHED)) == m.AlreadyTerminal(m.Status.FINISHED)
    _commit(store, "expiring")
    assert isinstance(store.execute(m.Claim(COMMUNITY, TARGET, 30)), m.Claimed)
    clock.advance(dt.timedelta(seconds=31))
    assert store.execute(m.Reap()) == m.Reaped(1)
    scans = _scans(plans)
    assert len(scans) > 20, f"auto_explain printed too few plans to judge: {plans[:3]}"
    wide = [scan for scan in scans if scan[2] > BOUND]
    assert not wide, f"scans that read past {BOUND} rows with {HISTORY} deliveries settled: {wide}"
