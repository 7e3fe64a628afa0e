"""The PostgreSQL store on a real server: the seeds' interleavings at the
store's own API, the schema's guarantees, the write fence and the clock."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.hooks.clock import PinnedClock, mark_test_database
from leaseproof.impl.migrate import available, migrate
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, EventCause, ScheduleCause
from leaseproof.model.errors import InvalidValue, Refused

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)
WORKFLOW, RUN = uuid.UUID(int=0x100), uuid.UUID(int=0x200)
T1, T2 = b"\x01" * 32, b"\x02" * 32
MESSAGE, DEFINITION = b"\x03" * 32, b"\x04" * 32
SECOND = dt.timedelta(seconds=1)


def binding(community: uuid.UUID, target: bytes, step: str = "s1", cause: Any = None) -> Binding:
    return Binding(
        community_id=community,
        workflow_id=WORKFLOW,
        run_id=RUN,
        step_id=step,
        target_pubkey=target,
        definition_event_id=DEFINITION,
        message_event_id=MESSAGE,
        cause=cause or EventCause(b"\x05" * 32),
    )


class World:
    """A store on a fresh database with two live communities sharing ids."""

    def __init__(self, dsn: str) -> None:
        self.conn = connect(dsn)
        self.store = PostgresDeliveryStore(self.conn)
        self.clock = PinnedClock(self.conn)
        mark_test_database(self.conn)
        self.clock.pin(START)
        for community in (A, B):
            self.store.execute(m.CreateCommunity(community))
            self.store.execute(m.CreateWorkflow(community, WORKFLOW))
            self.store.execute(m.CreateRun(community, WORKFLOW, RUN))
            self.store.execute(m.PublishEvent(community, MESSAGE))

    def commit(self, community: uuid.UUID, *targets: tuple[uuid.UUID, bytes], step: str = "s1") -> m.Committed:
        news = [m.NewDelivery(i, binding(community, t, step)) for i, t in targets]
        committed: m.Committed = self.store.execute(m.CommitDeliveries(community, RUN, step, news))
        return committed

    def claim(self, community: uuid.UUID, target: bytes, seconds: int = 10, **kw: Any) -> m.Lease:
        outcome = self.store.execute(m.Claim(community, target, seconds, **kw))
        assert isinstance(outcome, m.Claimed), outcome
        return outcome.lease

    def refusal(self, command: m.Command) -> Any:
        with pytest.raises(Refused) as refused:
            self.store.execute(command)
        return refused.value.rejection


@pytest.fixture
def world(delivery_dsn: str) -> Iterator[World]:
    w = World(delivery_dsn)
    yield w
    w.conn.close()


D1, D2 = uuid.UUID(int=1), uuid.UUID(int=2)


# -- the review findings, as the seeds' regression tests state them ----------


@pytest.mark.parametrize(("newer", "stale"), [("finished", "finished"), ("failed", "finished"), ("finished", "failed")])
def test_stale_holder_is_never_credited_the_newer_holders_terminal(world: World, newer: str, stale: str) -> None:
    world.commit(A, (D1, T1))
    gen1 = world.claim(A, T1, seconds=5)
    world.clock.advance(6 * SECOND)
    assert world.store.execute(m.Reap()) == m.Reaped(1)
    gen2 = world.claim(A, T1)
    assert (gen1.lease_generation, gen2.lease_generation) == (1, 3)  # claim, reap and claim each bump
    assert world.store.execute(m.Finish(gen2, m.Status(newer))) == m.Settled(m.Status(newer))
    assert world.store.execute(m.Finish(gen1, m.Status(stale))) == m.LeaseLost()
    # The real holder's retry is reconciled, even asking the other outcome.
    assert world.store.execute(m.Finish(gen2, m.Status(stale))) == m.AlreadyTerminal(m.Status(newer))


def test_expired_holder_cannot_renew_or_finish_before_the_reaper_runs(world: World) -> None:
    world.commit(A, (D1, T1))
    lease = world.claim(A, T1, seconds=5)
    world.clock.advance(5 * SECOND)  # exactly at the deadline: still held
    assert world.store.execute(m.Renew(lease, 5)) == m.Renewed(START + 10 * SECOND)
    world.clock.advance(5 * SECOND + dt.timedelta(microseconds=1))
    assert world.store.execute(m.Renew(lease, 30)) == m.LeaseLost()
    assert world.store.execute(m.Finish(lease, m.Status.FINISHED)) == m.LeaseLost()
    row = world.store.execute(m.GetDelivery(A, D1)).delivery
    assert (row.status, row.lease_until) == (m.Status.CLAIMED, START + 10 * SECOND)


@pytest.mark.parametrize("foreign", ["community", "target"])
def test_expected_binding_out_of_request_scope_is_a_miss(world: World, foreign: str) -> None:
    world.commit(A, (D1, T1))
    world.commit(B, (D1, T1))
    expected = binding(B, T1) if foreign == "community" else binding(A, T2)
    assert world.store.execute(m.Claim(A, T1, 30, expected=expected)) == m.ClaimMiss()
    assert world.store.execute(m.Claim(A, T1, 30, delivery_id=D1, expected=expected)) == m.ClaimMiss()
    assert world.store.execute(m.GetDelivery(A, D1)).delivery.status is m.Status.PENDING


def test_lease_rebuilt_with_a_foreign_target_fails_closed(world: World) -> None:
    world.commit(A, (D1, T1))
    lease = world.claim(A, T1)
    forged = m.Lease(A, D1, T2, lease.lease_generation, lease.lease_until)
    assert world.store.execute(m.Renew(forged, 30)) == m.LeaseLost()
    assert world.store.execute(m.Finish(forged, m.Status.FAILED)) == m.LeaseLost()
    assert world.store.execute(m.Finish(lease, m.Status.FINISHED)) == m.Settled(m.Status.FINISHED)
    assert world.store.execute(m.Finish(forged, m.Status.FINISHED)) == m.LeaseLost()


# -- claim, commit, reap ----------------------------------------------------


def test_claim_takes_the_oldest_pending_row_and_matches_every_expected_field(world: World) -> None:
    world.commit(A, (D2, T1), step="s1")
    world.clock.advance(SECOND)
    world.commit(A, (D1, T1), step="s2")
    wrong_cause = binding(A, T1, "s2", cause=ScheduleCause(START))
    assert world.store.execute(m.Claim(A, T1, 30, expected=wrong_cause)) == m.ClaimMiss()
    first = world.claim(A, T1)
    assert first.delivery_id == D2  # older created_at wins over the smaller id
    second = world.claim(A, T1, expected=binding(A, T1, "s2"))
    assert (second.delivery_id, second.lease_until) == (D1, START + SECOND + 10 * SECOND)
    assert world.store.execute(m.Claim(A, T1, 30)) == m.ClaimMiss()


def test_commit_is_atomic_per_step_and_idempotent_per_identity(world: World) -> None:
    assert world.commit(A, (D1, T1)) == m.Committed((D1,), identity_existed=False)
    before = world.store.snapshot()
    # T2 would be new, but D1 is taken by another identity: nothing commits.
    rejection = world.refusal(
        m.CommitDeliveries(
            A, RUN, "s2", [m.NewDelivery(D2, binding(A, T2, "s2")), m.NewDelivery(D1, binding(A, T1, "s2"))]
        )
    )
    assert rejection == m.DeliveryIdTaken(A, D1)
    assert world.store.snapshot() == before
    # A producer retry (even under another id) creates only what is missing.
    assert world.commit(A, (D2, T1), (D2, T2)) == m.Committed((D2,), identity_existed=True)


def test_the_same_delivery_id_in_two_communities_is_two_rows(world: World) -> None:
    world.commit(A, (D1, T1))
    world.commit(B, (D1, T1))
    lease = world.claim(A, T1)
    assert world.store.execute(m.Finish(lease, m.Status.FINISHED)) == m.Settled(m.Status.FINISHED)
    assert world.store.execute(m.GetDelivery(B, D1)).delivery.status is m.Status.PENDING


def test_reap_skips_fenced_tenants_inside_the_same_sweep(world: World) -> None:
    world.commit(A, (D1, T1))
    world.commit(B, (D1, T1))
    world.claim(A, T1, seconds=1)
    world.claim(B, T1, seconds=1)
    world.store.execute(m.SetCommunityState(B, m.CommunityState.FENCED))
    world.clock.advance(2 * SECOND)
    assert world.store.execute(m.Reap()) == m.Reaped(1)
    assert world.store.execute(m.GetDelivery(A, D1)).delivery.status is m.Status.PENDING
    assert world.store.execute(m.GetDelivery(B, D1)).delivery.status is m.Status.CLAIMED


def test_run_deletion_cascades_and_community_deletion_purges(world: World) -> None:
    world.commit(A, (D1, T1))
    world.commit(B, (D1, T1))
    world.store.execute(m.DeleteRun(A, RUN))
    assert world.refusal(m.GetDelivery(A, D1)) == m.NotFound("delivery", A, D1)
    world.store.execute(m.SetCommunityState(B, m.CommunityState.FENCED))
    world.store.execute(m.DeleteCommunity(B))
    state = world.store.snapshot()
    assert state.communities[B] is m.CommunityState.DELETED
    assert not [k for k in state.deliveries if k[0] == B] and (B, MESSAGE) not in state.events
    assert world.refusal(m.Claim(B, T1, 30)) == m.CommunityNotWritable(B, m.CommunityState.DELETED)


# -- bad input changes nothing ------------------------------------------------


@pytest.mark.parametrize("seconds", [0, -1, 86_401, True])
def test_non_positive_or_huge_leases_are_rejected_before_any_sql(world: World, seconds: int) -> None:
    with pytest.raises(InvalidValue) as invalid:
        m.Claim(A, T1, seconds)
    assert invalid.value.field == "lease_seconds"


def test_unknown_and_fenced_tenants_are_refused_without_writes(world: World) -> None:
    world.commit(A, (D1, T1))
    lease = world.claim(A, T1)
    stranger = uuid.UUID(int=0xDEAD)
    assert world.refusal(m.Claim(stranger, T1, 30)) == m.UnknownCommunity(stranger)
    world.store.execute(m.SetCommunityState(A, m.CommunityState.QUIESCING))
    before = world.store.snapshot()
    quiescing = m.CommunityNotWritable(A, m.CommunityState.QUIESCING)
    assert world.refusal(m.Renew(lease, 30)) == quiescing
    assert world.refusal(m.Finish(lease, m.Status.FINISHED)) == quiescing
    assert world.refusal(m.Claim(A, T2, 30)) == quiescing
    assert world.store.snapshot() == before


# -- the schema makes malformed rows unrepresentable --------------------------

_GOOD_ROW: dict[str, Any] = {
    "community_id": A,
    "id": uuid.UUID(int=77),
    "workflow_id": WORKFLOW,
    "run_id": RUN,
    "step_id": "s9",
    "target_pubkey": T1,
    "definition_event_id": DEFINITION,
    "message_event_id": MESSAGE,
    "cause_kind": "event",
    "cause_event_id": b"\x05" * 32,
    "cause_scheduled_for": None,
    "cause_invocation_id": None,
    "status": "pending",
    "lease_generation": 0,
    "lease_until": None,
    "claimed_at": None,
    "finished_at": None,
}

_MALFORMED: dict[str, dict[str, Any]] = {
    "empty step": {"step_id": ""},
    "whitespace step": {"step_id": " \t\n"},
    "65-character step": {"step_id": "x" * 65},
    "31-byte target": {"target_pubkey": b"\x01" * 31},
    "33-byte message": {"message_event_id": b"\x03" * 33},
    "no cause identity": {"cause_event_id": None},
    "two cause identities": {"cause_invocation_id": uuid.UUID(int=5)},
    "identity of another kind": {"cause_kind": "webhook"},
    "fractional schedule": {
        "cause_kind": "schedule",
        "cause_event_id": None,
        "cause_scheduled_for": START + dt.timedelta(microseconds=5),
    },
    "lease on a pending row": {"lease_until": START},
    "claimed without lease": {"status": "claimed", "lease_generation": 1},
    "terminal without finished_at": {"status": "finished"},
    "negative generation": {"lease_generation": -1},
}


def _insert(conn: psycopg.Connection[Any], row: dict[str, Any]) -> None:
    columns = ", ".join(row)
    values = ", ".join(f"%({name})s" for name in row)
    conn.execute(f"INSERT INTO workflow_agent_deliveries ({columns}, created_at) VALUES ({values}, lp_now())", row)


def test_a_well_formed_raw_row_is_accepted(world: World) -> None:
    _insert(world.conn, _GOOD_ROW)
    assert world.store.execute(m.GetDelivery(A, _GOOD_ROW["id"])).delivery.binding.step_id == "s9"


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_the_schema_rejects_malformed_rows(world: World, case: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        _insert(world.conn, {**_GOOD_ROW, **_MALFORMED[case]})


def test_the_database_fences_a_non_active_tenant_by_itself(world: World) -> None:
    # The tables other than the deliveries keep their own fence trigger (the deliveries
    # are written only through the functions, which check the fence under its lock).
    world.store.execute(m.SetCommunityState(A, m.CommunityState.FENCED))
    with pytest.raises(psycopg.errors.DatabaseError) as fenced:
        world.conn.execute("INSERT INTO events (community_id, id) VALUES (%s, %s)", (A, b"\x09" * 32))
    assert fenced.value.sqlstate == "LP001"
    assert fenced.value.diag.message_detail == "fenced"


# -- the clock and the migrations ---------------------------------------------


def test_unpinned_clock_is_the_moment_it_is_read_not_the_start_of_a_transaction(world: World) -> None:
    world.clock.unpin()
    with world.conn.transaction():
        world.conn.execute("SELECT 1")  # a statement after the transaction's start
        row = world.conn.execute(
            "SELECT statement_timestamp() <= lp_now() AND lp_now() <= clock_timestamp() AS statement,"
            " lp_now() > transaction_timestamp() AS later,"
            " lp_now() > %s AS after_the_pin",
            (START,),
        ).fetchone()
    assert row == {"statement": True, "later": True, "after_the_pin": True}
    world.clock.pin(START)
    world.clock.advance(3 * SECOND)
    assert world.conn.execute("SELECT lp_now() AS now").fetchone() == {"now": START + 3 * SECOND}


def test_migrations_apply_once(delivery_dsn: str) -> None:
    with connect(delivery_dsn) as conn:
        assert migrate(conn) == []  # the template already holds them all
        versions = [r["version"] for r in conn.execute("SELECT version FROM lp_schema_migrations ORDER BY 1")]
    assert versions == [version for version, _ in available()] and versions


def test_a_deleted_deliverys_id_is_retired_so_its_lease_governs_nothing(world: World) -> None:
    world.commit(A, (D1, T1))
    old = world.claim(A, T1)
    world.store.execute(m.DeleteRun(A, RUN))
    world.store.execute(m.CreateRun(A, WORKFLOW, RUN))
    assert world.refusal(m.CommitDeliveries(A, RUN, "s1", [m.NewDelivery(D1, binding(A, T1))])) == m.DeliveryIdTaken(
        A, D1
    )
    assert world.commit(A, (D2, T1)) == m.Committed((D2,), identity_existed=False)
    assert world.commit(A, (D1, T1)) == m.Committed((), identity_existed=True)  # a retry of a live identity
    fresh = world.claim(A, T1)
    assert (fresh.delivery_id, fresh.lease_generation) == (D2, 1)
    assert world.store.execute(m.Renew(old, 30)) == m.LeaseLost()
    assert world.store.snapshot().retired == frozenset({(A, D1)})


def test_a_refusal_after_a_write_rolls_the_step_back_whichever_way_the_id_is_taken(world: World) -> None:
    world.commit(A, (D1, T1))
    world.store.execute(m.DeleteRun(A, RUN))  # D1 is retired
    world.store.execute(m.CreateRun(A, WORKFLOW, RUN))
    world.commit(A, (D2, T1))  # D2 is live
    before = world.store.snapshot()
    d3 = uuid.UUID(int=3)
    for taken in (D1, D2):  # retired (found before its insert), live (the insert's unique violation)
        step = [m.NewDelivery(d3, binding(A, T1, "s2")), m.NewDelivery(taken, binding(A, T2, "s2"))]
        assert world.refusal(m.CommitDeliveries(A, RUN, "s2", step)) == m.DeliveryIdTaken(A, taken)
        assert world.store.snapshot() == before  # d3, inserted first, rolled back with it


def _prepared(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()
    assert row is not None
    return int(row["n"])


def test_a_refusal_keeps_the_connections_prepared_statements(world: World) -> None:
    # A refusal is an answer of the function, not an error: nothing rolls back, and
    # psycopg (which answers a ROLLBACK by deallocating every prepared statement) keeps them.
    for _ in range(6):  # psycopg prepares a statement at its sixth execution
        world.store.execute(m.CreateWorkflow(A, uuid.uuid4()))
    prepared = _prepared(world.conn)
    assert prepared >= 1  # the call of lp_create_workflow
    assert world.refusal(m.CreateWorkflow(A, WORKFLOW)) == m.AlreadyExists("workflow", A, WORKFLOW)
    assert world.refusal(m.CreateRun(A, uuid.uuid4(), RUN)).entity == "workflow"
    assert _prepared(world.conn) >= prepared
    # An error does roll back, and psycopg deallocates (the contrast).
    with pytest.raises(psycopg.errors.UndefinedTable), world.conn.transaction():
        world.conn.execute("SELECT * FROM no_such_table")
    assert _prepared(world.conn) == 0
