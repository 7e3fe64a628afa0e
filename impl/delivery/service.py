"""The delivery store as a service holds it: a DSN, not a connection.

`PostgresDeliveryStore` is one connection and dies with it. `DeliveryService` keeps the
store's typed errors and adds what a long-running worker needs when its connection is
lost: the next call reconnects, and a call is sent again (once, by default) when that is
safe: always when the connection was lost before the COMMIT (`ConnectionLost(applied=False)`),
and when it was lost while committing (`applied=None`) only if the model declares the
command safe to send again (`leaseproof.model.delivery.RESENDS`); the resend's answer says
what happened. A claim without a key whose outcome is unknown is raised to the caller.
`Unavailable` (load, not a lost answer) is raised as it is, but a resend that fails tells
the caller the first call's `ConnectionLost(applied=None)`, never that nothing took
effect. `resent_at` says when a call's answer came from a resend, which an audit needs to
tell a first attempt that never ran from one that settled. docs/bounded-waits.md says more.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import psycopg

from leaseproof.impl.connection import WAITS, Waits, connect
from leaseproof.impl.delivery.store import PostgresDeliveryStore, Sweep
from leaseproof.impl.errors import ConnectionLost, Unavailable
from leaseproof.model import delivery as m
from leaseproof.model.errors import Refused

Connect = Callable[[str, Waits], Any]


def may_resend(command: m.Command, lost: ConnectionLost) -> bool:
    """Whether `command`, whose connection was lost as `lost` says, may be sent again as it is."""
    return lost.applied is False or m.RESENDS[type(command)].safe_for(command)


class DeliveryService:
    """The delivery machine behind a DSN: reconnects, and resends a call when it is safe.

    Not thread-safe (one connection at a time, as the store)."""

    def __init__(
        self,
        dsn: str,
        waits: Waits = WAITS,
        *,
        resends: int = 1,
        store_class: type[PostgresDeliveryStore] = PostgresDeliveryStore,
        connect: Connect = connect,
    ) -> None:
        if resends < 0:
            raise ValueError(f"resends must be 0 or more, not {resends}")
        self.dsn, self.waits, self.resends = dsn, waits, resends
        self.store_class, self._connect = store_class, connect
        self._store: PostgresDeliveryStore | None = None
        self.connections = 0  # how many connections it has opened
        self.resent_at: float | None = None  # the last call's: when its answering resend was sent

    def execute(self, command: m.Command) -> m.Outcome:
        """Run one model command, as `PostgresDeliveryStore.execute` does, on a live connection."""
        return self._call(type(command).__name__, command, lambda store: store.execute(command))

    def sweep(self) -> Sweep:
        """The reaper's sweep (`PostgresDeliveryStore.sweep`), sent again as a `Reap` would be."""
        return self._call("Sweep", m.Reap(), lambda store: store.sweep())  # type: ignore[no-any-return]

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> DeliveryService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, operation: str, command: m.Command, call: Callable[[PostgresDeliveryStore], Any]) -> Any:
        attempt = 0
        unknown: ConnectionLost | None = None  # an earlier attempt's, whose outcome nobody knows
        self.resent_at = None
        while True:
            try:
                store = self._live(operation)
                if attempt:
                    self.resent_at = time.time()
                return call(store)
            except (Unavailable, Refused):  # no server, a bound reached, a refusal: nothing done *this* time
                if (
                    unknown is not None
                ):  # a resend's failure says nothing of the first call, which may have taken effect
                    raise unknown from unknown.__cause__
                raise
            except ConnectionLost as lost:
                self._drop()
                if lost.applied is not False:
                    unknown = unknown or lost
                if attempt >= self.resends or not may_resend(command, lost):
                    if unknown is not None and unknown is not lost:
                        raise unknown from unknown.__cause__  # the first call's outcome is still unknown
                    raise
                attempt += 1

    def _live(self, operation: str) -> PostgresDeliveryStore:
        if self._store is not None:  # a connection found dead is dropped by _call, and not before
            return self._store
        try:
            conn = self._connect(self.dsn, self.waits)
        except psycopg.OperationalError as exc:
            raise Unavailable(operation, f"cannot connect to the server ({str(exc).strip()})") from exc
        self.connections += 1
        self._store = self.store_class(conn)
        return self._store

    def _drop(self) -> None:
        if self._store is not None:
            with contextlib.suppress(psycopg.Error):  # it is gone already
                self._store.conn.close()
            self._store = None
