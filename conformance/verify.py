"""Run the delivery conformance machine against one adapter and judge it."""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from leaseproof.conformance.boundary import DeliveryAdapter
from leaseproof.conformance.delivery_machine import Coverage, RunAborted, machine_for
from leaseproof.conformance import world as w
from leaseproof.conformance.scenarios import run_scenarios
from leaseproof.conformance.trace import Trace, record


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
    trace: Trace | None = None  # the counterexample as a language-neutral trace


def run_conformance(
    adapter: DeliveryAdapter,
    *,
    max_examples: int,
    seed_value: int,
    steps: int = 50,
    shrink: bool = True,
    scenarios: bool = True,
    on_example: Callable[[Coverage], None] | None = None,
) -> Verdict:
    """Drive `adapter` and the model in lockstep: the fixed scenarios (unless
    `scenarios` is false), then `max_examples` generated programs."""
    coverage = Coverage()
    machine = seed(seed_value)(machine_for(adapter, coverage, on_example))
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    config = settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        phases=phases,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    started = time.monotonic()
    try:
        if scenarios:
            run_scenarios(machine)
        with with_reporter(lambda _: None):  # the program arrives on the exception instead
            run_state_machine_as_test(machine, settings=config)
    except RunAborted as aborted:
        return Verdict(
            conforms=False,
            coverage=coverage,
            seconds=time.monotonic() - started,
            seed=seed_value,
            fault=f"{type(aborted.fault).__name__}: {aborted.fault}",
            fault_program=tuple(getattr(aborted, "__notes__", [])) + tuple(aborted.program),
            trace=record(f"fault of {adapter.name}, seed {seed_value}", w.START, coverage.last_commands),
        )
    except Exception as exc:  # noqa: BLE001 - any failure of the run is the verdict
        return Verdict(
            conforms=False,
            coverage=coverage,
            seconds=time.monotonic() - started,
            seed=seed_value,
            counterexample="\n".join(failing_program(exc)),
            failure=f"{type(exc).__name__}: {exc}",
            trace=record(f"counterexample against {adapter.name}, seed {seed_value}", w.START, coverage.last_commands),
        )
    return Verdict(True, coverage, time.monotonic() - started, seed_value)


def failing_program(exc: BaseException) -> list[str]:
    """The steps of the shrunk failing program, from Hypothesis's notes on `exc`."""
    notes = getattr(exc, "__notes__", [])
    return [line for line in notes if line.startswith(("state", "leases_", "in the fixed scenario"))]
