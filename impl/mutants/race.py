"""Race mutants: variants of the bundled machines that are correct one operation at
a time and wrong only under concurrency.

Each reintroduces a race the implementation once had, or could have, and says which
bug class it stands for; unlike the generated mutants, they are written by hand, one
per known bug class. Each is an edit of one database function (`FUNCTIONS`: `Patch`es
of the shipped bodies, derived from their text, not copies of it). Most split one
atomic statement into a read and a write: a statement boundary the race lives in,
where a forced interleaving parks a client (`impl/hooks/gate.py`). Others drop a lock,
or the turn sweeps take. Each passes the sequential lockstep and is caught by
`leaseproof stress`, by a forced interleaving (conformance/concurrent/schedules.py,
`INTERLEAVINGS`), or both.
"""

from __future__ import annotations

from typing import TypedDict

from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.impl.migrate import Addition, Patch, functions
from leaseproof.impl.mutants.delivery import Mutant, edits
from leaseproof.impl.mutants.lifecycle import LifecycleMutant

Store = PostgresDeliveryStore


def _span(function: str, start: str, end: str) -> str:
    """The shipped `function`'s text from `start` up to (not including) the first `end` after it."""
    body = functions()[function].body
    if body.count(start) != 1 or end not in body[body.index(start) :]:
        raise ValueError(f"{function}: no single {start!r} ... {end!r}")
    head = body.index(start)
    return body[head : body.index(end, head)]


def _declare(function: str, *variables: str) -> Patch:
    """Declare `variables` ("name type") in the shipped `function`, which has no DECLARE or has one."""
    body = functions()[function].body
    declared = "".join(f"    {v};\n" for v in variables)
    if "\nDECLARE\n" in body:
        return Patch(function, "\nDECLARE\n", "\nDECLARE\n" + declared)
    return Patch(function, "\nBEGIN\n", "\nDECLARE\n" + declared + "BEGIN\n")


# -- lp_claim: the candidate read, then written by key ------------------------------------

# The shipped candidate: the oldest pending row that matches, locked, skipping locked rows.
_CANDIDATE = _span(
    "lp_claim", "SELECT d.community_id, d.id FROM workflow_agent_deliveries d", "        FOR UPDATE SKIP LOCKED"
)
_CANDIDATE_GATE = "(SELECT e.state = 'active' FROM env e) AND NOT EXISTS (SELECT FROM retried)"


class ClaimReadThenUpdate(Store):
    """Check-then-act on claim: the oldest pending candidate is read in one statement,
    without `FOR UPDATE SKIP LOCKED`, and then updated by key in a second statement that
    does not re-check it is still pending. Two claimers that read the same candidate both
    claim it (a double claim, the second at generation + 2). Both statements run under
    the community's fence, as the bundled claim does; the write checks the community's
    state and a request key's lease as the shipped statement does.

    The write leaves a terminal row alone: the schema refuses to move one (migration
    0004's guards), so a candidate finished between the read and the write would make
    the statement raise, and a stress run would end in a fault instead of the double
    claim this variant stands for."""

    FUNCTIONS = edits(
        _declare("lp_claim", "v_candidate uuid"),
        Patch(
            "lp_claim",
            "    RETURN QUERY\n    WITH env AS MATERIALIZED (",
            "    -- The candidate, read without a lock.\n    "
            + _CANDIDATE.replace("SELECT d.community_id, d.id FROM", "SELECT d.id INTO v_candidate FROM", 1)
            .replace(_CANDIDATE_GATE, "true", 1)
            .rstrip()
            + ";\n    RETURN QUERY\n    WITH env AS MATERIALIZED (",
        ),
        Patch(
            "lp_claim",
            _CANDIDATE + "        FOR UPDATE SKIP LOCKED\n",
            "SELECT p_community AS community_id, v_candidate AS id\n"
            f"        WHERE v_candidate IS NOT NULL AND {_CANDIDATE_GATE}\n",
        ),
        Patch(
            "lp_claim",
            "WHERE d.community_id = candidate.community_id AND d.id = candidate.id\n",
            "WHERE d.community_id = candidate.community_id AND d.id = candidate.id\n"
            "          AND d.status IN ('pending', 'claimed')\n",
        ),
    )


# -- lp_finish: the lease checked by a read, the terminal written by key ------------------------

# The lease check of the shipped finish (its UPDATE's WHERE clause, after the row's key).
_LEASE = _span("lp_finish", "AND d.target_pubkey = p_target\n          AND", "\n        RETURNING d.status")


class FinishCheckThenAct(Store):
    """Check-then-act on finish: the row is read and the lease (status claimed,
    generation, target, unexpired) checked by one statement, and the terminal is written
    by key by the next, with no lease in the UPDATE's WHERE. A holder whose check passed
    settles over whatever happened meanwhile: a reap and a newer holder's claim, or its
    own concurrent retry with the other outcome (the terminal flips, which the schema
    refuses: `delivery_terminal_once`)."""

    FUNCTIONS = edits(
        _declare("lp_finish", "v_held boolean"),
        Patch(
            "lp_finish",
            "    WITH env AS MATERIALIZED (",
            "    -- The lease, checked by a read of its own.\n"
            "    SELECT true INTO v_held FROM workflow_agent_deliveries d\n"
            "    WHERE d.community_id = p_community AND d.id = p_delivery\n          "
            + _LEASE.replace("e.t", "lp_now()")
            + ";\n    WITH env AS MATERIALIZED (",
        ),
        Patch("lp_finish", _LEASE, "AND v_held IS TRUE"),
    )


# -- lp_finish: the fence let go before the reconciliation ------------------------------------------

_FENCE = "pg_advisory_xact_lock_shared(lp_fence_key(p_community))"
_UNFENCE = "PERFORM pg_advisory_unlock_shared(lp_fence_key(p_community));"


class ReconcileOutsideTransaction(Store):
    """The reconciliation read of an uncertain completion runs outside the community's
    fence: the finish takes the fence as a session's lock and lets it go once its write
    is done (or failed), before the reconciliation. After a finish that settled nothing,
    a community deletion that commits before the read purges the row, and the same
    holder's retry is told `LeaseLost`, an outcome no serial order gives (before the
    deletion it is `AlreadyTerminal`, after it `CommunityNotWritable`). (Named from when
    the reconciliation was a transaction of its own, after the finish's.)"""

    FUNCTIONS = edits(
        Patch("lp_finish", f"PERFORM {_FENCE}", f"PERFORM {_FENCE.replace('_xact', '')}"),
        Patch("lp_finish", "    WITH env AS MATERIALIZED (", "    BEGIN\n    WITH env AS MATERIALIZED ("),
        Patch(
            "lp_finish",
            "    FROM env e LEFT JOIN settled s ON true;\n",
            "    FROM env e LEFT JOIN settled s ON true;\n"
            f"    EXCEPTION WHEN OTHERS OR query_canceled THEN\n        {_UNFENCE}\n        RAISE;\n    END;\n"
            f"    {_UNFENCE}\n",
        ),
    )


# -- lp_commit_deliveries: no turn for the step ---------------------------------------------------


class CommitWithoutIdentityLock(Store):
    """commit_deliveries skips the per-(community, run, step) advisory lock (it computes
    the key, and locks nothing): two commits of one step that overlap both read "no
    delivery of the step exists yet", so both report `identity_existed=False` and a
    producer signs its message twice. The unique constraints still prevent duplicate
    rows (a commit of the same ids waits for the other and is sent again by the store,
    which then sees them: only commits of different targets of the step show it)."""

    FUNCTIONS = edits(Patch("lp_commit_deliveries", "pg_advisory_xact_lock(hashtextextended(", "(hashtextextended("))


# -- lp_sweep: the expired claims read, then reaped by key; sweeps that do not take turns -----------

_TURN = "PERFORM 1 FROM lp_reaper FOR UPDATE;"
_NO_TURN = Patch("lp_sweep", _TURN, "PERFORM 1 FROM lp_reaper;")
_DUE = _span(
    "lp_sweep", "SELECT d.community_id, d.id FROM workflow_agent_deliveries d", "        FOR UPDATE OF d SKIP LOCKED"
)


class ReapReadThenUpdate(Store):
    """Check-then-act on the reaper: the expired claims of writable communities are read
    in one statement and returned to pending by key in the next, which re-checks neither
    status nor expiry. Two reapers that read the same expired claim both reap it (the
    generation is bumped twice, both report it), and a claim made in between is stolen.
    Sweeps do not take turns either (turns would hide the race)."""

    FUNCTIONS = edits(
        _NO_TURN,
        _declare("lp_sweep", "v_communities uuid[]", "v_ids uuid[]"),
        Patch(
            "lp_sweep",
            "    WITH due AS (\n        " + _DUE + "        FOR UPDATE OF d SKIP LOCKED\n    ), done AS (",
            "    -- The expired claims, read without a lock.\n    "
            + _DUE.replace(
                "SELECT d.community_id, d.id FROM",
                "SELECT array_agg(d.community_id), array_agg(d.id) INTO v_communities, v_ids FROM",
                1,
            ).rstrip()
            + ";\n    WITH due AS (\n"
            "        SELECT * FROM unnest(v_communities, v_ids) AS k (community_id, id)\n    ), done AS (",
        ),
    )


class SweepsOverlap(Store):
    """Found by `leaseproof stress`: reapers do not take turns. The later of two
    overlapping sweeps, whose statement began before the earlier one committed, meets a
    row the earlier one reaped, locks its newest version, re-checks it, leaves it, and
    keeps it locked until it commits; a claimer skips the locked row and claims a
    younger one, though the oldest was pending."""

    FUNCTIONS = edits(_NO_TURN)


# -- the lifecycle machine ------------------------------------------------------------------------

# The current runtime row an admission matches its selected record against (the shipped guard).
_MATCH = _span("lp_admit", "SELECT d.* FROM channel_authority a", "\n        FOR SHARE")
_RECORD = "community_id, workflow_id, owner, channel_id, hash, enabled, incarnation, actions, revision"


class AdmissionWithoutRowLock(ReplicaEngine):
    """Admission as a read and then a write: the current runtime row is matched against
    the selected record exactly as the bundled guard does, but without `FOR SHARE`, by one
    statement, and the run is then inserted, pinned to what was read, by the next. A
    definition update, disable or delete that commits in between does not wait for the
    admission, which then admits (and executes) a revision that is no longer current."""

    FUNCTIONS = edits(
        _declare("lp_admit", "v_current record"),
        Patch(
            "lp_admit",
            "    INSERT INTO admitted_runs\n",
            "    -- The current row, read without a lock.\n    "
            + _MATCH.replace("SELECT d.* FROM", "SELECT d.* INTO v_current FROM", 1)
            + ";\n    INSERT INTO admitted_runs\n",
        ),
        Patch(
            "lp_admit",
            "(\n        " + _MATCH + "\n        FOR SHARE\n    ) AS r",
            "(SELECT "
            + ", ".join(f"v_current.{column}" for column in _RECORD.split(", "))
            + f" WHERE v_current.community_id IS NOT NULL) AS r ({_RECORD})",
        ),
    )


class ResumesInterleave(RunResumer):
    """Found by `leaseproof stress`: resumes of one run do not take turns (its row is read
    without `FOR NO KEY UPDATE`), so two concurrent resumes interleave their actions in
    the run's sink."""

    FUNCTIONS = edits(Patch("lp_resume_run", "WHERE r.id = p_run FOR NO KEY UPDATE;", "WHERE r.id = p_run;"))


class AuthorityCheckUnlocked(LifecycleStore):
    """Found by `leaseproof stress`: the author's channel authority is read without a
    lock (no `FOR SHARE`), by a save and by a deletion, so a revocation commits between
    the check and the write, and a revoked author's save or deletion lands after it."""

    FUNCTIONS = edits(
        Patch("lp_save_definition", "a.member = p_author\n    FOR SHARE;", "a.member = p_author;"),
        Patch("lp_delete_definition", "a.member = p_author\n    FOR SHARE;", "a.member = p_author;"),
    )


# -- lp_get_delivery: a read that skips what others hold -----------------------------------

_FREE = """
CREATE FUNCTION lp_test_free(p_community uuid, p_delivery uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM FROM workflow_agent_deliveries d
    WHERE d.community_id = p_community AND d.id = p_delivery
    FOR KEY SHARE SKIP LOCKED;
    RETURN FOUND;
END
$$
"""


class ReadSkipsLocked(Store):
    """A read that borrows the claim's pattern: a pending delivery is looked up with
    `FOR KEY SHARE SKIP LOCKED` (`lp_test_free`, a function this variant adds), so a row
    a claimer holds locked reads as not found. One operation at a time no lock is held
    and every read is right; only a read that overlaps a claim of the row sees the
    wrong answer (and a claim that overlaps the read skips the row it holds)."""

    FUNCTIONS = edits(
        Patch(
            "lp_get_delivery",
            "LEFT JOIN workflow_agent_deliveries d ON d.community_id = p_community AND d.id = p_delivery;",
            "LEFT JOIN workflow_agent_deliveries d ON d.community_id = p_community AND d.id = p_delivery\n"
            "        AND (d.status <> 'pending' OR lp_test_free(d.community_id, d.id));",
        ),
        Addition(_FREE),
    )


DELIVERY_RACE_MUTANTS: dict[str, type[PostgresDeliveryStore]] = {
    "claim-read-then-update": ClaimReadThenUpdate,
    "finish-check-then-act": FinishCheckThenAct,
    "reconcile-outside-transaction": ReconcileOutsideTransaction,
    "commit-without-identity-lock": CommitWithoutIdentityLock,
    "reap-read-then-update": ReapReadThenUpdate,
    "sweeps-overlap": SweepsOverlap,
    "read-skips-locked": ReadSkipsLocked,
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
    "finish-check-then-act": "check-then-act finish: a lease checked by a read settles over a reap, a newer claim or a retry",
    "reconcile-outside-transaction": "reconciliation outside the fence: a community deletion in between yields LeaseLost",
    "commit-without-identity-lock": "lost per-step identity lock: concurrent producer retries both report identity_existed=False",
    "reap-read-then-update": "check-then-act reaper: two reapers both reap one expired claim, or steal a newer holder's claim",
    "admission-without-row-lock": "admission without the row lock: a concurrent update, disable or delete commits between match and insert",
    "sweeps-overlap": "overlapping reapers: the loser keeps a reaped row locked, and a claimer skips the oldest candidate",
    "read-skips-locked": "a read that skips locked rows: a pending delivery a claimer holds reads as not found",
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
