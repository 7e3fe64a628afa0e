"""The mutation score: how many mechanically generated bugs the checks find.

The shipped mutants were written by people who knew the scenarios; the generated ones
(`impl/mutants/generated/`: one site of one database function's body changed) were
not, so they measure what an implementation written elsewhere can rely on. Each runs
through the checks that can see it: a sequential mutant, the lockstep search alone on
every seed and the fixed scenarios once; a race mutant, stress on every seed and the
contention schedules of the function it changes; a scope mutant, the scope check
(`scopes.py`). A survivor is equivalent (`equivalent.py` says why) or a weakness of
the checks. The score is killed by any check / non-equivalent, and must reach
`MIN_SCORE`; the search's own score is reported beside it; a disproved equivalence
claim fails the run. A task is one (mutant, check, seed), spread over `jobs`
processes, each with its own database. docs/search-power.md says more.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import multiprocessing
import multiprocessing.connection
import os
import signal
import statistics
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.boundary.protocols import SomeAdapter
from leaseproof.conformance.concurrent import contention
from leaseproof.conformance.concurrent.stress import StressFault, stress
from leaseproof.conformance.evidence import scopes
from leaseproof.conformance.harness.databases import databases_named, drop_database, scratch_database
from leaseproof.conformance.harness.provision import require_test_databases
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.impl.connection import connect
from leaseproof.impl.migrate import migrate
from leaseproof.impl.mutants.generated.catalogue import GeneratedMutant, by_name, generated_mutants
from leaseproof.impl.mutants.generated.equivalent import EQUIVALENT

SEEDS = (1, 2, 3, 4, 5)  # the full score's seeds
SEARCH_ALONE = "search alone"
SCENARIOS = "scenarios"
STRESS = "stress"
CONTENTION = "contention"  # conformance/concurrent/contention.py: the race mutants
SCOPE = "scope"  # conformance/evidence/scopes.py: the scope mutants
CHECKS = (SEARCH_ALONE, SCENARIOS, STRESS, CONTENTION, SCOPE)
UNSEEDED = (SCENARIOS, CONTENTION, SCOPE)  # the checks that take no seed


@attrs.frozen
class Budget:
    """How much each check may run before a mutant still alive survives it."""

    examples: int = 300  # lockstep programs of the search alone (verify's default)
    steps: int = 50  # most steps per program (verify's default)
    stress_programs: int = 100
    stress_seconds: float = 60.0


@attrs.frozen
class Task:
    mutant: str
    check: str
    seed: int | None  # None: the fixed scenarios, which take none
    examples: int | None = None  # the programs of the search or of stress, if not the budget's
    every: int = 1  # contention: one schedule in this many (contention.schedules' sample)


@attrs.frozen
class Result:
    """One check of one mutant on one seed."""

    mutant: str
    check: str
    seed: int | None
    killed: bool
    examples: int  # until the kill (0: the set-up of the first program, or a fixed scenario), or all that ran
    seconds: float
    how: str = ""  # "divergence", "fault" (the implementation raised), or "" if it survived
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "seconds": round(self.seconds, 2)}


def contended(mutant: GeneratedMutant) -> bool:
    """Whether the contention schedules know the function a race mutant changes."""
    return mutant.kind == "race" and mutant.function in _locking(mutant.machine)


@functools.cache
def _locking(machine: str) -> frozenset[str]:
    return frozenset(contention.locking_statements(machine))


def tasks(mutants: Sequence[GeneratedMutant], seeds: Sequence[int]) -> list[Task]:
    """Every check of every mutant: the search on each seed and the scenarios once
    (sequential mutants), stress on each seed and, where there are some, the contention
    schedules of the function they change once (race mutants), the scope check once
    (scope mutants)."""
    found: list[Task] = []
    for mutant in mutants:
        if mutant.kind == "scope":
            found.append(Task(mutant.name, SCOPE, None))
        elif mutant.kind == "race":
            found += [Task(mutant.name, STRESS, seed) for seed in seeds]
            if contended(mutant):
                found.append(Task(mutant.name, CONTENTION, None))
        else:
            found += [Task(mutant.name, SEARCH_ALONE, seed) for seed in seeds]
            found.append(Task(mutant.name, SCENARIOS, None))
    return found


def run_task(task: Task, dsn: str, budget: Budget) -> Result:
    """Run one check of one mutant on the (migrated) database `dsn`."""
    mutant = by_name(task.mutant)
    started = time.monotonic()
    if task.check == CONTENTION:
        return _contention(task, mutant, dsn, started)
    if task.check == SCOPE:
        broken = scopes.judge(dsn, mutant.classes())
        seconds = time.monotonic() - started
        return Result(
            task.mutant, SCOPE, None, broken is not None, 0, seconds, "divergence" if broken else "", broken or ""
        )
    if task.check == STRESS:
        adapter = mutant.adapter(dsn)
        try:
            return _stress(task, adapter, mutant.machine, budget, started)
        finally:
            adapter.close()
    adapter = ForkedAdapter(lambda: mutant.adapter(dsn), mutant.machine)
    try:
        verdict = run_conformance(
            adapter,
            Run(
                machine=mutant.machine,
                max_examples=1 if task.check == SCENARIOS else task.examples or budget.examples,
                seed=task.seed or 0,
                steps=budget.steps,
                shrink=False,
                scenarios=task.check == SCENARIOS,
                generate=task.check != SCENARIOS,
            ),
        )
    finally:
        adapter.close()
    seconds = time.monotonic() - started
    coverage = verdict.coverage
    if verdict.conforms:
        ran = coverage.scenarios if task.check == SCENARIOS else coverage.examples
        return Result(task.mutant, task.check, task.seed, False, ran, seconds)
    what = (verdict.fault or verdict.failure).splitlines()
    return Result(
        task.mutant,
        task.check,
        task.seed,
        True,
        coverage.first_failure or 0,
        seconds,
        "fault" if verdict.fault else "divergence",
        what[0] if what else "",
    )


def _contention(task: Task, mutant: GeneratedMutant, dsn: str, started: float) -> Result:
    """The contention schedules of the mutant's function, up to the first that fails."""
    ran = 0
    verdicts = contention.schedules(
        dsn, mutant.machine, mutant.classes(), mutant.function, stop_at_first=True, every=task.every
    )
    for verdict in verdicts:
        ran += 1
        if not verdict.ok:
            _confirm(dsn, mutant, verdict)
            how = "fault" if verdict.fault else "divergence"
            observed = f", then {verdict.observer}" if verdict.observer else ""
            detail = (
                f"{verdict.parked} waiting {verdict.where} {verdict.statement}, {verdict.beside} beside{observed}:"
                f" {verdict.why}"
            )
            return Result(task.mutant, CONTENTION, None, True, ran, time.monotonic() - started, how, detail)
    return Result(task.mutant, CONTENTION, None, False, ran, time.monotonic() - started)


def _confirm(dsn: str, mutant: GeneratedMutant, verdict: contention.Verdict) -> None:
    """A kill counts only if the bundled implementation passes the schedule that killed:
    else the schedule, not the mutant, is wrong (a disagreement the spec names, say)."""
    control = contention.again(dsn, mutant.machine, contention.bundled(mutant.machine), verdict)
    if control is None or not control.ok:
        why = "does not reach it" if control is None else f"fails it too: {control.why}"
        raise RuntimeError(
            f"contention schedule {verdict.parked} ({verdict.where} {verdict.statement}) | {verdict.beside}"
            f" | {verdict.observer}: the bundled implementation {why}"
        )


def _stress(task: Task, adapter: SomeAdapter, machine: str, budget: Budget, started: float) -> Result:
    assert task.seed is not None
    try:
        report = stress(
            adapter,
            machine=machine,
            workers=8,
            duration=budget.stress_seconds,
            seed=task.seed,
            max_programs=task.examples or budget.stress_programs,
        )
    except StressFault as fault:
        return Result(task.mutant, STRESS, task.seed, True, 0, time.monotonic() - started, "fault", str(fault))
    seconds = time.monotonic() - started
    programs = report.progress.programs
    if report.finding is None:
        detail = f"{report.progress.unknown} histories unknown" if report.progress.unknown else ""
        return Result(task.mutant, STRESS, task.seed, False, programs, seconds, detail=detail)
    finding = report.finding
    return Result(
        task.mutant, STRESS, task.seed, True, programs, seconds, "divergence",
        f"{finding.kind}: {finding.failed} of {finding.repeats} repetitions failed",
    )  # fmt: skip


# -- the score -----------------------------------------------------------------------


@attrs.frozen
class Score:
    mutants: tuple[GeneratedMutant, ...]
    seeds: tuple[int, ...]
    budget: Budget
    results: tuple[Result, ...]
    seconds: float

    def of(self, mutant: str, check: str | None = None) -> list[Result]:
        return [r for r in self.results if r.mutant == mutant and check in (None, r.check)]

    def killed(self, mutant: str) -> bool:
        return any(r.killed for r in self.of(mutant))

    def equivalent(self, mutant: GeneratedMutant) -> bool:
        return mutant.name in EQUIVALENT

    @property
    def survivors(self) -> list[GeneratedMutant]:
        """Non-equivalent mutants that every check missed: weaknesses of the checks."""
        return [m for m in self.mutants if not self.killed(m.name) and not self.equivalent(m)]

    @property
    def score(self) -> float:
        """Killed by any check / non-equivalent (1.0 when every mutant is equivalent)."""
        counted = [m for m in self.mutants if not self.equivalent(m)]
        return sum(self.killed(m.name) for m in counted) / len(counted) if counted else 1.0

    def searched(self) -> list[GeneratedMutant]:
        """The non-equivalent sequential mutants the search ran on."""
        return [
            m
            for m in self.mutants
            if m.kind == "sequential" and not self.equivalent(m) and self.of(m.name, SEARCH_ALONE)
        ]

    def killed_by_search(self, mutant: str) -> bool:
        return any(r.killed for r in self.of(mutant, SEARCH_ALONE))

    @property
    def search_score(self) -> float:
        """The search's own power: of the non-equivalent sequential mutants it ran on, the
        share it killed on some seed, with the fixed scenarios off (1.0 when it ran on none)."""
        counted = self.searched()
        return sum(self.killed_by_search(m.name) for m in counted) / len(counted) if counted else 1.0

    @property
    def missed_by_search(self) -> list[GeneratedMutant]:
        """Non-equivalent sequential mutants the search missed on every seed (another check may have killed them)."""
        return [m for m in self.searched() if not self.killed_by_search(m.name)]

    @property
    def disproved(self) -> list[GeneratedMutant]:
        """Mutants claimed equivalent that a check killed: the claim is wrong."""
        return [m for m in self.mutants if self.equivalent(m) and self.killed(m.name)]

    def by_check(self) -> list[tuple[str, str, int, int, str]]:
        """(check, seed, killed, non-equivalent, examples until the kill: median / max) per check and seed."""
        rows = []
        for check in CHECKS:
            seeds: Sequence[int | None] = (None,) if check in UNSEEDED else self.seeds
            for seed in seeds:
                results = [
                    r for r in self.results
                    if r.check == check and r.seed == seed and r.mutant not in EQUIVALENT
                ]  # fmt: skip
                if not results:
                    continue
                kills = [r.examples for r in results if r.killed]
                spread = f"{statistics.median(kills):g} / {max(kills)}" if kills else "-"
                rows.append((check, "-" if seed is None else str(seed), len(kills), len(results), spread))
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "seeds": list(self.seeds),
            "budget": attrs.asdict(self.budget),
            "seconds": round(self.seconds, 1),
            "mutants": len(self.mutants),
            "equivalent": sorted(m.name for m in self.mutants if self.equivalent(m)),
            "by_check": [
                {"check": c, "seed": s, "killed": k, "non_equivalent": n, "examples_median_max": e}
                for c, s, k, n, e in self.by_check()
            ],
            "score": round(self.score, 4),
            "search_score": round(self.search_score, 4),
            "searched": len(self.searched()),
            "survivors": [m.name for m in self.survivors],
            "missed_by_search": [m.name for m in self.missed_by_search],
            "disproved_equivalences": [m.name for m in self.disproved],
            "results": [r.to_json() for r in self.results],
        }


def report(score: Score) -> str:
    """The score as text: per check, then the survivors and the equivalent mutants with their reasons."""
    kinds = {kind: sum(m.kind == kind for m in score.mutants) for kind in ("sequential", "race", "scope")}
    equivalent = [m for m in score.mutants if score.equivalent(m)]
    lines = [
        f"generated mutants: {len(score.mutants)} ({kinds['sequential']} sequential, {kinds['race']} race, "
        f"{kinds['scope']} scope), "
        f"{len(equivalent)} equivalent; seeds {', '.join(map(str, score.seeds))}; "
        f"search budget {score.budget.examples} programs of up to {score.budget.steps} steps; "
        f"stress budget {score.budget.stress_programs} programs or {score.budget.stress_seconds:g}s; "
        f"{score.seconds:.0f}s",
        "",
        f"{'check':<14} {'seed':>20} {'killed':>8} {'of':>5} {'score':>8}   examples until the kill (median / max)",
    ]
    for check, seed, killed, total, spread in score.by_check():
        lines.append(f"{check:<14} {seed:>20} {killed:>8} {total:>5} {killed / total:>8.1%}   {spread}")
    killed_any = sum(score.killed(m.name) for m in score.mutants if not score.equivalent(m))
    non_equivalent = len(score.mutants) - len(equivalent)
    if non_equivalent:
        share = killed_any / non_equivalent
        lines.append(f"{'any check':<14} {'':>20} {killed_any:>8} {non_equivalent:>5} {share:>8.1%}")
    searched = score.searched()
    if searched:
        found = len(searched) - len(score.missed_by_search)
        share = score.search_score
        lines.append(f"{'search alone':<14} {'any seed, sequential':>20} {found:>8} {len(searched):>5} {share:>8.1%}")
    lines.append("")
    for mutant in score.survivors:
        missed = ", ".join(f"{r.check}{'' if r.seed is None else f' seed {r.seed}'}" for r in score.of(mutant.name))
        lines.append(f"SURVIVED {mutant.name}: {mutant.stands_for} (missed by {missed})")
    survivors = {m.name for m in score.survivors}
    for mutant in score.missed_by_search:
        if mutant.name not in survivors:
            by = ", ".join(sorted({r.check for r in score.of(mutant.name) if r.killed}))
            lines.append(f"MISSED BY THE SEARCH {mutant.name}: {mutant.stands_for} (killed by {by} only)")
    for mutant in score.disproved:
        killers = [r for r in score.of(mutant.name) if r.killed]
        lines.append(
            f"NOT EQUIVALENT {mutant.name}: listed as equivalent, but {killers[0].check} killed it "
            f"({killers[0].detail}); remove it from impl/mutants/generated/equivalent.py"
        )
    if equivalent:
        lines.append(f"equivalent ({len(equivalent)}), each with why no program can tell it apart:")
        lines += [f"  {m.name}: {EQUIVALENT[m.name]}" for m in equivalent]
    return "\n".join(lines) + "\n"


# -- running it ----------------------------------------------------------------------

_worker_dsn: str | None = None


def _start_worker(databases: Any) -> None:
    """A worker's first act: take a database of its own for every task it will
    run, and leave as soon as the process that started it is gone (killed,
    even by SIGKILL), rather than run on as an orphan."""
    global _worker_dsn
    # A terminal's Ctrl-C reaches the whole process group: the parent stops the
    # workers itself (and drops their databases), without a traceback from each.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_dsn = databases.get()
    parent = multiprocessing.parent_process()
    if parent is not None:
        sentinel = parent.sentinel
        threading.Thread(target=_exit_with, args=(sentinel,), daemon=True, name="parent watch").start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])  # returns when the parent process has ended
    os._exit(1)


def _run_in_worker(task: Task, budget: Budget) -> Result:
    assert _worker_dsn is not None
    return run_task(task, _worker_dsn, budget)


@contextlib.contextmanager
def _databases(server: Server, count: int) -> Iterator[list[str]]:
    """`count` migrated databases, dropped at the end. Each is named after this
    process (lp_mutation_<pid>_...), so that whoever cleans up after a run that
    was killed outright can tell its databases from other runs' on one server."""
    prefix = f"lp_mutation_{os.getpid()}"
    try:
        with contextlib.ExitStack() as stack:
            template_dsn = stack.enter_context(scratch_database(server, prefix=f"{prefix}_template"))
            with connect(template_dsn) as conn:
                migrate(conn)
            template = str(conninfo_to_dict(template_dsn)["dbname"])
            yield [
                stack.enter_context(scratch_database(server, template=template, prefix=prefix)) for _ in range(count)
            ]
    finally:
        # An interrupt (SIGTERM, Ctrl-C) between a CREATE DATABASE and the registration
        # of its drop would leave that database behind: drop whatever bears the name.
        for name in databases_named(server, prefix):
            drop_database(server, name)
        scopes.drop_roles(server.dsn, prefix)  # a scope check's roles, if a worker was killed inside one


def default_jobs() -> int:
    """One worker per core the process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@attrs.frozen
class Plan:
    """What a score run runs: its mutants, seeds, budget, and each (mutant, check, seed)."""

    mutants: tuple[GeneratedMutant, ...]
    seeds: tuple[int, ...]
    budget: Budget
    tasks: tuple[Task, ...]


# The fast subset (CI): one seed; every mutant listed as equivalent, on a small
# budget (8 programs of the search or of stress, one contention schedule in
# FAST_STRIDE), so a claim that stops holding is caught; a fixed 1 in FAST_STRIDE
# of the other sequential ones (`in_fast_sample`), on the default budget (only a
# survivor spends it all); and 1 in FAST_STRIDE of the other race ones the
# contention schedules know, through those alone; and every scope mutant, through
# the scope check (a tenth of a second each).
# Not stress: it kills some of the race mutants, and not the same ones twice
# (its timing is not the seed's), so CI would fail at random.
FAST_STRIDE, FAST_EXAMPLES, FAST_EQUIVALENT_EXAMPLES = 8, Budget().examples, 8


def in_fast_sample(name: str) -> bool:
    """Whether the fast subset runs the mutant `name` (one not listed as equivalent): a
    fixed share, 1 in FAST_STRIDE, chosen by the name's CRC-32, so that the sample does not
    move when a claim is added or a mutant appears elsewhere in the catalogue."""
    return zlib.crc32(name.encode()) % FAST_STRIDE == 0


# A run fails when the search alone kills fewer than this share of the non-equivalent
# sequential mutants it ran on, or all its checks fewer than this share of all of them.
MIN_SCORE = 0.95


def plan(
    names: Sequence[str] = (),
    machine: str | None = None,
    *,
    fast: bool = False,
    seeds: Sequence[int] | None = None,
    examples: int | None = None,
    kind: str | None = None,
) -> Plan:
    """The run the arguments name: the mutants named (all if none) of `machine`
    (both if None) and `kind` (sequential or race; both if None), all their
    checks on every seed, or the fast subset."""
    chosen = tuple(by_name(name) for name in names) if names else generated_mutants(machine)
    chosen = tuple(m for m in chosen if machine in (None, m.machine) and kind in (None, m.kind))
    if not chosen:
        what = " ".join(([f"a {kind} mutant"] if kind else []) + ([f"of the {machine} machine"] if machine else []))
        raise ValueError(f"none of the mutants {', '.join(names)} is {what}")
    budget = Budget() if examples is None else Budget(examples=examples)
    if not fast:
        run_seeds = tuple(seeds or SEEDS)
        return Plan(chosen, run_seeds, budget, tuple(tasks(chosen, run_seeds)))
    run_seeds = tuple(seeds or SEEDS[:1])
    others = [m for m in chosen if m.name not in EQUIVALENT and m.kind == "sequential"]
    races = [m for m in chosen if m.name not in EQUIVALENT and contended(m)]
    sampled = {m.name for m in others if in_fast_sample(m.name)}
    raced = {m.name for m in races if in_fast_sample(m.name)}
    scoped = {m.name for m in chosen if m.kind == "scope"}
    subset = tuple(m for m in chosen if m.name in EQUIVALENT or m.name in sampled | raced | scoped)
    work: list[Task] = []
    for task in tasks(subset, run_seeds):
        if task.mutant in raced and task.check != CONTENTION:
            continue  # stress kills are not repeatable: CI runs the contention schedules alone
        if task.check == SEARCH_ALONE:
            small = FAST_EQUIVALENT_EXAMPLES if task.mutant in EQUIVALENT else FAST_EXAMPLES
            task = attrs.evolve(task, examples=min(small, budget.examples))
        elif task.check == STRESS:
            task = attrs.evolve(task, examples=min(FAST_EQUIVALENT_EXAMPLES, budget.stress_programs))
        elif task.check == CONTENTION and task.mutant in EQUIVALENT:
            task = attrs.evolve(task, every=FAST_STRIDE)
        work.append(task)
    return Plan(subset, run_seeds, budget, tuple(work))


def run_score(
    server: Server,
    mutants: Sequence[GeneratedMutant] | None = None,
    *,
    seeds: Sequence[int],
    budget: Budget = Budget(),
    jobs: int = 1,
    on_result: Callable[[Result, int, int], None] | None = None,
    work: Sequence[Task] | None = None,
) -> Score:
    """Every check of every mutant (all generated ones if None), or the `work`
    given, on `jobs` processes; `on_result(result, done, total)` hears of each
    as it finishes."""
    require_test_databases(server, "the mutation score")
    chosen = tuple(mutants if mutants is not None else generated_mutants())
    work = list(work) if work is not None else tasks(chosen, seeds)
    started = time.monotonic()
    results: list[Result] = []
    with _databases(server, jobs) as dsns:
        if jobs == 1:
            for task in work:
                results.append(run_task(task, dsns[0], budget))
                if on_result is not None:
                    on_result(results[-1], len(results), len(work))
        else:
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            for dsn in dsns:
                queue.put(dsn)
            pool = concurrent.futures.ProcessPoolExecutor(
                jobs, mp_context=context, initializer=_start_worker, initargs=(queue,)
            )
            try:
                futures = [pool.submit(_run_in_worker, task, budget) for task in work]
                for future in concurrent.futures.as_completed(futures):
                    results.append(future.result())
                    if on_result is not None:
                        on_result(results[-1], len(results), len(work))
            except BaseException:
                # Interrupted (Ctrl-C, SIGTERM) or a worker failed: stop the workers
                # now, not after their running checks, before the databases go.
                workers = list((getattr(pool, "_processes", None) or {}).values())
                pool.shutdown(wait=False, cancel_futures=True)
                for process in workers:
                    process.terminate()
                for process in workers:
                    process.join(timeout=10)
                raise
            pool.shutdown()
    order = {(t.mutant, t.check, t.seed): i for i, t in enumerate(work)}  # results in the order of the plan
    results.sort(key=lambda r: order[(r.mutant, r.check, r.seed)])
    return Score(chosen, tuple(seeds), budget, tuple(results), time.monotonic() - started)
