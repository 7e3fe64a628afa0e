"""Mutants of the lifecycle implementation: each reintroduces one defect the seed's reviews found.

A mutant replaces the definition store, the replica engine or the resumer
with a variant that differs in one place: an edit of the database function
the operation calls (`FUNCTIONS`, as in `impl/mutants/delivery.py`), or, where
the defect is the client's (a replica's cache, the record a caller admits), an
override of the method.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from leaseproof.impl.delivery.store import refuse_community
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer, record_from_row
from leaseproof.impl.migrate import Addition, Patch, functions
from leaseproof.impl.mutants.delivery import edits
from leaseproof.model import lifecycle as m

_HASH = Patch("lp_admit", "AND d.hash = p_hash", "AND p_hash IS NOT NULL")
_INCARNATION = Patch("lp_admit", "AND d.incarnation = p_incarnation", "AND p_incarnation IS NOT NULL")


class AdmissionIgnoresHash(ReplicaEngine):
    FUNCTIONS = edits(_HASH)


class AdmissionIgnoresIncarnation(ReplicaEngine):
    FUNCTIONS = edits(_INCARNATION)


class AdmissionByIdOnly(ReplicaEngine):
    """Bare-id admission: any current row of the coordinate admits the cached record."""

    FUNCTIONS = edits(_HASH, _INCARNATION, Patch("lp_admit", "\n          AND d.enabled", ""))


def derived(name: str, new_name: str, *changes: tuple[str, str]) -> Addition:
    """A function to add beside the shipped ones: the shipped `name`, called `new_name`, with
    each (old, new) of `changes` made to its definition (old occurring exactly once)."""
    definition = functions()[name].definition.replace(f"FUNCTION {name}(", f"FUNCTION {new_name}(", 1)
    for old, new in changes:
        if definition.count(old) != 1:
            raise ValueError(f"{name}: the changed text occurs {definition.count(old)} times, not once: {old!r}")
        definition = definition.replace(old, new)
    return Addition(definition)


class RefreshedAdmissionStaleExecution(ReplicaEngine):
    """The caller refreshes the record for admission but executes its stale parse: it reads
    the coordinate's current record (the enabled records, as a refresh reads them, its
    cache left as it was) and is admitted against that, while the run executes the
    actions of the record its cache selected (`lp_test_admit_parsed`: the admission of
    `lp_admit`, executing the actions its caller passes), and is reported pinned to it."""

    FUNCTIONS = edits(
        derived(
            "lp_admit",
            "lp_test_admit_parsed",
            ("p_incarnation timestamptz,", "p_incarnation timestamptz, p_actions text[],"),
            ("SELECT v_run, a FROM unnest(v_actions)", "SELECT v_run, a FROM unnest(p_actions)"),
        )
    )

    SQL_ADMIT_PARSED = """
        SELECT outcome, state, run_id, revision FROM lp_test_admit_parsed(
            %(community_id)s, %(workflow_id)s, %(door)s, %(owner)s, %(channel_id)s, %(hash)s, %(incarnation)s,
            %(actions)s)
    """

    def fire(self, c: m.Fire) -> Any:
        row = self._call(self.SQL_FIRE_CHECK, {"community_id": c.community_id})
        refuse_community(row, c.community_id)
        if row["now"] - self.cache.loaded_at >= m.CACHE_TTL:
            self.refresh()
        selected = self.cache.records.get((c.community_id, c.workflow_id))
        if selected is None:
            return m.NotSelected()
        _, *rows = self.conn.execute(self.SQL_ENABLED).fetchall()
        current = (record_from_row(r) for r in rows if (r["community_id"], r["workflow_id"]) == selected.coordinate)
        fresh = next(current, selected)
        params = {
            "community_id": fresh.community_id,
            "workflow_id": fresh.workflow_id,
            "door": c.door,
            "owner": fresh.owner,
            "channel_id": fresh.channel_id,
            "hash": fresh.hash,
            "incarnation": fresh.incarnation,
            "actions": list(selected.actions),
        }
        row = self._call(self.SQL_ADMIT_PARSED, params)
        refuse_community(row, c.community_id)
        if row["outcome"] == "AdmissionRefused":
            return m.AdmissionRefused()
        return m.Admitted(row["run_id"], selected)


class CacheNeverExpires(ReplicaEngine):
    """The TTL is never honoured: a replica serves its first load forever."""

    def fire(self, c: m.Fire) -> Any:
        self.cache = attrs.evolve(self.cache, loaded_at=self._now())
        return super().fire(c)


class ReportEnforcementSplits(LifecycleStore):
    """Moderation report enforcement deletes through its own path: it tombstones the
    head (the schema's cascade takes the runtime row with it) and records no cutoff
    (`lp_test_enforce_report`, a function this variant adds beside the canonical
    `lp_delete_definition`)."""

    FUNCTIONS = edits(
        Addition("""
CREATE FUNCTION lp_test_enforce_report(p_community uuid, p_workflow uuid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    DELETE FROM definition_heads h WHERE h.community_id = p_community AND h.workflow_id = p_workflow;
END
$$
""")
    )

    SQL_ENFORCE_REPORT = "SELECT lp_test_enforce_report(%(community_id)s, %(workflow_id)s)"

    def alternate_delete(self, c: m.AlternateDelete) -> Any:
        if not c.path.startswith("report-enforcement"):
            return super().alternate_delete(c)
        self._call(self.SQL_ENFORCE_REPORT, {"community_id": c.community_id, "workflow_id": c.workflow_id})
        return m.AlternateDeletionRejected(c.path)


class CutoffIgnored(LifecycleStore):
    """Delayed saves are not checked against the deletion cutoff."""

    FUNCTIONS = edits(
        Patch(
            "lp_save_definition",
            "FROM definition_cutoffs c\n        WHERE c.community_id",
            "FROM definition_cutoffs c\n        WHERE false AND c.community_id",
        )
    )


class ResumeReloadsCurrent(RunResumer):
    """The residual risk the reviewers named: resume reloads the current definition (the
    coordinate's runtime row) instead of the run's pinned record."""

    FUNCTIONS = edits(
        Patch(
            "lp_resume_run",
            "SELECT r.* INTO pinned FROM admitted_runs r WHERE r.id = p_run FOR NO KEY UPDATE;",
            "SELECT d.* INTO pinned FROM admitted_runs r\n"
            "    JOIN definition_runtime d ON d.community_id = r.community_id AND d.workflow_id = r.workflow_id\n"
            "    WHERE r.id = p_run FOR NO KEY UPDATE OF r;",
        )
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
        return PostgresLifecycleAdapter(
            dsn, store_class=self.store, engine_class=self.engine, resumer_class=self.resumer
        )


LIFECYCLE_MUTANTS: tuple[LifecycleMutant, ...] = (
    LifecycleMutant(
        "admission-ignores-hash",
        "a stale replica admits a superseded or disabled revision",
        engine=AdmissionIgnoresHash,
    ),
    LifecycleMutant(
        "admission-ignores-incarnation",
        "a stale replica admits across an identical recreation",
        engine=AdmissionIgnoresIncarnation,
    ),
    LifecycleMutant("admission-by-id", "bare-id admission: no selected-record match at all", engine=AdmissionByIdOnly),
    LifecycleMutant(
        "refreshed-admission-stale-execution",
        "admits the refreshed record, executes the stale parse",
        engine=RefreshedAdmissionStaleExecution,
    ),
    LifecycleMutant("cache-never-expires", "a replica serves its cache past the TTL", engine=CacheNeverExpires),
    LifecycleMutant(
        "report-enforcement-splits",
        "report enforcement deletes outside the canonical path, with no cutoff",
        store=ReportEnforcementSplits,
    ),
    LifecycleMutant(
        "cutoff-ignored", "a delayed save at or before the cutoff revives a deleted coordinate", store=CutoffIgnored
    ),
    LifecycleMutant(
        "resume-reloads-current",
        "a resumed run executes the current definition, not its pinned one",
        resumer=ResumeReloadsCurrent,
    ),
)
