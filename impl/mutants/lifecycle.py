"""Mutants of the lifecycle implementation: each reintroduces one defect the seed's reviews found.

A mutant replaces the definition store, the replica engine or the resumer
with a variant that differs in one named statement or method.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer, record_from_row, record_params
from leaseproof.impl.mutants.delivery import _swap
from leaseproof.model import lifecycle as m


class AdmissionIgnoresHash(ReplicaEngine):
    SQL_ADMIT = _swap(ReplicaEngine.SQL_ADMIT, "AND d.hash = %(hash)s", "AND %(hash)s::bytea IS NOT NULL")


class AdmissionIgnoresIncarnation(ReplicaEngine):
    SQL_ADMIT = _swap(
        ReplicaEngine.SQL_ADMIT, "AND d.incarnation = %(incarnation)s", "AND %(incarnation)s::timestamptz IS NOT NULL"
    )


class AdmissionByIdOnly(ReplicaEngine):
    """Bare-id admission: any current row of the coordinate admits the cached record."""

    SQL_ADMIT = _swap(
        _swap(
            _swap(ReplicaEngine.SQL_ADMIT, "AND d.hash = %(hash)s", "AND %(hash)s::bytea IS NOT NULL"),
            "AND d.incarnation = %(incarnation)s",
            "AND %(incarnation)s::timestamptz IS NOT NULL",
        ),
        "AND d.enabled",
        "",
    )


class RefreshedAdmissionStaleExecution(ReplicaEngine):
    """The caller refreshes the record for admission but executes its stale parse."""

    SQL_CURRENT = """
        SELECT community_id, workflow_id, owner, channel_id, hash, enabled, incarnation, actions, revision
        FROM definition_runtime WHERE community_id = %(community_id)s AND workflow_id = %(workflow_id)s
    """

    def fire(self, c: m.Fire) -> Any:
        with self.conn.transaction():
            self._writable(c.community_id)
        if self._now() - self.cache.loaded_at >= m.CACHE_TTL:
            self.refresh()
        selected = self.cache.records.get((c.community_id, c.workflow_id))
        if selected is None:
            return m.NotSelected()
        current = self._one(self.SQL_CURRENT, {"community_id": c.community_id, "workflow_id": c.workflow_id})
        fresh = record_from_row(current) if current is not None else selected
        with self.conn.transaction():
            row = self._one(self.SQL_ADMIT, {**record_params(fresh), "door": c.door})
            if row is None:
                return m.AdmissionRefused()
            self.execute_actions(row["id"], selected.actions)
        return m.Admitted(row["id"], selected)


class CacheNeverExpires(ReplicaEngine):
    """The TTL is never honoured: a replica serves its first load forever."""

    def fire(self, c: m.Fire) -> Any:
        self.cache = attrs.evolve(self.cache, loaded_at=self._now())
        return super().fire(c)


class ReportEnforcementSplits(LifecycleStore):
    """Moderation report enforcement deletes through its own path: it tombstones the
    head (the schema's cascade takes the runtime row with it) and records no cutoff."""

    SQL_TOMBSTONE = "DELETE FROM definition_heads WHERE community_id = %(community_id)s AND workflow_id = %(workflow_id)s"

    def alternate_delete(self, c: m.AlternateDelete) -> Any:
        if not c.path.startswith("report-enforcement"):
            return super().alternate_delete(c)
        with self.conn.transaction():
            self.conn.execute(self.SQL_TOMBSTONE, {"community_id": c.community_id, "workflow_id": c.workflow_id})
        return m.AlternateDeletionRejected(c.path)


class CutoffIgnored(LifecycleStore):
    """Delayed saves are not checked against the deletion cutoff."""

    SQL_CUTOFF = _swap(LifecycleStore.SQL_CUTOFF, "WHERE community_id", "WHERE false AND community_id")


class ResumeReloadsCurrent(RunResumer):
    """The residual risk the reviewers named: resume reloads the current definition."""

    SQL_PINNED = _swap(
        RunResumer.SQL_PINNED,
        "FROM admitted_runs WHERE id = %(run_id)s",
        "FROM (SELECT d.* FROM admitted_runs r JOIN definition_runtime d USING (community_id, workflow_id)"
        " WHERE r.id = %(run_id)s) current_row",
    )


@attrs.frozen
class LifecycleMutant:
    name: str
    stands_for: str
    store: type[LifecycleStore] = LifecycleStore
    engine: type[ReplicaEngine] = ReplicaEngine
    resumer: type[RunResumer] = RunResumer
    machine: ClassVar[str] = "lifecycle"

    def adapter(self, dsn: str) -> PostgresLifecycleAdapter:
        """The bundled lifecycle adapter running this mutant's classes, on the database `dsn`."""
        return PostgresLifecycleAdapter(dsn, store_class=self.store, engine_class=self.engine, resumer_class=self.resumer)


LIFECYCLE_MUTANTS: tuple[LifecycleMutant, ...] = (
    LifecycleMutant("admission-ignores-hash", "a stale replica admits a superseded or disabled revision", engine=AdmissionIgnoresHash),
    LifecycleMutant("admission-ignores-incarnation", "a stale replica admits across an identical recreation", engine=AdmissionIgnoresIncarnation),
    LifecycleMutant("admission-by-id", "bare-id admission: no selected-record match at all", engine=AdmissionByIdOnly),
    LifecycleMutant("refreshed-admission-stale-execution", "admits the refreshed record, executes the stale parse", engine=RefreshedAdmissionStaleExecution),
    LifecycleMutant("cache-never-expires", "a replica serves its cache past the TTL", engine=CacheNeverExpires),
    LifecycleMutant("report-enforcement-splits", "report enforcement deletes outside the canonical path, with no cutoff", store=ReportEnforcementSplits),
    LifecycleMutant("cutoff-ignored", "a delayed save at or before the cutoff revives a deleted coordinate", store=CutoffIgnored),
    LifecycleMutant("resume-reloads-current", "a resumed run executes the current definition, not its pinned one", resumer=ResumeReloadsCurrent),
)
