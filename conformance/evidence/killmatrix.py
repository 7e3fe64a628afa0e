"""The kill matrix: every shipped mutant against every check that applies to it.

A check is only as good as the bugs it catches, so the matrix runs each known-buggy
variant of the bundled implementation (`impl/mutants/`) against its checks
(`Subject.checks`) and records, per (mutant, check), whether the check killed it,
after how many examples and seconds, and how short the evidence was. Sequential
mutants meet the lockstep (with the fixed scenarios, and by the search alone); race
mutants stress and, where random scheduling does not meet them, a forced
interleaving; fault mutants stress with connections cut; service, restart and
network mutants the nemesis (over the wire: stalls, kills, the proxy's faults); the
lease-queue profile judges every delivery mutant. The fast subset (`fast=True`)
keeps the checks that take seconds. Every check is seeded, but where a stress run
meets a race varies between runs. docs/kill-matrix.md has each check and budget.
"""

from __future__ import annotations

import contextlib
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.boundary.wire import SubprocessAdapter
from leaseproof.conformance.concurrent import nemesis
from leaseproof.conformance.concurrent.explain import violation_sentence
from leaseproof.conformance.concurrent.faults import NETWORK_FAULTS, Killer, Mix, Network, Staller
from leaseproof.conformance.concurrent.linearizability import timeline
from leaseproof.conformance.concurrent.models import SPECS
from leaseproof.conformance.concurrent.schedules import (
    INTERLEAVINGS,
    LIFECYCLE_INTERLEAVINGS,
    Interleaving,
    run_interleaving,
)
from leaseproof.conformance.concurrent.stress import StressFault, StressReport, stress
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.provision import require_test_databases
from leaseproof.conformance.harness.proxy import FaultProxy
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep.core import Coverage
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.conformance.queues.matrix import judge_subject
from leaseproof.conformance.queues.subjects.bundled import BundledQueue
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.service import DeliveryService
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.migrate import migrate
from leaseproof.impl.mutants.delivery import MUTANTS, Mutant
from leaseproof.impl.mutants.faults import FAULT_MUTANTS, NETWORK_MUTANTS, RESTART_MUTANTS
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS, LifecycleMutant
from leaseproof.impl.mutants.race import RACE_MUTANTS
from leaseproof.impl.mutants.service import SERVICE_MUTANTS

SEED = 20261129  # the kill tests' seed
SEQUENTIAL, RACE, FAULT, SERVICE = "sequential", "race", "fault", "service"
RESTART, NETWORK = "restart", "network"
KINDS = (SEQUENTIAL, RACE, FAULT, SERVICE, RESTART, NETWORK)

SCENARIOS_AND_SEARCH = "lockstep: scenarios+search"
SEARCH_ALONE = "lockstep: search alone"
STRESS = "stress"
FORCED = "forced interleaving"
GUARANTEES = "guarantees profile"
NEMESIS = "nemesis"
KILLS = "nemesis: kill"  # the nemesis of an implementation over the wire, its process killed
LOST_ANSWERS = "nemesis: network"  # the same, the proxy's faults between it and its server
STALLS = "nemesis: stall"  # the same, a tenant's rows held by a connection of the harness's own
WIRE = (KILLS, LOST_ANSWERS, STALLS)  # the nemesis over the wire, of `serve --mutant NAME`
CHECKS = (SCENARIOS_AND_SEARCH, SEARCH_ALONE, STRESS, FORCED, GUARANTEES, NEMESIS, *WIRE)
NEMESIS_SECONDS = 30.0  # of each service mutant's nemesis run, on each seed
RESTART_SECONDS = 120.0  # of each restart mutant's run under kills, on each seed
WIRE_RATE = 0.5  # the share of rounds a fault strikes in, in the nemesis over the wire
WIRE_ROUNDS = 4  # rounds of each of its programs (as `leaseproof nemesis --adapter-cmd`)
GUARANTEE_RACES = 20  # rounds of each of the profile's races
FAULT_RACES = 100  # for a fault mutant, which only the rounds with a cut can show (`leaseproof guarantees`' default)
TERMINATE = 0.5  # the share of rounds with a connection cut (the profile's races; stress of a fault mutant)

STRESS_WORKERS, STRESS_REPEATS = 8, 3  # as tests/conformance/concurrent/test_stress.py runs the race mutants


@attrs.frozen
class Budgets:
    """How much each check may run before a mutant that is still alive survives it."""

    search: int = attrs.field(validator=attrs.validators.gt(0))  # lockstep programs (after the scenarios, or alone)
    stress: int = attrs.field(validator=attrs.validators.gt(0))  # stress programs, each run STRESS_REPEATS times
    stress_seconds: float = attrs.field(validator=attrs.validators.gt(0))  # and at most this long
    steps: int = attrs.field(default=50, validator=attrs.validators.gt(0))  # most steps per lockstep program


# The full matrix: the evidence tests' search budget, and the stress budget the race tests use.
FULL = Budgets(search=1000, stress=1000, stress_seconds=900)
# The fast subset: every sequential mutant dies in a fixed scenario, and each
# stress-caught race mutant usually within a few dozen programs, in seconds.
# But where a race shows varies from run to run (with this seed, kills of one
# mutant were seen anywhere from program 5 to program 299), so stress keeps the
# full budget: a smaller one would make CI flaky, and a budget is spent in
# full only by a mutant that survives.
FAST = Budgets(search=100, stress=FULL.stress, stress_seconds=FULL.stress_seconds)


@attrs.frozen
class Subject:
    """One mutant as the matrix runs it."""

    name: str
    machine: str  # "delivery" or "lifecycle"
    kind: str = attrs.field(validator=attrs.validators.in_(KINDS))
    stands_for: str  # the review finding or bug class
    variant: Mutant | LifecycleMutant  # what builds its adapter
    interleaving: Interleaving | None = None  # the forced schedule that catches it, if it needs one

    def adapter(self, dsn: str) -> PostgresDeliveryAdapter | PostgresLifecycleAdapter:
        """The bundled implementation with this mutant's classes, on the database `dsn`."""
        return self.variant.adapter(dsn)

    def checks(self, fast: bool) -> tuple[str, ...]:
        """The checks that apply to it, in the order they run; `fast`: the fast subset's. The
        full matrix also judges each delivery mutant by the lease-queue profile (`leaseproof
        guarantees`), which sees only the lease lifecycle of one tenant and target."""
        profile = (GUARANTEES,) if self.machine == "delivery" and not fast else ()
        if self.kind == SERVICE:
            served = isinstance(self.variant, Mutant) and self.variant.service is DeliveryService
            return () if fast else (NEMESIS, STALLS) if served else (NEMESIS,)
        if self.kind == RESTART:
            return () if fast else (KILLS,)
        if self.kind == NETWORK:
            return () if fast else (LOST_ANSWERS,)
        if self.kind == FAULT:
            return (STRESS, GUARANTEES)
        if self.kind == SEQUENTIAL:
            return (SCENARIOS_AND_SEARCH,) if fast else (SCENARIOS_AND_SEARCH, SEARCH_ALONE, *profile)
        if self.interleaving is None:
            return (STRESS, *profile)
        return (FORCED,) if fast else (STRESS, FORCED, *profile)


_SEQUENTIAL_MUTANTS: tuple[Mutant | LifecycleMutant, ...] = (*MUTANTS, *LIFECYCLE_MUTANTS)
_FORCED_SCHEDULES: dict[str, Interleaving] = {**INTERLEAVINGS, **LIFECYCLE_INTERLEAVINGS}
SUBJECTS: tuple[Subject, ...] = (
    *(Subject(mu.name, mu.machine, SEQUENTIAL, mu.stands_for, mu) for mu in _SEQUENTIAL_MUTANTS),
    *(Subject(mu.name, mu.machine, RACE, mu.stands_for, mu, _FORCED_SCHEDULES.get(mu.name)) for mu in RACE_MUTANTS),
    *(Subject(mu.name, mu.machine, FAULT, mu.stands_for, mu) for mu in FAULT_MUTANTS),
    *(Subject(mu.name, mu.machine, SERVICE, mu.stands_for, mu) for mu in SERVICE_MUTANTS),
    *(Subject(mu.name, mu.machine, RESTART, mu.stands_for, mu) for mu in RESTART_MUTANTS),
    *(Subject(mu.name, mu.machine, NETWORK, mu.stands_for, mu) for mu in NETWORK_MUTANTS),
)


def select(names: Sequence[str] = (), machine: str | None = None, kind: str | None = None) -> tuple[Subject, ...]:
    """The shipped mutants named (all if none), of `machine` (both if None) and
    `kind` (sequential, race or fault; all if None), in registry order."""
    unknown = [name for name in names if name not in {s.name for s in SUBJECTS}]
    if unknown:
        raise ValueError(f"no mutant named {', '.join(unknown)}; the mutants are {', '.join(s.name for s in SUBJECTS)}")
    chosen = tuple(
        s
        for s in SUBJECTS
        if (not names or s.name in names) and machine in (None, s.machine) and kind in (None, s.kind)
    )
    if not chosen:
        what = " ".join(([f"a {kind} mutant"] if kind else []) + ([f"of the {machine} machine"] if machine else []))
        raise ValueError(f"none of the mutants {', '.join(names)} is {what}")
    return chosen


@attrs.frozen
class Row:
    """One (mutant, check) cell of the matrix."""

    mutant: str
    machine: str
    kind: str
    finding: str
    check: str
    seed: int | None  # None: a check that takes no seed (a forced schedule)
    killed: bool
    # Until the kill, or all that ran if it survived: lockstep examples (0 when a
    # fixed scenario killed it), stress programs, or forced schedules.
    examples: int
    unit: str  # "examples", "programs" or "schedules"
    seconds: float  # until the kill, or the whole check if it survived
    check_seconds: float  # the whole check, shrinking included
    budget: int  # the most examples (programs, schedules) the check could run
    # Steps of the shrunk lockstep program, operations of the minimal stress
    # piece, or operations of the forced schedule; None when not killed, or when
    # a fixed scenario killed it (a scenario is not shrunk).
    shrunk_length: int | None = None
    scenario: str | None = None  # the fixed scenario that killed it
    how: str = ""  # "divergence", "fault" (the implementation raised), or "" if not killed
    detail: str = ""  # why it died, or why nothing was found
    # The shrunk program; or for stress, the sentence on the violation and the minimal piece's timeline.
    counterexample: str = ""
    # A stress run that found a violation: what its page draws (not in the JSON document).
    stress: StressReport | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def why(self) -> str:
        """The one line that says what the check saw: for stress, the violation in the model's words."""
        return (
            self.counterexample.splitlines()[0]
            if self.check in (STRESS, NEMESIS, *WIRE) and self.counterexample
            else ""
        )

    def to_json(self) -> dict[str, Any]:
        fields = attrs.asdict(self, filter=lambda field, _: field.name != "stress")
        return {**fields, "seconds": round(self.seconds, 2), "check_seconds": round(self.check_seconds, 2)}


@attrs.frozen
class KillMatrix:
    rows: tuple[Row, ...]
    subjects: tuple[Subject, ...]
    fast: bool
    seeds: tuple[int, ...]
    seconds: float

    def killed(self, subject: Subject) -> bool:
        """Killed by at least one of its checks that ran."""
        return any(row.killed for row in self.rows if row.mutant == subject.name)

    @property
    def judged(self) -> tuple[Subject, ...]:
        """The subjects some check ran on (the fast subset runs none on a service, restart or network mutant)."""
        return tuple(s for s in self.subjects if s.checks(self.fast))

    @property
    def survivors(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.judged if not self.killed(s))

    def counts(self) -> dict[str, tuple[int, int]]:
        """(killed, total) mutants of each kind, of those judged."""
        return {
            kind: (
                sum(self.killed(s) for s in self.judged if s.kind == kind),
                sum(s.kind == kind for s in self.judged),
            )
            for kind in KINDS
        }

    def summary(self) -> str:
        parts = [f"{k} of {n} {kind} mutants killed" for kind, (k, n) in self.counts().items() if n]
        seeds = f"seed{'s' if len(self.seeds) > 1 else ''} {', '.join(map(str, self.seeds))}"
        text = ", ".join(parts) + f" ({'fast subset' if self.fast else 'full matrix'}, {seeds}, {self.seconds:.0f}s)"
        search = [row for row in self.rows if row.check == SEARCH_ALONE]
        if search:
            text += "\n" + search_alone_summary(search)
        if self.survivors:
            text += f"\nSURVIVED: {', '.join(self.survivors)}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "fast": self.fast,
            "seeds": list(self.seeds),
            "seconds": round(self.seconds, 1),
            "counts": {kind: {"killed": k, "total": n} for kind, (k, n) in self.counts().items()},
            "survivors": list(self.survivors),
            "rows": [row.to_json() for row in self.rows],
        }


# -- running the checks ----------------------------------------------------------------------


class _KillClock:
    """`on_example` for a lockstep run: notes when the first failure was first seen
    (the next example's start: a shrink attempt, or the final replay)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.killed_after: float | None = None

    def __call__(self, coverage: Coverage) -> None:
        if coverage.first_failure is not None and self.killed_after is None:
            self.killed_after = time.monotonic() - self.started


def _program_steps(counterexample: str) -> int:
    """Steps of a shrunk program as Hypothesis prints it, without its set-up and tear-down."""
    lines = [line.strip() for line in counterexample.splitlines()]
    return sum("state." in line and not line.startswith(("state.setup(", "state.teardown(")) for line in lines)


def _scenario(counterexample: str) -> str | None:
    prefix = "in the fixed scenario "
    line = next((line for line in counterexample.splitlines() if line.startswith(prefix)), None)
    return line.removeprefix(prefix).split(":", 1)[0] if line else None


def _lockstep(subject: Subject, dsn: str, check: str, seed: int, budgets: Budgets) -> Row:
    adapter = ForkedAdapter(lambda: subject.adapter(dsn), subject.machine)
    clock = _KillClock()
    try:
        verdict = run_conformance(
            adapter,
            Run(
                machine=subject.machine,
                max_examples=budgets.search,
                seed=seed,
                steps=budgets.steps,
                scenarios=check == SCENARIOS_AND_SEARCH,
                on_example=clock,
            ),
        )
    finally:
        adapter.close()
    total = time.monotonic() - clock.started
    base = _row(subject, check, budget=budgets.search, unit="examples", check_seconds=total, seed=seed)
    coverage = verdict.coverage
    if verdict.conforms:
        return attrs.evolve(base, killed=False, examples=coverage.examples, seconds=total, detail="conforms")
    # A fault (the implementation raised) carries its notes, the scenario's among them, with its program.
    notes = verdict.counterexample or "\n".join(verdict.fault_program)
    scenario = _scenario(notes) if coverage.first_failure == 0 else None
    first_line = (verdict.fault or verdict.failure).splitlines()[0] if (verdict.fault or verdict.failure) else ""
    return attrs.evolve(
        base,
        killed=True,
        examples=coverage.first_failure or 0,
        seconds=clock.killed_after if clock.killed_after is not None and scenario is None else verdict.seconds,
        # A fault is not shrunk (nothing was judged to shrink towards); 0 steps: the set-up itself failed.
        shrunk_length=None if scenario or verdict.fault else _program_steps(verdict.counterexample),
        scenario=scenario,
        how="fault" if verdict.fault else "divergence",
        detail=first_line,
        counterexample=verdict.counterexample if not scenario else "",
    )


def _stress(subject: Subject, dsn: str, seed: int, budgets: Budgets, server: str | None = None) -> Row:
    """Stress, with connections cut for a fault mutant; for a restart, network or service
    mutant (`server`: the server's DSN), the nemesis of `serve --mutant NAME` over the wire,
    its process killed, the proxy's faults between it and the server, or a tenant stalled."""
    started = time.monotonic()
    check = STRESS if server is None else {RESTART: KILLS, NETWORK: LOST_ANSWERS, SERVICE: STALLS}[subject.kind]
    seconds = budgets.stress_seconds if server is None else RESTART_SECONDS
    base = _row(subject, check, budget=budgets.stress, unit="programs", check_seconds=0.0, seed=seed)
    proxy = FaultProxy(server).start() if check == LOST_ANSWERS and server is not None else None
    served = None if server is None else _served(subject, server, proxy)
    adapter = served if served is not None else subject.adapter(dsn)
    try:
        faults: Mix | None = None
        if proxy is not None:
            faults = Mix([Network(proxy, kind, 1.0, seed) for kind in NETWORK_FAULTS], WIRE_RATE, seed)
        elif served is not None and check == STALLS:
            faults = Mix([Staller(served.databases[subject.machine], 1.0, seed)], WIRE_RATE, seed)
        elif served is not None:
            faults = Mix([Killer(served, served.databases[subject.machine], 1.0, seed)], WIRE_RATE, seed)
        report = stress(
            adapter,
            machine=subject.machine,
            workers=STRESS_WORKERS,
            duration=seconds,
            seed=seed,
            repeats=STRESS_REPEATS,
            max_programs=budgets.stress,
            terminate=TERMINATE if subject.kind == FAULT else 0.0,
            database=dsn,
            faults=faults,
            rounds=WIRE_ROUNDS if server is not None else 2,
        )
    except StressFault as fault:
        seconds = time.monotonic() - started
        return attrs.evolve(base, killed=True, seconds=seconds, check_seconds=seconds, how="fault", detail=str(fault))
    finally:
        adapter.close()
        if proxy is not None:
            proxy.close()
    p, finding = report.progress, report.finding
    base = attrs.evolve(base, examples=p.programs, seconds=p.seconds, check_seconds=time.monotonic() - started)
    if finding is None and report.stuck is not None:
        late = report.stuck.waited[0].operation
        said = f"{late.client}: {SPECS[report.machine].describe_command(late.command)} waited for a stalled tenant"
        return attrs.evolve(base, killed=True, how="divergence", detail="not live", counterexample=said)
    if finding is None:
        why = f"linearizable in {p.histories:,} histories"
        if p.unknown:
            why += f" ({p.unknown:,} unknown: the checker ran out of budget)"
        if p.programs < budgets.stress:
            why += f"; stopped at {seconds:g}s"
        return attrs.evolve(base, killed=False, detail=why)
    violation = finding.result.violation
    said = finding.result.summary()
    if violation is not None:
        spec = SPECS[report.machine]
        said = f"{violation_sentence(violation, spec, finding.history)}\n{timeline(violation, spec)}"
    return attrs.evolve(
        base,
        killed=True,
        shrunk_length=len(violation.piece) if violation is not None else None,
        how="divergence",
        detail=f"{finding.kind}: {finding.failed} of {finding.repeats} repetitions failed",
        counterexample=said,
        stress=report,
    )


def _served(subject: Subject, server: str, proxy: FaultProxy | None = None) -> SubprocessAdapter:
    """The mutant behind `serve` in a process of its own, on the server `server`, or through
    `proxy` in front of it (its LEASEPROOF_DSN)."""
    command = f"{shlex.quote(sys.executable)} -m leaseproof.conformance.boundary.serve --mutant {subject.name}"
    if proxy is None:
        return SubprocessAdapter(f"{command} --dsn {shlex.quote(server)}", machine=subject.machine)
    through = {"LEASEPROOF_DSN": proxy.dsn_through(server)}
    return SubprocessAdapter(command, machine=subject.machine, env=through)


def _forced(subject: Subject, dsn: str) -> Row:
    assert subject.interleaving is not None
    started = time.monotonic()
    base = _row(subject, FORCED, budget=1, unit="schedules", check_seconds=0.0, seed=None)
    # A delivery schedule drives the mutant's store class; a lifecycle one, its classes (the record).
    variant = subject.variant if isinstance(subject.variant, LifecycleMutant) else subject.variant.store
    try:
        judgement = run_interleaving(subject.interleaving, dsn, variant)
    except Exception as exc:  # noqa: BLE001 - a schedule that breaks judges nothing
        seconds = time.monotonic() - started
        return attrs.evolve(
            base, killed=False, examples=1, seconds=seconds, check_seconds=seconds,
            detail=f"the schedule {subject.interleaving.name!r} broke: {type(exc).__name__}: {exc}",
        )  # fmt: skip
    seconds = time.monotonic() - started
    return attrs.evolve(
        base,
        killed=not judgement.linearizable,
        examples=1,
        seconds=seconds,
        check_seconds=seconds,
        shrunk_length=judgement.operations if not judgement.linearizable else None,
        how="" if judgement.linearizable else "divergence",
        detail=f"{subject.interleaving.name}: {judgement.why}",
    )


def _guarantees(subject: Subject, dsn: str, seed: int, budgets: Budgets) -> Row:
    """The lease-queue profile against the mutant as a queue: its scenarios, `budgets.search`
    programs and GUARANTEE_RACES rounds of each race (FAULT_RACES for a fault mutant), a TERMINATE
    share of them with a connection cut; killed if it breaks any guarantee."""
    if isinstance(subject.variant, LifecycleMutant):
        raise ValueError(f"{subject.name}: the profile judges the delivery store")
    started = time.monotonic()
    queue = BundledQueue(dsn, subject.variant.store, name=f"leaseproof:{subject.name}")
    try:
        with tempfile.TemporaryDirectory(prefix="lp-kill-") as traces:
            races = FAULT_RACES if subject.kind == FAULT else GUARANTEE_RACES
            row = judge_subject(queue, seed=seed, examples=budgets.search, races=races, traces=Path(traces),
                                terminate=TERMINATE, database=dsn)  # fmt: skip
    finally:
        queue.close()
    seconds = time.monotonic() - started
    base = _row(subject, GUARANTEES, budget=budgets.search, unit="programs", check_seconds=seconds, seed=seed)
    broken = [cell for cell in row.cells if cell.verdict == "violated"]
    unclear = [cell for cell in row.cells if cell.verdict == "inconclusive"]
    if not broken:
        why = f"holds every guarantee in {row.programs} programs and {row.races} races"
        return attrs.evolve(base, examples=row.programs, seconds=seconds, detail=unclear[0].detail if unclear else why)
    return attrs.evolve(
        base,
        killed=True,
        examples=row.programs,
        seconds=seconds,
        how="divergence",
        detail="; ".join(f"{cell.guarantee.value} ({cell.found_by})" for cell in broken),
        counterexample=broken[0].detail,
    )


def _nemesis(subject: Subject, dsn: str, seed: int) -> Row:
    """The nemesis on the mutant's store and client, every fault a shared server allows."""
    variant = subject.variant
    assert isinstance(variant, Mutant)
    faults = tuple(kind for kind in nemesis.FAULTS if kind != "restart")  # the server is the matrix's
    plan = nemesis.Plan(seed, NEMESIS_SECONDS, faults=faults, store=variant.store, service=variant.service)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lp-killmatrix-nemesis-") as folder:
        report = nemesis.run(dsn, plan, Path(folder), say=lambda line: None)
    seconds = time.monotonic() - started
    base = _row(subject, NEMESIS, budget=1, unit="runs", check_seconds=seconds, seed=seed)
    problems = report.problems
    if not report.live:
        problems.append(f"not live: a healthy tenant's expired lease waited {report.worst_healthy_delay:.2f}s")
    injected = ", ".join(f"{kind} {report.faults[kind]}" for kind in faults)
    if not problems:
        return attrs.evolve(base, examples=1, seconds=seconds, detail=f"safe and live under {injected}")
    found = f"{len(problems)} found under {injected}"
    return attrs.evolve(
        base, killed=True, examples=1, seconds=seconds, how="divergence", detail=found, counterexample=problems[0]
    )


def _row(subject: Subject, check: str, *, budget: int, unit: str, check_seconds: float, seed: int | None) -> Row:
    return Row(
        subject.name, subject.machine, subject.kind, subject.stands_for, check, seed,
        killed=False, examples=0, unit=unit, seconds=0.0, check_seconds=check_seconds, budget=budget,
    )  # fmt: skip


def search_alone_summary(rows: Sequence[Row]) -> str:
    """The search-alone evidence over its seeds: how soon every mutant died, how short
    its counterexample, how long its shrinking took."""
    killed = [row for row in rows if row.killed]
    if not killed:
        return f"search alone: no mutant killed in {len(rows)} runs"
    examples = sorted(row.examples for row in killed)
    shrunk = [row.shrunk_length for row in killed if row.shrunk_length is not None]
    shrinking = [row.check_seconds - row.seconds for row in killed]
    return (
        f"search alone: {len(killed)} of {len(rows)} runs killed their mutant; examples until the kill: "
        f"median {statistics.median(examples):g}, most {examples[-1]:,}; shrunk to at most "
        f"{max(shrunk, default=0)} steps; shrinking took at most {max(shrinking):.1f}s"
    )


@contextlib.contextmanager
def _template(server: Server) -> Iterator[str]:
    """A migrated database to clone for each check, dropped at the end."""
    with scratch_database(server, prefix="lp_killmatrix") as dsn:
        with connect(dsn) as conn:
            migrate(conn)
        yield str(conninfo_to_dict(dsn)["dbname"])


def run_matrix(
    server: Server,
    subjects: Sequence[Subject] = SUBJECTS,
    *,
    fast: bool = False,
    seeds: Sequence[int] = (SEED,),
    budgets: Budgets | None = None,
    on_row: Callable[[Row], None] | None = None,
) -> KillMatrix:
    """Run each subject's checks (the fast subset's if `fast`), the seeded ones on
    every seed, each on a fresh database of `server`; `on_row` hears of each row
    as it is finished."""
    require_test_databases(server, "the kill matrix")
    budgets = budgets or (FAST if fast else FULL)
    started = time.monotonic()
    rows: list[Row] = []
    with _template(server) as template:
        for subject in subjects:
            for check in subject.checks(fast):
                for seed in seeds if check != FORCED else seeds[:1]:
                    with scratch_database(server, template=template) as dsn:
                        if check == STRESS:
                            row = _stress(subject, dsn, seed, budgets)
                        elif check == FORCED:
                            row = _forced(subject, dsn)
                        elif check == GUARANTEES:
                            row = _guarantees(subject, dsn, seed, budgets)
                        elif check == NEMESIS:
                            row = _nemesis(subject, dsn, seed)
                        elif check in WIRE:
                            row = _stress(subject, dsn, seed, budgets, server=server.dsn)
                        else:
                            row = _lockstep(subject, dsn, check, seed, budgets)
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
    return KillMatrix(tuple(rows), tuple(subjects), fast, tuple(seeds), time.monotonic() - started)


# -- the table ------------------------------------------------------------------------------------

COLUMNS = ("mutant", "machine", "finding", "check", "seed", "killed", "examples", "seconds", "shrunk length")


def cells(row: Row) -> tuple[str, ...]:
    """A row as the table's cells."""
    if row.killed:
        killed = "yes (fault)" if row.how == "fault" else "yes"
    else:
        killed = "NO"
    if row.scenario is not None:
        examples = f"0 (scenario {row.scenario})"
    elif row.killed:
        examples = f"{row.examples:,} {row.unit.removesuffix('s') if row.examples == 1 else row.unit}"
    else:
        examples = f"{row.examples:,} {row.unit}, none failed"
    if row.shrunk_length is None:
        length = "-"
    else:
        noun = "step" if row.check.startswith("lockstep") else "operation"
        length = f"{row.shrunk_length} {noun}{'' if row.shrunk_length == 1 else 's'}"
    seed = "-" if row.seed is None else str(row.seed)
    return (row.mutant, row.machine, row.finding, row.check, seed, killed, examples, f"{row.seconds:.1f}", length)


def table(matrix: KillMatrix) -> str:
    """The matrix as a Markdown table, what stress saw in each history it convicted, then the summary."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(" --- " for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells(row)) + " |" for row in matrix.rows]
    for check, heading in (
        (STRESS, "what stress saw:"),
        (NEMESIS, "what the nemesis saw:"),
        (KILLS, "what the nemesis saw, killing the process:"),
        (LOST_ANSWERS, "what the nemesis saw, between the process and its server:"),
        (STALLS, "what the nemesis saw, a tenant stalled:"),
    ):
        seen = [f"- {r.mutant} (seed {r.seed}): {r.why}" for r in matrix.rows if r.check == check and r.why]
        if seen:
            lines += ["", heading, *seen]
    return "\n".join(lines) + "\n\n" + matrix.summary() + "\n"


def progress_line(row: Row) -> str:
    """One line on a finished check, for stderr."""
    seed, killed, examples, seconds, length = cells(row)[4:]
    where = "" if row.seed is None else f" seed {seed}"
    return f"  {row.mutant} · {row.check}{where}: killed {killed} · {examples} · {seconds}s · shrunk {length}"
