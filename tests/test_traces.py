"""Traces: written, read, replayed against implementations, checked against the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from leaseproof.conformance import world as w
from leaseproof.conformance.trace import TraceError, check, read, record, replay, write
from leaseproof.impl.adapter import PostgresDeliveryAdapter
from leaseproof.impl.mutants import MUTANTS
from leaseproof.impl.provision import Server
from leaseproof.model import delivery as m

CORPUS = Path(__file__).parent.parent / "conformance" / "corpus"
A, T1, T2 = w.COMMUNITIES["A"], w.TARGETS["T1"], w.TARGETS["T2"]
D1 = w.DELIVERIES["d1"]


def _stale_holder_program() -> list[m.Command]:
    """Review finding 1, as plain commands: the stale holder's finish after a reap and a newer holder."""
    binding = w.binding("A", "W1", "R1", "s1", "T1", "D1", "M1", "event:E1")
    lease = m.Lease(A, D1, T1, 1, w.START + w.dt.timedelta(seconds=5))
    return [
        m.CreateCommunity(A),
        m.CreateWorkflow(A, w.WORKFLOWS["W1"]),
        m.CreateRun(A, w.WORKFLOWS["W1"], w.RUNS["R1"]),
        m.PublishEvent(A, w.MESSAGES["M1"]),
        m.CommitDeliveries(A, w.RUNS["R1"], "s1", [m.NewDelivery(D1, binding)]),
        m.Claim(A, T1, 5),
        m.AdvanceClock(w.dt.timedelta(seconds=6)),
        m.Reap(),
        m.Claim(A, T1, 30),
        m.Finish(m.Lease(A, D1, T1, 3, w.START + w.dt.timedelta(seconds=36)), m.Status.FINISHED),
        m.Finish(lease, m.Status.FINISHED),
    ]


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "stale-holder.jsonl"
    write(record("stale holder", w.START, _stale_holder_program()), path)
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseproof.conformance.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_a_trace_survives_the_round_trip_through_its_file(trace_file: Path) -> None:
    trace = read(trace_file)
    assert trace == record("stale holder", w.START, _stale_holder_program())
    assert trace.steps[-1].outcome == m.LeaseLost()
    header = json.loads(trace_file.read_text().splitlines()[0])
    assert header == {"trace": 1, "machine": "delivery", "start": "2026-01-01T00:00:00.000000Z", "name": "stale holder"}


def test_replay_passes_the_real_store_and_finds_the_mutant(trace_file: Path, delivery_dsn: str) -> None:
    trace = read(trace_file)
    real = PostgresDeliveryAdapter(delivery_dsn)
    assert replay(trace, real) is None
    real.close()
    mutant = next(mu for mu in MUTANTS if mu.name == "reconcile-unfenced")
    buggy = PostgresDeliveryAdapter(delivery_dsn, mutant.store)
    divergence = replay(trace, buggy)
    buggy.close()
    assert divergence is not None and divergence.step == len(trace.steps)
    assert divergence.expected == "model:          LeaseLost()"
    assert divergence.actual == "implementation: AlreadyTerminal(status=finished)"


def test_check_trace_reports_the_first_step_the_model_disagrees_with(trace_file: Path, tmp_path: Path) -> None:
    assert check(read(trace_file)) is None
    lines = trace_file.read_text().splitlines()
    step = json.loads(lines[-1])
    step["outcome"] = {"type": "AlreadyTerminal", "status": "finished"}  # what the buggy system said
    del step["state"]
    (tmp_path / "history.jsonl").write_text("\n".join([*lines[:-1], json.dumps(step)]) + "\n")
    run = _cli("check-trace", str(tmp_path / "history.jsonl"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "first divergence at step 11: Finish(" in run.stdout
    assert "recorded: AlreadyTerminal(status=finished)" in run.stdout
    assert "model:    LeaseLost()" in run.stdout
    assert "the steps before it:" in run.stdout and "8. Reap()" in run.stdout
    assert _cli("check-trace", str(trace_file)).returncode == 0


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "empty"),
        ("not json\n", ":1: not JSON"),
        ('{"trace": 2, "machine": "delivery"}\n', ":1: the header must be"),
        ('{"trace": 1, "machine": "delivery", "start": "2026-01-01T00:00:00.000000Z"}\n{"command": 1}\n', ':2: a step needs "command" and "outcome"'),
        (
            '{"trace": 1, "machine": "delivery", "start": "2026-01-01T00:00:00.000000Z"}\n'
            '{"command": {"type": "Reap"}, "outcome": {"type": "Reaped", "count": "two"}}\n',
            ":2: outcome.count: expected int",
        ),
    ],
)
def test_a_malformed_trace_is_a_usage_error_naming_the_line(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=problem.replace("(", r"\(")):
        read(path)
    run = _cli("check-trace", str(path))
    assert run.returncode == 2 and problem in run.stderr


def test_expected_failures_never_go_stale(trace_file: Path, tmp_path: Path, pg_server: Server) -> None:
    expect = tmp_path / "expected-failures.txt"
    expect.write_text("# knowingly divergent\nstale-holder\n")
    mutant = ["--dsn", pg_server.dsn, "--mutant", "reconcile-unfenced"]
    run = _cli("replay", str(trace_file), "--expect-fail", str(expect), *mutant)
    assert run.returncode == 0 and "xfail" in run.stdout, run.stdout + run.stderr
    run = _cli("replay", str(trace_file), "--expect-fail", str(expect), "--dsn", pg_server.dsn)
    assert run.returncode == 1 and "XPASS" in run.stdout and "remove it from" in run.stdout
    run = _cli("replay", str(trace_file), *mutant)
    assert run.returncode == 1 and "FAIL" in run.stdout and "first divergence at step 11" in run.stdout


def test_the_corpus_holds_one_trace_per_shipped_mutant() -> None:
    assert sorted(p.stem for p in CORPUS.glob("*.jsonl")) == sorted(mu.name for mu in MUTANTS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mu: mu.name)
def test_each_corpus_trace_passes_the_real_store_and_catches_its_mutant(mutant: object, delivery_dsn: str) -> None:
    trace = read(CORPUS / f"{mutant.name}.jsonl")  # type: ignore[attr-defined]
    assert check(trace) is None, "the recorded expectations no longer match the model: regenerate the corpus"
    real = PostgresDeliveryAdapter(delivery_dsn)
    try:
        assert replay(trace, real) is None
    finally:
        real.close()
    buggy = PostgresDeliveryAdapter(delivery_dsn, mutant.store)  # type: ignore[attr-defined]
    try:
        caught = replay(trace, buggy) is not None
    except Exception:  # noqa: BLE001 - the mutant raised instead of answering: caught too
        caught = True
    finally:
        buggy.close()
    assert caught, f"the corpus trace of {mutant.name} no longer catches it"  # type: ignore[attr-defined]
