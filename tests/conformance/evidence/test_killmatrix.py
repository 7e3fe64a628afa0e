"""The kill matrix (`leaseproof mutants`): it kills shipped mutants with the checks
that apply to them, reports figures that hold up, and fails when a "mutant"
that is really the correct implementation survives."""

from __future__ import annotations

import json
import subprocess
import sys

import attrs
import pytest

from leaseproof.conformance.boundary.serve import SERVED
from leaseproof.conformance.concurrent.schedules import INTERLEAVINGS, LIFECYCLE_INTERLEAVINGS
from leaseproof.conformance.evidence import killmatrix as km
from leaseproof.conformance.frontends.cli import main
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.mutants.delivery import MUTANTS, Mutant
from leaseproof.impl.mutants.faults import FAULT_MUTANTS, NETWORK_MUTANTS, RESTART_MUTANTS
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS
from leaseproof.impl.mutants.race import RACE_MUTANTS
from leaseproof.impl.mutants.service import SERVICE_MUTANTS

# The correct store, dressed as a mutant: nothing can kill it.
BUNDLED = Mutant("bundled-store", "nothing: this is the bundled store", PostgresDeliveryStore)
BUNDLED_SEQUENTIAL = km.Subject("bundled-store", "delivery", km.SEQUENTIAL, BUNDLED.stands_for, BUNDLED)
BUNDLED_RACE = km.Subject(
    "bundled-store-raced", "delivery", km.RACE, BUNDLED.stands_for, BUNDLED, INTERLEAVINGS["sweeps-overlap"]
)
TINY = km.Budgets(search=5, stress=2, stress_seconds=60, steps=10)


def _rows(matrix: km.KillMatrix) -> dict[tuple[str, str], km.Row]:
    return {(row.mutant, row.check): row for row in matrix.rows}


def test_every_shipped_mutant_is_in_the_matrix_once_with_its_checks() -> None:
    names = [s.name for s in km.SUBJECTS]
    shipped = (
        *MUTANTS, *LIFECYCLE_MUTANTS, *RACE_MUTANTS, *FAULT_MUTANTS, *SERVICE_MUTANTS, *RESTART_MUTANTS,
        *NETWORK_MUTANTS,
    )  # fmt: skip
    assert len(names) == len(set(names)) == len(shipped)
    kinds = {s.name: s.kind for s in km.SUBJECTS}
    assert {n for n, k in kinds.items() if k == km.RACE} == {mu.name for mu in RACE_MUTANTS}
    assert {n for n, k in kinds.items() if k == km.FAULT} == {mu.name for mu in FAULT_MUTANTS}
    assert {n for n, k in kinds.items() if k == km.SERVICE} == {mu.name for mu in SERVICE_MUTANTS}
    assert {n for n, k in kinds.items() if k == km.RESTART} == {mu.name for mu in RESTART_MUTANTS}
    assert {n for n, k in kinds.items() if k == km.NETWORK} == {mu.name for mu in NETWORK_MUTANTS}
    forced = {s.name for s in km.SUBJECTS if s.interleaving is not None}
    assert forced == set(INTERLEAVINGS) | set(LIFECYCLE_INTERLEAVINGS)
    assert forced == {
        "reconcile-outside-transaction", "sweeps-overlap", "admission-without-row-lock", "authority-check-unlocked",
        "read-skips-locked",
    }  # fmt: skip
    assert {s.machine for s in km.SUBJECTS if s.interleaving is not None} == {"delivery", "lifecycle"}
    for subject in km.SUBJECTS:
        full, fast = subject.checks(fast=False), subject.checks(fast=True)
        if subject.kind == km.SERVICE:  # the nemesis, in the full matrix only (CI runs a short one in the tests)
            # and, for a bug in the store, which `serve --mutant` serves, the nemesis over the wire with stalls
            served = subject.name in {mu.name for mu in SERVED}
            assert (full, fast) == ((km.NEMESIS, km.STALLS) if served else (km.NEMESIS,), ()), subject.name
            continue
        if subject.kind in (km.RESTART, km.NETWORK):  # the nemesis over the wire: the full matrix only
            assert (full, fast) == ((km.KILLS if subject.kind == km.RESTART else km.LOST_ANSWERS,), ()), subject.name
            continue
        assert set(fast) <= set(full) and fast, subject.name
        profile = (km.GUARANTEES,) if subject.machine == "delivery" else ()
        if subject.kind == km.FAULT:
            assert full == fast == (km.STRESS, km.GUARANTEES)
        elif subject.kind == km.SEQUENTIAL:
            assert full == (km.SCENARIOS_AND_SEARCH, km.SEARCH_ALONE, *profile)
            assert fast == (km.SCENARIOS_AND_SEARCH,)
        elif subject.name in forced:
            assert full == (km.STRESS, km.FORCED, *profile) and fast == (km.FORCED,)
        else:
            assert full == (km.STRESS, *profile) and fast == (km.STRESS,)


def test_the_profile_kills_a_bug_class_from_the_field_and_names_the_guarantee(pg_server: Server) -> None:
    (subject,) = km.select(["oban-rescue-beyond-scope"])
    with scratch_database(pg_server) as dsn:
        row = km._guarantees(subject, dsn, km.SEED, TINY)
    assert row.killed and row.check == km.GUARANTEES and row.unit == "programs"
    assert "rescue-only-expired (scenario)" in row.detail, row.detail


def test_a_fault_mutant_is_killed_by_both_checks_that_cut_connections(pg_server: Server) -> None:
    """claim-then-deadline passes the sequential lockstep and every race (its tests show it);
    stress with cuts and the profile's rounds with cuts both kill it."""
    matrix = km.run_matrix(pg_server, km.select(["claim-then-deadline"]), fast=True)
    rows = _rows(matrix)
    stressed, profile = rows[("claim-then-deadline", km.STRESS)], rows[("claim-then-deadline", km.GUARANTEES)]
    assert stressed.killed and stressed.how == "divergence", stressed.detail
    assert profile.killed and "nothing-lost (race, connection cut)" in profile.detail, profile.detail
    assert matrix.counts()[km.FAULT] == (1, 1)


def test_selection_by_name_and_machine() -> None:
    assert [s.name for s in km.select(["cutoff-ignored", "reconcile-unfenced"])] == [
        "reconcile-unfenced",
        "cutoff-ignored",
    ]
    assert {s.machine for s in km.select(machine="lifecycle")} == {"lifecycle"}
    with pytest.raises(ValueError, match="no mutant named nope"):
        km.select(["nope"])
    with pytest.raises(ValueError, match="none of the mutants cutoff-ignored is of the delivery machine"):
        km.select(["cutoff-ignored"], "delivery")


def test_the_fast_matrix_kills_chosen_mutants_with_the_expected_checks(pg_server: Server) -> None:
    races = ["reconcile-outside-transaction", "sweeps-overlap", "admission-without-row-lock"]
    subjects = km.select(["reconcile-unfenced", "cutoff-ignored", *races])
    heard: list[km.Row] = []
    matrix = km.run_matrix(pg_server, subjects, fast=True, on_row=heard.append)
    assert list(matrix.rows) == heard  # one progress call per finished check
    rows = _rows(matrix)
    assert set(rows) == {
        ("reconcile-unfenced", km.SCENARIOS_AND_SEARCH),
        ("cutoff-ignored", km.SCENARIOS_AND_SEARCH),
        ("reconcile-outside-transaction", km.FORCED),
        ("sweeps-overlap", km.FORCED),
        ("admission-without-row-lock", km.FORCED),
    }
    # The review's finding 1 dies in the fixed scenario written for it, before any search.
    fenced = rows[("reconcile-unfenced", km.SCENARIOS_AND_SEARCH)]
    assert fenced.killed and fenced.how == "divergence"
    assert fenced.scenario == "stale_holder_finishes_after_newer_holder"
    assert fenced.examples == 0 and fenced.shrunk_length is None
    assert fenced.finding.startswith("review finding 1") and fenced.kind == km.SEQUENTIAL
    assert 0 < fenced.seconds <= fenced.check_seconds < 60
    assert rows[("cutoff-ignored", km.SCENARIOS_AND_SEARCH)].scenario == "delayed_and_replayed_saves"
    # The forced schedules: one each, judged on their concurrent operations.
    reconcile = rows[("reconcile-outside-transaction", km.FORCED)]
    sweeps = rows[("sweeps-overlap", km.FORCED)]
    assert reconcile.killed and (reconcile.examples, reconcile.unit, reconcile.shrunk_length) == (1, "schedules", 2)
    assert "no serial order of the model gives this history" in reconcile.detail
    assert sweeps.killed and sweeps.shrunk_length == 4 and "not linearizable" in sweeps.detail
    # A lifecycle race: its schedule runs the mutant's classes (a stale admission, parked inside lp_admit).
    admission = rows[("admission-without-row-lock", km.FORCED)]
    assert admission.killed and admission.machine == "lifecycle" and admission.shrunk_length == 4, admission.detail
    assert matrix.survivors == ()
    assert matrix.counts() == {
        km.SEQUENTIAL: (2, 2), km.RACE: (3, 3), km.FAULT: (0, 0), km.SERVICE: (0, 0), km.RESTART: (0, 0),
        km.NETWORK: (0, 0),
    }  # fmt: skip
    assert matrix.summary().startswith("2 of 2 sequential mutants killed, 3 of 3 race mutants killed (fast subset")


def test_a_search_kill_is_counted_in_examples_and_shrunk_to_a_short_program(pg_server: Server) -> None:
    """Both lockstep checks, as the full matrix runs them, on a search budget small
    enough for the default run (this mutant dies in a handful of examples)."""
    budgets = km.Budgets(search=300, stress=1, stress_seconds=1)
    matrix = km.run_matrix(pg_server, km.select(["cache-never-expires"]), budgets=budgets)
    rows = _rows(matrix)
    assert rows[("cache-never-expires", km.SCENARIOS_AND_SEARCH)].scenario == "authority_fences_and_ttl"
    row = rows[("cache-never-expires", km.SEARCH_ALONE)]
    assert row.killed and row.how == "divergence" and row.scenario is None
    assert 1 <= row.examples <= 300 and row.budget == 300
    # Shrunk to the bug itself: the clock passes the TTL, and a fire is served from the stale cache.
    assert row.shrunk_length == 2, row.counterexample
    assert row.counterexample.splitlines()[2:4] == [
        "state.advance_clock(seconds=1)",
        "state.fire_cached(door='event')",
    ]
    assert "state mismatch after Fire" in row.detail
    assert 0 < row.seconds <= row.check_seconds


def test_the_correct_implementation_survives_every_check(pg_server: Server) -> None:
    matrix = km.run_matrix(pg_server, [BUNDLED_SEQUENTIAL, BUNDLED_RACE], fast=False, budgets=TINY)
    rows = _rows(matrix)
    assert set(rows) == {
        ("bundled-store", km.SCENARIOS_AND_SEARCH),
        ("bundled-store", km.SEARCH_ALONE),
        ("bundled-store", km.GUARANTEES),
        ("bundled-store-raced", km.STRESS),
        ("bundled-store-raced", km.FORCED),
        ("bundled-store-raced", km.GUARANTEES),
    }
    assert not any(row.killed for row in rows.values())
    assert rows[("bundled-store", km.GUARANTEES)].detail == "holds every guarantee in 5 programs and 60 races"
    # Every program generated; those that repeat one already sent are not sent (nor counted) again.
    assert 0 < rows[("bundled-store", km.SEARCH_ALONE)].examples <= TINY.search
    assert rows[("bundled-store-raced", km.STRESS)].examples == TINY.stress
    assert "linearizable" in rows[("bundled-store-raced", km.FORCED)].detail
    assert matrix.survivors == ("bundled-store", "bundled-store-raced")
    assert "SURVIVED: bundled-store, bundled-store-raced" in matrix.summary()
    assert all("| NO |" in line for line in km.table(matrix).splitlines()[2:8])


def test_the_json_document(pg_server: Server) -> None:
    matrix = km.run_matrix(pg_server, (*km.select(["sweeps-overlap"]), BUNDLED_RACE), fast=True)
    document = json.loads(json.dumps(matrix.to_json()))
    assert set(document) == {"fast", "seeds", "seconds", "counts", "survivors", "rows"}
    assert document["fast"] is True and document["seeds"] == [km.SEED]
    assert document["counts"] == {
        "sequential": {"killed": 0, "total": 0},
        "race": {"killed": 1, "total": 2},
        "fault": {"killed": 0, "total": 0},
        "service": {"killed": 0, "total": 0},
        "restart": {"killed": 0, "total": 0},
        "network": {"killed": 0, "total": 0},
    }
    assert document["survivors"] == ["bundled-store-raced"]
    killed, survived = document["rows"]
    assert set(killed) == {f.name for f in attrs.fields(km.Row)} - {"stress"}  # the run itself: drawn on its page
    assert (
        killed["mutant"] == "sweeps-overlap" and killed["check"] == "forced interleaving" and killed["killed"] is True
    )
    assert (killed["examples"], killed["unit"], killed["shrunk_length"]) == (1, "schedules", 4)
    assert survived["killed"] is False and survived["shrunk_length"] is None


def test_a_service_mutant_is_judged_by_the_nemesis_and_over_the_wire_in_the_full_matrix_only(
    pg_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    subjects = km.select(["reap-deletes"])
    assert [s.kind for s in subjects] == [km.SERVICE] and subjects[0].checks(fast=True) == ()
    fast = km.run_matrix(pg_server, subjects, fast=True)
    assert fast.rows == () and fast.survivors == () and fast.counts()["service"] == (0, 0)
    monkeypatch.setattr(km, "NEMESIS_SECONDS", 4.0)
    matrix = km.run_matrix(pg_server, subjects, seeds=(1,))
    row, wire = matrix.rows
    assert (row.check, row.seed, row.killed, row.unit) == (km.NEMESIS, 1, True, "runs"), row
    assert row.why.startswith("lost: delivery ") and "found under kill" in row.detail
    assert "what the nemesis saw:\n- reap-deletes (seed 1): lost: delivery " in km.table(matrix)
    # Its bug is in the store, so `serve --mutant` serves it to the nemesis over the wire, with stalls.
    assert (wire.check, wire.seed, wire.killed, wire.unit) == (km.STALLS, 1, True, "programs"), wire
    assert "what the nemesis saw, a tenant stalled:\n- reap-deletes (seed 1): " in km.table(matrix)
    assert matrix.counts()["service"] == (1, 1)


@pytest.mark.parametrize("kind", ["service", "restart", "network"])
def test_the_fast_subset_of_service_or_restart_mutants_alone_is_refused(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mutants", "--fast", "--kind", kind]) == 2
    assert "runs no check on a service, restart or network mutant" in capsys.readouterr().err


# -- the command -------------------------------------------------------------------------------------


def test_mutants_command_prints_the_table_and_exits_0(pg_server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["mutants", "--fast", "--dsn", pg_server.dsn, "--mutant", "reconcile-unfenced", "--mutant", "sweeps-overlap"]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.out + captured.err
    lines = captured.out.splitlines()
    assert lines[0] == "| mutant | machine | finding | check | seed | killed | examples | seconds | shrunk length |"
    assert lines[2].startswith("| reconcile-unfenced | delivery | review finding 1:")
    assert (
        "| lockstep: scenarios+search | 20261129 | yes | 0 (scenario stale_holder_finishes_after_newer_holder) |"
        in lines[2]
    )
    assert (
        lines[3].startswith("| sweeps-overlap | delivery |")
        and "| forced interleaving | - | yes | 1 schedule |" in lines[3]
    )
    assert lines[3].endswith("| 4 operations |")
    assert "1 of 1 sequential mutants killed, 1 of 1 race mutants killed (fast subset, seed 20261129" in captured.out
    progress = [line for line in captured.err.splitlines() if line.startswith("  ") and " · " in line]
    assert (
        len(progress) == 2
        and "reconcile-unfenced · lockstep: scenarios+search seed 20261129: killed yes" in progress[0]
    )


def test_a_surviving_mutant_makes_the_command_exit_1_naming_it(
    pg_server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(km, "SUBJECTS", (*km.SUBJECTS, BUNDLED_RACE))
    status = main(
        ["mutants", "--fast", "--dsn", pg_server.dsn, "--mutant", "bundled-store-raced", "reconcile-unfenced"]
    )
    captured = capsys.readouterr()
    assert status == 1, captured.out + captured.err
    assert (
        "| bundled-store-raced | delivery | nothing: this is the bundled store | forced interleaving | - | NO |"
        in captured.out
    )
    assert "SURVIVED: bundled-store-raced" in captured.out
    assert "survived every check that ran: bundled-store-raced" in captured.err


def test_usage_and_provisioning_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutants", "--mutant", "no-such-mutant"]) == 2
    assert "no mutant named no-such-mutant" in capsys.readouterr().err
    assert main(["mutants", "--machine", "delivery", "--mutant", "cutoff-ignored"]) == 2
    assert "none of the mutants cutoff-ignored is of the delivery machine" in capsys.readouterr().err
    unreachable = "host=127.0.0.1 port=1 user=nobody dbname=postgres connect_timeout=2"
    assert main(["mutants", "--fast", "--mutant", "reconcile-unfenced", "--dsn", unreachable]) == 2
    assert "--dsn" in capsys.readouterr().err


def test_mutants_json_from_a_real_process(pg_server: Server) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "leaseproof.conformance.frontends.cli", "mutants", "--fast", "--json", "--seed", "7",
         "--dsn", pg_server.dsn, "--machine", "lifecycle", "--mutant", "cutoff-ignored"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    document = json.loads(run.stdout)  # nothing but the document on stdout
    assert document["seeds"] == [7] and document["survivors"] == []
    (row,) = document["rows"]
    assert (row["mutant"], row["machine"], row["check"], row["killed"]) == (
        "cutoff-ignored", "lifecycle", "lockstep: scenarios+search", True,
    )  # fmt: skip
    assert "cutoff-ignored · lockstep: scenarios+search seed 7: killed yes" in run.stderr


@pytest.mark.evidence
def test_the_fast_matrix_kills_every_shipped_mutant(pg_server: Server) -> None:
    """What CI runs as `leaseproof mutants --fast`, as a test."""
    matrix = km.run_matrix(pg_server, fast=True)
    assert matrix.survivors == (), km.table(matrix)
    print(km.table(matrix))
