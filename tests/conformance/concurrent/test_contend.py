"""Contention at the database (`stress --contend`): the injector learns what an
implementation locks from pg_locks, holds it from connections of its own, and lets it go
once statements wait; the bundled implementation stays linearizable under it, its holds
are in the history (allowances, not liveness findings), and it never waits itself."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from leaseproof.conformance.concurrent import contend as ct
from leaseproof.conformance.concurrent.history import History, Operation, Stall
from leaseproof.conformance.concurrent.history_file import read_history, write_history
from leaseproof.conformance.concurrent.programs import GENERATORS
from leaseproof.conformance.concurrent.stalls import waited
from leaseproof.conformance.concurrent.stress import Runner, stress
from leaseproof.conformance.frontends.cli import main
from leaseproof.conformance.lockstep import world as w
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.model import delivery as d

SEED = 20261207


@pytest.mark.parametrize(
    "key", [0, 1, 42, -1, -(2**63), 2**63 - 1, 0x1234_5678_9ABC_DEF0, (7, -3), (-(2**31), 2**31 - 1)]
)
def test_an_advisory_key_read_off_pg_locks_is_taken_again_by_the_same_arguments(scratch_dsn: str, key: Any) -> None:
    arguments = key if isinstance(key, tuple) else (key,)
    with psycopg.connect(scratch_dsn) as conn:
        placeholders = ", ".join(["%s"] * len(arguments))
        conn.execute(f"SELECT pg_advisory_xact_lock({placeholders})", arguments)
        (seen,) = conn.execute(
            "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks"
            " WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchall()
    assert ct.advisory_arguments((int(seen[0]), int(seen[1]), int(seen[2]))) == arguments


def test_a_draw_is_in_proportion_to_how_often_a_lock_was_seen() -> None:
    choices = random.Random(1)
    drawn = [ct.weighted(choices, {"a": 1, "b": 9}) for _ in range(2000)]
    assert 0.05 < drawn.count("a") / len(drawn) < 0.15
    assert ct.weighted(random.Random(3), {"a": 1, "b": 9}) == ct.weighted(random.Random(3), {"a": 1, "b": 9})


@pytest.fixture
def delivery(delivery_dsn: str) -> Iterator[PostgresDeliveryAdapter]:
    adapter = PostgresDeliveryAdapter(delivery_dsn)
    yield adapter
    adapter.close()


def test_the_bundled_store_stays_linearizable_while_its_locks_are_held_and_let_go(
    delivery: PostgresDeliveryAdapter, delivery_dsn: str
) -> None:
    contender = ct.Contender(delivery_dsn, 0.5, SEED)
    report = stress(
        delivery, machine="delivery", workers=8, duration=600, seed=SEED, repeats=2, max_programs=20, faults=contender
    )
    assert report.verdict == "LINEARIZABLE", report.finding and report.finding.result.summary()
    # It learned what the store locks: the deliveries' table (claims lock its rows, commits
    # write it) and advisory keys (fences, producers' keys).
    assert "public.workflow_agent_deliveries" in contender.map.row_tables()
    assert "public.workflow_agent_deliveries" in contender.map.written_tables()
    assert contender.map.keys()
    # It held locks in about half the rounds, and the store's statements waited for them.
    counts = contender.counts
    assert counts.ended > 0 and counts.ended + counts.missed == counts.rounds_faulted
    assert 0.3 < counts.rounds_faulted / (report.progress.histories * 2) < 0.7
    assert contender.waiting > 0
    assert all(h.order >= 1 for held in contender.rounds for h in held)


def test_the_holds_are_in_the_history_as_allowances_not_as_stalls_anyone_waited_for(
    delivery: PostgresDeliveryAdapter, delivery_dsn: str, tmp_path: Any
) -> None:
    contender = ct.Contender(delivery_dsn, 1.0, SEED)
    runner = Runner(delivery, "delivery", 4, seed=SEED, faults=contender)
    programs = random.Random(SEED)
    try:
        # A round with nothing to hold yet watches pg_locks throughout: what it sees is held
        # in the next rounds (a few programs at most, however loaded the machine).
        for _ in range(5):
            history = runner.run(GENERATORS["delivery"](programs, 4))
            if any(contender.schedule()):
                break
    finally:
        runner.close()
    assert any(contender.schedule()), "no round of 5 programs held a lock"
    assert len(contender.schedule()) == 2  # one entry a round, the rounds without holds empty
    held = [s for s in history.stalls if s.by == "contention"]
    assert held and all(s.began < s.ended for s in held)
    assert not waited(history)  # what waited for a hold was meant to
    write_history(tmp_path / "h.jsonl", history)
    assert read_history(tmp_path / "h.jsonl") == history


def test_a_sweep_that_waited_for_a_stalled_client_is_a_finding_and_for_a_hold_is_not() -> None:
    sweep = Operation(1, "w1", d.Reap(), d.Reaped(0), invoked=1, returned=6)
    for by, findings in (("stall", 1), ("contention", 0)):
        stall = Stall(w.COMMUNITIES["A"], 2, 3, 4, 5, by=by)
        history = History("delivery", None, (sweep,), (), (stall,))
        assert len(waited(history)) == findings, by


def test_a_lifecycle_run_under_contention_stays_linearizable(delivery_dsn: str) -> None:
    adapter = PostgresLifecycleAdapter(delivery_dsn)
    contender = ct.Contender(delivery_dsn, 0.5, SEED)
    try:
        report = stress(
            adapter, machine="lifecycle", workers=8, duration=600, seed=SEED, repeats=2, max_programs=10,
            faults=contender,
        )  # fmt: skip
    finally:
        adapter.close()
    assert report.verdict == "LINEARIZABLE", report.finding and report.finding.result.summary()
    assert contender.counts.ended > 0 and contender.waiting > 0


def test_stress_contend_prints_what_it_held(delivery_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["stress", "--dsn", delivery_dsn, "--machine", "delivery", "--workers", "4", "--duration", "3"]
    assert main([*argv, "--seed", "3", "--contend", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "holding locks its statements take in 0.5 of rounds" in out
    assert "contention: locks held in " in out and "learned " in out
