"""Run a conformance machine against one adapter and judge it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.errors import FlakyFailure
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from leaseproof.conformance.lockstep.core import (
    Coverage,
    LockstepMachine,
    Lockstepped,
    RunAborted,
    ShrinkBound,
    fault_name,
    release,
)
from leaseproof.conformance.lockstep.delivery import machine_for
from leaseproof.conformance.lockstep.delivery_scenarios import SCENARIOS, run_scenarios
from leaseproof.conformance.lockstep.lifecycle import lifecycle_machine_for
from leaseproof.conformance.lockstep.lifecycle_scenarios import LIFECYCLE_SCENARIOS
from leaseproof.conformance.lockstep.swarm import independent_programs, without_local_constants


@attrs.frozen
class Machine:
    """One specified machine: how to bind its lockstep machine, and its fixed scenarios."""

    name: str
    bind: Callable[[Lockstepped, Coverage | None, Callable[[Coverage], None] | None], type[LockstepMachine]]
    scenarios: tuple[Callable[[Any], None], ...]
    traces: bool  # whether its counterexamples can be written as traces


MACHINES: dict[str, Machine] = {
    "delivery": Machine("delivery", machine_for, SCENARIOS, traces=True),
    "lifecycle": Machine("lifecycle", lifecycle_machine_for, LIFECYCLE_SCENARIOS, traces=True),
}


Behaviour = tuple[str, str, str]  # (operation, guard, outcome variant), as the rules declare it


@attrs.frozen
class Behaviours:
    """What a verdict covers of the behaviours the rules declare: the one count
    the subset verdict and the summary both print."""

    declared: tuple[Behaviour, ...]  # every behaviour of the machine, in table order
    checkable: tuple[Behaviour, ...]  # those of the operations the adapter offers
    never: tuple[Behaviour, ...]  # those checkable that the run never exercised

    @property
    def exercised(self) -> int:
        return len(self.checkable) - len(self.never)


@attrs.frozen
class Recorded:
    """A counterexample's commands, in order from the initial state at `world.START`, with the
    machine they are of and a name: what a trace is made of (conformance/traces/trace.py,
    `trace_of`, which owns the trace format)."""

    name: str
    machine: str
    commands: tuple[Any, ...]


@attrs.frozen
class Verdict:
    conforms: bool
    coverage: Coverage
    seconds: float
    seed: int
    counterexample: str = ""  # the minimal failing program, as Hypothesis prints it
    failure: str = ""  # what went wrong in its last step
    fault: str = ""  # the adapter broke: no verdict on conformance, and why
    fault_program: tuple[str, ...] = ()  # where it happened, and the commands run in that program
    recorded: Recorded | None = None  # the counterexample's commands, for a language-neutral trace
    shrink_stopped: str = ""  # why the shrinking of the counterexample ended early, if it did

    @property
    def not_offered(self) -> tuple[str, ...]:
        """The machine's operations the adapter leaves out: never sent, so never checked."""
        spec, offers = self.coverage.spec, self.coverage.offers
        return () if spec is None else tuple(op.__name__ for op in spec.variants if not offers(op.__name__))

    @property
    def behaviours(self) -> Behaviours:
        """The declared behaviours, those checkable through the adapter, and those never exercised."""
        coverage = self.coverage
        if coverage.spec is None:  # nothing ran
            return Behaviours((), (), ())
        declared = tuple(coverage.spec.behaviours())
        return Behaviours(declared, tuple(coverage.checkable_behaviours()), tuple(coverage.missing_behaviours()))

    def counterexample_heading(self, no_scenarios: bool = False) -> str:
        """How the counterexample is introduced: a generated program replays with its seed; a fixed
        scenario is met by every run first, whatever the seed."""
        if self.coverage.first_failure == 0:
            return (
                "counterexample (a fixed scenario: every run checks it first, whatever the seed; --no-scenarios "
                "leaves the scenarios out and lets the search find its own)"
            )
        return f"minimal counterexample (replay with --seed {self.seed}{' --no-scenarios' if no_scenarios else ''})"

    def subset(self) -> str:
        """What a verdict on an adapter that leaves operations out covers ("" if it offers them all)."""
        if not self.not_offered or self.coverage.spec is None:
            return ""
        behaviours = self.behaviours
        return (
            f"{len(behaviours.checkable)} of the {len(behaviours.declared)} behaviours the rules declare are"
            f" checkable through it; not checked: {', '.join(self.not_offered)}"
        )


@attrs.frozen(kw_only=True)
class Run:
    """What one lockstep run does: the fixed scenarios (unless `scenarios` is false), then
    (unless `generate` is false) `max_examples` generated programs of `steps` steps, from
    `seed`; the first failure is shrunk unless `shrink` is false, within `shrink_bound`.

    `hypothesis_settings`: the settings to start from (a profile), whose deadline, phases,
    health checks, verbosity and example database then apply; without it the run has no
    deadline, no database and no health checks. `reporter`: where Hypothesis's own reports
    go (default: nowhere); `on_example`: called after each program with the coverage so far."""

    max_examples: int
    seed: int
    machine: str = "delivery"
    steps: int = 50
    shrink: bool = True
    scenarios: bool = True
    generate: bool = True
    shrink_bound: ShrinkBound | None = None  # None: a fresh ShrinkBound() for each run
    on_example: Callable[[Coverage], None] | None = None
    hypothesis_settings: settings | None = None
    reporter: Callable[[object], None] | None = None

    def __attrs_post_init__(self) -> None:
        if not (self.scenarios or self.generate):
            raise ValueError("nothing to run: neither the scenarios nor generated programs")
        if self.machine not in MACHINES:
            raise ValueError(f"no machine {self.machine!r}: the machines are {sorted(MACHINES)}")

    def hypothesis(self) -> settings:
        """The Hypothesis settings of the generated programs."""
        if self.hypothesis_settings is None:
            phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if self.shrink else [])
            base = settings(deadline=None, database=None, phases=phases, suppress_health_check=list(HealthCheck))
        else:
            phases = [phase for phase in self.hypothesis_settings.phases if self.shrink or phase is not Phase.shrink]
            base = settings(self.hypothesis_settings, phases=phases)
        return settings(
            base,
            max_examples=self.max_examples,
            stateful_step_count=self.steps,
            print_blob=False,
            # Shrink the first failure found: with the default (True) Hypothesis keeps
            # generating after it until a budget or 10 wall-clock seconds run out, so on a
            # slower machine the shrink starts elsewhere and a seed's "minimal" program differs.
            report_multiple_bugs=False,
        )


def run_conformance(adapter: Lockstepped, run: Run) -> Verdict:
    """Drive `adapter` and the model in lockstep as `run` says, and judge it."""
    coverage = Coverage()
    spec = MACHINES[run.machine]
    bound = seed(run.seed)(spec.bind(adapter, coverage, run.on_example))
    bound.shrink_bound = shrink_bound = run.shrink_bound if run.shrink_bound is not None else ShrinkBound()
    started = time.monotonic()
    try:
        if run.scenarios:
            run_scenarios(bound, spec.scenarios)
        if run.generate:
            # The program arrives on the exception, not through the reporter.
            with (
                with_reporter(run.reporter or (lambda _: None)),
                shrink_bound.clock(coverage),
                independent_programs(),
                without_local_constants(),
            ):
                run_state_machine_as_test(bound, settings=run.hypothesis())
    except RunAborted as aborted:
        return Verdict(
            conforms=False,
            coverage=coverage,
            seconds=time.monotonic() - started,
            seed=run.seed,
            fault=f"{fault_name(aborted.fault)}: {aborted.fault}",
            fault_program=tuple(getattr(aborted, "__notes__", [])) + tuple(aborted.program),
        )
    except Exception as exc:  # noqa: BLE001 - any failure of the run is the verdict
        failure = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, FlakyFailure):
            failure = (
                "the implementation answered the same program differently on another run, so it is not "
                "deterministic (for example a query without ORDER BY that returns the first of several rows, "
                "whose order follows the table's physical layout); what the runs saw:\n"
                + "\n".join(f"  {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}" for e in exc.exceptions)
            )
        return Verdict(
            conforms=False,
            coverage=coverage,
            seconds=time.monotonic() - started,
            seed=run.seed,
            counterexample="\n".join(failing_program(exc)),
            failure=failure,
            recorded=_recorded(spec, f"counterexample against {adapter.name}, seed {run.seed}", coverage),
            shrink_stopped=shrink_bound.stopped,
        )
    finally:
        release(bound)
    return Verdict(True, coverage, time.monotonic() - started, run.seed)


def _recorded(machine: Machine, name: str, coverage: Coverage) -> Recorded | None:
    return Recorded(name, machine.name, tuple(coverage.last_commands)) if machine.traces else None


def failing_program(exc: BaseException) -> list[str]:
    """The steps of the shrunk failing program, from Hypothesis's notes on `exc`."""
    notes = getattr(exc, "__notes__", [])
    return [line for line in notes if line.startswith(("state", "leases_", "in the fixed scenario"))]
