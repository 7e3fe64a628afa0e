"""The implementation checked in a process of its own (`ForkedAdapter`): the same
verdicts, counterexamples and faults as in process, and a child that dies is a
fault, never a pass."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from leaseproof.conformance.lockstep.core import ShrinkBound
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.conformance.lockstep.verify import Run, Verdict, run_conformance
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS
from leaseproof.model import delivery as m


def _both(factory: Callable[[], Any], machine: str, **run: Any) -> tuple[Verdict, Verdict]:
    """The verdict of one run with the adapter in process, then of the same run forked.
    Their shrinking is bounded by its attempts alone: a time bound, on a loaded machine,
    may end the two at different programs (and says so)."""
    verdicts = []
    for adapter in (factory(), ForkedAdapter(factory, machine)):
        try:
            bound = ShrinkBound(seconds=math.inf)
            verdicts.append(run_conformance(adapter, Run(machine=machine, shrink_bound=bound, **run)))
        finally:
            adapter.close()
    return verdicts[0], verdicts[1]


def _same(inline: Verdict, forked: Verdict) -> None:
    assert not inline.shrink_stopped and not forked.shrink_stopped
    assert (forked.conforms, forked.failure, forked.counterexample) == (
        inline.conforms,
        inline.failure,
        inline.counterexample,
    )
    assert (forked.fault, forked.fault_program) == (inline.fault, inline.fault_program)
    a, b = inline.coverage, forked.coverage
    assert (b.generated, b.scenarios, b.first_failure, b.failed_at) == (
        a.generated, a.scenarios, a.first_failure, a.failed_at
    )  # fmt: skip
    # A shrink's attempts are the same in number and end at the same program, but
    # which of them repeat a program already sent, and so are not sent again, and
    # how many steps they run differ by one or a few between any two runs, in
    # process too (seen: 131 and 130 programs sent of 184; not yet explained).
    if inline.conforms:
        assert (b.examples, b.steps, b.behaviours) == (a.examples, a.steps, a.behaviours)


def test_a_conforming_run_is_the_same_run_forked(delivery_dsn: str) -> None:
    inline, forked = _both(lambda: PostgresDeliveryAdapter(delivery_dsn), "delivery", max_examples=15, seed=4)
    assert inline.conforms, inline.failure
    _same(inline, forked)


@pytest.mark.parametrize(
    ("mutants", "name", "machine", "seed"),
    [(MUTANTS, "claim-scope-unchecked", "delivery", 3), (LIFECYCLE_MUTANTS, "admission-by-id", "lifecycle", 3)],
    ids=["delivery", "lifecycle"],
)
def test_the_same_seed_prints_the_same_counterexample_forked(
    delivery_dsn: str, mutants: Any, name: str, machine: str, seed: int
) -> None:
    mutant = by_name(mutants, name)
    inline, forked = _both(lambda: mutant.adapter(delivery_dsn), machine, max_examples=300, seed=seed, scenarios=False)
    assert not inline.conforms and not inline.fault
    assert "state." in inline.counterexample
    _same(inline, forked)


def test_the_lifecycle_scenarios_pass_forked(delivery_dsn: str) -> None:
    inline, forked = _both(lambda: PostgresLifecycleAdapter(delivery_dsn), "lifecycle", max_examples=5, seed=2)
    assert inline.conforms, inline.failure
    _same(inline, forked)


class _RaisesOnFinish(PostgresDeliveryAdapter):
    """Raises `error()` instead of answering the first Finish it is sent."""

    error: Callable[[], BaseException] = staticmethod(lambda: RuntimeError("the finish broke"))

    def execute(self, command: m.Command) -> m.Outcome:
        if isinstance(command, m.Finish):
            raise self.error()
        return super().execute(command)


def test_an_adapter_that_raises_is_the_same_fault_forked(delivery_dsn: str) -> None:
    inline, forked = _both(lambda: _RaisesOnFinish(delivery_dsn), "delivery", max_examples=50, seed=1)
    assert inline.fault == "RuntimeError: the finish broke"
    assert inline.fault_program and inline.fault_program[-1].startswith("Finish(")
    _same(inline, forked)


def test_an_exception_that_cannot_travel_keeps_its_name(delivery_dsn: str) -> None:
    class LocalError(Exception):  # defined here: pickle cannot find it by name
        pass

    class Raises(_RaisesOnFinish):
        error = staticmethod(lambda: LocalError("only here"))

    inline, forked = _both(lambda: Raises(delivery_dsn), "delivery", max_examples=50, seed=1)
    assert inline.fault == "LocalError: only here"
    _same(inline, forked)


class _DiesOnFinish(PostgresDeliveryAdapter):
    def execute(self, command: m.Command) -> m.Outcome:
        if isinstance(command, m.Finish):
            os._exit(3)  # the child process dies mid-step
        return super().execute(command)


def test_a_child_that_dies_is_a_fault_not_a_verdict(delivery_dsn: str) -> None:
    adapter = ForkedAdapter(lambda: _DiesOnFinish(delivery_dsn), "delivery")
    try:
        verdict = run_conformance(adapter, Run(max_examples=50, seed=1))
    finally:
        adapter.close()
    assert not verdict.conforms
    assert verdict.fault.startswith("ChildFailed: the process running the delivery adapter stopped answering")
    assert "exited with status 3" in verdict.fault


def test_a_factory_that_fails_raises_its_error() -> None:
    def broken() -> Any:
        raise ValueError("no such database")

    with pytest.raises(ValueError, match="no such database"):
        ForkedAdapter(broken, "delivery")


def test_the_child_carries_the_adapters_name_and_ends_with_the_pipe(delivery_dsn: str) -> None:
    adapter = ForkedAdapter(lambda: PostgresDeliveryAdapter(delivery_dsn), "delivery")
    assert adapter.name == "postgres:PostgresDeliveryStore"
    process = adapter._process
    adapter._conn.close()  # as if the harness died: the child reads the end of its pipe
    process.join(30)
    assert process.exitcode == 0


def test_a_forked_adapter_serves_only_its_machine(delivery_dsn: str) -> None:
    adapter = ForkedAdapter(lambda: PostgresDeliveryAdapter(delivery_dsn), "delivery")
    try:
        with pytest.raises(ValueError, match="built for the delivery machine"):
            run_conformance(adapter, Run(machine="lifecycle", max_examples=1, seed=1))
    finally:
        adapter.close()
    assert not adapter._process.is_alive()


_HARNESS = """
import sys, time
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
adapter = ForkedAdapter(lambda: PostgresDeliveryAdapter(sys.argv[1]), "delivery")
print(adapter._process.pid, flush=True)
time.sleep(600)
"""


def test_a_harness_killed_outright_leaves_no_child(delivery_dsn: str) -> None:
    """SIGKILL gives the harness no chance to close anything: the child sees the end
    of its pipe, closes its adapter (its connection) and exits."""
    harness = subprocess.Popen([sys.executable, "-c", _HARNESS, delivery_dsn], stdout=subprocess.PIPE, text=True)
    try:
        assert harness.stdout is not None
        child = int(harness.stdout.readline())
    finally:
        harness.kill()
        harness.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)  # waiting for another process to exit, not for time to pass
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its dead parent's reaper) has exited too
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"
