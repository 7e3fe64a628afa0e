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


@runtime_checkable
class DeliveryAdapter(Protocol):
    """An implementation of the delivery machine, driven command by command."""

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


DeliveryAdapterFactory = Callable[[], DeliveryAdapter]
