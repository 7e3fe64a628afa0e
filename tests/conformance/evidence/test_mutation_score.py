"""The mutation score (`leaseproof mutants --generated`): its plan, its verdicts,
and the facts its equivalence claims rest on, on a real server."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import psycopg
import psycopg.sql
import pytest

from leaseproof.conformance.evidence import score as ms
from leaseproof.conformance.frontends.cli import main
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.mutants.generated.catalogue import by_name, generated_mutants
from leaseproof.impl.mutants.generated.equivalent import EQUIVALENT

KILLED = "lp_claim/flip-arithmetic/1"  # a claim lowers the generation: dies at once
EQUIVALENT_ONE = "lp_claim/drop-conjunct/7"  # a request key compared with NULL
SCOPED = "lp_claim/drop-conjunct/1"  # a claim for a community the role does not act for


def test_every_equivalence_claim_names_a_generated_mutant_and_gives_a_reason() -> None:
    names = {m.name for m in generated_mutants()}
    assert set(EQUIVALENT) <= names
    assert all(len(reason) > 40 for reason in EQUIVALENT.values())


def test_the_full_plan_runs_every_check_of_every_mutant_on_every_seed() -> None:
    plan = ms.plan()
    assert plan.seeds == ms.SEEDS and len(plan.mutants) == len(generated_mutants())
    checks = {(t.mutant, t.check, t.seed) for t in plan.tasks}
    for mutant in plan.mutants:
        if mutant.kind == "scope":
            assert {(n, c) for n, c, _ in checks if n == mutant.name} == {(mutant.name, ms.SCOPE)}
        elif mutant.kind == "race":
            assert {(mutant.name, ms.STRESS, seed) for seed in ms.SEEDS} <= checks
            assert (mutant.name, ms.CONTENTION, None) in checks
        else:
            assert {(mutant.name, ms.SEARCH_ALONE, seed) for seed in ms.SEEDS} <= checks
            assert (mutant.name, ms.SCENARIOS, None) in checks


def test_the_fast_plan_keeps_every_equivalence_claim_and_a_stride_of_the_rest() -> None:
    plan = ms.plan(fast=True)
    chosen = {m.name for m in plan.mutants}
    assert set(EQUIVALENT) <= chosen
    others = [m for m in generated_mutants() if m.name not in EQUIVALENT and m.kind == "sequential"]
    races = [m for m in generated_mutants() if m.name not in EQUIVALENT and m.kind == "race"]
    contended = {m.name for m in races if ms.in_fast_sample(m.name)}
    scoped = {m.name for m in generated_mutants() if m.kind == "scope"}
    assert {by_name(name).machine for name in contended} == {"delivery", "lifecycle"}
    assert chosen - set(EQUIVALENT) == {m.name for m in others if ms.in_fast_sample(m.name)} | contended | scoped
    # A fixed share, chosen by name: about one in FAST_STRIDE, whatever else the catalogue holds.
    assert (
        len(others) / ms.FAST_STRIDE * 0.8
        < len([m for m in others if ms.in_fast_sample(m.name)])
        < len(others) / ms.FAST_STRIDE * 1.2
    )
    assert {(t.mutant, t.check) for t in plan.tasks if t.mutant in scoped} == {(n, ms.SCOPE) for n in scoped}
    assert contended and {(t.mutant, t.check) for t in plan.tasks if t.mutant in contended} == {
        (name, ms.CONTENTION) for name in contended
    }  # the contention schedules alone: stress kills are not repeatable
    assert plan.seeds == ms.SEEDS[:1]
    search = [t for t in plan.tasks if t.check == ms.SEARCH_ALONE]
    assert {t.examples for t in search if t.mutant in EQUIVALENT} == {ms.FAST_EQUIVALENT_EXAMPLES}
    assert {t.examples for t in search if t.mutant not in EQUIVALENT} == {ms.FAST_EXAMPLES}
    stress = [t for t in plan.tasks if t.check == ms.STRESS]
    assert all(t.mutant in EQUIVALENT and t.examples == ms.FAST_EQUIVALENT_EXAMPLES for t in stress)
    # a race mutant listed as equivalent passes stress on a small budget, and a fixed sample of
    # the contention schedules; the others' contention runs every schedule until one kills
    claimed = {m.name for m in generated_mutants() if m.name in EQUIVALENT and m.kind == "race"}
    contention = {t.mutant: t.every for t in plan.tasks if t.check == ms.CONTENTION}
    assert claimed <= {t.mutant for t in stress} & contention.keys()
    assert {every for name, every in contention.items() if name in claimed} == {ms.FAST_STRIDE}
    assert {every for name, every in contention.items() if name not in claimed} == {1}


def test_a_plan_of_unknown_names_or_of_the_wrong_machine_is_refused() -> None:
    with pytest.raises(ValueError, match="no generated mutant named"):
        ms.plan(["lp_renew/nope/1"])
    with pytest.raises(ValueError, match="lifecycle machine"):
        ms.plan([KILLED], machine="lifecycle")


def test_a_score_kills_what_it_can_and_leaves_equivalent_mutants_out_of_its_denominator(pg_server: Server) -> None:
    mutants = [by_name(KILLED), by_name(EQUIVALENT_ONE), by_name(SCOPED)]
    score = ms.run_score(pg_server, mutants, seeds=[1], budget=ms.Budget(examples=20), jobs=1)
    assert score.killed(KILLED) and not score.killed(EQUIVALENT_ONE) and score.killed(SCOPED)
    assert score.survivors == [] and score.disproved == []
    rows = {(check, seed): (killed, total) for check, seed, killed, total, _ in score.by_check()}
    assert rows == {(ms.SEARCH_ALONE, "1"): (1, 1), (ms.SCENARIOS, "-"): (1, 1), (ms.SCOPE, "-"): (1, 1)}
    assert "Claim was answered ClaimMiss(), not Forbidden" in score.of(SCOPED)[0].detail
    text = ms.report(score)
    assert "SURVIVED" not in text and f"  {EQUIVALENT_ONE}: " in text


def test_a_killed_equivalence_claim_is_reported_and_fails_the_run(
    pg_server: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(EQUIVALENT, KILLED, "a claim that does not hold")
    monkeypatch.setenv("LEASEPROOF_DSN", pg_server.dsn)
    status = main(["mutants", "--generated", "--mutant", KILLED, "--seed", "1", "--jobs", "1", "--max-examples", "5"])
    captured = capsys.readouterr()
    assert status == 1
    assert f"NOT EQUIVALENT {KILLED}" in captured.out


def test_workers_on_their_own_databases_give_the_same_verdicts(pg_server: Server) -> None:
    mutants = [by_name(KILLED), by_name(EQUIVALENT_ONE)]
    budget = ms.Budget(examples=10)
    alone = ms.run_score(pg_server, mutants, seeds=[1, 2], budget=budget, jobs=1)
    spread = ms.run_score(pg_server, mutants, seeds=[1, 2], budget=budget, jobs=2)
    verdicts = [(r.mutant, r.check, r.seed, r.killed, r.examples) for r in alone.results]
    assert verdicts == [(r.mutant, r.check, r.seed, r.killed, r.examples) for r in spread.results]


def test_the_json_document_lists_the_score_by_check(pg_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEPROOF_DSN", pg_server.dsn)
    out, err = io.StringIO(), io.StringIO()
    from leaseproof.conformance.frontends import cli

    args = cli.build_parser().parse_args(
        ["mutants", "--generated", "--json", "--mutant", KILLED, "--seed", "3", "--jobs", "1", "--max-examples", "5"]
    )
    assert cli.load("mutants").command(args, out, err) == 0
    document = json.loads(out.getvalue())
    assert document["seeds"] == [3] and document["survivors"] == [] and document["mutants"] == 1
    assert {row["check"] for row in document["by_check"]} == {ms.SEARCH_ALONE, ms.SCENARIOS}


# -- the facts the equivalence claims rest on -------------------------------------------------


def _refused(dsn: str, sql: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.IntegrityError) as refused:
        conn.execute(sql)
    return str(refused.value)


_COMMUNITY = "00000000-0000-4000-8000-000000000001"
_SETUP = f"""
    INSERT INTO communities (id) VALUES ('{_COMMUNITY}');
    INSERT INTO workflows VALUES ('{_COMMUNITY}', '00000000-0000-4000-8000-000000000002');
    INSERT INTO workflow_runs
        VALUES ('{_COMMUNITY}', '00000000-0000-4000-8000-000000000002', '00000000-0000-4000-8000-000000000003');
    INSERT INTO events VALUES ('{_COMMUNITY}', '\\x{"11" * 32}');
"""


def _delivery(status: str, lease: str, cause: str = "'event', '\\x" + "22" * 32 + "', NULL, NULL") -> str:
    return f"""
        INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, target_pubkey,
            definition_event_id, message_event_id, cause_kind, cause_event_id, cause_scheduled_for,
            cause_invocation_id, status, lease_generation, lease_until, claimed_at, created_at)
        VALUES ('{_COMMUNITY}', gen_random_uuid(), '00000000-0000-4000-8000-000000000002',
            '00000000-0000-4000-8000-000000000003', 's1', '\\x{"33" * 32}', '\\x{"44" * 32}', '\\x{"11" * 32}',
            {cause}, '{status}', {1 if status == "claimed" else 0}, {lease}, {lease}, now())
    """


def test_a_pinned_clock_is_refused_outside_a_test_database(delivery_dsn: str) -> None:
    """The fact behind the test clock's claims (lp_now's `pinned IS NOT NULL`, `lp_test_hooks()`)."""
    with psycopg.connect(delivery_dsn, autocommit=True) as conn:
        database = psycopg.sql.Identifier(conn.info.dbname)
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} RESET leaseproof.test_hooks").format(database))
        with pytest.raises(psycopg.DatabaseError, match="cannot be pinned"):
            conn.execute("INSERT INTO lp_clock (pinned_at) VALUES (now())")


def test_purged_runs_and_deleted_heads_take_their_rows_with_them(delivery_dsn: str) -> None:
    """The cascades behind skipping a purge's or a deletion's first statement."""
    with psycopg.connect(delivery_dsn, autocommit=True) as conn:
        conn.execute(_SETUP)
        conn.execute(_delivery("pending", "NULL"))
        conn.execute(f"UPDATE communities SET state = 'deleted' WHERE id = '{_COMMUNITY}'")
        conn.execute(f"DELETE FROM workflow_runs WHERE community_id = '{_COMMUNITY}'")
        assert conn.execute("SELECT count(*) FROM workflow_agent_deliveries").fetchone() == (0,)
        references = conn.execute(
            "SELECT confdeltype FROM pg_constraint WHERE conrelid = 'definition_runtime'::regclass AND contype = 'f'"
        ).fetchall()
    assert references == [("c",)]  # the runtime row's one foreign key, to its head, cascades


# -- faults: the run ends cleanly however it is stopped --------------------------------------

_LONG = ["lp_claim/drop-conjunct/7", "lp_resume_run/drop-conjunct/12"]  # equivalent: each runs its whole budget


def _databases(server: Server, run: subprocess.Popen[str]) -> set[str]:
    """The databases of the score run `run` (named after its pid): other runs may share the server."""
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        like = f"lp\\_mutation\\_{run.pid}\\_%"
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (like,))
        return {row[0] for row in rows}


def _until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def _gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


def _score_run(server: Server) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "leaseproof.conformance.frontends.cli", "mutants", "--generated"]
    command += ["--mutant", *_LONG]
    command += ["--seed", "1", "2", "--jobs", "2", "--dsn", server.dsn]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_a_run_drops_a_database_of_its_own_whose_drop_was_never_registered(pg_server: Server) -> None:
    """An interrupt can land between a CREATE DATABASE and the registration of its drop;
    the run's databases are named after it, so its exit drops such a one too."""
    prefix = f"lp_mutation_{os.getpid()}"
    with ms._databases(pg_server, 1) as dsns:
        assert len(dsns) == 1
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{prefix}_stray"')
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{prefix}%",)).fetchall()
    assert rows == []


def test_sigterm_stops_the_workers_and_drops_every_database(pg_server: Server) -> None:
    run = _score_run(pg_server)
    _until(lambda: len(_databases(pg_server, run)) >= 3, "the template and both workers' databases")
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130 and "interrupted; cleaned up" in err
    _until(lambda: _gone(run.pid), "every process of the run to end")
    assert _databases(pg_server, run) == set()


def test_workers_leave_when_their_parent_is_killed_outright(pg_server: Server) -> None:
    run = _score_run(pg_server)
    _until(lambda: len(_databases(pg_server, run)) >= 3, "the template and both workers' databases")
    run.kill()  # SIGKILL: nothing of the parent's runs; its workers must notice on their own
    run.communicate(timeout=60)
    _until(lambda: _gone(run.pid), "the orphaned workers to exit")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:  # a killed run cannot drop its databases
        for name in _databases(pg_server, run):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
