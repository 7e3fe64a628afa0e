"""The lifecycle machine on PostgreSQL: definition writes, and replica engines.

`LifecycleStore` owns saves and deletions; `ReplicaEngine` is one serving
replica: its own connection, its own TTL cache of enabled records, and the
only admission path. Each operation calls the one database function that
performs it (`impl/migrations/0006_database_api.sql`): a save or a deletion is
serialized per coordinate there, and an admission matches the *selected*
record against the current row in one locking `INSERT … SELECT`. As in the
delivery store, the calls are named class attributes.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import psycopg

from leaseproof.impl.delivery.store import FencedWriter, refuse_community
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as m
from leaseproof.model.errors import Refused
from leaseproof.model.frozenmap import FrozenMap

RECORD_COLUMNS = "community_id, workflow_id, owner, channel_id, hash, enabled, incarnation, actions, revision"


def record_from_row(row: dict[str, Any]) -> m.Record:
    return m.Record(
        community_id=row["community_id"],
        workflow_id=row["workflow_id"],
        owner=bytes(row["owner"]),
        channel_id=row["channel_id"],
        hash=bytes(row["hash"]),
        enabled=row["enabled"],
        incarnation=row["incarnation"],
        actions=tuple(row["actions"]),
        revision=bytes(row["revision"]),
    )


class LifecycleStore(FencedWriter):
    """Channel authority, saves and deletions."""

    SQL_SET_AUTHORITY = """
        SELECT outcome, state FROM lp_set_authority(%(community_id)s, %(channel_id)s, %(member)s, %(active)s)
    """
    SQL_SAVE = """
        SELECT outcome, state, at, enabled FROM lp_save_definition(
            %(event_id)s, %(community_id)s, %(workflow_id)s, %(author)s, %(channel_id)s, %(created_at)s,
            %(actions)s, %(enabled)s)
    """
    SQL_DELETE = """
        SELECT outcome, state, at, channel_id FROM lp_delete_definition(
            %(community_id)s, %(workflow_id)s, %(author)s, %(created_at)s)
    """

    def set_authority(self, c: m.SetAuthority) -> d.Ok:
        params = {"community_id": c.community_id, "channel_id": c.channel_id, "member": c.member, "active": c.active}
        refuse_community(self._call(self.SQL_SET_AUTHORITY, params), c.community_id)
        return d.Ok()

    def save(self, c: m.SaveDefinition) -> Any:
        e = c.event
        params = {
            "event_id": e.event_id,
            "community_id": e.community_id,
            "workflow_id": e.workflow_id,
            "author": e.author,
            "channel_id": e.channel_id,
            "created_at": e.created_at,
            "actions": list(e.definition.actions),
            "enabled": e.definition.enabled,
        }
        row = self._call(self.SQL_SAVE, params)
        refuse_community(row, e.community_id)
        outcome = row["outcome"]
        if outcome == "NoAuthority":
            raise Refused(m.NoAuthority(e.channel_id, e.author))
        if outcome == "NotAuthor":
            raise Refused(m.NotAuthor(e.workflow_id, e.author))
        if outcome == "Superseded":
            return m.Superseded(row["at"])
        if outcome == "BeforeCutoff":
            return m.BeforeCutoff(row["at"])
        if outcome == "Created":
            return m.Created(row["at"])
        return m.Updated(row["enabled"])

    def delete(self, c: m.DeleteDefinition) -> Any:
        params = {
            "community_id": c.community_id,
            "workflow_id": c.workflow_id,
            "author": c.author,
            "created_at": c.created_at,
        }
        row = self._call(self.SQL_DELETE, params)
        refuse_community(row, c.community_id)
        outcome = row["outcome"]
        if outcome == "NotFound":
            raise Refused(d.NotFound("workflow", c.community_id, c.workflow_id))
        if outcome == "NotAuthor":
            raise Refused(m.NotAuthor(c.workflow_id, c.author))
        if outcome == "NoAuthority":
            raise Refused(m.NoAuthority(row["channel_id"], c.author))
        if outcome == "Superseded":
            return m.Superseded(row["at"])
        return m.Deleted(row["at"])

    def alternate_delete(self, c: m.AlternateDelete) -> Any:
        # Every alternate path would split head and runtime: refused, always.
        raise Refused(m.AlternateDeletionRejected(c.path))


class ReplicaEngine(FencedWriter):
    """One serving replica: its own connection and its own TTL cache."""

    SQL_NOW = "SELECT lp_now() AS now"
    SQL_FIRE_CHECK = "SELECT outcome, state, now FROM lp_fire_check(%(community_id)s)"
    SQL_ENABLED = f"SELECT loaded_at, {RECORD_COLUMNS} FROM lp_enabled_records()"
    SQL_ADMIT = """
        SELECT outcome, state, run_id, revision FROM lp_admit(
            %(community_id)s, %(workflow_id)s, %(door)s, %(owner)s, %(channel_id)s, %(hash)s, %(incarnation)s)
    """

    def __init__(self, conn: psycopg.Connection[dict[str, Any]], name: str) -> None:
        super().__init__(conn)
        self.name = name
        self.cache = m.Cache(loaded_at=self._now())

    def _now(self) -> dt.datetime:
        now: dt.datetime = self._call(self.SQL_NOW, {})["now"]
        return now

    def refresh(self) -> None:
        loaded, *rows = self.conn.execute(self.SQL_ENABLED).fetchall()
        records = (record_from_row(row) for row in rows)
        self.cache = m.Cache(loaded["loaded_at"], FrozenMap((r.coordinate, r) for r in records))

    def fire(self, c: m.Fire) -> Any:
        row = self._call(self.SQL_FIRE_CHECK, {"community_id": c.community_id})
        refuse_community(row, c.community_id)  # a refused fire touches nothing, not even the cache
        if row["now"] - self.cache.loaded_at >= m.CACHE_TTL:
            self.refresh()
        selected = self.cache.records.get((c.community_id, c.workflow_id))
        if selected is None:
            return m.NotSelected()
        params = {
            "community_id": selected.community_id,
            "workflow_id": selected.workflow_id,
            "door": c.door,
            "owner": selected.owner,
            "channel_id": selected.channel_id,
            "hash": selected.hash,
            "incarnation": selected.incarnation,
        }
        row = self._call(self.SQL_ADMIT, params)
        refuse_community(row, c.community_id)
        if row["outcome"] == "AdmissionRefused":
            return m.AdmissionRefused()
        # The run pins the row it locked: the selected content, at the current revision.
        return m.Admitted(row["run_id"], attrs.evolve(selected, revision=bytes(row["revision"])))


class RunResumer(FencedWriter):
    """Resume of an admitted run: only its pinned revision, only while current."""

    SQL_RESUME = "SELECT outcome, state, actions, community_id FROM lp_resume_run(%(run_id)s)"

    def resume(self, c: m.ResumeRun) -> Any:
        row = self._call(self.SQL_RESUME, {"run_id": c.run_id})
        if row["outcome"] == "UnknownRun":
            raise Refused(m.UnknownRun(c.run_id))
        refuse_community(row, row["community_id"])
        if row["outcome"] == "ResumeRefused":
            return m.ResumeRefused()
        return m.Resumed(tuple(row["actions"]))
