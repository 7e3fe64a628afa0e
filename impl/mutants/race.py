"""Race mutants: bugs that are correct one operation at a time and wrong under concurrency.

Each variant of the bundled store (or replica engine) runs every operation
exactly as the real one does when nothing else runs: the sequential
lockstep suite passes it (tests/conformance/concurrent/test_interleavings.py proves that), and
only a forced interleaving (the statement gate, `impl/hooks/gate.py`) shows it.
They are kept apart from `impl/mutants/delivery.py` and `impl/mutants/lifecycle.py`,
whose registries are asserted to be killed by sequential search.

Most of them split one atomic statement into a read and a write. The
bundled method runs that statement through `_one` (or `_statement`, for a
statement that is its own transaction); the variant intercepts it there, so
the rest of the method (scope checks, fences, how the outcome is built) is
the bundled code, and the write keeps the statement's name: a
schedule that pauses "before `store.SQL_CLAIM`" pauses the bundled store
before its one statement and the variant between its read and its write.
"""

from __future__ import annotations

from typing import Any, TypedDict

from leaseproof.impl.delivery.store import (
    _DELIVERY_COLUMNS,
    FENCE_CTE,
    FENCED,
    FENCED_FROM,
    WRITE_FENCE_CTE,
    PostgresDeliveryStore,
)
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer, record_from_row, record_params
from leaseproof.impl.mutants.delivery import Mutant, _swap
from leaseproof.impl.mutants.lifecycle import LifecycleMutant
from leaseproof.model import delivery as m

Store = PostgresDeliveryStore


def _between(sql: str, start: str, end: str) -> str:
    """The text of `sql` from `start` up to (not including) the last `end`."""
    if start not in sql or end not in sql:
        raise ValueError(f"statement has no {start!r} ... {end!r}")
    return start + sql.split(start, 1)[1].rsplit(end, 1)[0]


class ClaimReadThenUpdate(Store):
    """Check-then-act on claim: the oldest pending candidate is read in one
    statement, without `FOR UPDATE SKIP LOCKED`, and then updated by key in a
    second statement that does not re-check it is still pending. Two
    claimers that read the same candidate both claim it (a double claim,
    the second at generation + 2). Both statements check the community's
    fence as the bundled one does.

    The write leaves a terminal row alone: the schema refuses to move one
    (migration 0004's guards), so a candidate finished between the read and
    the write would make the statement raise, and a stress run would end in a
    fault instead of the double claim this variant stands for (seen in CI:
    the wire stress test, at random)."""

    SQL_CLAIM_CANDIDATE = f"""
        WITH {FENCE_CTE}, candidate AS (
            {_between(Store.SQL_CLAIM, "SELECT community_id, id FROM workflow_agent_deliveries", "FOR UPDATE SKIP LOCKED")}
        )
        SELECT {FENCED}, candidate.id FROM {FENCED_FROM} LEFT JOIN candidate ON true
    """
    # The bundled claim's assignments, written by key: no re-check that the row is pending.
    SQL_CLAIM = f"""
        WITH {FENCE_CTE}, claimed AS (
            UPDATE workflow_agent_deliveries d
            {_between(Store.SQL_CLAIM, "SET status = 'claimed'", "FROM candidate")}
            WHERE (SELECT state = 'active' FROM fence)
              AND d.community_id = %(community_id)s AND d.id = %(candidate_id)s
              AND d.status IN ('pending', 'claimed')
            RETURNING {", ".join("d." + c.strip() for c in _DELIVERY_COLUMNS.split(","))}
        )
        SELECT {FENCED}, claimed.* FROM {FENCED_FROM} LEFT JOIN claimed ON true
    """

    def _statement(self, sql: str, params: dict[str, Any]) -> dict[str, Any]:
        if sql == self.SQL_CLAIM:
            candidate = super()._statement(self.SQL_CLAIM_CANDIDATE, params)
            if candidate["id"] is None:
                return candidate  # no candidate (or a refusal): the bundled claim answers from its fence
            params = {**params, "candidate_id": candidate["id"]}
        return super()._statement(sql, params)


class FinishCheckThenAct(Store):
    """Check-then-act on finish: the row is read, the lease (status claimed,
    generation, target, unexpired) is checked in Python, and the terminal is
    written by key, with no lease in the UPDATE's WHERE. A holder whose
    check passed settles over whatever happened meanwhile: a reap and a
    newer holder's claim, or its own concurrent retry with the other
    outcome (the terminal flips)."""

    SQL_FINISH_READ = f"""
        WITH {WRITE_FENCE_CTE}
        SELECT {FENCED}, d.status, d.lease_generation, d.target_pubkey, d.lease_until, lp_now() AS now
        FROM {FENCED_FROM}
        LEFT JOIN workflow_agent_deliveries d ON d.community_id = %(community_id)s AND d.id = %(delivery_id)s
    """
    SQL_FINISH = f"""
        WITH {WRITE_FENCE_CTE}, settled AS (
            UPDATE workflow_agent_deliveries
            {_between(Store.SQL_FINISH, "SET status", "WHERE")}
            WHERE (SELECT state = 'active' FROM fence)
              AND community_id = %(community_id)s AND id = %(delivery_id)s
            RETURNING status
        )
        SELECT {FENCED}, settled.status FROM {FENCED_FROM} LEFT JOIN settled ON true
    """

    def _statement(self, sql: str, params: dict[str, Any]) -> dict[str, Any]:
        if sql == self.SQL_FINISH:
            row = super()._statement(self.SQL_FINISH_READ, params)
            held = (
                row["status"] == m.Status.CLAIMED.value
                and row["lease_generation"] == params["lease_generation"]
                and bytes(row["target_pubkey"]) == params["target_pubkey"]
                and row["lease_until"] >= row["now"]
            )
            if row["community_state"] != m.CommunityState.ACTIVE.value or not held:
                return {**row, "status": None}  # the bundled finish refuses, or goes on to its reconciliation read
        return super()._statement(sql, params)


class ReconcileOutsideTransaction(Store):
    """The reconciliation read of an uncertain completion does not check the
    community's fence: after the finish that settled nothing, a community
    deletion that commits before the read purges the row, and the same
    holder's retry is told `LeaseLost`, an outcome no serial order gives
    (before the deletion it is `AlreadyTerminal`, after it
    `CommunityNotWritable`). (Named from when the store's finish was one
    transaction and this read ran after it, outside the share lock.)"""

    SQL_FINISH_RECONCILE = """
        SELECT status FROM workflow_agent_deliveries
        WHERE community_id = %(community_id)s AND id = %(delivery_id)s
          AND target_pubkey = %(target_pubkey)s
          AND lease_generation = %(lease_generation)s
          AND status IN ('finished', 'failed')
    """

    def finish(self, c: m.Finish) -> Any:
        params = {
            "community_id": c.lease.community_id,
            "delivery_id": c.lease.delivery_id,
            "target_pubkey": c.lease.target_pubkey,
            "lease_generation": c.lease.lease_generation,
            "outcome": c.outcome.value,
        }
        row = self._fenced(self.SQL_FINISH, params, c.lease.community_id)
        if row["status"] is not None:
            return m.Settled(m.Status(row["status"]))
        read = self._one(self.SQL_FINISH_RECONCILE, params)  # its own snapshot, no fence
        return m.LeaseLost() if read is None else m.AlreadyTerminal(m.Status(read["status"]))


class CommitWithoutIdentityLock(Store):
    """commit_deliveries skips the per-(community, run, step) advisory lock
    (it computes the key, and locks nothing): two retries of one step both
    read "no delivery exists yet", so both report `identity_existed=False`
    and a producer signs its message twice. The unique identity constraint
    still prevents duplicate rows."""

    SQL_LOCK_IDENTITY = _swap(Store.SQL_LOCK_IDENTITY, "SELECT pg_advisory_xact_lock(", "SELECT (")


class ReapReadThenUpdate(Store):
    """Check-then-act on the reaper: the expired claims of writable
    communities are read in one statement and returned to pending by key in
    a second one that re-checks neither status nor expiry. Two reapers that
    read the same expired claim both reap it (the generation is bumped
    twice, both report it), and a claim made in between is stolen."""

    SQL_ONE_SWEEP_AT_A_TIME = "SELECT 1"  # sweeps that took turns would hide the race

    SQL_REAP_EXPIRED = """
        SELECT d.community_id, d.id FROM workflow_agent_deliveries d
        JOIN communities c ON c.id = d.community_id
        WHERE d.status = 'claimed' AND d.lease_until < lp_now() AND c.state = 'active'
        FOR SHARE OF c
    """
    SQL_REAP = """
        WITH reaped AS (
            UPDATE workflow_agent_deliveries d
            SET status = 'pending', lease_generation = d.lease_generation + 1,
                lease_until = NULL, claimed_at = NULL, claim_key = NULL
            FROM unnest(%(community_ids)s::uuid[], %(ids)s::uuid[]) AS k(community_id, id)
            WHERE d.community_id = k.community_id AND d.id = k.id
            RETURNING 1
        )
        SELECT count(*) AS reaped FROM reaped
    """

    def _one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        if sql == self.SQL_REAP:
            expired = self.conn.execute(self.SQL_REAP_EXPIRED).fetchall()
            params = {"community_ids": [r["community_id"] for r in expired], "ids": [r["id"] for r in expired]}
        return super()._one(sql, params)


class AdmissionWithoutRowLock(ReplicaEngine):
    """Admission as a read and then a write: the current runtime row is
    matched against the selected record exactly as the bundled guard does,
    but without `FOR SHARE`, and the run is then inserted, pinned to what
    was read, by a second statement. A definition update, disable or delete
    that commits in between does not wait for the admission, which then
    admits (and executes) a revision that is no longer current."""

    SQL_ADMIT_READ = _swap(_between(ReplicaEngine.SQL_ADMIT, "SELECT d.* FROM definition_runtime d", ") r"), "FOR SHARE", "")
    SQL_ADMIT = """
        INSERT INTO admitted_runs
            (community_id, workflow_id, door, owner, channel_id, hash, enabled, incarnation, actions, revision, admitted_at)
        VALUES (%(community_id)s, %(workflow_id)s, %(door)s, %(owner)s, %(channel_id)s, %(hash)s, %(enabled)s,
                %(incarnation)s, %(actions)s, %(revision)s, lp_now())
        RETURNING id, revision
    """

    def _one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        if sql == self.SQL_ADMIT:
            current = super()._one(self.SQL_ADMIT_READ, params)
            if current is None:
                return None
            params = {**record_params(record_from_row(current)), "door": params["door"]}
        return super()._one(sql, params)


class SweepsOverlap(Store):
    """Found by `leaseproof stress`: reapers do not take turns. The later of two
    overlapping sweeps waits on a row the earlier one reaps, re-checks it,
    leaves it, and keeps it locked until it commits; a claimer skips the
    locked row and claims a younger one, though the oldest was pending."""

    SQL_ONE_SWEEP_AT_A_TIME = "SELECT 1"


class ResumesInterleave(RunResumer):
    """Found by `leaseproof stress`: resumes of one run do not take turns, so
    two concurrent resumes interleave their actions in the run's sink."""

    SQL_PINNED = _swap(RunResumer.SQL_PINNED, " FOR NO KEY UPDATE", "")


class AuthorityCheckUnlocked(LifecycleStore):
    """Found by `leaseproof stress`: the author's channel authority is read
    without a lock, so a revocation commits between the check and the
    write, and a revoked author's save or deletion lands after it."""

    SQL_HAS_AUTHORITY = _swap(LifecycleStore.SQL_HAS_AUTHORITY, "FOR SHARE", "")


DELIVERY_RACE_MUTANTS: dict[str, type[PostgresDeliveryStore]] = {
    "claim-read-then-update": ClaimReadThenUpdate,
    "finish-check-then-act": FinishCheckThenAct,
    "reconcile-outside-transaction": ReconcileOutsideTransaction,
    "commit-without-identity-lock": CommitWithoutIdentityLock,
    "reap-read-then-update": ReapReadThenUpdate,
    "sweeps-overlap": SweepsOverlap,
}

class LifecycleClasses(TypedDict, total=False):
    """Keyword arguments of `PostgresLifecycleAdapter` that build a lifecycle mutant."""

    store_class: type[LifecycleStore]
    engine_class: type[ReplicaEngine]
    resumer_class: type[RunResumer]


# Keyword arguments of `PostgresLifecycleAdapter` that build each mutant.
LIFECYCLE_RACE_MUTANTS: dict[str, LifecycleClasses] = {
    "admission-without-row-lock": {"engine_class": AdmissionWithoutRowLock},
    "authority-check-unlocked": {"store_class": AuthorityCheckUnlocked},
    "resumes-interleave": {"resumer_class": ResumesInterleave},
}

RACE_FINDINGS: dict[str, str] = {
    "claim-read-then-update": "check-then-act claim: two claimers read one pending row and both claim it",
    "finish-check-then-act": "check-then-act finish: a lease checked in Python settles over a reap, a newer claim or a retry",
    "reconcile-outside-transaction": "reconciliation read without the fence: a community deletion in between yields LeaseLost",
    "commit-without-identity-lock": "lost per-step identity lock: concurrent producer retries both report identity_existed=False",
    "reap-read-then-update": "check-then-act reaper: two reapers both reap one expired claim, or steal a newer holder's claim",
    "admission-without-row-lock": "admission without the row lock: a concurrent update, disable or delete commits between match and insert",
    "sweeps-overlap": "overlapping reapers: the loser keeps a reaped row locked, and a claimer skips the oldest candidate",
    "resumes-interleave": "unserialized resumes: two resumes of one run interleave their actions in the sink",
    "authority-check-unlocked": "unlocked authority check: a save or deletion by a revoked author lands after the revocation",
}
assert RACE_FINDINGS.keys() == DELIVERY_RACE_MUTANTS.keys() | LIFECYCLE_RACE_MUTANTS.keys()

# The same mutants as the records the CLI and the kill tests use for every mutant.
DELIVERY_RACE: tuple[Mutant, ...] = tuple(
    Mutant(name, RACE_FINDINGS[name], store) for name, store in DELIVERY_RACE_MUTANTS.items()
)
RACE_MUTANTS: tuple[Mutant | LifecycleMutant, ...] = (
    *DELIVERY_RACE,
    *(
        LifecycleMutant(
            name,
            RACE_FINDINGS[name],
            store=parts.get("store_class", LifecycleStore),
            engine=parts.get("engine_class", ReplicaEngine),
            resumer=parts.get("resumer_class", RunResumer),
        )
        for name, parts in LIFECYCLE_RACE_MUTANTS.items()
    ),
)
