"""The lifecycle machine on PostgreSQL: definition writes, and replica engines.

`LifecycleStore` owns saves and deletions, each one transaction serialized
per coordinate. `ReplicaEngine` is one serving replica: its own connection,
its own TTL cache of enabled records, and the only admission path, one
locking `INSERT … SELECT` that matches the *selected* record against the
current row. Like the delivery store, statements are named class
attributes so a mutant differs in exactly the statement it names.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import psycopg

from leaseproof.impl.delivery.store import FencedWriter
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


def record_params(record: m.Record) -> dict[str, Any]:
    return {
        "community_id": record.community_id,
        "workflow_id": record.workflow_id,
        "owner": record.owner,
        "channel_id": record.channel_id,
        "hash": record.hash,
        "enabled": record.enabled,
        "incarnation": record.incarnation,
        "actions": list(record.actions),
        "revision": record.revision,
    }


class _Writes(FencedWriter):
    """Lifecycle writers: the shared fence check, and the action sink."""

    SQL_EXECUTE = "INSERT INTO executed_actions (run_id, action) SELECT %(run_id)s, unnest(%(actions)s::text[])"

    def execute_actions(self, run_id: int, actions: tuple[str, ...]) -> None:
        """The sink: a real system would act here; we record each action, in order."""
        self.conn.execute(self.SQL_EXECUTE, {"run_id": run_id, "actions": list(actions)})


class LifecycleStore(_Writes):
    """Communities, channel authority, saves and deletions."""

    SQL_LOCK_COORDINATE = """
        SELECT pg_advisory_xact_lock(hashtextextended(
            jsonb_build_array('definition', %(community_id)s::text, %(workflow_id)s::text)::text, 0))
    """
    # Share-locked: a revocation waits for the write that relied on the
    # authority, so no write lands after the revocation that forbids it.
    SQL_HAS_AUTHORITY = """
        SELECT 1 FROM channel_authority
        WHERE community_id = %(community_id)s AND channel_id = %(channel_id)s AND member = %(member)s
        FOR SHARE
    """
    SQL_GRANT = "INSERT INTO channel_authority VALUES (%(community_id)s, %(channel_id)s, %(member)s) ON CONFLICT DO NOTHING"
    SQL_REVOKE = """
        DELETE FROM channel_authority
        WHERE community_id = %(community_id)s AND channel_id = %(channel_id)s AND member = %(member)s
    """
    SQL_HEAD = """
        SELECT author, channel_id, created_at FROM definition_heads
        WHERE community_id = %(community_id)s AND workflow_id = %(workflow_id)s FOR UPDATE
    """
    SQL_CUTOFF = "SELECT cutoff FROM definition_cutoffs WHERE community_id = %(community_id)s AND workflow_id = %(workflow_id)s"
    SQL_UPSERT_HEAD = """
        INSERT INTO definition_heads
            (community_id, workflow_id, event_id, author, channel_id, created_at, actions, enabled)
        VALUES (%(community_id)s, %(workflow_id)s, %(event_id)s, %(owner)s, %(channel_id)s, %(created_at)s,
                %(actions)s, %(signed_enabled)s)
        ON CONFLICT (community_id, workflow_id) DO UPDATE SET
            event_id = excluded.event_id, created_at = excluded.created_at,
            actions = excluded.actions, enabled = excluded.enabled
    """
    SQL_UPSERT_RUNTIME = f"""
        INSERT INTO definition_runtime ({RECORD_COLUMNS})
        VALUES (%(community_id)s, %(workflow_id)s, %(owner)s, %(channel_id)s, %(hash)s, %(enabled)s,
                %(incarnation)s, %(actions)s, %(revision)s)
        ON CONFLICT (community_id, workflow_id) DO UPDATE SET
            hash = excluded.hash, enabled = excluded.enabled, actions = excluded.actions, revision = excluded.revision
    """
    # Tombstone, runtime removal and cutoff, together.
    SQL_DELETE = (
        "DELETE FROM definition_runtime WHERE community_id = %(community_id)s AND workflow_id = %(workflow_id)s",
        "DELETE FROM definition_heads WHERE community_id = %(community_id)s AND workflow_id = %(workflow_id)s",
        """INSERT INTO definition_cutoffs VALUES (%(community_id)s, %(workflow_id)s, %(created_at)s)
           ON CONFLICT (community_id, workflow_id) DO UPDATE SET cutoff = excluded.cutoff""",
    )

    def set_authority(self, c: m.SetAuthority) -> d.Ok:
        params = {"community_id": c.community_id, "channel_id": c.channel_id, "member": c.member}
        with self._transaction():
            self._writable(c.community_id)
            self.conn.execute(self.SQL_GRANT if c.active else self.SQL_REVOKE, params)
        return d.Ok()

    def save(self, c: m.SaveDefinition) -> Any:
        e = c.event
        params: dict[str, Any] = {
            "community_id": e.community_id,
            "workflow_id": e.workflow_id,
            "channel_id": e.channel_id,
            "member": e.author,
        }
        with self._transaction():
            self._writable(e.community_id)
            self.conn.execute(self.SQL_LOCK_COORDINATE, params)
            if self._one(self.SQL_HAS_AUTHORITY, params) is None:
                raise Refused(m.NoAuthority(e.channel_id, e.author))
            head = self._one(self.SQL_HEAD, params)
            if head is not None and (bytes(head["author"]), head["channel_id"]) != (e.author, e.channel_id):
                raise Refused(m.NotAuthor(e.workflow_id, e.author))
            if head is not None and e.created_at <= head["created_at"]:
                return m.Superseded(head["created_at"])
            cutoff = self._one(self.SQL_CUTOFF, params)
            if head is None and cutoff is not None and e.created_at <= cutoff["cutoff"]:
                return m.BeforeCutoff(cutoff["cutoff"])
            # A new coordinate's incarnation is the save's instant. An update keeps the
            # runtime row's own: SQL_UPSERT_RUNTIME's ON CONFLICT does not set it (a
            # coordinate with a head has its runtime row), so it is not read here.
            record = m.project(e, e.created_at)
            row = {
                **record_params(record),
                "event_id": e.event_id,
                "created_at": e.created_at,
                "signed_enabled": e.definition.enabled,
            }
            self.conn.execute(self.SQL_UPSERT_HEAD, row)
            self.conn.execute(self.SQL_UPSERT_RUNTIME, row)
        return m.Created(record.incarnation) if head is None else m.Updated(record.enabled)

    def delete(self, c: m.DeleteDefinition) -> Any:
        params = {"community_id": c.community_id, "workflow_id": c.workflow_id, "created_at": c.created_at}
        with self._transaction():
            self._writable(c.community_id)
            self.conn.execute(self.SQL_LOCK_COORDINATE, params)
            head = self._one(self.SQL_HEAD, params)
            if head is None:
                raise Refused(d.NotFound("workflow", c.community_id, c.workflow_id))
            if bytes(head["author"]) != c.author:
                raise Refused(m.NotAuthor(c.workflow_id, c.author))
            authority = {**params, "channel_id": head["channel_id"], "member": c.author}
            if self._one(self.SQL_HAS_AUTHORITY, authority) is None:
                raise Refused(m.NoAuthority(head["channel_id"], c.author))
            if c.created_at < head["created_at"]:
                return m.Superseded(head["created_at"])
            for sql in self.SQL_DELETE:
                self.conn.execute(sql, params)
        return m.Deleted(c.created_at)

    def alternate_delete(self, c: m.AlternateDelete) -> Any:
        # Every alternate path would split head and runtime: refused, always.
        raise Refused(m.AlternateDeletionRejected(c.path))


class ReplicaEngine(_Writes):
    """One serving replica: its own connection and its own TTL cache."""

    SQL_NOW = "SELECT lp_now() AS now"
    SQL_ENABLED = f"SELECT {RECORD_COLUMNS} FROM definition_runtime WHERE enabled"
    # The only admission path: the selected record must still be the
    # current, active, enabled row in every revision field; the share lock
    # makes definition writers and deleters wait for (or win over) it.
    SQL_ADMIT = """
        INSERT INTO admitted_runs
            (community_id, workflow_id, door, owner, channel_id, hash, enabled, incarnation, actions, revision, admitted_at)
        SELECT r.community_id, r.workflow_id, %(door)s, r.owner, r.channel_id, r.hash, r.enabled,
               r.incarnation, r.actions, r.revision, lp_now()
        FROM (
            SELECT d.* FROM definition_runtime d
            JOIN channel_authority a
              ON a.community_id = d.community_id AND a.channel_id = d.channel_id AND a.member = d.owner
            WHERE d.community_id = %(community_id)s AND d.workflow_id = %(workflow_id)s
              AND d.enabled
              AND d.hash = %(hash)s
              AND d.owner = %(owner)s
              AND d.channel_id = %(channel_id)s
              AND d.incarnation = %(incarnation)s
            FOR SHARE
        ) r
        RETURNING id, revision
    """

    def __init__(self, conn: psycopg.Connection[dict[str, Any]], name: str) -> None:
        super().__init__(conn)
        self.name = name
        self.cache = m.Cache(loaded_at=self._now())

    def _now(self) -> dt.datetime:
        now: dt.datetime = self.conn.execute(self.SQL_NOW).fetchone()["now"]  # type: ignore[index]  # the statement always returns one row
        return now

    def refresh(self) -> None:
        with self._transaction():
            now = self._now()
            rows = self.conn.execute(self.SQL_ENABLED).fetchall()
        records = (record_from_row(row) for row in rows)
        self.cache = m.Cache(now, FrozenMap((r.coordinate, r) for r in records))

    def fire(self, c: m.Fire) -> Any:
        with self._transaction():
            self._writable(c.community_id)  # a refused fire touches nothing, not even the cache
        if self._now() - self.cache.loaded_at >= m.CACHE_TTL:
            self.refresh()
        selected = self.cache.records.get((c.community_id, c.workflow_id))
        if selected is None:
            return m.NotSelected()
        with self._transaction():
            self._writable(c.community_id)
            row = self._one(self.SQL_ADMIT, {**record_params(selected), "door": c.door})
            if row is None:
                return m.AdmissionRefused()
            self.execute_actions(row["id"], selected.actions)
        # The run pins the row it locked: the selected content, at the current revision.
        return m.Admitted(row["id"], attrs.evolve(selected, revision=bytes(row["revision"])))


class RunResumer(_Writes):
    """Resume of an admitted run: only its pinned revision, only while current."""

    # Locked, so resumes of one run take turns: each appends its whole action
    # list, never interleaved with another's in the sink.
    SQL_PINNED = f"SELECT {RECORD_COLUMNS} FROM admitted_runs WHERE id = %(run_id)s FOR NO KEY UPDATE"
    # The admission guard again, for the pinned record.
    SQL_STILL_CURRENT = """
        SELECT 1 FROM definition_runtime d
        JOIN channel_authority a
          ON a.community_id = d.community_id AND a.channel_id = d.channel_id AND a.member = d.owner
        WHERE d.community_id = %(community_id)s AND d.workflow_id = %(workflow_id)s AND d.enabled
          AND d.hash = %(hash)s AND d.owner = %(owner)s AND d.channel_id = %(channel_id)s
          AND d.incarnation = %(incarnation)s AND d.actions = %(actions)s AND d.revision = %(revision)s
        FOR SHARE
    """

    def resume(self, c: m.ResumeRun) -> Any:
        with self._transaction():
            row = self._one(self.SQL_PINNED, {"run_id": c.run_id})
            if row is None:
                raise Refused(m.UnknownRun(c.run_id))
            pinned = record_from_row(row)
            self._writable(pinned.community_id)
            if self._one(self.SQL_STILL_CURRENT, record_params(pinned)) is None:
                return m.ResumeRefused()
            self.execute_actions(c.run_id, pinned.actions)
        return m.Resumed(pinned.actions)
