"""The bundled lifecycle implementation behind the conformance adapter boundary.

Each replica is a real, separate `ReplicaEngine` with its own connection and
its own cache; definition writes go through a `LifecycleStore` on another
connection.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.adapter import Connect, reset_database
from leaseproof.impl.delivery.store import FencedWriter, PostgresDeliveryStore, read_consistently
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.impl.hooks.functions import install, patches_of
from leaseproof.impl.lifecycle.store import RECORD_COLUMNS, LifecycleStore, ReplicaEngine, RunResumer, record_from_row
from leaseproof.impl.migrate import migrate
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as m
from leaseproof.model.errors import Refused
from leaseproof.model.frozenmap import FrozenMap


class PostgresLifecycleSession:
    """One client of the lifecycle on its own connection: what a concurrent worker drives.

    Definition writes, community changes and resumes run on the session's
    connection. Fires go to the shared replica engines, as requests reach a
    serving replica: each engine serves one request at a time (it has one
    connection), so fires on one replica queue while the other replica,
    the writers and the resumers run concurrently with them.
    """

    def __init__(self, adapter: PostgresLifecycleAdapter, conn: Any = None) -> None:
        """`conn`: the session's connection (default: a new one to the adapter's database)."""
        self.conn = adapter.connect(adapter.dsn) if conn is None else conn
        self.clock = PinnedClock(self.conn)
        self.communities = adapter.communities_class(self.conn)
        self.store = adapter.store_class(self.conn)
        self.resumer = adapter.resumer_class(self.conn)
        self.engines = adapter.engines
        self.engine_locks = adapter.engine_locks

    def execute(self, command: Any) -> Any:
        try:
            return self._dispatch(command)
        except Refused as refused:
            return refused.rejection

    def _dispatch(self, c: Any) -> Any:
        if isinstance(c, d.AdvanceClock):
            self.clock.advance(c.by)
            return d.Ok()
        if isinstance(c, d.CreateCommunity | d.SetCommunityState):
            return self.communities.execute(c)
        operation = type(c).__name__
        if isinstance(c, m.RefreshCache | m.Fire):
            engine = self.engines.get(c.replica)
            if engine is None:
                raise Refused(m.UnknownReplica(c.replica))
            with self.engine_locks[c.replica], engine.typed_errors(operation):
                if isinstance(c, m.RefreshCache):
                    engine.refresh()
                    return d.Ok()
                return engine.fire(c)
        handlers: dict[type, tuple[FencedWriter, Callable[[Any], Any]]] = {
            m.SetAuthority: (self.store, self.store.set_authority),
            m.SaveDefinition: (self.store, self.store.save),
            m.DeleteDefinition: (self.store, self.store.delete),
            m.AlternateDelete: (self.store, self.store.alternate_delete),
            m.ResumeRun: (self.resumer, self.resumer.resume),
        }
        writer, handler = handlers[type(c)]
        with writer.typed_errors(operation):
            return handler(c)

    def close(self) -> None:
        self.conn.close()


class PostgresLifecycleAdapter:
    def __init__(
        self,
        dsn: str,
        replicas: tuple[str, ...] = ("r1", "r2"),
        store_class: type[LifecycleStore] = LifecycleStore,
        engine_class: type[ReplicaEngine] = ReplicaEngine,
        resumer_class: type[RunResumer] = RunResumer,
        communities_class: type[PostgresDeliveryStore] = PostgresDeliveryStore,
        connect: Connect = connect,
    ) -> None:
        self.name = f"postgres:{store_class.__name__}+{engine_class.__name__}+{resumer_class.__name__}"
        self.dsn, self.store_class, self.resumer_class = dsn, store_class, resumer_class
        # Community creation and state changes: the delivery store's statements.
        self.communities_class, self.connect = communities_class, connect
        with connect(dsn) as conn:
            migrate(conn)
            install(conn, patches_of(store_class, engine_class, resumer_class, communities_class))
        self.engines = {name: engine_class(connect(dsn), name) for name in replicas}
        self.engine_locks = {name: threading.Lock() for name in replicas}
        self.client = PostgresLifecycleSession(self)
        self.conn = self.client.conn
        self.clock = self.client.clock
        self._tables: dict[int, tuple[list[tuple[Any, ...]], Any]] = {}  # the last snapshot's, by query

    def reset(self, start: dt.datetime) -> None:
        reset_database(self.conn, start)
        for engine in self.engines.values():
            engine.cache = m.Cache(loaded_at=start)

    def execute(self, command: Any) -> Any:
        return self.client.execute(command)

    def session(self) -> PostgresLifecycleSession:
        """Another client of the same database and the same replicas."""
        return PostgresLifecycleSession(self)

    SNAPSHOT_QUERIES = (
        "SELECT lp_now()",
        "SELECT id, state FROM communities",
        "SELECT community_id, channel_id, member FROM channel_authority",
        "SELECT community_id, workflow_id, event_id, author, channel_id, created_at, actions, enabled"
        " FROM definition_heads",
        f"SELECT {RECORD_COLUMNS} FROM definition_runtime",
        "SELECT community_id, workflow_id, cutoff FROM definition_cutoffs",
        f"SELECT id, door, admitted_at, {RECORD_COLUMNS} FROM admitted_runs",
        "SELECT run_id, action FROM executed_actions ORDER BY run_id, seq",
    )

    def snapshot(self) -> m.LifecycleSystem:
        """Every persisted row, the DB clock and every replica's cache (one round trip)."""
        tables = read_consistently(self.conn, self.SNAPSHOT_QUERIES)
        clock, communities, authority, heads, runtime, cutoffs, runs, actions = (
            self._decoded(i, rows) for i, rows in enumerate(tables)
        )
        return m.LifecycleSystem(
            now=clock,
            communities=communities,
            authority=authority,
            heads=heads,
            runtime=runtime,
            cutoffs=cutoffs,
            runs=runs,
            caches=FrozenMap({name: engine.cache for name, engine in self.engines.items()}),
            executed=actions,
        )

    def _decoded(self, query: int, rows: list[tuple[Any, ...]]) -> Any:
        """The model value of one snapshot query's rows; rows equal to the last
        snapshot's are not decoded again (most steps change one table, or none)."""
        last = self._tables.get(query)
        if last is not None and last[0] == rows:
            return last[1]
        value = _DECODE[query](rows)
        self._tables[query] = (rows, value)
        return value

    def close(self) -> None:
        for engine in self.engines.values():
            engine.conn.close()
        self.conn.close()


_RECORD_NAMES = tuple(c.strip() for c in RECORD_COLUMNS.split(","))


def _executed(actions: list[tuple[Any, ...]]) -> FrozenMap[int, tuple[str, ...]]:
    executed: dict[int, tuple[str, ...]] = {}
    for run_id, action in actions:
        executed[run_id] = (*executed.get(run_id, ()), action)
    return FrozenMap(executed)


# How each of SNAPSHOT_QUERIES's results becomes the model's value, in order.
_DECODE: tuple[Callable[[list[tuple[Any, ...]]], Any], ...] = (
    lambda clock: clock[0][0],
    lambda communities: FrozenMap((cid, d.CommunityState(state)) for cid, state in communities),
    lambda authority: frozenset((cid, channel, bytes(member)) for cid, channel, member in authority),
    lambda heads: FrozenMap(
        ((cid, wid), m.Head(bytes(event), bytes(author), channel, created, m.Definition(tuple(acts), enabled)))
        for cid, wid, event, author, channel, created, acts, enabled in heads
    ),
    lambda runtime: FrozenMap((r.coordinate, r) for r in map(_record, runtime)),
    lambda cutoffs: FrozenMap(((cid, wid), cutoff) for cid, wid, cutoff in cutoffs),
    lambda runs: FrozenMap((row[0], m.Run(row[0], row[1], _record(row[3:]), row[2])) for row in runs),
    _executed,
)


def _record(row: tuple[Any, ...]) -> m.Record:
    return record_from_row(dict(zip(_RECORD_NAMES, row, strict=True)))
