"""The stale-replica regression, end to end: two real engine objects, each with
its own cache and its own connection, against the real lifecycle store."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.hooks.clock import PinnedClock, mark_test_database
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.impl.migrate import migrate
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as m

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
C, W, CH = uuid.UUID(int=0xC), uuid.UUID(int=0x33), uuid.UUID(int=0xCC)
ALICE = b"\xaa" * 32
OLD, NEW = m.Definition(("post-summary",)), m.Definition(("post-summary", "page-oncall"))


def _event(at: int, definition: m.Definition) -> m.SaveDefinition:
    event_id = hashlib.sha256(f"{at}/{definition}".encode()).digest()
    return m.SaveDefinition(m.DefinitionEvent(event_id, C, W, ALICE, CH, T0 + dt.timedelta(seconds=at), definition))


class Pods:
    """A writer and two serving replicas, each on its own connection."""

    def __init__(self, dsn: str) -> None:
        self.conn = connect(dsn)
        migrate(self.conn)
        mark_test_database(self.conn)
        PinnedClock(self.conn).pin(T0)
        PostgresDeliveryStore(self.conn).execute(d.CreateCommunity(C))
        self.store = LifecycleStore(self.conn)
        self.store.set_authority(m.SetAuthority(C, CH, ALICE, True))
        assert isinstance(self.store.save(_event(1, OLD)), m.Created)
        self.a, self.b = ReplicaEngine(connect(dsn), "a"), ReplicaEngine(connect(dsn), "b")
        self.a.refresh()
        self.b.refresh()  # both warm with the old revision

    def count(self, table: str) -> int:
        n: int = self.conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]  # type: ignore[index]  # one row
        return n

    def executed(self) -> dict[int, tuple[str, ...]]:
        """Each run's executed actions, in order (the order across runs is not specified)."""
        runs: dict[int, tuple[str, ...]] = {}
        for r in self.conn.execute("SELECT run_id, action FROM executed_actions ORDER BY run_id, seq"):
            runs[r["run_id"]] = (*runs.get(r["run_id"], ()), r["action"])
        return runs

    def fire(self, engine: ReplicaEngine, door: str = "event") -> Any:
        return engine.fire(m.Fire(engine.name, door, C, W))

    def close(self) -> None:
        for conn in (self.conn, self.a.conn, self.b.conn):
            conn.close()


@pytest.fixture
def pods(delivery_dsn: str) -> Iterator[Pods]:
    p = Pods(delivery_dsn)
    yield p
    p.close()


def test_the_replicas_are_separate_engines(pods: Pods) -> None:
    connections = (pods.conn, pods.a.conn, pods.b.conn)
    pids = {c.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"] for c in connections}  # type: ignore[index]  # one row
    assert len(pids) == 3 and pods.a.cache is not pods.b.cache


def _delete(pods: Pods, at: int) -> None:
    assert pods.store.delete(m.DeleteDefinition(C, W, ALICE, T0 + dt.timedelta(seconds=at))) == m.Deleted(
        T0 + dt.timedelta(seconds=at)
    )


def _delete_then_save(definition: m.Definition) -> Callable[[Pods], object]:
    def change(p: Pods) -> object:
        _delete(p, 2)
        return p.store.save(_event(3, definition))

    return change


CHANGES: dict[str, Callable[[Pods], object]] = {
    "update": lambda p: p.store.save(_event(2, NEW)),
    "disable": lambda p: p.store.save(_event(2, m.Definition(("post-summary",), enabled=False))),
    "delete-then-recreate": _delete_then_save(NEW),
    "identical-recreate": _delete_then_save(OLD),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("door", m.DOORS)
def test_a_stale_replica_starts_no_run_and_no_action(pods: Pods, change: str, door: str) -> None:
    CHANGES[change](pods)
    assert pods.fire(pods.b, door) == m.AdmissionRefused()
    assert (pods.count("admitted_runs"), pods.count("executed_actions")) == (0, 0)
    pods.a.refresh()  # positive control: the fresh replica runs the current definition, if any
    outcome = pods.fire(pods.a, door)
    current = pods.conn.execute("SELECT actions FROM definition_runtime WHERE enabled").fetchone()
    if current is None:
        assert outcome == m.NotSelected()
        assert pods.count("executed_actions") == 0
    else:
        assert isinstance(outcome, m.Admitted) and outcome.record.actions == tuple(current["actions"])
        assert outcome.run_id == 1
        assert pods.executed() == {1: tuple(current["actions"])}


def test_a_pinned_run_resumes_only_its_own_revision(pods: Pods) -> None:
    admitted = pods.fire(pods.a)
    assert isinstance(admitted, m.Admitted) and admitted.run_id == 1
    resumer = RunResumer(pods.conn)
    assert resumer.resume(m.ResumeRun(1)) == m.Resumed(OLD.actions)
    pods.store.save(_event(2, NEW))
    assert resumer.resume(m.ResumeRun(1)) == m.ResumeRefused()
    assert pods.executed() == {1: ("post-summary", "post-summary")}
