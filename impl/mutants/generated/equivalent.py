"""Generated mutants that no program can tell from the bundled implementation.

Each entry names a mutant (`impl/mutants/generated/catalogue.py`) and says why it is
equivalent: which constraint, cascade, earlier statement or later check makes
the changed site unable to change any outcome or persisted field. The
mutation score leaves them out of its denominator and reports an entry here
that a check kills as a false claim. The facts the reasons rest on are
tested in `tests/conformance/evidence/test_mutation_score.py`.

Lock-only differences (a statement that locks more rows than it needs, or a
differently seeded advisory-lock key) are equivalent here where they can make
a transaction wait but never change what it does. A wait can close a cycle
(a deadlock: the server rolls one transaction back), so a mutant that makes
a transaction wait on rows another holds while holding rows that one needs is
not listed.
"""

from __future__ import annotations

_SEED = (
    "the advisory-lock key's hash seed: every caller of this statement takes the same (other) key, "
    "so the statement still excludes exactly its own callers"
)
_EXISTS_LIST = "EXISTS (SELECT 1 …) ignores its select list"
_ONLY_NONE = "the store only asks whether a row came back, never reads the selected constant"
_LEASE_IFF_CLAIMED = (
    "`lease_until` is set exactly while a row is claimed (CHECK delivery_lease_iff_claimed), and "
    "`lease_until` compared with NULL is not true, so the remaining comparison already requires 'claimed'"
)
_FENCE_TRIGGER = (
    "the write's gate on the community's state: without it a write to a community that is not active is "
    "refused by the fence trigger (lp_community_write_fence), with the same refusal the gate's store raises, "
    "and where no row matches nothing is written and the store refuses from the fence's state as before"
)
_REAP_RECHECKS = (
    "only widens the `expired`/`writable` CTEs, which choose the communities to lock, to more active ones; "
    "`due` re-checks every row (claimed, lease_until < now) and keeps only rows of those active communities, "
    "so the same rows are reaped"
)
_MEMBERSHIP = (
    "the query then returns every such id of the community; the store tests each wanted id for membership "
    "in what came back, which a superset answers the same"
)
_REVISION = (
    "`d.revision = %(revision)s` stays, and a revision (the head's event id, a hash of community, workflow, "
    "author, channel, content and time) names one save: the row it names has the pinned record's every field"
)

EQUIVALENT: dict[str, str] = {
    # -- delivery --------------------------------------------------------------------
    "PostgresDeliveryStore.SQL_LOCK_IDENTITY/off-by-one/1": _SEED,
    "PostgresDeliveryStore.SQL_ONE_SWEEP_AT_A_TIME/off-by-one/1": _SEED,
    "PostgresDeliveryStore.SQL_LOCK_CLAIM_KEY/off-by-one/1": _SEED,
    "PostgresDeliveryStore.SQL_CLAIM_RETRIED/drop-conjunct/4": (
        "a row keeps a claim key only while it is claimed (CHECK delivery_claim_key_only_while_claimed), so "
        "`claim_key = %(request_key)s` already requires 'claimed'"
    ),
    "PostgresDeliveryStore.SQL_IDENTITY_EXISTS/off-by-one/1": _EXISTS_LIST,
    "PostgresDeliveryStore.SQL_IDENTITY_EXISTS/off-by-one/2": _EXISTS_LIST,
    "PostgresDeliveryStore.SQL_IDENTITY_TAKEN/off-by-one/1": _ONLY_NONE,
    "PostgresDeliveryStore.SQL_IDENTITY_TAKEN/off-by-one/2": _ONLY_NONE,
    "PostgresDeliveryStore.SQL_WORKFLOW_EXISTS/off-by-one/1": _ONLY_NONE,
    "PostgresDeliveryStore.SQL_WORKFLOW_EXISTS/off-by-one/2": _ONLY_NONE,
    "PostgresDeliveryStore.SQL_KNOWN_EVENTS/drop-conjunct/2": _MEMBERSHIP,
    "PostgresDeliveryStore.SQL_RETIRED_IDS/drop-conjunct/2": _MEMBERSHIP,
    "PostgresDeliveryStore.SQL_CLAIM/drop-conjunct/14": (
        "the cause kind follows from which identity column is set (CHECK delivery_cause_exactly_one), and "
        "the three IS NOT DISTINCT FROM comparisons that stay match that column pattern exactly"
    ),
    "PostgresDeliveryStore.SQL_RENEW/drop-conjunct/2": _FENCE_TRIGGER,
    "PostgresDeliveryStore.SQL_FINISH/drop-conjunct/2": _FENCE_TRIGGER,
    "PostgresDeliveryStore.SQL_RENEW/drop-conjunct/7": _LEASE_IFF_CLAIMED,
    "PostgresDeliveryStore.SQL_FINISH/drop-conjunct/7": _LEASE_IFF_CLAIMED,
    "PostgresDeliveryStore.SQL_REAP/drop-conjunct/6": _LEASE_IFF_CLAIMED,
    "PostgresDeliveryStore.SQL_LOCK_DELETIONS/off-by-one/1": _SEED,
    "PostgresDeliveryStore.SQL_REAP/drop-conjunct/1": _REAP_RECHECKS,
    "PostgresDeliveryStore.SQL_REAP/drop-conjunct/2": _REAP_RECHECKS,
    "PostgresDeliveryStore.SQL_REAP/drop-conjunct/3": _REAP_RECHECKS,
    "PostgresDeliveryStore.SQL_REAP/flip-comparison/2": _REAP_RECHECKS,
    "PostgresDeliveryStore.SQL_REAP/shift-clock/1": _REAP_RECHECKS,
    "PostgresDeliveryStore.SQL_REAP/drop-distinct/1": (
        _REAP_RECHECKS + "; a row joined to several copies of its community is updated once"
    ),
    "PostgresDeliveryStore.SQL_REAP/left-join/1": _REAP_RECHECKS,
    # Not SQL_REAP/drop-lock/2 or /drop-skip-locked/1, once listed here as a sweep
    # that only waits where the bundled one skips: a sweep waiting on an expired
    # row a deletion's cascade holds, while the cascade waits on a row the sweep
    # locked, is a deadlock, and stress with deletions raced against the
    # reaper found it (the server rolled the deletion back).
    "PostgresDeliveryStore.SQL_REAP/off-by-one/3": "count(*) counts the returned rows, whatever each returns",
    "PostgresDeliveryStore.SQL_REAP/off-by-one/4": "count(*) counts the returned rows, whatever each returns",
    "PostgresDeliveryStore.SQL_PURGE_COMMUNITY[0]/drop-statement/1": (
        "the next statements delete the community's runs and events, and deliveries go with them "
        "(ON DELETE CASCADE from workflow_runs and from events); the community is already marked deleted, "
        "so the write fence admits the cascade and no id is retired"
    ),
    "PostgresDeliveryStore.SQL_PURGE_COMMUNITY[1]/drop-statement/1": (
        "the next statement deletes the community's workflows, and their runs go with them "
        "(ON DELETE CASCADE from workflows)"
    ),
    # -- lifecycle -------------------------------------------------------------------
    "LifecycleStore.SQL_LOCK_COORDINATE/off-by-one/1": _SEED,
    "LifecycleStore.SQL_HAS_AUTHORITY/off-by-one/1": _ONLY_NONE,
    "LifecycleStore.SQL_HAS_AUTHORITY/off-by-one/2": _ONLY_NONE,
    "RunResumer.SQL_STILL_CURRENT/off-by-one/1": _ONLY_NONE,
    "RunResumer.SQL_STILL_CURRENT/off-by-one/2": _ONLY_NONE,
    "LifecycleStore.SQL_DELETE[0]/drop-statement/1": (
        "the next statement deletes the head, and the runtime row goes with it "
        "(ON DELETE CASCADE from definition_heads)"
    ),
    "ReplicaEngine.SQL_ADMIT/drop-conjunct/6": (
        "`enabled` is part of the hashed content and a replica caches enabled records only, so a row whose "
        "hash matches the cached record's is enabled"
    ),
    "ReplicaEngine.SQL_ADMIT/drop-conjunct/8": (
        "a save by another author or in another channel is refused while a head lives (NotAuthor), and a "
        "recreation is a new incarnation (its time is after the cutoff, itself at or after the old head), so "
        "(coordinate, incarnation), which stay matched, fix the owner"
    ),
    "ReplicaEngine.SQL_ADMIT/drop-conjunct/9": (
        "a save by another author or in another channel is refused while a head lives (NotAuthor), and a "
        "recreation is a new incarnation, so (coordinate, incarnation), which stay matched, fix the channel"
    ),
    **{f"RunResumer.SQL_STILL_CURRENT/drop-conjunct/{site}": _REVISION for site in range(4, 12)},
    # Race mutants: the contention schedules of their statement pass (conformance/concurrent/contention.py).
    "PostgresDeliveryStore.SQL_FINISH/drop-lock/1": (
        "without the community's share lock a change of its state still lands before or after the finish: "
        "a write to a community no longer active is refused by the fence trigger (lp_community_write_fence, "
        "which reads the committed state), and a row a deletion purged while the finish waited for it leaves "
        "the finish to its reconciliation read, a statement of its own that reads the state with the rows and "
        "refuses it"
    ),
    "LifecycleStore.SQL_HEAD/drop-lock/1": (
        "every writer of a head (a save, a deletion) takes the coordinate's advisory lock (SQL_LOCK_COORDINATE) "
        "before it reads the head, and the only other way to a head, a community's deletion (a cascade), is not "
        "a lifecycle command; so the head's row lock never excludes a writer the advisory lock let through"
    ),
    "lifecycle:PostgresDeliveryStore.SQL_COMMUNITY_FOR_UPDATE/drop-lock/1": (
        "the lock keeps a deletion from landing between a state change's read and its update (which would "
        "revive a deleted community); the lifecycle machine never deletes a community, and the UPDATE itself "
        "still row-locks the community, so every writer's share lock still orders it against the change"
    ),
}
