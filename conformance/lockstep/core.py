"""The lockstep core every conformance machine shares.

A machine is described by a `MachineSpec` (Porcupine-style: the model's
step, its initial state, its invariants, its catalogue of outcome variants
and how to describe things); `LockstepMachine` drives the model and an
adapter with the same commands and checks, after every step, that the
outcomes are equal, that the model kept its invariants, and that the
implementation's full state equals the model's.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar, cast, runtime_checkable

import attrs
from hypothesis.errors import StopTest, UnsatisfiedAssumption
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import RuleBasedStateMachine

from leaseproof.conformance.boundary.protocols import Named, SomeAdapter
from leaseproof.conformance.lockstep.swarm import Swarm, without_hypothesis_rule_swarm
from leaseproof.model.rules import Decision, Rule, behaviours


class NonConformance(AssertionError):
    """The implementation disagreed with the model."""


class RunAborted(BaseException):
    """The adapter failed (raised, or broke the protocol): stop at once.

    A BaseException, so Hypothesis neither shrinks nor retries it: a fault
    is not a counterexample and is never compared with the model.
    """

    def __init__(self, fault: BaseException, program: list[str]) -> None:
        super().__init__(str(fault))
        self.fault, self.program = fault, program


def unchanged_or(
    before: Any,
    after: Any,
    of_states: Callable[[Any], list[str]],
    of_steps: Callable[[Any, Any, Any], list[str]],
    outcome: Any,
) -> list[str]:
    """A machine's invariant violations after a step. A step that left the state
    itself in place (a refusal, a miss, a read) has none to find: the state was
    checked when it was made, and every step invariant is about a change."""
    if after is before:
        return []
    return of_states(after) + of_steps(before, after, outcome)


@attrs.frozen
class MachineSpec:
    """What the lockstep core needs to know about one machine's model."""

    name: str
    decide: Callable[[Any, Any], Decision[Any]]  # the model's step, and the rule that decided it
    rules: Mapping[type, tuple[Rule, ...]]  # each operation's guarded cases, in check order
    initial_state: Callable[[dt.datetime], Any]
    violations: Callable[[Any, Any, Any], list[str]]  # (before, after, outcome): state and step invariants
    variants: dict[type, tuple[str, ...]]
    variant: Callable[[Any], str]
    describe: Callable[[Any], str]
    difference: Callable[[Any, Any], str]  # (model state, implementation state)
    # What a reader needs to see a failed step: (command, state before it, the model's state
    # after it, the implementation's state after it) -> the clock, and the rows the step
    # touched before and after on both sides.
    explain: Callable[[Any, Any, Any, Any], str] = lambda command, before, after, implementation: ""
    # Named transitions of the machine's rows (or coordinates), if it has any, each with
    # the rules ("Operation/guard") that make it; and how to read them off a step: each
    # (what moved, (from, to)).
    transitions: Mapping[tuple[str, str], tuple[str, ...]] = attrs.field(factory=dict)
    transitions_of: Callable[[Any, Any], list[tuple[Any, tuple[str, str]]]] = lambda before, after: []
    subject: str = "row"  # what moves along the transitions

    def step(self, state: Any, command: Any) -> tuple[Any, Any]:
        """The model's step: the next state and the outcome."""
        decision = self.decide(state, command)
        return decision.state, decision.outcome

    def behaviours(self) -> list[tuple[str, str, str]]:
        """Every (operation, guard, outcome variant) the rules declare, in table order.
        `leaseproof explore` proves each one reachable."""
        return behaviours(self.rules)


@attrs.define
class Coverage:
    """What a run exercised: outcome variants per operation, the rules that
    decided them, and row transitions."""

    spec: MachineSpec | None = None
    outcomes: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter)
    behaviours: collections.Counter[tuple[str, str, str]] = attrs.field(factory=collections.Counter)
    transitions: collections.Counter[tuple[str, str]] = attrs.field(factory=collections.Counter)
    # Programs run on the implementation. A program that repeats one already run
    # (Hypothesis draws different choices that make the same commands) is checked
    # against the model alone: a deterministic implementation gave every step of
    # it the same answers before, and `examples` does not count it.
    examples: int = 0
    # Programs Hypothesis started, whatever became of them: the programs it generated,
    # those it abandoned part-way (`discarded`), and after a failure every shrink attempt.
    # The shrink bound's clock counts attempts by it (`ShrinkBound`).
    generated: int = 0
    # Programs Hypothesis abandoned part-way before the first failure: it ran out of
    # choices, or rejected a draw (an unsatisfied assumption, an empty bundle). They do
    # not count toward max_examples (Hypothesis generates others in their place), so
    # `counted` leaves them out. `discarded_sent`: those of them sent before that.
    discarded: int = 0
    discarded_sent: int = 0
    scenarios: int = 0
    scenario: str = ""  # the fixed scenario running, while one is
    steps: int = 0
    # The programs sent up to and including the one in which the first failure
    # appeared (before shrinking); 0 when a fixed scenario failed. `failed_at`: the
    # `generated` count then. `failed_in`: the failing program's number as `counted`
    # numbers it (its place among the programs counted toward max_examples).
    first_failure: int | None = None
    failed_at: int = 0
    failed_in: int = 0
    # The commands of the most recent program; after a failure, Hypothesis
    # last replays the minimal one, so this is the counterexample.
    last_commands: list[Any] = attrs.field(factory=list)
    # Commands never sent because the adapter does not offer them, by operation.
    skipped: collections.Counter[str] = attrs.field(factory=collections.Counter)
    offered: frozenset[str] | None = None  # None: everything
    # (operation, guard) behaviours this adapter cannot take part in (e.g. a claim's retry
    # by its request key, for an adapter of protocol 2 or older): not counted as missing.
    inapplicable: frozenset[tuple[str, str]] = frozenset()

    @property
    def counted(self) -> int:
        """Programs generated that count toward max_examples: those Hypothesis started,
        less those it abandoned part-way. Before a failure, never more than max_examples."""
        if self.first_failure is not None:
            return self.failed_in
        return self.generated - self.discarded

    @property
    def repeats(self) -> int:
        """Of the programs counted before any failure, those not sent: each repeated a
        program already sent, so the model alone checked it."""
        sent = (self.examples if self.first_failure is None else self.first_failure) - self.discarded_sent
        return max(0, self.counted - sent)

    @property
    def shrink_attempts(self) -> int:
        """Programs Hypothesis ran after the first failure: its shrink attempts (valid or not) and
        its replays of the failing program (the shrink bound's clock counts the same)."""
        return self.generated - self.failed_at if self.first_failure else 0

    def record(self, before: Any, after: Any, command: Any, outcome: Any, rule: Rule) -> None:
        assert self.spec is not None
        self.steps += 1
        operation, variant = type(command).__name__, self.spec.variant(outcome)
        self.outcomes[(operation, variant)] += 1
        self.behaviours[(operation, rule.guard, variant)] += 1
        for _, pair in self.spec.transitions_of(before, after):
            self.transitions[pair] += 1

    def offers(self, operation: str) -> bool:
        return self.offered is None or operation in self.offered

    def missing_outcomes(self) -> list[tuple[str, str]]:
        """Variants never reached, of the operations the adapter offers."""
        assert self.spec is not None
        return [
            (op.__name__, v)
            for op, variants in self.spec.variants.items()
            for v in variants
            if self.offers(op.__name__) and (op.__name__, v) not in self.outcomes
        ]

    def checkable_behaviours(self) -> list[tuple[str, str, str]]:
        """Declared (operation, guard, outcome) behaviours of the operations the adapter offers."""
        assert self.spec is not None
        return [b for b in self.spec.behaviours() if self.offers(b[0]) and b[:2] not in self.inapplicable]

    def missing_behaviours(self) -> list[tuple[str, str, str]]:
        """Of the checkable behaviours, those never exercised."""
        return [b for b in self.checkable_behaviours() if b not in self.behaviours]

    def missing_transitions(self) -> list[tuple[str, str]]:
        assert self.spec is not None
        return [pair for pair in self.spec.transitions if pair not in self.transitions]


SHRINK_ATTEMPTS, SHRINK_SECONDS = 1000, 60.0


@attrs.define
class ShrinkBound:
    """How long the shrinking of a failure may go on: `attempts` programs, and at
    most `seconds`. The attempts make the bound deterministic: the same seed and
    budget end at the same program on any machine. The seconds are a backstop;
    when they, not the attempts, end the shrinking, the program printed may
    differ between runs, and `stopped` says so.

    Hypothesis bounds its shrinking by wall-clock time only (five minutes, its
    `MAX_SHRINKING_SECONDS`), which no two machines spend alike. `clock()` is
    the clock its engine reads instead while a run is shrinking: it counts
    shrink attempts, so its limit is a number of attempts."""

    attempts: int = SHRINK_ATTEMPTS
    seconds: float = SHRINK_SECONDS
    stopped: str = ""  # why the shrinking ended early, if it did
    started: float | None = None  # when the first failure was seen (time.monotonic)

    @contextlib.contextmanager
    def clock(self, coverage: Coverage) -> Iterator[None]:
        """Hypothesis's shrinking engine reads `_ShrinkClock` while this is entered."""
        # Hypothesis's engine imports `time` without re-exporting it (attr-defined);
        # while shrinking, a _ShrinkClock stands in for that module (assignment).
        saved = (engine.time, engine.MAX_SHRINKING_SECONDS)  # type: ignore[attr-defined]  # the engine's `time`
        engine.time, engine.MAX_SHRINKING_SECONDS = _ShrinkClock(self, coverage), self.attempts  # type: ignore[attr-defined, assignment]  # a clock for `time`
        try:
            yield
        finally:
            engine.time, engine.MAX_SHRINKING_SECONDS = saved  # type: ignore[attr-defined]  # `time` back


class _ShrinkClock:
    """The `time` module as Hypothesis's engine sees it during a bounded run:
    `perf_counter()` is the number of shrink attempts made, or, once the
    bound's seconds have passed, a reading past any deadline the engine has
    set; everything else is the real module's."""

    def __init__(self, bound: ShrinkBound, coverage: Coverage) -> None:
        self.bound, self.coverage = bound, coverage
        self.base: float | None = None  # the count when the engine set its deadline
        self.last = 0.0  # the latest reading

    def perf_counter(self) -> float:
        coverage, bound = self.coverage, self.bound
        if coverage.first_failure is None:
            return 0.0
        attempts = float(coverage.generated - coverage.failed_at)
        if self.base is None:
            self.base = attempts
        if bound.started is not None and time.monotonic() - bound.started > bound.seconds:
            bound.stopped = bound.stopped or (
                f"at its time bound of {bound.seconds:g}s (--shrink-seconds), after {attempts:,.0f} attempts;"
                " the time, not the budget, ended it, so a rerun may print another program"
            )
            # Past any deadline the engine sets, even one it sets from this very
            # reading (infinity would set an infinite one): each reading jumps
            # further than the attempts a deadline allows past the one before.
            self.last += bound.attempts + 1
            return self.last
        if attempts > self.base + bound.attempts and not bound.stopped:
            bound.stopped = f"after {bound.attempts:,} attempts, its budget (--shrink-attempts)"
        self.last = max(self.last, attempts)
        return attempts

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


# A trie of the programs a run has sent to its implementation, step by step
# (each step: the tuple of its commands). Every prefix in it passed.
_Programs = dict[tuple[Any, ...], "_Programs"]
# The most steps the trie remembers (a few hundred bytes each): the default
# budget of 300 programs of up to 50 steps needs 15,000; a soak of millions of
# programs would otherwise grow without bound. Past it, a program's new steps
# are sent but not remembered, so a later repeat of them is sent again.
PROGRAM_STEPS_REMEMBERED = 200_000


@attrs.frozen
class _Step:
    """A step as the model took it: its commands, each with the model's state before
    it and decision (None: the adapter does not offer it), and the step's label. Held
    while it repeats a program sent before; then sent to the implementation."""

    commands: tuple[Any, ...]
    decisions: tuple[tuple[Any, Decision[Any]] | None, ...]
    label: str | None


@attrs.frozen
class Failure:
    """How the implementation failed a program: it disagreed with the model
    (`fault` None: `message` says how), or it raised (`fault`: what it raised;
    `message` is its text). `commands`: the commands it had been sent in the
    program when it failed, the failing one included, if known."""

    message: str
    commands: int | None  # None: not known (every command of the program is listed)
    fault: BaseException | None = None


class ImplementationRaised(Exception):
    """What an implementation raised, where its exception cannot travel as itself
    (from the process it runs in): the exception's type name and text."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (ImplementationRaised, (self.kind, str(self)))


def fault_name(fault: BaseException) -> str:
    """The type name of what an adapter raised."""
    return fault.kind if isinstance(fault, ImplementationRaised) else type(fault).__name__


class StepChecker:
    """Sends steps to an adapter and checks each against the model's decisions:
    every command's outcome as it comes, the whole state after the step's last.
    Raises NonConformance at the first disagreement; what the adapter itself
    raises propagates, with `sent` the commands it had been sent since its reset."""

    def __init__(self, spec: MachineSpec, adapter: SomeAdapter) -> None:
        self.spec, self.adapter = spec, adapter
        self.sent = 0

    def reset(self, start: dt.datetime) -> None:
        self.sent = 0
        self.adapter.reset(start)

    def check(self, step: _Step) -> None:
        describe = self.spec.describe
        last: tuple[Any, Any, Any] | None = None  # the last command sent, the state before it and after
        for command, decided in zip(step.commands, step.decisions, strict=True):
            if decided is None:
                continue
            before, decision = decided
            self.sent += 1
            actual = self.adapter.execute(command)
            if actual != decision.outcome:
                raise NonConformance(
                    f"outcome mismatch for {describe(command)}\n"
                    f"  model:          {describe(decision.outcome)}\n"
                    f"  implementation: {describe(actual)}" + self._explained(command, before, decision.state, None)
                )
            last = (command, before, decision.state)
        if last is None:
            return  # nothing was sent: the state is the one checked after the step before
        snapshot = self.adapter.snapshot()
        if snapshot != last[2]:
            label = step.label or describe(step.commands[-1])
            difference = self.spec.difference(last[2], snapshot)
            raise NonConformance(f"state mismatch after {label}\n" + difference + self._explained(*last, snapshot))

    def _explained(self, command: Any, before: Any, after: Any, implementation: Any) -> str:
        """The failed step's context, as `spec.explain` writes it: reads the
        implementation's state if the caller has none (an outcome mismatch)."""
        if implementation is None:
            try:
                implementation = self.adapter.snapshot()
            except Exception as exc:  # noqa: BLE001 - the report goes on without it
                return f"\n(the implementation's state could not be read: {type(exc).__name__}: {exc})"
        text = self.spec.explain(command, before, after, implementation)
        return "\n" + text if text else ""

    def run(self, call: Callable[[], None]) -> Failure | None:
        """`call` (a reset or a check), and how the implementation failed in it, if it did."""
        try:
            call()
        except NonConformance as exc:
            return Failure(str(exc), self.sent)
        except Exception as fault:  # noqa: BLE001 - any exception from the adapter is a fault
            return Failure(str(fault), self.sent, fault)
        return None


class Executor(Protocol):
    """Where a lockstep machine's implementation runs. `reset` starts a program,
    `send` hands it a step (it may check it later), `settle` waits until every
    step sent has been checked and returns the program's failure, if any.
    Once a program has failed, the rest of its steps are not sent on.

    `InProcess` checks each step at once, in this process; `ForkedAdapter`
    (conformance/lockstep/forked.py) checks them in a process of its own while
    the next steps are drawn. Both report a failure at the same point, the
    program's end, so a seed prints the same counterexample with either."""

    def reset(self, start: dt.datetime) -> None: ...

    def send(self, step: _Step) -> None: ...

    def settle(self) -> Failure | None: ...


class InProcess:
    """The executor that checks each step as it is sent, in this process."""

    def __init__(self, spec: MachineSpec, adapter: SomeAdapter) -> None:
        self.checker = StepChecker(spec, adapter)
        self.failure: Failure | None = None

    def reset(self, start: dt.datetime) -> None:
        self.failure = self.checker.run(lambda: self.checker.reset(start))

    def send(self, step: _Step) -> None:
        if self.failure is None:
            self.failure = self.checker.run(lambda: self.checker.check(step))

    def settle(self) -> Failure | None:
        failure, self.failure = self.failure, None
        return failure


class LockstepMachine(RuleBasedStateMachine):
    """Model and implementation in lockstep; a machine subclasses it with rules.

    Every step is taken by the model at once (the next steps are drawn from its
    state and outcomes) and sent to the implementation, whose outcomes and state
    are checked against the model's; a disagreement fails the program at its
    end (`settle`, in the teardown), whichever executor checked it.

    Steps that repeat a program already sent in this run (Hypothesis often draws
    other choices that make the same commands) are held back and taken by the
    model alone; at the first new step the implementation is reset and sent the
    held steps, then the rest. Only a program that passed joins those sent."""

    spec: MachineSpec
    adapter: Lockstepped
    executor: Executor
    coverage: Coverage
    programs: _Programs  # shared by every program of one bound machine
    remembered: list[int]  # [steps in `programs`], shared the same way
    steps_remembered: int = PROGRAM_STEPS_REMEMBERED
    on_example: Callable[[Coverage], None] | None = None
    shrink_bound: ShrinkBound | None = None
    start: dt.datetime

    def __init__(self) -> None:
        super().__init__()
        without_hypothesis_rule_swarm(self)  # the machines' own swarm switches their rules
        self.swarm = Swarm()  # the set-up draws the program's own
        self.model = self.spec.initial_state(self.start)
        self.commands: list[Any] = []  # this example's commands so far
        self.coverage.last_commands = self.commands
        self._sent_at = self.programs  # this program's place in the trie of programs sent
        self._held: list[_Step] = []  # its steps so far, while it repeats a program sent before
        self._steps: list[tuple[Any, ...]] = []  # the commands of each of its steps
        self._live = False  # whether the implementation has been reset for it

    def begin(self) -> None:
        """Start a program: the first thing a set-up does. The implementation is
        reset when the program first takes a step no program sent before took."""
        self.coverage.generated += 1
        if self.on_example is not None:
            self.on_example(self.coverage)

    def _send_held(self) -> None:
        """Count the example, reset the implementation and send it the held steps."""
        self.coverage.examples += 1
        self._live = True
        self.executor.reset(self.start)
        held, self._held = self._held, []
        for step in held:
            self._send(step)

    def run(self, command: Any) -> Any:
        """One step: the model and the implementation apply `command`; the outcomes and the
        whole states must agree."""
        return self.run_together([command])[0]

    def run_together(self, commands: Sequence[Any], label: str | None = None) -> list[Any]:
        """Several commands as one step: each outcome is compared as it comes, the
        whole state once, after the last (the set-up's way: it is the same every
        program, and a state that went wrong in it is still wrong at its end).
        Returns the outcomes (the model's, which the implementation's must equal)."""
        try:
            state = self.model
            decisions: list[tuple[Any, Decision[Any]] | None] = []
            for command in commands:
                if self.coverage.offers(type(command).__name__):
                    decision = self.spec.decide(state, command)
                    decisions.append((state, decision))
                    state = decision.state
                    self.commands.append(command)
                else:  # never generated for this adapter: neither side runs it
                    self.coverage.skipped[type(command).__name__] += 1
                    decisions.append(None)
            step = _Step(tuple(commands), tuple(decisions), label)
            self._steps.append(step.commands)
            if not self._live and step.commands in self._sent_at:
                self._sent_at = self._sent_at[step.commands]
                self._held.append(step)
            else:
                if not self._live:
                    self._send_held()
                self._send(step)
            self.model = state
            return [None if decided is None else decided[1].outcome for decided in decisions]
        except BaseException:
            self._failed()
            raise

    def _send(self, step: _Step) -> None:
        """Count and check the model's side of `step`, then send it to the implementation."""
        for command, decided in zip(step.commands, step.decisions, strict=True):
            if decided is None:
                continue
            before, decision = decided
            self.coverage.record(before, decision.state, command, decision.outcome, decision.rule)
            violations = self.spec.violations(before, decision.state, decision.outcome)
            if violations:
                raise AssertionError("the model broke its own invariants:\n  " + "\n  ".join(violations))
        self.executor.send(step)

    def _failed(self) -> None:
        """Note the run's first failure: where it was found, and when shrinking starts."""
        if self.coverage.first_failure is None:
            self.coverage.first_failure = self.coverage.examples
            self.coverage.failed_at = self.coverage.generated
            self.coverage.failed_in = self.coverage.generated - self.coverage.discarded
            if self.shrink_bound is not None:
                self.shrink_bound.started = time.monotonic()

    def settle(self) -> None:
        """End the program: wait for the implementation to check every step sent, and
        raise how it failed, if it did. A program that passed joins the programs sent."""
        if not self._live:
            return
        self._live = False
        failure = self.executor.settle()
        if failure is None:
            self._remember()
            return
        self._failed()
        if failure.fault is None:
            raise NonConformance(failure.message)
        program = [self.spec.describe(c) for c in self.commands[: failure.commands]]  # [:None]: all
        raise RunAborted(failure.fault, program) from failure.fault

    def teardown(self) -> None:
        """Hypothesis ends every program here. If the program itself raised (a model
        invariant, an interrupt, Hypothesis's own control flow), that stands: the
        implementation is settled only when nothing is already on its way out.
        A program Hypothesis abandons (`StopTest`: out of choices, or a draw marked
        invalid; `UnsatisfiedAssumption`: a rejected draw) is counted as discarded,
        not as one of the programs max_examples counts."""
        raised = sys.exc_info()[1]
        if raised is None:
            self.settle()
            return
        if isinstance(raised, (StopTest, UnsatisfiedAssumption)) and self.coverage.first_failure is None:
            self.coverage.discarded += 1
            self.coverage.discarded_sent += self._live
        if isinstance(raised, Exception):
            with contextlib.suppress(NonConformance, RunAborted):
                self.settle()

    def _remember(self) -> None:
        """Add this program's steps to the trie of programs sent (up to its size)."""
        at = self.programs
        for commands in self._steps:
            if commands in at:
                at = at[commands]
            elif self.remembered[0] < self.steps_remembered:
                self.remembered[0] += 1
                at[commands] = at = {}
            else:
                return  # the trie is full: the rest of this program is not remembered


M = TypeVar("M", bound=LockstepMachine)


@runtime_checkable
class ChecksItself(Named, Protocol):
    """What stands for an adapter and brings the executor its steps are checked in
    (`ForkedAdapter`: the adapter runs in a process of its own)."""

    def lockstep_executor(self, spec: MachineSpec) -> Executor: ...

    def close(self) -> None: ...


# What the lockstep drives: an adapter, or what checks an adapter's steps itself.
Lockstepped: TypeAlias = SomeAdapter | ChecksItself


def executor_for(adapter: Lockstepped, spec: MachineSpec) -> Executor:
    """Where `adapter`'s steps are checked: its own executor if it brings one (a
    `ForkedAdapter` runs in a process of its own), else here, step by step."""
    return adapter.lockstep_executor(spec) if isinstance(adapter, ChecksItself) else InProcess(spec, adapter)


def bind(
    machine: type[M],
    adapter: Lockstepped,
    coverage: Coverage | None,
    on_example: Callable[[Coverage], None] | None,
    offered: frozenset[str] | None,
) -> type[M]:
    """A machine class bound to one adapter (reused, and reset, across examples)."""
    coverage = coverage if coverage is not None else Coverage()
    coverage.spec = machine.spec
    coverage.offered = offered
    bound = type(
        machine.__name__,
        (machine,),
        {
            "adapter": adapter,
            "executor": executor_for(adapter, machine.spec),
            "coverage": coverage,
            "programs": {},
            "remembered": [0],
            "on_example": staticmethod(on_example) if on_example is not None else None,
        },
    )
    return cast("type[M]", bound)  # a subclass of `machine`, made by type()


def release(bound: type[LockstepMachine]) -> None:
    """Let go of what a bound machine held for its run (made by `bind`). Hypothesis
    keeps every state machine class it ran, with the rules it read from it, for
    the life of the process; without this each run's adapter, executor and trie
    of programs sent (tens of thousands of objects per run) stayed reachable too,
    so a process that runs many (a mutation run's worker, a pytest session) grew
    with every run, and every collection walked all of it."""
    bound.programs = {}
    bound.remembered = [0]
    del bound.adapter, bound.executor  # set by `bind` on this class alone
    bound.on_example = None
    # Hypothesis's own record of the class (its rules and their strategies):
    # private; if a later version keeps it elsewhere, only the class stays.
    getattr(RuleBasedStateMachine, "_setup_state_per_class", {}).pop(bound, None)
