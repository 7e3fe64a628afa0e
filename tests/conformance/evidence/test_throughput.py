"""The throughput benchmark measures every subject it names, on real worker processes, and
checks that each subject did all its jobs; it asserts no speed (figures are in docs/throughput.md)."""

from __future__ import annotations

import importlib.metadata
import io
import json

import pytest

from leaseproof.conformance.evidence import throughput, throughput_peers
from leaseproof.conformance.frontends import cli
from leaseproof.conformance.harness.server import Server


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["throughput", *argv])
    return cli.load("throughput").command(args, out, err), out.getvalue(), err.getvalue()


def test_the_floor_and_the_store_are_measured_side_by_side_in_rotating_rounds(pg_server: Server) -> None:
    code, out, err = _run(
        ["--workers", "2", "--jobs", "30", "--rounds", "2", "--subjects", "floor,store", "--dsn", pg_server.dsn]
    )
    assert code == 0, err
    rounds = [line.strip() for line in out.splitlines() if line.strip().startswith("round ")]
    # Interleaved: the second round starts with the subject the first ran second.
    assert [r.split(":")[0] for r in rounds] == [
        "round 1/2 floor",
        "round 1/2 store",
        "round 2/2 store",
        "round 2/2 floor",
    ]
    assert all(" 30 jobs in " in r for r in rounds)
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| subject | version | workers | jobs/s (median) | × floor |")
    assert table[2].startswith("| floor | this checkout | 2 | ") and "| 1.00 |" in table[2]
    assert table[3].startswith("| store | this checkout | 2 | ")


def test_a_round_that_leaves_a_job_not_finished_fails_the_run(
    pg_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's own count check: a job no worker can finish (set up as failed) fails it."""
    stuck = throughput._FLOOR_SCHEMA + "; INSERT INTO floor_jobs (status) VALUES ('failed')"
    monkeypatch.setattr(throughput, "_FLOOR_SCHEMA", stuck)  # run by the round itself, in this process
    code, out, err = _run(
        ["--workers", "1", "--jobs", "3", "--rounds", "1", "--subjects", "floor", "--dsn", pg_server.dsn]
    )
    assert code == 1, (out, err)
    assert "the floor's jobs by status:" in err and "'failed': 1" in err and "'finished': 3" in err, err


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--subjects", "floor,redis"], "unknown subjects ['redis']"),
        (["--workers", "0"], "--workers and --rounds must be positive"),
        (["--workers", "4", "--jobs", "3"], "--jobs at least --workers"),
    ],
)
def test_bad_arguments_exit_2_before_anything_runs(argv: list[str], problem: str) -> None:
    code, out, err = _run(argv)
    assert code == 2 and problem in err and out == ""


def test_the_peer_versions_are_named() -> None:
    versions = throughput_peers.versions()
    assert set(versions) == {"procrastinate", "pgqueuer"}
    assert all(v == "not installed" or v[0].isdigit() for v in versions.values()), json.dumps(versions)


def _not_installed(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name in names:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_without_a_peers_driver_the_default_run_measures_the_rest_and_says_in_one_line_what_it_left_out(
    pg_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `[test]` install has PgQueuer but not asyncpg, the driver its workers run on: the default
    set used to end in one ModuleNotFoundError traceback a worker process."""
    _not_installed(monkeypatch, "asyncpg", "procrastinate")
    monkeypatch.setattr(throughput, "SUBJECTS", {k: v for k, v in throughput.SUBJECTS.items() if k != "store"})
    code, out, err = _run(["--workers", "1", "--jobs", "2", "--rounds", "1", "--dsn", pg_server.dsn])
    assert code == 0, err
    said = [line for line in err.splitlines() if line.startswith("leaseproof: not measuring")]
    assert said == [
        "leaseproof: not measuring procrastinate, pgqueuer, pgqueuer-1: not installed (procrastinate needs"
        " procrastinate; pgqueuer needs asyncpg; pgqueuer-1 needs asyncpg; the bench extra installs them)"
    ]
    assert "Traceback" not in err and "throughput: floor;" in out


def test_a_peer_named_without_its_driver_exits_2_and_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _not_installed(monkeypatch, "asyncpg")
    code, out, err = _run(["--subjects", "floor,pgqueuer-1"])
    assert code == 2 and out == ""
    assert err == "leaseproof: not installed: pgqueuer-1 needs asyncpg (pip install -e '.[bench]')\n"
