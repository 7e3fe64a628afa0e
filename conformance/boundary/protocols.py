"""The adapter boundary: what an implementation must offer to be checked.

One narrow interface per machine. The conformance machines know nothing
else about an implementation; the bundled PostgreSQL store is just the
first adapter.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from leaseproof.model import delivery as m

# Every adapter must support these: the harness's set-up and the lease
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


def offered_operations(adapter: object) -> frozenset[str]:
    """The operations an adapter offers: its `operations` attribute, else all of them."""
    return frozenset(getattr(adapter, "operations", ALL_OPERATIONS))


def takes_request_keys(adapter: object) -> bool:
    """Whether claims may carry a request key: an adapter that speaks the wire protocol takes
    them from version 3 (its `protocol` attribute); one in process always does."""
    protocol = getattr(adapter, "protocol", None)
    return protocol is None or protocol >= 3


@runtime_checkable
class DeliveryAdapter(Protocol):
    """An implementation of the delivery machine, driven command by command.

    An adapter may also have `operations`, the names of the commands it
    offers (at least `CORE_OPERATIONS`); without it, it offers them all.
    """

    name: str

    def reset(self, start: dt.datetime) -> None:
        """Forget everything; pin the implementation's clock at `start`."""

    def execute(self, command: m.Command) -> m.Outcome:
        """Apply one command. A refusal is returned as its `Rejection` value,
        never raised; `AdvanceClock` moves the pinned clock."""

    def snapshot(self) -> m.DeliverySystem:
        """Every persisted row and the current clock, as the model's state value."""

    def close(self) -> None:
        """Release connections and other resources."""


@runtime_checkable
class Session(Protocol):
    """One more client of an adapter's state, on its own connection.

    An adapter that can be driven concurrently (`leaseproof stress`) has
    `session() -> Session`. Sessions run commands at the same time as each
    other and as the adapter itself; `execute` is as the adapter's. If
    `execute` raises a connection error (psycopg's `OperationalError`,
    `ConnectionError`, `TimeoutError`) the command's outcome is unknown: it
    is recorded as indeterminate and the session is replaced; `close()` must
    not return while the abandoned command can still take effect.
    """

    def execute(self, command: m.Command) -> m.Outcome: ...

    def close(self) -> None: ...


DeliveryAdapterFactory = Callable[[], DeliveryAdapter]
