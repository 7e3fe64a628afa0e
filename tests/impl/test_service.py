"""DeliveryService: a store behind a DSN that reconnects, and sends a call again only when
the model says a resend is safe. Real server; connections are ended by the server itself
(pg_terminate_backend) at points the statement gate holds a call."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from leaseproof.impl.connection import Waits, connect
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.service import DeliveryService, may_resend
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.errors import ConnectionLost, Unavailable
from leaseproof.impl.hooks.gate import Gate, Schedule
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, EventCause

A, WORKFLOW, RUN = uuid.UUID(int=0xA), uuid.UUID(int=0x100), uuid.UUID(int=0x200)
TARGET, MESSAGE, DEFINITION = b"\x01" * 32, b"\x03" * 32, b"\x04" * 32
D1, D2 = uuid.UUID(int=0xD1), uuid.UUID(int=0xD2)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
_BOUND = 30.0


def _binding(step: str) -> Binding:
    return Binding(A, WORKFLOW, RUN, step, TARGET, DEFINITION, MESSAGE, EventCause(b"\x05" * 32))


@pytest.fixture
def world(delivery_dsn: str) -> Iterator[str]:
    """Community A with two pending deliveries, d1 older than d2 (pinned clock)."""
    adapter = PostgresDeliveryAdapter(delivery_dsn)
    try:
        adapter.reset(T0)
        for command in (
            m.CreateCommunity(A),
            m.CreateWorkflow(A, WORKFLOW),
            m.CreateRun(A, WORKFLOW, RUN),
            m.PublishEvent(A, MESSAGE),
            m.CommitDeliveries(A, RUN, "s1", [m.NewDelivery(D1, _binding("s1"))]),
            m.AdvanceClock(dt.timedelta(seconds=1)),
            m.CommitDeliveries(A, RUN, "s2", [m.NewDelivery(D2, _binding("s2"))]),
        ):
            adapter.execute(command)
    finally:
        adapter.close()
    yield delivery_dsn


def _end_backend(dsn: str, pid: int) -> None:
    with connect(dsn) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s, 10000) AS done", (pid,)).fetchone()["done"]  # type: ignore[index]  # one row


def _row(dsn: str, delivery: uuid.UUID) -> tuple[str, int]:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT status::text AS status, lease_generation FROM workflow_agent_deliveries WHERE id = %s",
            (delivery,),
        ).fetchone()
    assert row is not None
    return row["status"], row["lease_generation"]


def test_a_connection_the_server_ended_between_calls_is_replaced_by_the_next_call(world: str) -> None:
    with DeliveryService(world) as service:
        claimed = service.execute(m.Claim(A, TARGET, 30))
        assert isinstance(claimed, m.Claimed) and claimed.lease.delivery_id == D1
        assert service._store is not None
        _end_backend(world, service._store.conn.info.backend_pid)
        # The dead connection's call is refused as not applied (nothing was sent) and sent again on a new one.
        assert service.execute(m.Finish(claimed.lease, m.Status.FINISHED)) == m.Settled(m.Status.FINISHED)
        assert service.connections == 2
    assert _row(world, D1) == ("finished", 1)


class _CutOnce:
    """A connect() for the service whose first connection is gated: the call it runs is held
    before its COMMIT (`at="commit"`, a call that is a transaction) or before `statement`
    (`at="statement"`, a call that is that one statement, its own transaction), the server
    ends the backend there, and the call goes on and finds its connection gone while
    committing: for a statement of its own, its outcome is as unknown to the store as
    when the server ran it and the answer was lost. Later connections are plain."""

    def __init__(self, schedule: Schedule, statement: str, at: str = "commit") -> None:
        self.schedule, self.statement, self.at, self.gate = schedule, statement, at, None
        self.client: Any = None

    def __call__(self, dsn: str, waits: Waits) -> Any:
        conn = connect(dsn, waits)
        if self.client is not None:
            return conn
        self.client = self.schedule.client("service", conn)
        gated = self.client.gate
        self.pause = (
            gated.pause_before_commit(ran=self.statement) if self.at == "commit" else gated.pause_before(self.statement)
        )
        gate: Gate = self.client.gate
        return gate.as_connection()

    def cut_when_parked(self) -> None:
        self.pause.wait_parked()
        _end_backend(self.schedule.dsn, self.client.pid)
        self.pause.release()


def test_a_finish_lost_while_committing_is_sent_again_and_its_answer_says_what_happened(world: str) -> None:
    with DeliveryService(world) as setup:
        claimed = setup.execute(m.Claim(A, TARGET, 30))
    assert isinstance(claimed, m.Claimed)
    with Schedule(world) as schedule:
        cut = _CutOnce(schedule, PostgresDeliveryStore.SQL_FINISH, at="statement")
        service = DeliveryService(world, connect=cut)
        try:
            service._live("Finish")  # the gated connection, made on this thread
            cut.client.start(lambda: service.execute(m.Finish(claimed.lease, m.Status.FINISHED)))
            cut.cut_when_parked()
            # Here the statement never reached the server, so the resend settles it; had it run,
            # the resend would answer AlreadyTerminal(finished) (the model's resend rule; explore proves it).
            assert cut.client.result(_BOUND) == m.Settled(m.Status.FINISHED)
            assert service.connections == 2 and service.resent_at is not None  # the resend answered
            assert service.execute(m.Finish(claimed.lease, m.Status.FINISHED)) == m.AlreadyTerminal(m.Status.FINISHED)
            assert service.resent_at is None  # answered the first time
        finally:
            service.close()
    assert _row(world, D1) == ("finished", 1)


class _NoServerAfterTheFirst(_CutOnce):
    """As `_CutOnce`, and every later connection fails: the server is gone."""

    def __call__(self, dsn: str, waits: Waits) -> Any:
        if self.client is not None:
            raise psycopg.OperationalError("connection refused (the server is restarting)")
        return super().__call__(dsn, waits)


def test_a_call_lost_while_committing_whose_resend_cannot_connect_is_still_unknown(world: str) -> None:
    """Not `Unavailable`, which says nothing took effect: the first call may have."""
    with DeliveryService(world) as setup:
        claimed = setup.execute(m.Claim(A, TARGET, 30))
    assert isinstance(claimed, m.Claimed)
    with Schedule(world) as schedule:
        cut = _NoServerAfterTheFirst(schedule, PostgresDeliveryStore.SQL_FINISH, at="statement")
        service = DeliveryService(world, connect=cut)
        try:
            service._live("Finish")
            cut.client.start(lambda: service.execute(m.Finish(claimed.lease, m.Status.FINISHED)))
            cut.cut_when_parked()
            with pytest.raises(ConnectionLost) as raised:
                cut.client.result(_BOUND)
            assert raised.value.applied is None and raised.value.operation == "Finish"
            assert service.connections == 1
        finally:
            service.close()


def test_a_call_lost_while_committing_whose_resend_waits_past_its_bound_is_still_unknown(world: str) -> None:
    """The resend meets the row locked by another client and gives up (lock_timeout):
    `Unavailable` would say nothing took effect, and the first call may have."""
    with DeliveryService(world) as setup:
        claimed = setup.execute(m.Claim(A, TARGET, 30))
    assert isinstance(claimed, m.Claimed)
    with Schedule(world) as schedule, connect(world) as holder:
        cut = _CutOnce(schedule, PostgresDeliveryStore.SQL_FINISH, at="statement")
        service = DeliveryService(world, Waits(lock=0.2), connect=cut)
        try:
            service._live("Finish")
            cut.client.start(lambda: service.execute(m.Finish(claimed.lease, m.Status.FINISHED)))
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM workflow_agent_deliveries WHERE id = %s FOR UPDATE", (D1,))
            cut.cut_when_parked()
            with pytest.raises(ConnectionLost) as raised:
                cut.client.result(_BOUND)
            assert raised.value.applied is None and raised.value.operation == "Finish"
            assert service.connections == 2  # it was sent again, and that gave up
        finally:
            holder.execute("ROLLBACK")
            service.close()


def test_a_claim_lost_while_committing_is_not_sent_again(world: str) -> None:
    with Schedule(world) as schedule:
        cut = _CutOnce(schedule, PostgresDeliveryStore.SQL_CLAIM, at="statement")
        service = DeliveryService(world, connect=cut)
        try:
            service._live("Claim")
            cut.client.start(lambda: service.execute(m.Claim(A, TARGET, 30)))
            cut.cut_when_parked()
            with pytest.raises(ConnectionLost) as raised:
                cut.client.result(_BOUND)
            assert raised.value.applied is None and raised.value.operation == "Claim"
            assert service.connections == 1  # no second claim was sent
        finally:
            service.close()
    assert _row(world, D1) == ("pending", 0) and _row(world, D2) == ("pending", 0)  # nothing claimed twice


def test_a_keyed_claim_lost_while_committing_is_sent_again_and_gets_the_lease(world: str) -> None:
    """With a request key a claim is safe to resend: here the first COMMIT never reached the
    server, so the resend claims d1; had it, the resend would return the same lease."""
    with Schedule(world) as schedule:
        cut = _CutOnce(schedule, PostgresDeliveryStore.SQL_CLAIM)
        service = DeliveryService(world, connect=cut)
        try:
            service._live("Claim")
            cut.client.start(lambda: service.execute(m.Claim(A, TARGET, 30, request_key="worker-7/1")))
            cut.cut_when_parked()
            claimed = cut.client.result(_BOUND)
            assert isinstance(claimed, m.Claimed) and claimed.lease.delivery_id == D1
            assert service.connections == 2
            # Sent again now (its answer lost after all): the same lease, not d2.
            assert service.execute(m.Claim(A, TARGET, 30, request_key="worker-7/1")) == claimed
        finally:
            service.close()
    assert _row(world, D1) == ("claimed", 1) and _row(world, D2) == ("pending", 0)


def test_two_claims_with_one_key_take_turns_and_get_one_lease(world: str) -> None:
    """The second claim of a key waits for the first (the key's advisory lock), then finds its
    lease: one delivery claimed, not two."""
    with Schedule(world) as schedule:
        first, second = schedule.client("first"), schedule.client("second")
        stores = [PostgresDeliveryStore(c.gate.as_connection()) for c in (first, second)]
        claim = m.Claim(A, TARGET, 30, request_key="worker-7/2")
        parked = first.gate.pause_before_commit(ran=PostgresDeliveryStore.SQL_CLAIM)
        first.start(lambda: stores[0].execute(claim))
        parked.wait_parked()
        second.start(lambda: stores[1].execute(claim))
        second.wait_blocked()
        parked.release()
        one, two = first.result(_BOUND), second.result(_BOUND)
    assert isinstance(one, m.Claimed) and one == two
    assert _row(world, D1) == ("claimed", 1) and _row(world, D2) == ("pending", 0)


def test_no_server_to_connect_to_is_unavailable_and_nothing_was_sent(world: str) -> None:
    nowhere = psycopg.conninfo.make_conninfo(world, port=1, connect_timeout=5)
    service = DeliveryService(nowhere)
    with pytest.raises(Unavailable) as raised:
        service.execute(m.Claim(A, TARGET, 30))
    assert raised.value.operation == "Claim" and "cannot connect to the server" in str(raised.value)
    assert service.connections == 0


@pytest.mark.parametrize(
    ("command", "applied", "resend"),
    [
        (m.Reap(), None, True),
        (m.Claim(A, TARGET, 30), None, False),
        (m.Claim(A, TARGET, 30), False, True),
        (m.Claim(A, TARGET, 30, request_key="k"), None, True),
        (m.AdvanceClock(dt.timedelta(seconds=1)), None, False),
    ],
)
def test_what_may_be_sent_again_is_the_model_s_resend_rule(
    command: m.Command, applied: bool | None, resend: bool
) -> None:
    lost = ConnectionLost(type(command).__name__, applied, OSError("cut"))
    assert may_resend(command, lost) is resend


def test_resends_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="resends must be 0 or more"):
        DeliveryService("dbname=x", resends=-1)
