"""Concurrent histories: what a run of many clients did, in real-time order.

A history is the raw material of the linearizability checker. Every
operation has an invocation and (unless its outcome is unknown) a
response, both stamped by one logical clock that all clients share, so
"a returned before b was invoked" is exact. Between epochs there are
barriers: points where no operation is in flight, at which the controlled
clock may move and the implementation's full state may be read.

An operation whose response never arrived (its connection was lost, it
timed out, or a fault was injected after it ran) is *indeterminate*: it
may or may not have taken effect, at any point after its invocation and
before the next barrier. It is kept, never dropped and never guessed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import attrs


@attrs.frozen
class Indeterminate:
    """The outcome of an operation whose response never arrived."""

    reason: str = "no response"


# The reason recorded for an answer dropped on purpose (`stress --lose-responses`): the
# operation ran to its end, only its answer is unknown to the harness.
DROPPED = "response dropped (injected)"


@attrs.frozen
class Operation:
    """One call of one client: a model command, and the outcome it was given.

    `invoked` and `returned` are ticks of the history's logical clock;
    `returned` is None exactly when the outcome is `Indeterminate`.
    """

    id: int
    client: str
    command: Any
    outcome: Any
    invoked: int
    returned: int | None

    @property
    def indeterminate(self) -> bool:
        return isinstance(self.outcome, Indeterminate)

    def precedes(self, other: Operation) -> bool:
        """Real-time order: this returned before the other was invoked."""
        return self.returned is not None and self.returned < other.invoked


STALL_KINDS = ("stall", "contention")  # who held a stall's locks (`Stall.by`)


@attrs.frozen
class Stall:
    """A tenant whose rows a connection of the harness's own held locked (a stalled client),
    between two ticks: `began`, taken before it asked for the locks, and `ended`, after it
    had let them go. `patient` is a tick taken a set time before `letting_go`, which is
    taken as it starts to let them go: an operation in flight from before `patient` until
    after `letting_go` was kept waiting at least that long. Not an operation of the
    implementation: what it held lets others skip rows (the checker's allowances), and who
    waited for it is judged apart (conformance/concurrent/stalls.py). A hold of the
    contention injector (`by`, conformance/concurrent/contend.py) is recorded the same
    way, but operations are meant to wait for it: only its allowances apply."""

    key: Any  # the tenant: a community id
    began: int
    patient: int
    letting_go: int
    ended: int
    by: str = attrs.field(default="stall", validator=attrs.validators.in_(STALL_KINDS))

    def overlaps(self, op: Operation) -> bool:
        """`op` was in flight at some moment while the locks may have been held."""
        return op.invoked < self.ended and (op.returned is None or op.returned > self.began)


@attrs.frozen
class Barrier:
    """A quiescent point: every operation invoked before `at` has finished
    (or was abandoned and can no longer take effect), and none is in flight.
    `state` is the implementation's full state read at that point, if read."""

    at: int
    state: Any = None


@attrs.frozen
class History:
    """Everything a concurrent run did, from the state it started in."""

    machine: str
    initial: Any  # the model state the run started from
    operations: tuple[Operation, ...]
    barriers: tuple[Barrier, ...] = ()
    stalls: tuple[Stall, ...] = ()

    def __len__(self) -> int:
        return len(self.operations)

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.operations)


class Recorder:
    """Records a history as clients run; safe to share between threads.

    Each client calls `invoke` just before it sends a command and
    `respond` (or `abandon`) as soon as the answer (or the failure) is in
    hand, so the recorded interval contains the operation's real one.
    """

    def __init__(self, machine: str, initial: Any) -> None:
        self.machine, self.initial = machine, initial
        self._lock = threading.Lock()
        self._ticks = itertools.count(1)
        self._ids = itertools.count(1)
        self._open: dict[int, tuple[str, Any, int]] = {}
        self._done: list[Operation] = []
        self._barriers: list[Barrier] = []
        self._stalls: list[Stall] = []

    def tick(self) -> int:
        """A moment of the history's clock, for what happens beside the operations (a stall)."""
        with self._lock:
            return next(self._ticks)

    def stalled(self, stall: Stall) -> None:
        with self._lock:
            self._stalls.append(stall)

    def invoke(self, client: str, command: Any) -> int:
        with self._lock:
            op_id = next(self._ids)
            self._open[op_id] = (client, command, next(self._ticks))
        return op_id

    def respond(self, op_id: int, outcome: Any) -> Operation:
        with self._lock:
            client, command, invoked = self._open.pop(op_id)
            returned = None if isinstance(outcome, Indeterminate) else next(self._ticks)
            op = Operation(op_id, client, command, outcome, invoked, returned)
            self._done.append(op)
        return op

    def abandon(self, op_id: int, reason: str) -> Operation:
        """The outcome will never be known: record the operation as indeterminate."""
        return self.respond(op_id, Indeterminate(reason))

    def barrier(self, state: Any = None) -> Barrier:
        """Mark a quiescent point; the caller guarantees nothing is in flight."""
        with self._lock:
            if self._open:
                raise RuntimeError(f"a barrier with {len(self._open)} operations in flight")
            mark = Barrier(next(self._ticks), state)
            self._barriers.append(mark)
        return mark

    @property
    def last_state(self) -> Any:
        """The state the latest barrier read (the initial state if none read one)."""
        with self._lock:
            return next((b.state for b in reversed(self._barriers) if b.state is not None), self.initial)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._open)

    def history(self) -> History:
        with self._lock:
            if self._open:
                raise RuntimeError(f"{len(self._open)} operations are still in flight")
            operations = tuple(sorted(self._done, key=lambda op: op.id))
            return History(self.machine, self.initial, operations, tuple(self._barriers), tuple(self._stalls))


@attrs.frozen
class RefusedByTheDatabase:
    """A write that the database's own guards refused (migration 0004: SQLSTATE LP003),
    recorded as the operation's outcome. The model never answers this, so no serial
    order explains a history that holds one: the race is caught, by the database."""

    constraint: str


GUARD_SQLSTATE = "LP003"  # the bundled database's guards (impl/migrations/0004_guards.sql)
