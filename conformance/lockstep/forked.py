"""An adapter checked in a process of its own, while the next steps are drawn.

In one process the lockstep takes turns: the database waits while the harness draws a step,
and the harness waits while the database works. `ForkedAdapter` builds the adapter in a
forked child (so its factory need not be importable or picklable: a mutant's classes made at
run time serve as well) and hands it each step as soon as the model has taken it. The child
keeps a model of its own (deterministic, so it decides the same), takes each step on it,
sends the step to the adapter and compares outcomes and state as `StepChecker` does in
process. The harness asks for the verdict only at the end of each program
(`Executor.settle`), where an in-process run reports it too, so the same seed prints the same
counterexample either way. Every wait on the child is bounded by its being alive (if it dies,
the run stops with a fault); if the harness dies, the child reads the end of its pipe and
exits. Where `fork` is not available, the adapter is built and checked in process.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing
import pickle
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import attrs

from leaseproof.conformance.boundary.protocols import SomeAdapter
from leaseproof.conformance.lockstep.core import (
    Executor,
    Failure,
    ImplementationRaised,
    InProcess,
    MachineSpec,
    StepChecker,
    _Step,
)
from leaseproof.model.rules import Decision

POLL_SECONDS = 1.0  # how often a wait for the child checks that it is still alive
CLOSE_SECONDS = 30.0  # how long closing waits for the child to close its adapter and exit


class ChildFailed(Exception):
    """The child process that runs the adapter died or could not build it."""


def _specs() -> dict[str, MachineSpec]:
    from leaseproof.conformance.lockstep.delivery import DeliveryConformance
    from leaseproof.conformance.lockstep.lifecycle import LifecycleConformance

    return {"delivery": DeliveryConformance.spec, "lifecycle": LifecycleConformance.spec}


def _metadata(adapter: SomeAdapter) -> dict[str, object]:
    """What the lockstep reads of an adapter besides its calls: its name, and its
    `operations` and `protocol` where it has them."""
    return {name: getattr(adapter, name) for name in ("name", "operations", "protocol") if hasattr(adapter, name)}


def _portable(fault: BaseException) -> BaseException:
    """`fault` if it survives pickling, else its type name and text."""
    try:
        pickle.loads(pickle.dumps(fault))
    except Exception:  # noqa: BLE001 - any exception that does not travel is described instead
        return ImplementationRaised(type(fault).__name__, str(fault))
    return fault


def _child(conn: Connection, harness_end: Connection, factory: Callable[[], SomeAdapter], machine: str) -> None:
    """The child's side: build the adapter, then take requests until "close" or the pipe's end.
    `harness_end`, the other end, came along with the fork: closed, so that the harness's
    death is the pipe's end here."""
    harness_end.close()
    # A Ctrl-C or a hangup reaches the whole process group: the harness handles
    # it and closes this child, which must not die first in the middle of a step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    for each in (signal.SIGTERM, signal.SIGALRM):
        signal.signal(each, signal.SIG_DFL)
    try:
        adapter = factory()
        metadata = _metadata(adapter)
    except Exception as exc:  # noqa: BLE001 - sent to the harness, which raises it
        conn.send(("error", _portable(exc)))
        return
    try:
        # A broken pipe is the harness gone too, or closed with a reply unread.
        with contextlib.suppress(EOFError, OSError):
            conn.send(("ready", metadata))
            _Child(_specs()[machine], adapter).serve(conn)
    finally:
        adapter.close()
        conn.close()


@attrs.define
class _Started:
    """A program the child started on its own: reset at `start`, its first step
    `request` taken, leaving the model at `state` and `failure`."""

    start: dt.datetime
    request: tuple[Any, ...]
    state: Any
    failure: Failure | None
    sent: int


class _Child:
    """The child's model and checker, and the program it is checking.

    While the harness draws the next program, the child would wait. Instead,
    after each verdict, it starts the next program as the last one started (a
    reset, then the same first step: a machine's set-up, the same for every
    program), and keeps that start if the next program's reset and first step
    are those; otherwise it resets again. The implementation is sent the same
    commands from the same reset either way."""

    def __init__(self, spec: MachineSpec, adapter: SomeAdapter) -> None:
        self.spec, self.checker = spec, StepChecker(spec, adapter)
        self.state: Any = None
        self.failure: Failure | None = None
        self.start: dt.datetime | None = None  # the reset of the program being checked
        self.first: tuple[Any, ...] | None = None  # its first step's request, once it came
        self.started: _Started | None = None  # the next program, started ahead

    def serve(self, conn: Connection) -> None:
        """Answer requests until "close"; the pipe's end raises (EOFError, OSError)."""
        while True:
            request = conn.recv()
            what = request[0]
            if what == "reset":
                self.start, self.first = request[1], None
            elif what == "step":
                self.step(request)
            elif what == "settle":
                failure, self.failure = self.failure, None
                if failure is not None and failure.fault is not None:
                    failure = attrs.evolve(failure, fault=_portable(failure.fault))
                conn.send(("settled", failure))
                self.start_ahead()
            else:  # "close"
                return

    def step(self, request: tuple[Any, ...]) -> None:
        if self.first is None:  # the program's first step: start it, or take the start made ahead
            assert self.start is not None
            self.first = request
            started, self.started = self.started, None
            if started is not None and started.start == self.start and started.request == request:
                self.state, self.failure, self.checker.sent = started.state, started.failure, started.sent
                return
            self.reset(self.start)
        self.take(request)

    def take(self, request: tuple[Any, ...]) -> None:
        """The model's decisions for a step, and the implementation's check of it."""
        if self.failure is not None:
            return
        commands, offered, label = request[1], request[2], request[3]
        decisions: list[tuple[Any, Decision[Any]] | None] = []
        for command, sent in zip(commands, offered, strict=True):
            if not sent:
                decisions.append(None)
                continue
            decision = self.spec.decide(self.state, command)
            decisions.append((self.state, decision))
            self.state = decision.state
        step = _Step(commands, tuple(decisions), label)
        self.failure = self.checker.run(lambda: self.checker.check(step))

    def reset(self, start: dt.datetime) -> None:
        self.state = self.spec.initial_state(start)
        self.failure = self.checker.run(lambda: self.checker.reset(start))

    def start_ahead(self) -> None:
        """Reset and take the first step of the program just settled, for the next one."""
        if self.start is None or self.first is None:
            return
        start, first = self.start, self.first
        self.start = self.first = None
        self.reset(start)
        self.take(first)
        self.started = _Started(start, first, self.state, self.failure, self.checker.sent)
        self.failure = None


class ForkedExecutor:
    """The harness's side of a child that checks the steps: each request is sent
    without waiting; `settle` waits (while the child lives) for the verdict."""

    def __init__(self, owner: ForkedAdapter) -> None:
        self.owner = owner
        self.lost: ChildFailed | None = None  # the child died: every program fails with this fault

    def reset(self, start: dt.datetime) -> None:
        self._send(("reset", start))

    def send(self, step: _Step) -> None:
        offered = tuple(decided is not None for decided in step.decisions)
        self._send(("step", step.commands, offered, step.label))

    def _send(self, request: tuple[Any, ...]) -> None:
        if self.lost is None:
            try:
                self.owner._send(request)
            except ChildFailed as lost:
                self.lost = lost

    def settle(self) -> Failure | None:
        self._send(("settle",))
        if self.lost is None:
            try:
                failure: Failure | None = self.owner._receive()[1]
                return failure
            except ChildFailed as lost:
                self.lost = lost
        return Failure(str(self.lost), None, self.lost)


class ForkedAdapter:
    """An adapter that `factory()` builds in a child process, for the lockstep
    (`run_conformance`) of machine `machine`. It carries the adapter's name,
    `operations` and `protocol`; `close()` closes the adapter and ends the child."""

    name: str  # the adapter's (its `operations` and `protocol` too, where it has them)

    def __init__(self, factory: Callable[[], SomeAdapter], machine: str) -> None:
        self.machine = machine
        if "fork" not in multiprocessing.get_all_start_methods():
            self._local: SomeAdapter | None = factory()  # no fork here: the adapter runs in process
            vars(self).update(_metadata(self._local))
            return
        self._local = None
        context = multiprocessing.get_context("fork")
        self._conn, child_end = context.Pipe()
        self._process = context.Process(
            target=_child,
            args=(child_end, self._conn, factory, machine),
            name=f"leaseproof {machine} adapter",
            daemon=True,
        )
        try:
            self._process.start()
            child_end.close()
            reply = self._receive()
        except BaseException:  # an interrupt included: no child outlives a half-built adapter
            child_end.close()
            self._stop()
            raise
        if reply[0] == "error":
            self._stop()
            raise reply[1]
        vars(self).update(reply[1])

    def lockstep_executor(self, spec: MachineSpec) -> Executor:
        """The lockstep core's way in (`core.executor_for`)."""
        if spec.name != self.machine:
            raise ValueError(f"this adapter was built for the {self.machine} machine, not {spec.name}")
        if self._local is not None:
            return InProcess(spec, self._local)
        return ForkedExecutor(self)

    def _send(self, request: tuple[Any, ...]) -> None:
        try:
            self._conn.send(request)
        except OSError as exc:  # a broken pipe, a reset connection
            raise ChildFailed(self._death()) from exc

    def _receive(self) -> Any:
        while not self._conn.poll(POLL_SECONDS):
            if not self._process.is_alive():
                raise ChildFailed(self._death())
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise ChildFailed(self._death()) from None
        except Exception as exc:  # a reply that cannot be read is the child's failure
            raise ChildFailed(
                f"a reply from the process running the {self.machine} adapter could not be read: {exc}"
            ) from exc

    def _death(self) -> str:
        self._process.join(POLL_SECONDS)
        code = self._process.exitcode
        how = "is still running" if code is None else f"exited with status {code}"
        return f"the process running the {self.machine} adapter stopped answering (it {how})"

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            return
        with contextlib.suppress(OSError):  # it may be gone already
            self._conn.send(("close",))
        self._stop()

    def _stop(self) -> None:
        """End the pipe (the child, reading its end, closes its adapter and exits), wait
        (bounded) for the child to exit, and kill it past the bound."""
        self._conn.close()
        if self._process.pid is None:
            return  # never started
        self._process.join(CLOSE_SECONDS)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
