"""The bundled PostgreSQL store behind the conformance adapter boundary."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import psycopg

from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.hooks.clock import PinnedClock, mark_test_database
from leaseproof.impl.hooks.functions import install, patches_of
from leaseproof.impl.migrate import migrate
from leaseproof.model import delivery as m
from leaseproof.model.errors import Refused

# Forget every row of both machines, leaves first. Every community is marked
# deleted first, so the write fence admits the deletes and no delivery id is
# retired; DELETE on these small tables is an order of magnitude cheaper than
# TRUNCATE, which makes new files for every table. Run ids start at 1 again.
RESET = (
    "UPDATE communities SET state = 'deleted'",
    "DELETE FROM executed_actions",
    "DELETE FROM admitted_runs",
    "DELETE FROM definition_runtime",
    "DELETE FROM definition_heads",
    "DELETE FROM definition_cutoffs",
    "DELETE FROM channel_authority",
    "DELETE FROM workflow_agent_deliveries",
    "DELETE FROM retired_delivery_ids",
    "DELETE FROM workflow_runs",
    "DELETE FROM workflows",
    "DELETE FROM events",
    "DELETE FROM communities",
    "SELECT setval(pg_get_serial_sequence('admitted_runs', 'id'), 1, false)",
    "SELECT setval(pg_get_serial_sequence('executed_actions', 'seq'), 1, false)",
)


def reset_database(conn: psycopg.Connection[Any], start: dt.datetime) -> None:
    """Empty every table of both machines and pin the clock at `start`: one
    transaction, pipelined into one round trip. The database is marked a test
    database first (only there may tombstones go and the clock be pinned)."""
    with conn.pipeline(), conn.transaction():
        mark_test_database(conn)
        for statement in RESET:
            conn.execute(statement)
        PinnedClock(conn).pin(start)


Connect = Callable[[str], "psycopg.Connection[Any]"]
"""How the adapters open a connection: `connection.connect`, or a wrapper of it (a benchmark's recorder)."""


class PostgresDeliverySession:
    """One client of the store on its own connection: what a concurrent worker drives."""

    def __init__(self, dsn: str, store_class: type[PostgresDeliveryStore], connect: Connect = connect) -> None:
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

    def __init__(
        self, dsn: str, store_class: type[PostgresDeliveryStore] = PostgresDeliveryStore, connect: Connect = connect
    ) -> None:
        super().__init__(dsn, store_class, connect)
        self.name = f"postgres:{store_class.__name__}"
        self.dsn, self.store_class, self.connect = dsn, store_class, connect
        migrate(self.conn)
        install(self.conn, patches_of(store_class))

    def session(self) -> PostgresDeliverySession:
        """Another client of the same database, on its own connection."""
        return PostgresDeliverySession(self.dsn, self.store_class, self.connect)

    def reset(self, start: dt.datetime) -> None:
        reset_database(self.conn, start)

    def snapshot(self) -> m.DeliverySystem:
        return self.store.snapshot()
