"""A stalled tenant: a connection of the harness's own holds one tenant's rows while a round
runs (`faults.Staller`). What the checker lets a claim or a sweep skip is in
test_linearizability.py; here, who may wait for a stall (`stalls.waited`), and runs of the
bundled store, clean and with a sweep that waits for locks, under stalls."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest

from leaseproof.conformance.concurrent.faults import Staller
from leaseproof.conformance.concurrent.history import Barrier, History, Operation, Stall
from leaseproof.conformance.concurrent.linearizability import LINEARIZABLE, NOT_LINEARIZABLE, check
from leaseproof.conformance.concurrent.models import DELIVERY, _delivery_allowances
from leaseproof.conformance.concurrent.programs import Program, Round
from leaseproof.conformance.concurrent.stalls import holding, waited
from leaseproof.conformance.concurrent.stress import Runner, stress
from leaseproof.conformance.lockstep import world as w
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.mutants.service import SweepWaitsForLocks
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc

A, B = w.COMMUNITIES["A"], w.COMMUNITIES["B"]
LEASE = d.Lease(A, w.DELIVERIES["d1"], w.TARGETS["T1"], 1, w.START)


def _late(command: object, invoked: int = 2, returned: int = 20) -> list[Operation]:
    """What waited of one operation in flight from `invoked` to `returned`, against a stall of
    A from tick 1 to 10 whose patient tick is 5 and which starts to let go at 9."""
    op = Operation(1, "w1", command, d.Ok(), invoked, returned)
    history = History("delivery", None, (op,), (Barrier(30),), (Stall(A, 1, 5, 9, 10),))
    return [late.operation for late in waited(history)]


@pytest.mark.parametrize(
    ("command", "must_not_wait"),
    [
        (d.Reap(), True),  # the sweep skips what a stalled tenant holds
        (d.Claim(B, w.TARGETS["T1"], 30), True),  # another tenant's
        (d.Renew(attrs.evolve(LEASE, community_id=B), 30), True),
        (d.Finish(LEASE, d.Status.FINISHED), False),  # a write to a row the stall holds
        (d.Claim(A, w.TARGETS["T1"], 30), False),
        (lc.RefreshCache("r1"), False),  # no tenant's: a replica's cache
    ],
)
def test_what_may_wait_for_a_stalled_tenant(command: object, must_not_wait: bool) -> None:
    assert bool(_late(command)) is must_not_wait


def test_only_an_operation_in_flight_from_the_patient_tick_until_the_stall_lets_go_waited() -> None:
    assert _late(d.Reap(), invoked=2, returned=11)
    assert _late(d.Reap(), invoked=2, returned=10)  # answered as the locks went, before the stall's last tick
    assert not _late(d.Reap(), invoked=6, returned=11)  # began within the last WAIT_BOUND
    assert not _late(d.Reap(), invoked=2, returned=8)  # answered while the stall went on


def test_a_stalled_client_is_one_holding_a_lease() -> None:
    state = d.initial_state(w.START)
    binding = w.binding("B", "W1", "R1", "s1", "T1", "D1", "M1", "event:E1")
    for command in (
        d.CreateCommunity(B),
        d.CreateWorkflow(B, w.WORKFLOWS["W1"]),
        d.CreateRun(B, w.WORKFLOWS["W1"], w.RUNS["R1"]),
        d.PublishEvent(B, w.MESSAGES["M1"]),
        d.CommitDeliveries(B, w.RUNS["R1"], w.STEPS["s1"], (d.NewDelivery(w.DELIVERIES["d1"], binding),)),
    ):
        state, _ = d.step(state, command)
    assert holding(state) == []  # pending only
    state, claimed = d.step(state, d.Claim(B, w.TARGETS["T1"], 30))
    assert isinstance(claimed, d.Claimed) and holding(state) == [B]


# A and B set up; d1 and d2 committed in A for T1, d1 claimed for 30 s, then the clock past
# its lease: a stalled client of A would be d1's holder.
_PREFIX: tuple[object, ...] = (
    tuple(
        command
        for tenant in (A, B)
        for command in (
            d.CreateCommunity(tenant),
            d.CreateWorkflow(tenant, w.WORKFLOWS["W1"]),
            d.CreateRun(tenant, w.WORKFLOWS["W1"], w.RUNS["R1"]),
            d.PublishEvent(tenant, w.MESSAGES["M1"]),
        )
    )
    + tuple(
        d.CommitDeliveries(
            A,
            w.RUNS["R1"],
            w.STEPS[step],
            (d.NewDelivery(w.DELIVERIES[name], w.binding("A", "W1", "R1", step, "T1", "D1", "M1", "event:E1")),),
        )
        for name, step in (("d1", "s1"), ("d2", "s2"))
    )
    + (d.Claim(A, w.TARGETS["T1"], 30), d.AdvanceClock(31 * dt.timedelta(seconds=1)))
)
# One round, A stalled through it: a sweep, which finds d1 expired and held, and a claim of
# A, which finds d2 pending and held.
_SWEEP_AND_CLAIM = Program("delivery", _PREFIX, (Round(((d.Reap(),), (d.Claim(A, w.TARGETS["T1"], 30),)), None),))


def _stalled_run(dsn: str, store: type[PostgresDeliveryStore]) -> tuple[History, Staller]:
    adapter = PostgresDeliveryAdapter(dsn, store)
    staller = Staller(dsn, 1.0, 1)
    runner = Runner(adapter, "delivery", 2, faults=staller)
    try:
        return runner.run(_SWEEP_AND_CLAIM), staller
    finally:
        runner.close()
        adapter.close()


def test_the_bundled_store_skips_what_a_stalled_tenant_holds_without_waiting(scratch_dsn: str) -> None:
    history, staller = _stalled_run(scratch_dsn, PostgresDeliveryStore)
    assert [stall.key for stall in history.stalls] == [A] and staller.rows > 0  # d1's holder stalls
    (sweep,) = (op for op in history.operations if op.client != "prefix" and isinstance(op.command, d.Reap))
    (claim,) = (op for op in history.operations if op.client != "prefix" and isinstance(op.command, d.Claim))
    assert sweep.outcome == d.Reaped(0) and claim.outcome == d.ClaimMiss()  # each skipped what A's stall held
    assert check(history, DELIVERY).verdict == LINEARIZABLE and not waited(history)
    # Judged as if the stall had held nothing, neither skip is explained.
    blind = attrs.evolve(DELIVERY, allowances=lambda ops, stalls: _delivery_allowances(ops, ()))
    assert check(history, blind).verdict == NOT_LINEARIZABLE


def test_a_sweep_that_waits_for_a_stalled_tenant_is_not_live(scratch_dsn: str) -> None:
    history, _ = _stalled_run(scratch_dsn, SweepWaitsForLocks)
    late = waited(history)
    assert [type(each.operation.command) for each in late] == [d.Reap]
    assert late[0].operation.outcome == d.Reaped(1)  # it reaped d1, once the stall let it go
    assert check(history, DELIVERY).verdict == LINEARIZABLE  # every outcome right: only liveness shows it


def test_the_bundled_store_under_stalls_in_random_programs_is_linearizable_and_live(scratch_dsn: str) -> None:
    adapter = PostgresDeliveryAdapter(scratch_dsn, PostgresDeliveryStore)
    staller = Staller(scratch_dsn, 1.0, 2)
    try:
        report = stress(
            adapter, machine="delivery", workers=4, duration=60, seed=2, repeats=1, faults=staller, rounds=4,
            max_programs=2,
        )  # fmt: skip
    finally:
        adapter.close()
    assert report.verdict == "LINEARIZABLE" and report.stuck is None
    assert staller.counts.ended == 8 and staller.rows > 0  # each round stalled, rows held
