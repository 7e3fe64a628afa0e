"""The concurrent runner: many clients against one implementation, judged by the model.

Each client is a thread with its own session. For every program (programs.py)
the runner resets the implementation, runs the prefix, then each round's branches
truly concurrently, recording every invocation and response in one history
(history.py). Between rounds it waits until nothing is in flight, reads the
implementation's state (a barrier) and may move the controlled clock, so every
transaction sees one instant, as `now()` does. Each program runs `repeats`
times from the same start: a race fails in some repetitions, a logic bug in all.
After every clock move each replica whose cache expired is refreshed, so no fire
reloads its cache mid-admission, which the model's atomic fire cannot express.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import psycopg

from leaseproof.conformance.boundary.protocols import Concurrent, Session, SomeAdapter, takes_request_keys
from leaseproof.conformance.concurrent.faults import Cut, FaultCounts, RoundFault, Terminator
from leaseproof.conformance.concurrent.history import (
    DROPPED,
    GUARD_SQLSTATE,
    History,
    Indeterminate,
    Recorder,
    RefusedByTheDatabase,
)
from leaseproof.conformance.concurrent.linearizability import (
    DEFAULT_BUDGET,
    NOT_LINEARIZABLE,
    UNKNOWN,
    CheckResult,
    check,
)
from leaseproof.conformance.concurrent.models import SPECS
from leaseproof.conformance.concurrent.programs import GENERATORS, Program, resolve
from leaseproof.conformance.concurrent.stalls import Waited, waited
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.traces.trace import SPECS as LOCKSTEP
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc

# Errors after which nobody knows whether the operation took effect.
LOST = (psycopg.OperationalError, ConnectionError, TimeoutError)
REOPEN_TRIES = 3  # to open a session again after a cut (see Runner._reopened)


class StressFault(Exception):
    """The implementation raised instead of answering: nothing can be judged."""


@attrs.frozen
class Finding:
    """A program whose histories were not linearizable."""

    program: Program
    failed: int  # repetitions that violated
    repeats: int
    result: CheckResult  # the first violating repetition's check
    history: History
    index: int = 0  # the program's place among the seed's programs (from 0): a replay draws it again
    rounds: int = 2  # the rounds each program of the run had
    schedule: Any = None  # what the fault injector forced in the failing repetition's rounds, if it can be

    @property
    def kind(self) -> str:
        return "logic bug (every repetition fails)" if self.failed == self.repeats else "race (some repetitions pass)"


@attrs.frozen
class Stuck:
    """A program in whose run an operation waited for a stalled tenant it must not wait for
    (conformance/concurrent/stalls.py)."""

    program: Program
    history: History
    waited: tuple[Waited, ...]


@attrs.define
class Progress:
    seconds: float = 0.0
    programs: int = 0
    histories: int = 0
    operations: int = 0
    largest: int = 0  # operations in the largest history
    check_seconds: float = 0.0
    unknown: int = 0  # histories the checker ran out of budget on
    indeterminate: int = 0
    faults: FaultCounts = attrs.Factory(FaultCounts)  # faults injected in rounds (`terminate`, the nemesis's)
    # The model's (operation, guard, outcome) behaviours along the orders that explained the histories.
    behaviours: collections.Counter[tuple[str, str, str]] = attrs.Factory(collections.Counter)

    @property
    def rate(self) -> float:
        """Operations a second of the run alone: the checker's time (`check_seconds`,
        printed apart) left out."""
        running = self.seconds - self.check_seconds
        return self.operations / running if running > 0 else 0.0


@attrs.frozen
class StressReport:
    machine: str
    workers: int
    seed: int
    progress: Progress
    finding: Finding | None
    stuck: Stuck | None = None
    subject: str = ""  # the implementation, as its adapter names itself

    @property
    def verdict(self) -> str:
        if self.finding is not None:
            return "NOT LINEARIZABLE"
        if self.stuck is not None:
            return "NOT LIVE"
        if self.progress.unknown:
            return "UNKNOWN"
        return "LINEARIZABLE"


class _Client:
    """One worker's session and its latest lease."""

    def __init__(self, name: str, session: Session[Any, object]) -> None:
        self.name, self.session = name, session
        self.lease: d.Lease | None = None

    def run(self, recorder: Recorder, step: Any, lose: Callable[[], bool]) -> None:
        command = resolve(step, self.lease)
        op = recorder.invoke(self.name, command)
        try:
            outcome = self.session.execute(command)
        except LOST as exc:
            recorder.abandon(op, f"{type(exc).__name__}: {exc}")
            raise
        except psycopg.DatabaseError as exc:
            if exc.sqlstate != GUARD_SQLSTATE:  # the implementation broke
                recorder.abandon(op, f"fault: {type(exc).__name__}")
                raise StressFault(f"{self.name}: {command!r} raised {type(exc).__name__}: {exc}") from exc
            # The bundled database refused a transition the implementation attempted: an
            # outcome no model answers, so the history is judged, and caught, as a race.
            outcome = RefusedByTheDatabase(exc.diag.constraint_name or "?")
        except Exception as exc:  # the implementation broke
            recorder.abandon(op, f"fault: {type(exc).__name__}")
            raise StressFault(f"{self.name}: {command!r} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(outcome, d.Claimed):
            self.lease = outcome.lease
        # A lost admission would hide the run id the implementation chose,
        # which no later operation could be matched against: fires keep theirs.
        if not isinstance(command, lc.Fire) and lose():
            recorder.abandon(op, DROPPED)
        else:
            recorder.respond(op, outcome)


class Runner:
    """Runs programs against one adapter with `workers` concurrent sessions."""

    def __init__(
        self,
        adapter: SomeAdapter,
        machine: str,
        workers: int,
        *,
        lose: float = 0.0,
        seed: int = 0,
        faults: RoundFault | None = None,
    ) -> None:
        """`faults`: strike in some rounds while they run (conformance/concurrent/faults.py: end a
        busy backend of the adapter's database, kill or pause its process); the runner closes it."""
        if not isinstance(adapter, Concurrent):
            raise TypeError(f"{adapter.name} offers no session(): it cannot be driven concurrently")
        self.adapter, self.machine = adapter, machine
        self.open_session = adapter.session
        self.sessions = [self.open_session() for _ in range(workers)]
        # One more thread than clients: the fault injector's, beside the round's branches.
        self.pool = ThreadPoolExecutor(max_workers=workers + 1, thread_name_prefix="leaseproof-worker")
        self.faults = random.Random(seed ^ 0x10575)
        self.lose_rate = lose
        self.lose_lock = threading.Lock()
        self.injector = faults

    def close(self) -> None:
        self.pool.shutdown()
        for session in self.sessions:
            session.close()
        if self.injector is not None:
            self.injector.close()

    def _lose(self) -> bool:
        with self.lose_lock:
            return self.lose_rate > 0 and self.faults.random() < self.lose_rate

    def run(self, program: Program) -> History:
        """Run `program` once from the initial state; its recorded history."""
        self.adapter.reset(w.START)
        recorder = Recorder(self.machine, LOCKSTEP[self.machine].initial_state(w.START))
        if self.injector is not None:
            self.injector.record_into(recorder)
        clients = [_Client(f"w{i + 1}", s) for i, s in enumerate(self.sessions)]
        prefix = _Client("prefix", self.adapter)
        for step in program.prefix:
            prefix.run(recorder, step, lambda: False)
        recorder.barrier(self.adapter.snapshot())
        for round_ in program.rounds:
            start = threading.Barrier(len(round_.branches))

            def branch(client: _Client, steps: tuple[Any, ...]) -> None:
                start.wait()  # noqa: B023 - every branch ends (future.result()) before the next round rebinds it
                for step in steps:
                    try:
                        client.run(recorder, step, self._lose)
                    except LOST:
                        client.session.close()
                        client.session = self._reopened()
                        self.sessions[clients.index(client)] = client.session

            due = self.injector.due() if self.injector is not None else None
            if due is not None and self.injector is not None:
                self.injector.before_round(due)
            began = time.monotonic()
            futures = [self.pool.submit(branch, c, s) for c, s in zip(clients, round_.branches, strict=False)]
            cut = self._cut_during(futures, due)
            for future in futures:
                future.result()
            if cut is not None:
                cut.result()
            elif self.injector is not None:
                self.injector.observe(time.monotonic() - began)  # an unfaulted round: how long one takes
            mark = recorder.barrier(self.adapter.snapshot())
            if round_.advance is not None:
                coordinator = _Client("coordinator", self.adapter)
                coordinator.run(recorder, d.AdvanceClock(round_.advance), lambda: False)
                for command in _expired_refreshes(mark.state, round_.advance):
                    coordinator.run(recorder, command, lambda: False)
                recorder.barrier(self.adapter.snapshot())
        return recorder.history()

    def _reopened(self) -> Any:
        """A new session for a client whose connection was lost. Opening one is itself cut
        when a round's fault ends its backend as it sets the session up (the terminator ends
        any busy backend); one fault a round, so the second try holds, and the third ends it."""
        for _ in range(REOPEN_TRIES - 1):
            with contextlib.suppress(*LOST):
                return self.open_session()
        return self.open_session()

    def _cut_during(self, futures: list[Any], cut: Cut | None) -> Any:
        """If the injector's seed says so, strike while `futures` run: the injector's own
        future, which ends once the fault has landed (a backend exited, a process is back)
        or the round has ended."""
        if self.injector is None or cut is None:
            return None
        done = threading.Event()
        remaining = [len(futures)]
        lock = threading.Lock()

        def finished(_: Any) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        for future in futures:
            future.add_done_callback(finished)
        return self.pool.submit(self.injector.during_round, done, cut)


def _expired_refreshes(state: Any, advance: dt.timedelta) -> list[Any]:
    """A refresh of every replica cache that `advance` past the barrier `state` expires."""
    if not isinstance(state, lc.LifecycleSystem):
        return []
    now = state.now + advance
    return [lc.RefreshCache(name) for name, cache in state.caches.items() if now - cache.loaded_at >= lc.CACHE_TTL]


def stress(
    adapter: SomeAdapter,
    *,
    machine: str,
    workers: int,
    duration: float,
    seed: int,
    repeats: int = 3,
    lose: float = 0.0,
    budget: int = DEFAULT_BUDGET,
    on_progress: Callable[[Progress], None] | None = None,
    max_programs: int | None = None,
    terminate: float = 0.0,
    database: str | None = None,
    faults: RoundFault | None = None,
    rounds: int = 2,
) -> StressReport:
    """Generate and run programs for `duration` seconds (or `max_programs`);
    stop at the first program with a non-linearizable history. `terminate`: the
    fraction of rounds in which a busy backend of `database` (a DSN: the adapter's
    database) is ended; `faults`, instead: any injector (conformance/concurrent/faults.py),
    which the run closes. `rounds`: each program's rounds (more give a fault more
    operations after it to be seen by)."""
    if terminate and database is None:
        raise ValueError("ending backends needs the adapter's database (a DSN)")
    if terminate and faults is not None:
        raise ValueError("give terminate or faults, not both")
    spec = SPECS[machine]
    generate = GENERATORS[machine]
    options = _generator_options(machine, adapter)
    rng = random.Random(seed)
    progress = Progress()
    started = time.monotonic()
    if terminate and database is not None:
        faults = Terminator(database, terminate, seed)
    if faults is not None:
        progress.faults = faults.counts
    runner = Runner(adapter, machine, workers, lose=lose, seed=seed, faults=faults)
    judged = _Judging(runner, spec, repeats, budget, progress, on_progress, started)
    try:
        while time.monotonic() - started < duration and (max_programs is None or progress.programs < max_programs):
            program = generate(rng, workers, rounds=rounds, **options)
            failed, first, stuck = judged.runs(program)
            progress.programs += 1
            if first is not None or stuck is not None:
                finding = None
                if first is not None:
                    index = progress.programs - 1
                    finding = Finding(program, failed, repeats, *first[:2], index, rounds, first[2])
                return StressReport(machine, workers, seed, progress, finding, stuck, adapter.name)
    finally:
        runner.close()
    progress.seconds = time.monotonic() - started
    return StressReport(machine, workers, seed, progress, None, None, adapter.name)


def _generator_options(machine: str, adapter: SomeAdapter) -> dict[str, Any]:
    """What the machine's program generator is told of the adapter (the delivery machine: whether
    it takes request keys)."""
    return {"request_keys": takes_request_keys(adapter)} if machine == "delivery" else {}


def program_at(machine: str, seed: int, index: int, workers: int, rounds: int, adapter: SomeAdapter) -> Program:
    """The `index`-th program (from 0) a stress run of `seed` draws for `adapter`."""
    options = _generator_options(machine, adapter)
    rng = random.Random(seed)
    for _ in range(index):
        GENERATORS[machine](rng, workers, rounds=rounds, **options)
    return GENERATORS[machine](rng, workers, rounds=rounds, **options)


def replay(
    adapter: SomeAdapter,
    program: Program,
    *,
    seed: int,
    workers: int,
    repeats: int,
    lose: float = 0.0,
    budget: int = DEFAULT_BUDGET,
    on_progress: Callable[[Progress], None] | None = None,
    faults: RoundFault | None = None,
) -> StressReport:
    """Run one program `repeats` times (a found race again: `faults` forcing its schedule, if
    it had one); a finding if any repetition's history is not linearizable."""
    started = time.monotonic()
    progress = Progress()
    if faults is not None:
        progress.faults = faults.counts
    runner = Runner(adapter, program.machine, workers, lose=lose, seed=seed, faults=faults)
    try:
        judged = _Judging(runner, SPECS[program.machine], repeats, budget, progress, on_progress, started)
        failed, first, stuck = judged.runs(program)
    finally:
        runner.close()
    progress.programs = 1
    progress.seconds = time.monotonic() - started
    finding = None
    if first is not None:
        finding = Finding(program, failed, repeats, first[0], first[1], 0, len(program.rounds), first[2])
    return StressReport(program.machine, workers, seed, progress, finding, stuck, adapter.name)


@attrs.define
class _Judging:
    """Runs a program `repeats` times and checks each history, counting into `progress`."""

    runner: Runner
    spec: Any
    repeats: int
    budget: int
    progress: Progress
    on_progress: Callable[[Progress], None] | None
    started: float

    def runs(self, program: Program) -> tuple[int, tuple[CheckResult, History, Any] | None, Stuck | None]:
        """How many repetitions failed; a failing one's check, history and schedule; the first run
        in which an operation waited for a stall it must not wait for."""
        progress, failed = self.progress, 0
        first: tuple[CheckResult, History, Any] | None = None
        stuck: Stuck | None = None
        for _ in range(self.repeats):
            history = self.runner.run(program)
            schedule = self.runner.injector.schedule() if self.runner.injector is not None else None
            ticked = time.monotonic()
            result = check(history, self.spec, budget=self.budget)
            progress.check_seconds += time.monotonic() - ticked
            progress.histories += 1
            progress.operations += len(history)
            progress.largest = max(progress.largest, len(history))
            progress.indeterminate += sum(isinstance(op.outcome, Indeterminate) for op in history)
            progress.behaviours.update(result.behaviours)
            if result.verdict == UNKNOWN:
                progress.unknown += 1
            elif result.verdict == NOT_LINEARIZABLE:
                failed += 1
                # The finding is the first failing repetition, or the first that failed with locks
                # held (whose schedule a replay can force), if the first held none.
                if first is None or (schedule and not any(first[2] or ()) and any(schedule)):
                    first = (result, history, schedule)
            if stuck is None and (late := waited(history)):
                stuck = Stuck(program, history, tuple(late))
            progress.seconds = time.monotonic() - self.started
            if self.on_progress is not None:
                self.on_progress(progress)
        return failed, first, stuck
