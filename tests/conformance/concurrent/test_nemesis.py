"""The nemesis on a real server: worker processes killed, their backends ended,
paused past their leases, and a client stalled on a tenant's rows, while the
store is used on the real clock; then the audit. And the audit itself, on
logs and rows made to break each rule it checks."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from pathlib import Path

import pytest

from leaseproof.conformance.concurrent import nemesis
from leaseproof.conformance.concurrent.nemesis import FAULTS, Plan, Report
from leaseproof.conformance.frontends import cli
from leaseproof.conformance.harness import provision
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.service import DeliveryService
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.service import SERVICE_MUTANTS

SEED = 20261202
ON_A_SHARED_SERVER = tuple(f for f in FAULTS if f != "restart")  # the test session's server is not restarted


def test_a_seeded_run_under_every_fault_loses_nothing_settles_once_and_accepts_no_stale_holder(
    pg_server: Server, tmp_path: Path
) -> None:
    said: list[str] = []
    with scratch_database(pg_server) as dsn:
        plan = Plan(seed=SEED, duration=6, workers=3, per_tenant=200, faults=ON_A_SHARED_SERVER)
        report = nemesis.run(dsn, plan, tmp_path, said.append)
    assert all(report.faults[kind] >= 1 for kind in ON_A_SHARED_SERVER), report.faults  # each kind was injected
    assert report.cycles > 0 and report.answers["claim:Claimed"] > 0, said
    assert report.answers["reap:Reaped"] > 0, said  # the reaper's answers are audited too
    assert report.safe, "\n".join(said)
    assert report.committed == 600
    assert any(line.startswith("verdict: SAFE") for line in said)


@pytest.mark.parametrize(
    ("mutant", "caught_by"),
    [("reap-deletes", "lost"), ("generation-never-moves", "same_generation")],
)
def test_the_same_run_catches_a_store_that_breaks_an_audit_clause(
    pg_server: Server, tmp_path: Path, mutant: str, caught_by: str
) -> None:
    """The first test's run, on a variant of the store (impl/mutants/service.py) whose bug
    the named clause of the audit must find: the audit is seen failing on what it claims."""
    store = by_name(SERVICE_MUTANTS, mutant).store
    with scratch_database(pg_server) as dsn:
        plan = Plan(seed=SEED, duration=6, workers=3, per_tenant=200, faults=ON_A_SHARED_SERVER, store=store)
        report = nemesis.run(dsn, plan, tmp_path, lambda line: None)
    assert getattr(report, caught_by), report.lines()
    assert not report.safe


@pytest.mark.evidence
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    ("mutant", "caught_by"),
    [
        (None, None),
        ("reap-deletes", "lost"),
        ("finish-retry-settles-again", "double"),
        ("finish-ignores-generation", "stale"),
        ("generation-never-moves", "same_generation"),
        ("sweep-waits-for-locks", "live"),
        ("resend-claim-new-key", "orphaned"),
    ],
)
def test_the_nemesis_kills_each_service_mutant_and_passes_the_store_on_seeds_1_to_3(
    pg_server: Server, tmp_path: Path, seed: int, mutant: str | None, caught_by: str | None
) -> None:
    """`leaseproof nemesis --seed N --duration 30 [--mutant M]`, every fault a shared server allows
    (the kill matrix runs the same: `leaseproof mutants --kind service --seed 1 2 3`;
    docs/figures/nemesis.md has the table)."""
    variant = None if mutant is None else by_name(SERVICE_MUTANTS, mutant)
    store = PostgresDeliveryStore if variant is None else variant.store
    service = DeliveryService if variant is None else variant.service
    with scratch_database(pg_server) as dsn:
        plan = Plan(seed=seed, duration=30, per_tenant=300, faults=ON_A_SHARED_SERVER, store=store, service=service)
        report = nemesis.run(dsn, plan, tmp_path, lambda line: None)
    if caught_by is None:
        assert report.safe and report.live, report.lines()
    elif caught_by == "live":
        assert not report.live, report.lines()
    else:
        assert getattr(report, caught_by) and not report.safe, report.lines()


def test_a_seeded_run_with_server_restarts_stays_safe_on_a_server_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restarts (fast and immediate) need a server the run owns: an embedded one of its own."""
    monkeypatch.delenv(provision.DSN_ENV, raising=False)
    monkeypatch.setattr(provision, "docker_engine", lambda *a, **k: (False, "not for this test"))
    said: list[str] = []
    with provision.postgres_server() as server, scratch_database(server) as dsn:
        plan = Plan(seed=SEED, duration=5, workers=2, per_tenant=100, faults=("restart", "kill"), period=1.6)
        report = nemesis.run(dsn, plan, tmp_path, said.append, restart=server.restart)
    assert report.faults["restart"] >= 2 and sum(report.restarts.values()) == report.faults["restart"], said
    assert report.safe, "\n".join(said)
    assert report.cycles > 0, said


def test_the_restart_fault_needs_a_server_leaseproof_started(
    pg_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["nemesis", "--dsn", pg_server.dsn, "--duration", "1", "--faults", "restart"]) == 2
    assert "the restart fault needs a server leaseproof starts itself" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the restart fault needs"):
        nemesis.run("dbname=unused", Plan(seed=1, duration=1, faults=("restart",)), Path("."), restart=None)


# Rows made by hand as the store leaves them, for the audit's tests (the schema's guards check their shape).
_CLAIM = (
    "UPDATE workflow_agent_deliveries SET status = 'claimed', lease_generation = %s, claim_key = %s,"
    " lease_until = now() + interval '1 minute', claimed_at = now() WHERE id = %s"
)
_FINISH = (
    "UPDATE workflow_agent_deliveries SET status = 'finished', lease_until = NULL, claimed_at = NULL,"
    " claim_key = NULL, finished_at = now() WHERE id = %s"
)


def _log(path: Path, *entries: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries) + '{"op": "fin', encoding="utf-8")  # a cut line
    return path


def test_the_audit_finds_a_lost_delivery_a_double_settlement_a_stale_holder_a_shared_generation_and_a_stuck_claim(
    pg_server: Server, tmp_path: Path
) -> None:
    with scratch_database(pg_server) as dsn:
        ids = nemesis.prepare(dsn, Plan(seed=1, duration=1, tenants=1, per_tenant=3))
        first, second, third = (str(i) for i in ids)
        with connect(dsn) as conn:
            conn.execute(_CLAIM, (1, None, uuid.UUID(first)))  # first: claimed at 1, then finished
            conn.execute(_FINISH, (uuid.UUID(first),))
            conn.execute(_CLAIM, (2, None, uuid.UUID(second)))  # second: claimed at 2, by someone else
            conn.execute("UPDATE communities SET state = 'deleted'")  # the fence admits the delete
            conn.execute("DELETE FROM workflow_agent_deliveries WHERE id = %s", (uuid.UUID(third),))
        log = _log(
            tmp_path / "worker-0.jsonl",
            {"op": "claim", "answer": "Claimed", "id": first, "gen": 1},
            {"op": "claim", "answer": "Claimed", "id": first, "gen": 1},  # one generation handed out twice
            {"op": "finish", "answer": "Settled", "id": first, "gen": 1},
            {"op": "finish", "answer": "Settled", "id": first, "gen": 1},  # settled twice
            {"op": "finish", "answer": "Settled", "id": second, "gen": 1},  # the row is at generation 2, claimed
        )
        report = Report()
        nemesis._audit(dsn, ids, [log], report)
    assert report.lost == [f"lost: delivery {third} was committed and is gone"]
    assert report.double == [f"settled twice: delivery {first} at generations [1, 1]"]
    assert report.stale == [
        f"stale accepted: delivery {second} settled at generation 1, the row is claimed at generation 2"
    ]
    assert report.same_generation == [f"claimed twice: delivery {first} at generation 1"]
    # second is still claimed, a minute's lease, when the audit runs: nobody will process it.
    (stuck,) = report.unprocessed
    assert stuck.startswith(f"unprocessed: delivery {second} is still claimed at generation 2, its lease until ")
    assert not report.safe and report.lines()[-1].startswith("verdict: UNSAFE")


def test_the_audit_finds_a_resend_told_settled_again_and_a_lease_that_reached_nobody(
    pg_server: Server, tmp_path: Path
) -> None:
    with scratch_database(pg_server) as dsn:
        ids = nemesis.prepare(dsn, Plan(seed=1, duration=1, tenants=1, per_tenant=3))
        first, second, third = (str(i) for i in ids)
        with connect(dsn) as conn:
            for delivery, key in ((first, "lp-nemesis-worker-0/7/1"), (second, "lp-nemesis-worker-0/7/2")):
                conn.execute(_CLAIM, (1, key, uuid.UUID(delivery)))
                conn.execute(_FINISH, (uuid.UUID(delivery),))
            conn.execute(_CLAIM, (1, "lp-nemesis-worker-1/9/1", uuid.UUID(third)))  # handed to nobody
        now = time.time()
        worker_0 = _log(
            tmp_path / "worker-0.jsonl",
            {"op": "claim", "answer": "Claimed", "id": first, "gen": 1},
            {"op": "claim", "answer": "Claimed", "id": second, "gen": 1},
            # Its first attempt settled it (finished_at is now); the resend, sent a minute later, told Settled.
            {"op": "finish", "answer": "Settled", "id": first, "gen": 1, "resent_at": now + 60},
            # The first attempt never ran: the resend, sent a minute before the row was settled, settled it.
            {"op": "finish", "answer": "Settled", "id": second, "gen": 1, "resent_at": now - 60},
        )
        worker_1 = tmp_path / "worker-1.jsonl"
        worker_1.write_text("", encoding="utf-8")
        report = Report()
        nemesis._audit(dsn, ids, [worker_0, worker_1], report)
        assert len(report.double) == 1 and report.double[0].startswith(f"settled twice: delivery {first} was settled")
        (orphan,) = report.orphaned
        assert orphan.startswith("orphaned leases: 1 claimed and handed to no worker")
        assert third in orphan and "lp-nemesis-worker-1/9/1" in orphan
        # Explained: its worker was killed while it claimed (its last line), gave the claim up, or the run abandoned it.
        explanations: tuple[list[dict[str, object]], ...] = (
            [{"op": "claiming", "key": "lp-nemesis-worker-1/9/1"}],
            [{"op": "claiming", "key": "lp-nemesis-worker-1/9/1"}, {"op": "claiming", "key": "lp-nemesis-worker-1/5/1"},
             {"op": "claim", "answer": "ClaimMiss"}],
            [{"op": "lost", "answer": "ConnectionLost", "doing": "claim", "key": "lp-nemesis-worker-1/9/1"}],
        )  # fmt: skip
        for lines in explanations:
            _log(worker_1, *lines)
            explained = Report()
            nemesis._audit(dsn, ids, [worker_0, worker_1], explained)
            assert explained.orphaned == [], lines
        _log(worker_1, {"op": "claiming", "key": "lp-nemesis-worker-1/9/1"}, {"op": "claim", "answer": "ClaimMiss"})
        answered = Report()  # a claim answered (a miss) explains nothing
        nemesis._audit(dsn, ids, [worker_0, worker_1], answered)
        assert len(answered.orphaned) == 1
        abandoned = Report()
        nemesis._audit(dsn, ids, [worker_0, worker_1], abandoned, {"lp-nemesis-worker-1/9/1"})
        assert abandoned.orphaned == [] and not abandoned.safe  # (the double settlement stays)


def test_a_lease_that_ran_out_before_its_claim_was_resent_is_not_orphaned() -> None:
    """A keyed claim resent after its first lease ran out takes a new one (the model's rule):
    the first reached nobody, and that is no fault. Resent while it still held, it is."""
    t0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
    first = {"id": uuid.UUID(int=1), "generation": 1, "claim_key": "lp-nemesis-worker-0/1/1",
             "lease_until": t0 + dt.timedelta(seconds=1), "at": t0}  # fmt: skip
    resent = {**first, "id": uuid.UUID(int=2), "lease_until": t0 + dt.timedelta(seconds=3)}
    handed = {(str(uuid.UUID(int=2)), 1): 1}  # the resend's lease reached the worker
    for at, orphans in ((t0 + dt.timedelta(seconds=2), 0), (t0 + dt.timedelta(milliseconds=500), 1)):
        report = Report()
        nemesis._orphans([first, {**resent, "at": at}], handed, frozenset(), report)
        assert len(report.orphaned) == orphans, (at, report.orphaned)


def test_liveness_is_judged_against_its_bound() -> None:
    report = Report(worst_healthy_delay=nemesis.REAP_BOUND + 0.01)
    assert report.safe and not report.live and report.lines()[-1] == "verdict: SAFE, NOT LIVE"


@pytest.mark.parametrize(
    "args, message",
    [(["--faults", "kill,bogus"], "unknown faults ['bogus']"), (["--duration", "0"], "must be positive")],
)
def test_bad_arguments_exit_2_before_anything_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["nemesis", "--dsn", "postgresql://nobody@/nowhere", *args]) == 2
    assert message in capsys.readouterr().err


def test_the_command_prints_the_figures_and_its_exit_status_follows_the_verdict(
    pg_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--seed", "3", "--duration", "2", "--workers", "2", "--deliveries", "20", "--faults", "kill,terminate"]
    status = cli.main(["nemesis", "--dsn", pg_server.dsn, *args])
    out = capsys.readouterr().out
    assert out.startswith("nemesis seed 3: 2 workers, 2s, faults kill, terminate\n")
    assert "committed deliveries: 60" in out and "verdict: SAFE" in out, out
    assert status == (0 if "verdict: SAFE, LIVE" in out else 1)
