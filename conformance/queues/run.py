"""Programs of lease-queue acts, run against a queue and judged by the profile.

A *program* is a list of short JSON-able steps: ``["enqueue"]``, ``["fetch"]``,
``["heartbeat", i]``, ``["complete", i, outcome]``, ``["rescue"]``, ``["advance", seconds]``.
Holder ``i`` is the i-th fetch that handed something out (modulo how many there were; a
holder step before any fetch does nothing), so a program can act as any holder it made,
stale ones included. After its steps a program *drains* the queue (past every lease, a
rescue, then fetch and complete until nothing comes); then every job must be terminal.
`run` stops at the first step that breaks a guarantee or that the profile cannot explain
(a `Divergence`). Programs come from the fixed scenarios (`scenarios`), the search
(`search`: Hypothesis, then shrunk step by step) and races of two or three clients
(`RACES`, each followed by `settle`), in a seeded share of whose rounds a busy backend of
the queue's database is ended (`conformance/concurrent/faults.py`). specs/guarantees.md says more.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import hypothesis
from hypothesis import strategies as st

from leaseproof.conformance.concurrent.faults import Terminator
from leaseproof.conformance.harness.interleave import Event, Forced, Interleaver
from leaseproof.conformance.queues.protocol import Held, QueueAdapter
from leaseproof.model.frozenmap import FrozenMap
from leaseproof.model.queue import (
    TERMINAL,
    Act,
    Advance,
    Answer,
    Capability,
    Complete,
    Divergence,
    Enqueue,
    Fetch,
    Guarantee,
    Heartbeat,
    Job,
    QueueState,
    Rescue,
    Seen,
    Violation,
    holder,
    initial,
    judge,
    reference_answer,
)


@attrs.frozen
class Timing:
    """Every run's lease (seconds, every lease from a fetch or a heartbeat) and the instant its
    queue's clock starts at (`guarantees --lease-seconds`, `--start`)."""

    lease: int = 30
    start: dt.datetime = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

    def __attrs_post_init__(self) -> None:
        if self.lease < MIN_LEASE:
            # The clock moves by 1, lease // 2, lease - 1, lease and lease + 1 seconds: distinct from 3 on.
            raise ValueError(f"a lease of {MIN_LEASE} seconds or more, not {self.lease}")
        if self.start.tzinfo is None:
            raise ValueError(f"a start instant with its time zone, not {self.start.isoformat()}")

    def to_json(self) -> dict[str, Any]:
        return {"lease_seconds": self.lease, "start": self.start.isoformat()}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Timing:
        """The timing a trace records (a trace from before it recorded one: the defaults)."""
        default = cls()
        return cls(int(body.get("lease_seconds", default.lease)),
                   dt.datetime.fromisoformat(body["start"]) if "start" in body else default.start)  # fmt: skip


MIN_LEASE = 3
TIMING = Timing()
MAX_HOLDER = 7  # generated holder indices: 0..MAX_HOLDER (modulo the holders there are)
RACE_TIMEOUT = 30.0  # seconds a race's clients may take together

Step = list[Any]
Program = list[Step]


@attrs.frozen
class Ran:
    """What one program did: the trace of its acts, and what ended it early, if anything."""

    trace: tuple[dict[str, Any], ...]
    violations: tuple[Violation, ...] = ()
    divergence: Divergence | None = None

    @property
    def broken(self) -> frozenset[Guarantee]:
        return frozenset(v.guarantee for v in self.violations)


def _derive(before: Seen | None, after: Seen | None) -> Answer:
    """A completion's answer, from its job's rows, when the queue's API said nothing."""
    if after is not None and after.status in TERMINAL and (before is None or before.status != after.status):
        return Answer.APPLIED
    return Answer.REFUSED


class _Run:
    """One program against one queue: the profile's state, the holders made, the trace."""

    def __init__(self, queue: QueueAdapter, timing: Timing) -> None:
        self.queue, self.timing = queue, timing
        self.deadline = Capability.DEADLINE in queue.capabilities
        queue.reset(timing.start, timing.lease)
        ends = Capability.ENDS_AT_EXPIRY in queue.capabilities
        self.state: QueueState = initial(timing.start, timing.lease, ends)
        self.holders: list[tuple[str, int, Any]] = []  # (job, attempt, handle), in fetch order
        self.rows: dict[str, Seen] = {}
        self.trace: list[dict[str, Any]] = []
        self.violations: list[Violation] = []
        self.divergence: Divergence | None = None

    @property
    def over(self) -> bool:
        return bool(self.violations) or self.divergence is not None

    def step(self, step: Step) -> None:
        """Take one step and judge it; a queue that raises ends the run as a divergence (it
        neither breaks nor keeps a guarantee: nothing is known of what it did)."""
        try:
            self._step(step)
        except Exception as exc:  # noqa: BLE001 - any failure of the queue is reported, with its step
            self.trace.append({"step": step, "act": f"{step[0]} raised {raised(exc)}"})
            self.divergence = Divergence(f"{step[0]} raised {raised(exc)}")

    def _step(self, step: Step) -> None:
        kind = step[0]
        answer: Answer | None = None
        who = ""  # what the acting holder was (`model.queue.holder`), for the trace
        act: Act
        if kind == "enqueue":
            act = Enqueue(self.queue.enqueue())
        elif kind == "fetch":
            held: Held | None = self.queue.fetch()
            act = Fetch(None if held is None else held.job)
            if held is not None:
                attempt = self.state.jobs[held.job].attempt + 1 if held.job in self.state.jobs else 1
                self.holders.append((held.job, attempt, held.handle))
        elif kind in ("heartbeat", "complete"):
            if not self.holders:
                return
            job, attempt, handle = self.holders[int(step[1]) % len(self.holders)]
            who = holder(self.state, job, attempt, self.deadline)
            if kind == "heartbeat":
                act, answer = Heartbeat(job, attempt), self.queue.heartbeat(handle)
            else:
                act, answer = Complete(job, attempt, str(step[2])), self.queue.complete(handle, str(step[2]))
        elif kind == "rescue":
            act = Rescue()
            self.queue.rescue()
        elif kind == "advance":
            act = Advance(int(step[1]))
            self.queue.advance(act.seconds)
        else:
            raise ValueError(f"unknown step {step!r}")
        before, self.rows = self.rows, self.queue.rows()
        if isinstance(act, Complete) and answer is None:
            answer = _derive(before.get(act.job), self.rows.get(act.job))
        self.state, violations, divergences = judge(
            self.state, act, answer or Answer.REFUSED, FrozenMap(self.rows), self.deadline
        )
        entry: dict[str, Any] = {"step": step, "act": _describe(act)}
        if answer is not None:
            entry["answer"] = answer.value
            entry["holder"] = who
        entry["rows"] = {key: row.status for key, row in sorted(self.rows.items())}
        self.trace.append(entry)
        self.violations.extend(violations)
        if divergences and not violations:
            self.divergence = divergences[0]

    def drain(self) -> None:
        """Past every lease, a rescue, a second, then fetch and complete until nothing comes; every
        job must end terminal."""
        self.step(["advance", self.timing.lease + 1])
        if not self.over and Capability.RESCUE in self.queue.capabilities:
            self.step(["rescue"])
            self.step(["advance", 1])  # a rescued job may be due only from the next instant on
        for _ in range(len(self.state.jobs) + 1):
            if self.over:
                return
            fetched = len(self.holders)
            self.step(["fetch"])
            if len(self.holders) == fetched or self.over:
                break
            self.step(["complete", len(self.holders) - 1, "finished"])
        if self.over:
            return
        left = sorted(key for key, job in self.state.jobs.items() if job.status not in TERMINAL)
        if left:
            why = f"after the drain, never completed: {', '.join(f'{k} ({self.state.jobs[k].status})' for k in left)}"
            self.violations.append(Violation(Guarantee.NOTHING_LOST, why))

    def result(self) -> Ran:
        return Ran(tuple(self.trace), tuple(self.violations), self.divergence)


def raised(exc: BaseException) -> str:
    """An exception and what caused it, on one line (a library's wrapper says little alone)."""
    parts: list[str] = []
    while exc is not None and len(parts) < 3:
        parts.append(f"{type(exc).__name__}: {' '.join(str(exc).split())}")
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return ", caused by ".join(parts)


def _describe(act: Act) -> str:
    if isinstance(act, Enqueue):
        return f"enqueue -> {act.job}"
    if isinstance(act, Fetch):
        return f"fetch -> {act.job or 'nothing'}"
    if isinstance(act, Heartbeat):
        return f"heartbeat {act.job} as attempt {act.attempt}"
    if isinstance(act, Complete):
        return f"complete {act.job} as attempt {act.attempt}: {act.outcome}"
    if isinstance(act, Advance):
        return f"advance {act.seconds}s"
    return "rescue"


def run(queue: QueueAdapter, program: Iterable[Step], *, drain: bool = True, timing: Timing = TIMING) -> Ran:
    """Run `program` on a fresh queue, judging each step; stop at the first broken guarantee."""
    one = _Run(queue, timing)
    for step in program:
        one.step(step)
        if one.over:
            return one.result()
    if drain:
        one.drain()
    return one.result()


# -- fixed scenarios: one for each guarantee ------------------------------------------------

_SECOND = ["advance", 1]  # a second later (a queue may make a rescued job due only from the next instant on)


def scenarios(lease: int) -> dict[Guarantee, Program]:
    """The fixed scenario of each guarantee that has one, for leases of `lease` seconds."""
    _EXPIRE = ["advance", lease + 1]  # noqa: N806 - a step, named as the others
    return {
        Guarantee.NO_DOUBLE_CLAIM: [["enqueue"], ["fetch"], ["fetch"], ["complete", 0, "finished"]],
        Guarantee.NO_STALE_COMPLETION: [
            ["enqueue"],
            ["fetch"],
            _EXPIRE,
            ["rescue"],
            _SECOND,
            ["fetch"],
            ["complete", 0, "finished"],
        ],
        Guarantee.NO_STALE_HEARTBEAT: [
            ["enqueue"],
            ["fetch"],
            _EXPIRE,
            ["rescue"],
            _SECOND,
            ["fetch"],
            ["heartbeat", 0],
        ],
        Guarantee.EXPIRED_CANNOT_RENEW: [["enqueue"], ["fetch"], _EXPIRE, ["heartbeat", 0]],
        Guarantee.EXPIRED_CANNOT_COMPLETE: [["enqueue"], ["fetch"], _EXPIRE, ["complete", 0, "finished"]],
        Guarantee.LIVE_HOLDER_SERVED: [
            ["enqueue"],
            ["fetch"],
            ["advance", lease - 1],
            ["heartbeat", 0],
            ["advance", lease - 1],
            ["complete", 0, "failed"],
        ],
        Guarantee.TERMINAL_ONCE: [
            ["enqueue"],
            ["fetch"],
            ["complete", 0, "finished"],
            ["complete", 0, "failed"],
            _EXPIRE,
            ["rescue"],
            _SECOND,
            ["fetch"],
        ],
        Guarantee.RESCUE_ONLY_EXPIRED: [
            ["enqueue"],
            ["fetch"],
            ["advance", lease - 1],
            ["rescue"],
            _SECOND,
            ["rescue"],
            ["complete", 0, "finished"],
        ],
        Guarantee.RESCUE_TAKES_EXPIRED: [
            ["enqueue"],
            ["enqueue"],
            ["fetch"],
            ["fetch"],
            ["advance", lease - 1],
            ["heartbeat", 0],
            ["advance", 2],
            ["rescue"],
        ],
        Guarantee.NOTHING_LOST: [
            ["enqueue"],
            ["enqueue"],
            ["enqueue"],
            ["fetch"],
            ["complete", 0, "finished"],
            ["fetch"],
        ],
    }


def scenario_steps(
    guarantee: Guarantee, capabilities: frozenset[Capability], lease: int = TIMING.lease
) -> Program | None:
    """The fixed scenario of `guarantee` as this queue can run it (None: none, or it needs an
    act the queue lacks). A queue that takes over expired jobs in its fetch and has no rescue
    of its own runs a scenario's rescues as nothing: its next fetch is the rescue; one whose
    failures are retried (no `Capability.FAIL`) completes as finished instead."""
    program = scenarios(lease).get(guarantee)
    if program is None:
        return None
    if Capability.RESCUE not in capabilities and Capability.TAKEOVER in capabilities:
        program = [step for step in program if step[0] != "rescue"]
    if Capability.FAIL not in capabilities:
        program = [[*step[:2], "finished"] if step[0] == "complete" else step for step in program]
    if any(not offers(step, capabilities) for step in program):
        return None
    return program


def offers(step: Step, capabilities: frozenset[Capability]) -> bool:
    if step[0] == "heartbeat":
        return Capability.HEARTBEAT in capabilities
    if step[0] == "rescue":
        return Capability.RESCUE in capabilities
    return True


# -- generated programs ---------------------------------------------------------------------


def steps(capabilities: frozenset[Capability], lease: int = TIMING.lease) -> st.SearchStrategy[Step]:
    """Any one step a queue with `capabilities` can take. The clock
    moves by a second, by around half a lease, or by a lease give or take a second: the
    instants where a lease is just live, just expired, or long gone."""
    holder = st.integers(0, MAX_HOLDER)
    choices: dict[str, st.SearchStrategy[Step]] = {
        "enqueue": st.just(["enqueue"]),
        "fetch": st.just(["fetch"]),
        "complete": st.tuples(st.just("complete"), holder, st.sampled_from(outcomes(capabilities))).map(list),
        "advance": st.tuples(st.just("advance"), st.sampled_from([1, lease // 2, lease - 1, lease, lease + 1])).map(
            list
        ),
        "heartbeat": st.tuples(st.just("heartbeat"), holder).map(list),
        "rescue": st.just(["rescue"]),
    }
    return st.one_of([choice for kind, choice in choices.items() if offers([kind], capabilities)])


def outcomes(capabilities: frozenset[Capability]) -> list[str]:
    """The completions a queue's holders send: "failed" too only where a failure is for good."""
    return sorted(TERMINAL) if Capability.FAIL in capabilities else ["finished"]


def programs(
    capabilities: frozenset[Capability], max_steps: int, lease: int = TIMING.lease
) -> st.SearchStrategy[Program]:
    """Programs of 1 to `max_steps` steps, every length as likely (left to itself, Hypothesis
    draws mostly very short lists, too short to make a holder stale and then act as it).
    Swarm testing (each program leaving out a random few kinds of step) was tried and
    measured: it found the field's bug classes on fewer seeds, not more."""
    return st.integers(1, max_steps).flatmap(lambda n: st.lists(steps(capabilities, lease), min_size=n, max_size=n))


def shrink(queue: QueueAdapter, program: Program, guarantee: Guarantee, timing: Timing = TIMING) -> tuple[Program, Ran]:
    """A program no step of which can be deleted without losing the violation of `guarantee`
    (deleting halves, then quarters, ... then single steps, until a pass deletes nothing),
    and its run."""
    best = run(queue, program, timing=timing)
    if guarantee not in best.broken:
        raise ValueError(f"the program does not break {guarantee.value}")
    chunk = max(1, len(program) // 2)
    while True:
        deleted, start = False, 0
        while start < len(program):
            candidate = program[:start] + program[start + chunk :]
            ran = run(queue, candidate, timing=timing) if candidate else None
            if ran is not None and guarantee in ran.broken:
                program, best, deleted = candidate, ran, True
            else:
                start += chunk
        if chunk == 1 and not deleted:
            return program, best
        chunk = max(1, chunk // 2)


@attrs.frozen
class Found:
    """The first violation of one guarantee a search met, shrunk (unless running it again did not
    break the guarantee: then as the search met it, `shrunk` False)."""

    program: Program
    ran: Ran
    shrunk: bool = True


def search(
    queue: QueueAdapter,
    *,
    seed: int,
    examples: int,
    max_steps: int = 24,
    progress: Callable[[int], None] = lambda done: None,
    until: Callable[[frozenset[Guarantee]], bool] = lambda broken: False,
    timing: Timing = TIMING,
) -> tuple[dict[Guarantee, Found], list[tuple[Program, Divergence]], int]:
    """Generated programs: the first violation met of each guarantee (shrunk), the programs
    the profile could not follow, and how many programs ran; the search ends early once
    `until` says the guarantees broken so far are enough."""
    found: dict[Guarantee, tuple[Program, Ran]] = {}
    diverged: list[tuple[Program, Divergence]] = []
    count = 0
    if examples < 1:
        return {}, [], 0

    @hypothesis.settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[hypothesis.Phase.generate, hypothesis.Phase.target],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.seed(seed)
    @hypothesis.given(programs(queue.capabilities, max_steps, timing.lease))
    def explore(program: Program) -> None:
        nonlocal count
        if until(frozenset(found)):
            # Raised before anything runs: Hypothesis's replay of the example that raised
            # runs nothing either, and `count` is the programs that ran.
            raise _Enough
        count += 1
        progress(count)
        ran = run(queue, program, timing=timing)
        # Steer towards programs whose holders act after they lost their lease: where
        # every guarantee about stale and expired holders is decided.
        hypothesis.target(float(sum(entry.get("holder") in ("stale", "expired") for entry in ran.trace)))
        for violation in ran.violations:
            found.setdefault(violation.guarantee, (program, ran))
        if ran.divergence is not None and len(diverged) < 5:
            diverged.append((program, ran.divergence))

    with contextlib.suppress(_Enough):
        explore()
    shrunk = {}
    for guarantee, (program, ran) in found.items():
        try:
            small, again = shrink(queue, program, guarantee, timing)
        except ValueError:  # the same program, run again, did not break it: the queue is not deterministic
            shrunk[guarantee] = Found(program, ran, shrunk=False)
        else:
            shrunk[guarantee] = Found(small, again)
    return shrunk, diverged, count


class _Enough(Exception):
    """Ends a search whose `until` is met."""


# -- races of two or three clients ---------------------------------------------------------


@attrs.frozen
class Lost:
    """A client's call that raised in a round whose connection was cut: what it did is unknown
    (it took effect or it did not), and the race is judged allowing either."""

    why: str


@attrs.frozen
class Raced:
    """One race: what each client was told, the rows after, and what was wrong, if anything.
    `cut`: a busy backend of the queue's database was ended while the clients ran; `lost`: the
    calls that raised then."""

    description: str
    violation: Violation | None
    cut: bool = False
    lost: tuple[str, ...] = ()
    wired: Wired = attrs.Factory(lambda: Wired())


@attrs.frozen
class Wire:
    """How a race's clients' statements are watched at the wire (conformance/harness/interleave.py):
    their order recorded, or, given the recorded events (`force`), forced to it."""

    interleaver: Interleaver
    force: tuple[Event, ...] | None = None


@attrs.frozen
class Wired:
    """What the wire saw of one race: the events recorded, or how forcing them went."""

    events: tuple[Event, ...] = ()
    forced: Forced | None = None


def _together(
    calls: list[Callable[[], Any]], terminator: Terminator | None = None, wire: Wire | None = None
) -> tuple[list[Any], bool, Wired]:
    """Run the calls on threads released at once: their results, whether a connection was cut, and
    what the wire saw (`wire`: recorded, or forced to a recorded order). If the terminator's seed
    says so, it ends one busy backend of the queue's database while they run; a call that raised
    in a round it cut is `Lost`. Any other exception is re-raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: dict[int, BaseException] = {}
    lock, left, done = threading.Lock(), [len(calls)], threading.Event()

    def body(index: int) -> None:
        try:
            barrier.wait(RACE_TIMEOUT)
            results[index] = calls[index]()
        except BaseException as exc:  # noqa: BLE001 - re-raised (or judged as lost) below
            errors[index] = exc
        finally:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

    plan = terminator.due() if terminator is not None else None
    ended: list[bool] = []
    failed: list[BaseException] = []

    def cutting() -> None:
        assert terminator is not None
        try:
            assert plan is not None
            ended.append(terminator.during_round(done, plan))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            failed.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(calls))]
    if plan is not None:
        threads.append(threading.Thread(target=cutting, daemon=True))
    began = time.monotonic()
    with _watched(wire) as (events, forced):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(RACE_TIMEOUT)
    wired = Wired(tuple(events), forced)
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"a race's clients did not return within {RACE_TIMEOUT}s")
    if terminator is not None and plan is None:
        terminator.observe(time.monotonic() - began)  # an uncut round: how long one takes
    if failed:
        raise failed[0]
    cut = bool(ended and ended[0])
    if errors and not cut:
        raise next(iter(errors.values()))
    for index, exc in errors.items():
        results[index] = Lost(raised(exc))
    return results, cut, wired


@contextlib.contextmanager
def _watched(wire: Wire | None) -> Iterator[tuple[list[Event], Forced | None]]:
    """The events `wire` records while open, or how forcing its events goes."""
    if wire is None:
        yield [], None
    elif wire.force is None:
        with wire.interleaver.recording() as events:
            yield events, None
    else:
        with wire.interleaver.forcing(list(wire.force)) as forced:
            yield [], forced


def _lost(results: list[Any], names: list[str]) -> tuple[str, ...]:
    return tuple(f"{name} raised {result.why}" for name, result in zip(names, results, strict=True)
                 if isinstance(result, Lost))  # fmt: skip


def _cut(description: str, cut: bool, lost: tuple[str, ...]) -> str:
    if not cut:
        return description
    return description + (f" (a connection was cut: {'; '.join(lost)})" if lost else " (a connection was cut)")


def settle(queue: QueueAdapter, jobs: list[str], description: str, timing: Timing = TIMING) -> Violation | None:
    """After a race: the clock past every lease, a rescue and a second, then fetch and complete
    until nothing comes. Every job must end terminal (whatever a cut connection left behind),
    and none that was terminal may be handed out again."""
    queue.advance(timing.lease + 1)
    if Capability.RESCUE in queue.capabilities:
        queue.rescue()
        queue.advance(1)
    after = "then, with every lease run out and a rescue,"
    for _ in range(len(jobs) + 1):
        rows = queue.rows()
        held = queue.fetch()
        if held is None:
            break
        was = rows.get(held.job)
        if was is not None and was.status in TERMINAL:
            why = f"{description}; {after} {held.job}, {was.status}, was handed out again"
            return Violation(Guarantee.TERMINAL_ONCE, why)
        queue.complete(held.handle, "finished")
    rows = queue.rows()
    left = [f"{job} ({rows[job].status if job in rows else 'gone'})" for job in jobs
            if job not in rows or rows[job].status not in TERMINAL]  # fmt: skip
    if left:
        why = f"{description}; {after} fetching until nothing came never completed {', '.join(left)}"
        return Violation(Guarantee.NOTHING_LOST, why)
    return None


def _ended(queue: QueueAdapter, job: str, description: str, violation: Violation | None, cut: bool,
           lost: tuple[str, ...], timing: Timing, wired: Wired) -> Raced:  # fmt: skip
    """A race's judgement, after the queue settled (`settle`) if the race itself broke nothing."""
    description = _cut(description, cut, lost)
    if violation is None:
        violation = settle(queue, [job], description, timing)
    elif cut:
        violation = Violation(violation.guarantee, _cut(violation.why, cut, lost))
    return Raced(description, violation, cut, lost, wired)


def _only_job_fetched(queue: QueueAdapter, job: str) -> Held | None:
    held = queue.fetch()
    return held if held is not None and held.job == job else None


def _unfetched(job: str) -> Raced:
    return Raced("the fetch did not hand out the only job", Violation(Guarantee.NOTHING_LOST, f"{job} was not fetched"))


def race_completion_rescue(
    queue: QueueAdapter, terminator: Terminator | None = None, timing: Timing = TIMING, wire: Wire | None = None
) -> Raced:
    """A holder whose lease ran out completes while a rescue runs. Either order is allowed; the
    completion's answer and the job's row must agree with one of them (with a call lost to a
    cut connection, either it took effect or it did not)."""
    start = timing.start
    queue.reset(start, timing.lease)
    job = queue.enqueue()
    held = _only_job_fetched(queue, job)
    if held is None:
        return _unfetched(job)
    queue.advance(timing.lease + 1)
    deadline = Capability.DEADLINE in queue.capabilities
    lease = dt.timedelta(seconds=timing.lease)
    ends = Capability.ENDS_AT_EXPIRY in queue.capabilities
    claimed = initial(start, timing.lease, ends).with_job(job, Job("claimed", 1, start + lease))
    state = attrs.evolve(claimed, now=start + lease + dt.timedelta(seconds=1))  # the holder's lease ran out
    completing, rescuing = queue.session(), queue.session()
    try:
        before = queue.rows().get(job)
        calls = [lambda: completing.complete(held.handle, "finished"), rescuing.rescue]
        results, cut, wired = _together(calls, terminator, wire)
    finally:
        completing.close()
        rescuing.close()
    answer = results[0]
    after = queue.rows().get(job)
    told = _derive(before, after) if answer is None or isinstance(answer, Lost) else answer
    first = reference_answer(state, Complete(job, 1, "finished"), deadline)  # the completion first
    allowed = {(Answer.REFUSED, "pending"), (Answer.REFUSED, "failed")}  # the rescue first (or a refused completion)
    if first is Answer.APPLIED:
        allowed.add((Answer.APPLIED, "finished"))
    lost = _lost(results, ["the completion", "the rescue"])
    if lost:
        allowed.add((Answer.REFUSED, "claimed"))  # neither took effect
    status = None if after is None else after.status
    description = f"complete {job} (lease run out) racing a rescue: the completion {told.value}, the row {status}"
    violation = None
    if (told, status) not in allowed:
        violation = Violation(Guarantee.COMPLETION_RACING_RESCUE, description + ", which no order explains")
    return _ended(queue, job, description, violation, cut, lost, timing, wired)


def race_fetches(
    queue: QueueAdapter, terminator: Terminator | None = None, timing: Timing = TIMING, wire: Wire | None = None
) -> Raced:
    """Two workers fetch one job at once: at most one gets it."""
    queue.reset(timing.start, timing.lease)
    job = queue.enqueue()
    one, two = queue.session(), queue.session()
    try:
        got, cut, wired = _together([one.fetch, two.fetch], terminator, wire)
    finally:
        one.close()
        two.close()
    jobs = [held.job for held in got if isinstance(held, Held)]
    description = f"two fetches of one job ({job}) at once handed out {jobs or 'nothing'}"
    violation = Violation(Guarantee.NO_DOUBLE_CLAIM, description) if len(jobs) > 1 else None
    lost = _lost(got, ["a fetch", "the other fetch"])
    return _ended(queue, job, description, violation, cut, lost, timing, wired)


def race_rescues_and_fetch(
    queue: QueueAdapter, terminator: Terminator | None = None, timing: Timing = TIMING, wire: Wire | None = None
) -> Raced:
    """Two rescues of one expired job and a worker fetching it at once (it fetches again until it
    gets the job or both rescues are over): whoever fetches it holds a live lease, which no
    rescue may take (a rescuer that acts on what it read before the other rescue would), and
    can renew it."""
    queue.reset(timing.start, timing.lease)
    job = queue.enqueue()
    if _only_job_fetched(queue, job) is None:
        return _unfetched(job)
    queue.advance(timing.lease + 1)
    clients = [queue.session() for _ in range(3)]
    over = [threading.Event(), threading.Event()]

    def rescuing(index: int) -> Callable[[], None]:
        def body() -> None:
            try:
                clients[index].rescue()
            finally:
                over[index].set()

        return body

    def fetching() -> Held | None:
        while True:
            finished = all(event.is_set() for event in over)
            held = clients[2].fetch()
            if held is not None or finished:
                return held

    try:
        results, cut, wired = _together([rescuing(0), rescuing(1), fetching], terminator, wire)
    finally:
        for client in clients:
            client.close()
    lost = _lost(results, ["a rescue", "the other rescue", "the fetch"])
    held = results[2] if isinstance(results[2], Held) else None
    row = queue.rows().get(job)
    status = None if row is None else row.status
    if held is None:
        description = f"two rescues and a fetch of {job} at once: the fetch found nothing (row {status})"
        return _ended(queue, job, description, None, cut, lost, timing, wired)
    description = f"two rescues and a fetch of {job} at once: the fetch took it, and its row is then {status}"
    violation = None
    if status != "claimed":
        violation = Violation(Guarantee.RESCUE_ONLY_EXPIRED, description + ": a rescue took the fresh lease")
    elif Capability.HEARTBEAT in queue.capabilities and queue.heartbeat(held.handle) is not Answer.APPLIED:
        description += "; its holder's heartbeat was refused"
        violation = Violation(Guarantee.LIVE_HOLDER_SERVED, description)
    return _ended(queue, job, description, violation, cut, lost, timing, wired)


Race = Callable[[QueueAdapter, Terminator | None, Timing, Wire | None], Raced]
RACES: dict[Guarantee, Race] = {
    Guarantee.COMPLETION_RACING_RESCUE: race_completion_rescue,
    Guarantee.NO_DOUBLE_CLAIM: race_fetches,
    Guarantee.RESCUE_ONLY_EXPIRED: race_rescues_and_fetch,
}
# What every race round judges besides its own guarantee: the queue settles afterwards (`settle`).
SETTLED = (Guarantee.NOTHING_LOST, Guarantee.TERMINAL_ONCE)
