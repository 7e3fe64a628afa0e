"""The adapter boundary: what an implementation must offer to be checked.

`Adapter` is the one interface every implementation of a machine offers; the
capability protocols name what is optional, and the harness asks for each with
`isinstance` (they are runtime-checkable) instead of probing attributes. The
bundled stores, the forked and wire adapters and the examples are checked
against these types by mypy (tests/conformance/boundary/test_protocols.py); an
adapter loaded at run time is checked by `as_adapter`, with the same names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeAlias, TypeVar, cast, runtime_checkable

from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc

# Every delivery adapter must support these: the harness's set-up and the lease
# lifecycle cannot be checked without them. The others are optional: an
# adapter lists what it offers in `operations`, and the harness never sends
# the rest.
CORE_OPERATIONS = frozenset(
    {
        "CreateCommunity", "CreateWorkflow", "CreateRun", "PublishEvent", "CommitDeliveries",
        "Claim", "Renew", "Finish", "Reap", "AdvanceClock",
    }
)  # fmt: skip
ALL_OPERATIONS = frozenset(op.__name__ for op in m.OUTCOME_VARIANTS)

Command = TypeVar("Command", contravariant=True)
Outcome = TypeVar("Outcome", covariant=True)
State = TypeVar("State", covariant=True)


@runtime_checkable
class Session(Protocol[Command, Outcome]):
    """One more client of an adapter's state, on its own connection.

    Sessions run commands at the same time as each other and as the adapter
    itself; `execute` is as the adapter's. If `execute` raises a connection
    error (psycopg's `OperationalError`, `ConnectionError`, `TimeoutError`) the
    command's outcome is unknown: it is recorded as indeterminate and the
    session is replaced; `close()` must not return while the abandoned command
    can still take effect.
    """

    def execute(self, command: Command) -> Outcome: ...

    def close(self) -> None: ...


@runtime_checkable
class Named(Protocol):
    """Anything the reports name: an adapter, or what stands for one (a `ForkedAdapter`)."""

    @property
    def name(self) -> str:
        """What the reports call the implementation."""


@runtime_checkable
class Adapter(Named, Session[Command, Outcome], Protocol[Command, Outcome, State]):
    """An implementation of one machine, driven command by command."""

    def reset(self, start: dt.datetime) -> None:
        """Forget everything; pin the implementation's clock at `start`."""

    def execute(self, command: Command) -> Outcome:
        """Apply one command. A refusal is returned as its `Rejection` value,
        never raised; `AdvanceClock` moves the pinned clock."""

    def snapshot(self) -> State:
        """Every persisted row and the current clock, as the model's state value."""

    def close(self) -> None:
        """Release connections and other resources."""


DeliveryAdapter: TypeAlias = Adapter[m.Command, m.Outcome, m.DeliverySystem]
LifecycleAdapter: TypeAlias = Adapter[lc.Command, lc.Outcome, lc.LifecycleSystem]
# An adapter of a machine chosen at run time: the harness sends it commands the
# machine's model drew, and compares what comes back with the model's.
SomeAdapter: TypeAlias = Adapter[Any, object, object]


@runtime_checkable
class Concurrent(Protocol):
    """An adapter that can be driven by several clients at once (`leaseproof stress`)."""

    def session(self) -> Session[Any, object]: ...


@runtime_checkable
class Offering(Protocol):
    """An adapter that offers only some operations (at least `CORE_OPERATIONS`)."""

    @property
    def operations(self) -> frozenset[str]: ...


@runtime_checkable
class Versioned(Protocol):
    """An adapter that speaks a version of the wire protocol (`protocol.md`)."""

    @property
    def protocol(self) -> int: ...


@runtime_checkable
class Announcing(Protocol):
    """An adapter whose state lives in databases it names, by machine: where a fault
    injector may end its backends or lock its rows."""

    @property
    def databases(self) -> Mapping[str, str]: ...


@runtime_checkable
class Restartable(Announcing, Protocol):
    """An adapter whose process can be killed and started again (the nemesis's kills)."""

    def why_no_restart(self) -> str:
        """Why it cannot be restarted without losing its state ("" if it can)."""

    def restart(self, settle: Callable[[], None] | None = None) -> None:
        """Kill its process, run `settle`, start it again on the same state."""


REQUIRED = ("name", "reset", "execute", "snapshot", "close")


class NotAnAdapter(TypeError):
    """What a factory handed over at run time is not an `Adapter`: it lacks some of its members."""


def as_adapter(made: object) -> SomeAdapter:
    """`made` (what an `--adapter` factory returned), checked to have every member of `Adapter`;
    raises `NotAnAdapter` naming what it lacks."""
    lacking = [member for member in REQUIRED if not hasattr(made, member)]
    if lacking:
        raise NotAnAdapter(f"the factory returned {made!r}, which lacks {', '.join(lacking)}")
    return cast("SomeAdapter", made)


def offered_operations(adapter: Named) -> frozenset[str]:
    """The operations an adapter offers: its `operations`, else all of them."""
    return adapter.operations if isinstance(adapter, Offering) else ALL_OPERATIONS


def takes_request_keys(adapter: Named) -> bool:
    """Whether claims may carry a request key: an adapter that speaks the wire protocol takes
    them from version 3; one in process always does."""
    return not isinstance(adapter, Versioned) or adapter.protocol >= 3


def announced_database(adapter: Named, machine: str) -> str | None:
    """The database an adapter announces for `machine`, if it announces one."""
    return adapter.databases.get(machine) if isinstance(adapter, Announcing) else None
