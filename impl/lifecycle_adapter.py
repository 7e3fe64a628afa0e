"""The bundled lifecycle implementation behind the conformance adapter boundary.

Each replica is a real, separate `ReplicaEngine` with its own connection and
its own cache; definition writes go through a `LifecycleStore` on another
connection.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

from leaseproof.impl.lifecycle_store import LifecycleStore, ReplicaEngine, RunResumer, record_from_row
from leaseproof.impl.migrate import migrate
from leaseproof.impl.store import PinnedClock, PostgresDeliveryStore, connect
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as m
from leaseproof.model.errors import Refused
from leaseproof.model.frozenmap import FrozenMap

_RESET = """
    TRUNCATE executed_actions, admitted_runs, definition_runtime, definition_heads, definition_cutoffs,
             channel_authority, communities, lp_clock RESTART IDENTITY CASCADE
"""


class PostgresLifecycleSession:
    """One client of the lifecycle on its own connection: what a concurrent worker drives.

    Definition writes, community changes and resumes run on the session's
    connection. Fires go to the shared replica engines, as requests reach a
    serving replica: each engine serves one request at a time (it has one
    connection), so fires on one replica queue while the other replica,
    the writers and the resumers run concurrently with them.
    """

    def __init__(self, adapter: PostgresLifecycleAdapter) -> None:
        self.conn = connect(adapter.dsn)
        self.clock = PinnedClock(self.conn)
        self.communities = PostgresDeliveryStore(self.conn)
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
        if isinstance(c, m.RefreshCache | m.Fire):
            engine = self.engines.get(c.replica)
            if engine is None:
                raise Refused(m.UnknownReplica(c.replica))
            with self.engine_locks[c.replica]:
                if isinstance(c, m.RefreshCache):
                    engine.refresh()
                    return d.Ok()
                return engine.fire(c)
        handlers = {
            m.SetAuthority: self.store.set_authority,
            m.SaveDefinition: self.store.save,
            m.DeleteDefinition: self.store.delete,
            m.AlternateDelete: self.store.alternate_delete,
            m.ResumeRun: self.resumer.resume,
        }
        return handlers[type(c)](c)

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
    ) -> None:
        self.name = f"postgres:{store_class.__name__}+{engine_class.__name__}+{resumer_class.__name__}"
        self.dsn, self.store_class, self.resumer_class = dsn, store_class, resumer_class
        with connect(dsn) as conn:
            migrate(conn)
        self.engines = {name: engine_class(connect(dsn), name) for name in replicas}
        self.engine_locks = {name: threading.Lock() for name in replicas}
        self.client = PostgresLifecycleSession(self)
        self.conn = self.client.conn
        self.clock = self.client.clock

    def reset(self, start: dt.datetime) -> None:
        with self.conn.transaction():
            self.conn.execute(_RESET)
            self.clock.pin(start)
        for engine in self.engines.values():
            engine.cache = m.Cache(loaded_at=start)

    def execute(self, command: Any) -> Any:
        return self.client.execute(command)

    def session(self) -> PostgresLifecycleSession:
        """Another client of the same database and the same replicas."""
        return PostgresLifecycleSession(self)

    def snapshot(self) -> m.LifecycleSystem:
        with self.conn.transaction():
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            q = self.conn.execute
            now = q("SELECT lp_now() AS now").fetchone()["now"]  # type: ignore[index]
            communities = {r["id"]: d.CommunityState(r["state"]) for r in q("SELECT id, state FROM communities")}
            authority = frozenset(
                (r["community_id"], r["channel_id"], bytes(r["member"])) for r in q("SELECT * FROM channel_authority")
            )
            heads = {
                (r["community_id"], r["workflow_id"]): m.Head(
                    bytes(r["event_id"]),
                    bytes(r["author"]),
                    r["channel_id"],
                    r["created_at"],
                    m.Definition(tuple(r["actions"]), r["enabled"]),
                )
                for r in q("SELECT * FROM definition_heads")
            }
            runtime = {(r["community_id"], r["workflow_id"]): record_from_row(r) for r in q("SELECT * FROM definition_runtime")}
            cutoffs = {(r["community_id"], r["workflow_id"]): r["cutoff"] for r in q("SELECT * FROM definition_cutoffs")}
            runs = {
                r["id"]: m.Run(r["id"], r["door"], record_from_row(r), r["admitted_at"])
                for r in q("SELECT * FROM admitted_runs")
            }
            executed: dict[int, tuple[str, ...]] = {}
            for r in q("SELECT run_id, action FROM executed_actions ORDER BY run_id, seq"):
                executed[r["run_id"]] = executed.get(r["run_id"], ()) + (r["action"],)
        return m.LifecycleSystem(
            now=now,
            communities=FrozenMap(communities),
            authority=authority,
            heads=FrozenMap(heads),
            runtime=FrozenMap(runtime),
            cutoffs=FrozenMap(cutoffs),
            runs=FrozenMap(runs),
            caches=FrozenMap({name: engine.cache for name, engine in self.engines.items()}),
            executed=FrozenMap(executed),
        )

    def close(self) -> None:
        for engine in self.engines.values():
            engine.conn.close()
        self.conn.close()
