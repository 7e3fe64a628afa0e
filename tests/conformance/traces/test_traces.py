"""Traces: written, read, replayed against implementations, checked against the model."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import pytest
from helpers import REPO, leaseproof, write_adapters

from leaseproof.conformance.boundary import codec
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.lifecycle import CONTENTS
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.conformance.traces.trace import (
    Divergence,
    Trace,
    TraceError,
    check,
    read,
    record,
    replay,
    trace_of,
    write,
)
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS, Mutant
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS, LifecycleMutant
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc

CORPUS = REPO / "conformance" / "traces" / "corpus"
A, T1, T2 = w.COMMUNITIES["A"], w.TARGETS["T1"], w.TARGETS["T2"]
D1 = w.DELIVERIES["d1"]
SEED = 20261129


def _stale_holder_program() -> list[m.Command]:
    """Review finding 1, as plain commands: the stale holder's finish after a reap and a newer holder."""
    binding = w.binding("A", "W1", "R1", "s1", "T1", "D1", "M1", "event:E1")
    lease = m.Lease(A, D1, T1, 1, w.START + dt.timedelta(seconds=5))
    return [
        m.CreateCommunity(A),
        m.CreateWorkflow(A, w.WORKFLOWS["W1"]),
        m.CreateRun(A, w.WORKFLOWS["W1"], w.RUNS["R1"]),
        m.PublishEvent(A, w.MESSAGES["M1"]),
        m.CommitDeliveries(A, w.RUNS["R1"], "s1", [m.NewDelivery(D1, binding)]),
        m.Claim(A, T1, 5),
        m.AdvanceClock(dt.timedelta(seconds=6)),
        m.Reap(),
        m.Claim(A, T1, 30),
        m.Finish(m.Lease(A, D1, T1, 3, w.START + dt.timedelta(seconds=36)), m.Status.FINISHED),
        m.Finish(lease, m.Status.FINISHED),
    ]


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "stale-holder.jsonl"
    write(record("stale holder", w.START, _stale_holder_program()), path)
    return path


_cli = leaseproof


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
    mutant = by_name(MUTANTS, "reconcile-unfenced")
    buggy = PostgresDeliveryAdapter(delivery_dsn, mutant.store)
    divergence = replay(trace, buggy)
    buggy.close()
    assert divergence is not None and divergence.step == len(trace.steps)
    assert divergence.expected == "model:          LeaseLost()"
    assert divergence.actual == "implementation: AlreadyTerminal(status=finished)   <- not the model's"
    assert divergence.recorded == "recorded:       LeaseLost()"
    assert divergence.who == "the implementation disagrees with the model"


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
        (
            '{"trace": 1, "machine": "delivery", "start": "2026-01-01T00:00:00.000000Z"}\n{"command": 1}\n',
            ':2: a step needs "command" and "outcome"',
        ),
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


SHIPPED: tuple[Mutant | LifecycleMutant, ...] = (*MUTANTS, *LIFECYCLE_MUTANTS)


def test_the_corpus_holds_one_trace_per_shipped_mutant_of_either_machine() -> None:
    assert sorted(p.stem for p in CORPUS.glob("*.jsonl")) == sorted(mu.name for mu in SHIPPED)
    for mutant in SHIPPED:
        path = CORPUS / f"{mutant.name}.jsonl"
        assert json.loads(path.read_text().splitlines()[0])["machine"] == mutant.machine, path.name
        assert read(path).machine == mutant.machine


@pytest.mark.parametrize("mutant", SHIPPED, ids=lambda mu: mu.name)
def test_each_corpus_trace_passes_the_real_store_and_catches_its_mutant(
    mutant: Mutant | LifecycleMutant, delivery_dsn: str
) -> None:
    trace = read(CORPUS / f"{mutant.name}.jsonl")
    assert check(trace) is None, "the recorded expectations no longer match the model: regenerate the corpus"
    real = (
        PostgresDeliveryAdapter(delivery_dsn)
        if mutant.machine == "delivery"
        else PostgresLifecycleAdapter(delivery_dsn)
    )
    try:
        assert replay(trace, real) is None
    finally:
        real.close()
    buggy = mutant.adapter(delivery_dsn)
    try:
        caught = replay(trace, buggy) is not None
    except Exception:  # noqa: BLE001 - the mutant raised instead of answering: caught too
        caught = True
    finally:
        buggy.close()
    assert caught, f"the corpus trace of {mutant.name} no longer catches it"


# -- lifecycle traces --------------------------------------------------------------------

SECOND = dt.timedelta(seconds=1)
W1, ALICE, GENERAL = w.WORKFLOWS["W1"], w.AUTHORS["alice"], w.CHANNELS["general"]


def _save(content: str, seconds: int) -> lc.SaveDefinition:
    event_id = hashlib.sha256(f"A/W1/{content}/{seconds}".encode()).digest()
    at = w.START + seconds * SECOND
    return lc.SaveDefinition(lc.DefinitionEvent(event_id, A, W1, ALICE, GENERAL, at, CONTENTS[content]))


def _stale_replica_program() -> list[object]:
    """The seed's stale replica, as plain commands: r2 still serves revision "a" after the update to "b"."""
    return [
        m.CreateCommunity(A),
        lc.SetAuthority(A, GENERAL, ALICE, True),
        _save("a", 1),
        lc.RefreshCache("r1"),
        lc.RefreshCache("r2"),
        lc.Fire("r1", "event", A, W1),
        _save("b", 2),
        lc.Fire("r2", "manual", A, W1),  # r2's cached revision is stale: refused
        lc.ResumeRun(1),  # run 1's pinned revision is gone: fail closed
        lc.RefreshCache("r2"),
        lc.Fire("r2", "manual", A, W1),
        lc.ResumeRun(2),
        m.AdvanceClock(10 * SECOND),
    ]


STALE_REPLICA_OUTCOMES = [
    "Ok", "Ok", "Created", "Ok", "Ok", "Admitted", "Updated", "AdmissionRefused", "ResumeRefused", "Ok", "Admitted",
    "Resumed", "Ok",
]  # fmt: skip


@pytest.fixture
def lifecycle_trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "stale-replica.jsonl"
    write(record("stale replica", w.START, _stale_replica_program(), machine="lifecycle"), path)
    return path


def _lifecycle_adapter(dsn: str, mutant: LifecycleMutant | None = None) -> PostgresLifecycleAdapter:
    return PostgresLifecycleAdapter(dsn) if mutant is None else mutant.adapter(dsn)


def _replayed(trace: Trace, dsn: str, mutant: LifecycleMutant | None = None) -> Divergence | Exception | None:
    """The trace replayed on the bundled lifecycle implementation (or a mutant): its divergence, or what it raised."""
    adapter = _lifecycle_adapter(dsn, mutant)
    try:
        return replay(trace, adapter)
    except Exception as raised:  # noqa: BLE001 - a mutant may fail by raising; the caller judges it
        return raised
    finally:
        adapter.close()


def test_a_lifecycle_trace_names_its_machine_and_survives_its_file(lifecycle_trace_file: Path) -> None:
    trace = read(lifecycle_trace_file)
    assert trace == record("stale replica", w.START, _stale_replica_program(), machine="lifecycle")
    assert trace.machine == "lifecycle"
    assert [lc.variant(s.outcome) for s in trace.steps] == STALE_REPLICA_OUTCOMES
    last = trace.steps[-1].state
    assert last is not None
    assert dict(last.executed) == {1: ("post-summary",), 2: ("post-summary", "page-oncall") * 2}
    header = json.loads(lifecycle_trace_file.read_text().splitlines()[0])
    assert header == {
        "trace": 1,
        "machine": "lifecycle",
        "start": "2026-01-01T00:00:00.000000Z",
        "name": "stale replica",
    }
    assert json.loads(lifecycle_trace_file.read_text().splitlines()[1])["state"]["type"] == "LifecycleSystem"
    assert check(trace) is None


def test_a_lifecycle_trace_replays_cleanly_on_the_bundled_implementation_and_finds_the_mutant(
    lifecycle_trace_file: Path, delivery_dsn: str
) -> None:
    trace = read(lifecycle_trace_file)
    assert _replayed(trace, delivery_dsn) is None
    divergence = _replayed(trace, delivery_dsn, by_name(LIFECYCLE_MUTANTS, "admission-ignores-hash"))
    assert isinstance(divergence, Divergence) and divergence.step == 8
    assert divergence.report().startswith(
        "first divergence at step 8: Fire(replica='r2', door='manual', community_id=A"
    )
    assert divergence.expected == "model:          AdmissionRefused()"
    assert divergence.actual.startswith("implementation: Admitted(run_id=2, record=Record(")
    assert "7. SaveDefinition(" in divergence.report()


@pytest.mark.parametrize("mutant", LIFECYCLE_MUTANTS, ids=lambda mu: mu.name)
def test_a_lifecycle_counterexample_trace_fails_its_mutant_and_passes_the_bundled_implementation(
    mutant: LifecycleMutant, delivery_dsn: str, tmp_path: Path
) -> None:
    buggy = _lifecycle_adapter(delivery_dsn, mutant)
    try:
        verdict = run_conformance(buggy, Run(machine="lifecycle", max_examples=1, seed=SEED))
    finally:
        buggy.close()
    recorded = trace_of(verdict.recorded)
    assert not verdict.conforms and recorded is not None and recorded.machine == "lifecycle"
    path = tmp_path / f"{mutant.name}.jsonl"
    write(recorded, path)
    trace = read(path)
    assert trace == recorded
    assert check(trace) is None  # every recorded outcome and state is the model's
    assert _replayed(trace, delivery_dsn) is None
    assert _replayed(trace, delivery_dsn, mutant) is not None


def test_a_searched_and_shrunk_lifecycle_counterexample_is_a_trace(delivery_dsn: str) -> None:
    """No fixed scenarios: the trace is the minimal program the search shrank to (Coverage.last_commands)."""
    mutant = by_name(LIFECYCLE_MUTANTS, "cache-never-expires")
    buggy = _lifecycle_adapter(delivery_dsn, mutant)
    try:
        verdict = run_conformance(buggy, Run(machine="lifecycle", max_examples=300, seed=SEED, scenarios=False))
    finally:
        buggy.close()
    trace = trace_of(verdict.recorded)
    assert not verdict.conforms and not verdict.fault and trace is not None
    divergence = _replayed(trace, delivery_dsn, mutant)
    assert isinstance(divergence, Divergence) and divergence.step == len(trace.steps)
    assert _replayed(trace, delivery_dsn) is None


def test_check_runs_the_lifecycle_model_over_a_recorded_history(lifecycle_trace_file: Path, tmp_path: Path) -> None:
    lines = lifecycle_trace_file.read_text().splitlines()
    stale_fire = json.loads(lines[8])
    # What a buggy system recorded: the stale replica admitted its cached revision.
    admitted = record("", w.START, _stale_replica_program()[:6], machine="lifecycle").steps[-1].outcome
    stale_fire["outcome"] = codec.encode(lc.Admitted(2, admitted.record))
    del stale_fire["state"]
    history = tmp_path / "history.jsonl"
    history.write_text("\n".join([*lines[:8], json.dumps(stale_fire), *lines[9:]]) + "\n")
    divergence = check(read(history))
    assert divergence is not None and divergence.step == 8
    assert divergence.expected.startswith("recorded: Admitted(run_id=2")
    assert divergence.actual == "model:    AdmissionRefused()"

    last = json.loads(lines[-1])
    last["state"]["executed"][1]["actions"].append("page-oncall")  # run 2 ran one action too many
    history.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    divergence = check(read(history))
    assert divergence is not None and divergence.step == len(lines) - 1
    assert divergence.actual == "model:    a different state"
    assert divergence.difference.startswith("executed: implementation FrozenMap({1: (")
    assert "but the model says FrozenMap({1: ('post-summary',), 2:" in divergence.difference


def test_check_trace_on_the_command_line_takes_a_lifecycle_trace(lifecycle_trace_file: Path) -> None:
    run = _cli("check-trace", str(lifecycle_trace_file))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"all {len(STALE_REPLICA_OUTCOMES)} steps agree with the model" in run.stdout


def test_a_trace_replayed_against_another_machines_implementation_is_a_trace_error(
    lifecycle_trace_file: Path, trace_file: Path, adapter: PostgresDeliveryAdapter
) -> None:
    with pytest.raises(
        TraceError, match="a lifecycle trace, but postgres:PostgresDeliveryStore answers with a DeliverySystem"
    ):
        replay(read(lifecycle_trace_file), adapter)
    with pytest.raises(TraceError, match=r"a delivery trace, but .* answers with a LifecycleSystem"):
        _raise(_replayed(read(trace_file), adapter.dsn))


def _raise(result: object) -> None:
    if isinstance(result, Exception):
        raise result


LIFECYCLE_HEADER = '{"trace": 1, "machine": "lifecycle", "start": "2026-01-01T00:00:00.000000Z"}\n'
DELIVERY_STATE = json.dumps({"type": "DeliverySystem", "now": "2026-01-01T00:00:00.000000Z", "communities": [], "workflows": [], "runs": [], "events": [], "deliveries": [], "retired": []})  # fmt: skip


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"trace": 1, "machine": "billing", "start": "2026-01-01T00:00:00.000000Z"}\n', ':1: the header\'s "machine" must be "delivery" or "lifecycle", not \'billing\''),
        ('{"trace": 1, "start": "2026-01-01T00:00:00.000000Z"}\n', ':1: the header\'s "machine" must be "delivery" or "lifecycle", not None'),
        (LIFECYCLE_HEADER + '{"command": {"type": "Reap"}, "outcome": {"type": "Reaped", "count": 0}}\n', ":2: Reap is not a lifecycle command"),
        ('{"trace": 1, "machine": "delivery", "start": "2026-01-01T00:00:00.000000Z"}\n{"command": {"type": "ResumeRun", "run_id": 1}, "outcome": {"type": "UnknownRun", "run_id": 1}}\n', ":2: ResumeRun is not a delivery command"),
        (LIFECYCLE_HEADER + '{"command": {"type": "AdvanceClock", "by": 1}, "outcome": {"type": "Ok"}, "state": ' + DELIVERY_STATE + "}\n", ':2: state: expected an object with "type": "LifecycleSystem", got \'DeliverySystem\''),
        (LIFECYCLE_HEADER + '{"command": {"type": "ResumeRun", "run_id": 0}, "outcome": {"type": "UnknownRun", "run_id": 0}}\n', ":2: command.run_id: must be a positive integer"),
    ],
    ids=["unknown machine", "no machine", "delivery command", "lifecycle command", "delivery state", "bad run id"],
)  # fmt: skip
def test_a_trace_of_the_wrong_machine_or_none_is_a_trace_error(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as error:
        read(path)
    assert str(error.value) == f"{path}{problem}"


# -- replay checks the record too, sends only what is offered, and goes on past a fault -------


def _tampered(trace_file: Path, tmp_path: Path, step: int, field: str, value: object) -> Path:
    """The trace with one step's recorded `field` replaced by `value` (encoded)."""
    lines = trace_file.read_text().splitlines()
    entry = json.loads(lines[step])
    entry[field] = value
    lines[step] = json.dumps(entry)
    path = tmp_path / f"tampered-{field}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_finds_a_recorded_outcome_the_model_does_not_give(
    trace_file: Path, tmp_path: Path, delivery_dsn: str, pg_server: Server
) -> None:
    last = len(read(trace_file).steps)
    wrong = _tampered(trace_file, tmp_path, last, "outcome", codec.encode(m.AlreadyTerminal(m.Status.FINISHED)))
    real = PostgresDeliveryAdapter(delivery_dsn)
    divergence = replay(read(wrong), real)
    real.close()
    assert divergence is not None and divergence.step == last
    assert divergence.who.startswith("the trace's record disagrees with the model")
    assert divergence.recorded.endswith("<- not the model's") and not divergence.actual.endswith("<- not the model's")
    run = _cli("replay", str(wrong), "--dsn", pg_server.dsn)
    assert run.returncode == 1 and "FAIL" in run.stdout and "the trace's record disagrees" in run.stdout, run.stdout


def test_replay_finds_a_recorded_state_the_model_does_not_reach(
    trace_file: Path, tmp_path: Path, delivery_dsn: str
) -> None:
    trace = read(trace_file)
    first_state = json.loads(trace_file.read_text().splitlines()[1])["state"]
    wrong = _tampered(trace_file, tmp_path, 3, "state", first_state)  # step 3 claims step 1's state
    real = PostgresDeliveryAdapter(delivery_dsn)
    divergence = replay(read(wrong), real)
    real.close()
    assert trace.steps[2].state != trace.steps[0].state
    assert divergence is not None and divergence.step == 3
    assert divergence.recorded == "recorded:       a different state"
    assert divergence.actual == "implementation: the model's state"
    assert "the recorded state, against the model's" in divergence.difference


def test_replay_sends_only_what_the_adapter_offers(trace_file: Path, tmp_path: Path, pg_server: Server) -> None:
    write_adapters(tmp_path)
    fenced = tmp_path / "fenced.jsonl"
    commands = [*_stale_holder_program()[:6], m.SetCommunityState(A, m.CommunityState.FENCED), m.Reap()]
    write(record("fenced", w.START, commands), fenced)
    args = ("replay", str(trace_file), str(fenced), "--dsn", pg_server.dsn, "--adapter", "adapters:core_only")
    run = _cli(*args, cwd=tmp_path)
    assert run.returncode == 3, run.stdout + run.stderr
    assert f"pass  {trace_file}" in run.stdout
    assert f"n/a   {fenced}: needs SetCommunityState, which the adapter does not offer; not sent" in run.stdout
    assert "1 passed, 0 failed, 1 not applicable" in run.stdout
    accepted = _cli(*args, "--accept-subset", cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr


def test_a_fault_in_one_trace_is_that_traces_and_writes_no_counterexample(
    trace_file: Path, tmp_path: Path, pg_server: Server
) -> None:
    write_adapters(tmp_path)
    quiet = tmp_path / "no-sweep.jsonl"
    write(record("no sweep", w.START, _stale_holder_program()[:6]), quiet)
    adapter = ("--dsn", pg_server.dsn, "--adapter", "adapters:fails_to_reap")
    run = _cli("replay", str(trace_file), str(quiet), *adapter, cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert (
        f"FAULT {trace_file}: the adapter failed, so nothing was judged: RuntimeError: the sweep crashed" in run.stdout
    )
    assert f"pass  {quiet}" in run.stdout  # the batch went on
    assert "1 passed, 0 failed, 1 faulted" in run.stdout
    verify = _cli("verify", "--machine", "delivery", "--seed", "1", "--max-examples", "5", *adapter, cwd=tmp_path)
    assert verify.returncode == 2 and "verdict: NONE" in verify.stdout, verify.stdout + verify.stderr
    assert not list(tmp_path.glob("leaseproof-*counterexample-*")), "a fault is not a counterexample"


def test_one_replay_takes_traces_of_both_machines_each_on_its_own_implementation(pg_server: Server) -> None:
    traces = [str(CORPUS / "admission-by-id.jsonl"), str(CORPUS / "reconcile-unfenced.jsonl")]
    run = leaseproof("replay", *traces, "--dsn", pg_server.dsn, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "against postgres:PostgresDeliveryStore, postgres:LifecycleStore" in run.stdout
    assert "2 passed, 0 failed" in run.stdout
    # A mutant is one machine's: with traces of the other, it is a usage error that says so.
    mixed = leaseproof("replay", *traces, "--mutant", "reconcile-unfenced", "--dsn", pg_server.dsn, timeout=300)
    assert mixed.returncode == 2 and mixed.stdout == ""
    assert "--mutant reconcile-unfenced is a mutant of the delivery machine: replay its traces alone" in mixed.stderr
