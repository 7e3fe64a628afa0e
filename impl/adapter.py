"""The bundled PostgreSQL store behind the conformance adapter boundary."""

from __future__ import annotations

import datetime as dt

from leaseproof.impl.migrate import migrate
from leaseproof.impl.store import PinnedClock, PostgresDeliveryStore, connect
from leaseproof.model import delivery as m
from leaseproof.model.errors import Refused

_RESET = """
    TRUNCATE workflow_agent_deliveries, retired_delivery_ids, workflow_runs, workflows, events, communities, lp_clock
        CASCADE
"""


class PostgresDeliverySession:
    """One client of the store on its own connection: what a concurrent worker drives."""

    def __init__(self, dsn: str, store_class: type[PostgresDeliveryStore]) -> None:
        self.conn = connect(dsn)
        self.store = store_class(self.conn)
        self.clock = PinnedClock(self.conn)

    def execute(self, command: m.Command) -> m.Outcome:
        if isinstance(command, m.AdvanceClock):
            self.clock.advance(command.by)
            return m.Ok()
        try:
            return self.store.execute(command)
        except Refused as refused:
            return refused.rejection

    def close(self) -> None:
        self.conn.close()


class PostgresDeliveryAdapter(PostgresDeliverySession):
    """Drives a `PostgresDeliveryStore` (or a variant of it) on one database."""

    def __init__(self, dsn: str, store_class: type[PostgresDeliveryStore] = PostgresDeliveryStore) -> None:
        super().__init__(dsn, store_class)
        self.name = f"postgres:{store_class.__name__}"
        self.dsn, self.store_class = dsn, store_class
        migrate(self.conn)

    def session(self) -> PostgresDeliverySession:
        """Another client of the same database, on its own connection."""
        return PostgresDeliverySession(self.dsn, self.store_class)

    def reset(self, start: dt.datetime) -> None:
        with self.conn.transaction():
            self.conn.execute(_RESET)
            self.clock.pin(start)

    def snapshot(self) -> m.DeliverySystem:
        return self.store.snapshot()
