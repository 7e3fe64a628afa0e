"""Generated mutants that no program of the model can tell from the bundled implementation.

Each entry names a mutant (`catalogue.py`) and says why it is equivalent: which
constraint, cascade, earlier statement or later check keeps the changed site from
changing any outcome or persisted field the model states. The mutation score leaves them
out of its denominator, runs each on a small budget in CI, and reports an entry that a
check kills as a false claim; `tests/conformance/evidence/test_mutation_score.py` tests
the facts the reasons rest on. Three families are equivalent to the model only, and say
where else they are checked (docs/search-power.md); a lock-only difference (a differently
seeded advisory-lock key) is listed only where every caller takes the same key.
"""

from __future__ import annotations

import re

from leaseproof.impl.migrate import functions as _shipped
from leaseproof.impl.mutants.generated.catalogue import by_name, functions_of, generated_mutants, site_of

_SEED = (
    "the advisory-lock key's hash seed: every caller takes its key from this one function (or this one "
    "statement), so the same transactions still exclude each other"
)
_SWEEP_REPORT = (
    "changes only the sweep's report of what it left or skipped (Sweep.left, Sweep.skipped), or the order of "
    "the communities it tries (any order locks the same set): the model's Reap answers how many it reaped, "
    "which this does not change; tests/impl/test_store.py and test_reaper_under_locks.py check the report"
)
_NULL_HEAD = (
    "when no head was found, SELECT INTO leaves the record's fields (and `cutoff`) NULL, and a comparison "
    "with NULL is not true, so the condition is false without FOUND as it is with it"
)
_CUTOFF_BEHIND_HEAD = (
    "with a head, the cutoff (if any) is older than it: a save at or before a cutoff is refused "
    "(BeforeCutoff), and a deletion's cutoff is at or after the head it deletes; the update reached here "
    "is newer than the head, so it is never at or before the cutoff"
)
_REVISION = (
    "`d.revision = pinned.revision` stays, and a revision is the id of the signed save that wrote the row, "
    "a hash of everything it says (content, enabled, author, channel, time): the row it names has the "
    "pinned run's every field"
)
_ENABLED_IN_HASH = (
    "`enabled` is hashed with the actions (lp_definition_hash), and a replica caches and admits enabled "
    "records only (lp_enabled_records), so a row whose hash matches the admitted or pinned record is enabled"
)
_ORDINALITY = (
    "unnest() WITH ORDINALITY is a function scan that yields the elements in order, and nothing between it "
    "and the INSERT or aggregate (no join, no sort, no parallel plan) reorders them"
)
_BOUNDS = (
    "accepts actions the model refuses to construct (m.Definition: 1 to 8 actions, each non-blank text of at "
    "most 64 characters), which no command carries; tests/impl/test_api.py checks that the database refuses "
    "each such argument as the model does"
)
_TEST_CLOCK = (
    "differs only where lp_clock holds a pinned instant in a database that is not a test database, or is "
    "unpinned in one that is: lp_clock_guard refuses a pinned clock outside a test database, and every check "
    "pins the clock of its test database before its first operation"
)
_FIRST_OF_A_REFUSAL = (
    "the lateral that yields a second row yields one only when two targets are refused for the same reason, "
    "and the verdict is then that refusal, not Committed, so nothing is inserted; the verdict's first row, "
    "which SELECT INTO reads, carries the first of them in target order (a join ON true is a nested loop, "
    "which emits a lateral's rows in its ORDER BY, and every other lateral yields at most one row)"
)
_ENTER_CLOCK = (
    "no function of the delivery machine reads the clock lp_enter returns: they read its refusal and state, "
    "and take their own reading of the clock where they need one (the lifecycle's functions read e.now, and "
    "their mutant of this line is not claimed)"
)
_LEASE_ONLY_WHILE_CLAIMED = (
    "the same condition compares the row's lease_until with the clock, and a row holds a lease exactly while "
    "it is claimed (the delivery_shape check), so a row whose lease_until passes the comparison is claimed"
)
_ONLY_COUNTED = (
    "the rows of this RETURNING are only counted (count(*)), never read, so what each row carries does not matter"
)
_TRIES_MORE_FENCES = (
    "the sweep then also try-locks the fences of communities whose claimed rows have not expired; the "
    "statement that reaps still requires an expired lease, one operation at a time every try-lock succeeds, "
    "and under contention only the report (Sweep.skipped) can name another community"
)
_DELIVERY_BOUNDS = (
    "accepts an argument the model refuses to construct (a commit of no target: CommitDeliveries names at "
    "least one delivery; a resume of run 0: run ids are positive), which no command carries; "
    "tests/impl/test_attacks.py sends each and checks that the database refuses it, changing nothing"
)
_INSERT_ORDER = (
    "the order the new rows are inserted in is only their physical order, which no read observes: a claim "
    "orders by (created_at, id), unique in a community, the answer lists the ids in target order by its own "
    "ORDER BY, and every other read looks rows up by key or reads them as a set"
)
_ANSWER_REFUSES_FIRST = (
    "for a community that is not active the answer is its refusal whatever this CTE finds, and the candidate "
    "row the update takes keeps its own check of the state, so nothing is claimed either way"
)
_CAUSE_KIND_FROM_COLUMNS = (
    "the three cause identity columns are compared too (IS NOT DISTINCT FROM), and a cause of each kind has "
    "exactly its own identity column (delivery_shape, and the model's cause types), so equal identity "
    "columns mean equal kinds"
)
_INCARNATION = (
    "`d.incarnation = p_incarnation` stays: while a head lives, a save by another author or in another "
    "channel is refused (NotAuthor), and a recreation after a deletion is a new incarnation (its time is "
    "after the cutoff, itself at or after the old head), so (coordinate, incarnation) fix the channel and "
    "the owner"
)
_COMMIT_STATE_FIRST = (
    "the verdict answers the community's refusal before it reads the run, the events or the targets, and the "
    "insert needs a Committed verdict: the gate on the state only spares reading (and key-share locking) rows "
    "of a community that is not active"
)


def _sweep_report() -> dict[str, str]:
    """lp_sweep's mutants of its last statement (the report of rows left) and of the
    order and the skipped half of its communities' aggregates."""
    body = _shipped()["lp_sweep"].body
    report_starts = body.index("SELECT coalesce(array_agg(d.community_id")
    claims = {}
    for mutant in generated_mutants("delivery"):
        if mutant.function != "lp_sweep":
            continue
        site = site_of(mutant.mutation, body)
        about_c = mutant.mutation.before.strip(", ") in ("ORDER BY c", "c")
        if site >= report_starts or about_c or mutant.mutation.before == "NOT got":
            claims[mutant.name] = _SWEEP_REPORT
    return claims


def _where(function: str, operator: str, before: str) -> list[str]:
    return [
        m.name
        for m in generated_mutants()
        if m.function == function and m.mutation.operator == operator and m.mutation.before == before
    ]


def _statement_around(body: str, site: int) -> str:
    """The text of the statement of `body` (between semicolons) that holds `site`."""
    return body[body.rfind(";", 0, site) + 1 : body.find(";", site)]


def _lease_only_while_claimed() -> list[str]:
    """Mutants that drop `status = 'claimed'` from a condition of a statement that also
    compares lease_until with the clock."""
    shipped = _shipped()
    claims = []
    for mutant in generated_mutants():
        before = " ".join(mutant.mutation.before.split())
        if mutant.mutation.operator != "drop-conjunct" or before.removesuffix(" AND").removeprefix("AND ") not in (
            "status = 'claimed'",
            "d.status = 'claimed'",
        ):
            continue
        body = shipped[mutant.function].body
        statement = _statement_around(body, site_of(mutant.mutation, body))
        if re.search(r"\blease_until\s*(<|>=)", statement):
            claims.append(mutant.name)
    return claims


def _only_counted() -> list[str]:
    """Mutants of the `1` of `RETURNING 1` in a CTE whose rows are only counted."""
    shipped = _shipped()
    claims = []
    for mutant in generated_mutants():
        if mutant.mutation.operator != "off-by-one":
            continue
        body = shipped[mutant.function].body
        site = site_of(mutant.mutation, body)
        if not body.endswith("RETURNING ", 0, site):
            continue
        name = re.findall(r"(\w+) AS \(", body[:site])[-1]
        statement = _statement_around(body, site)
        # Where its rows are read: after FROM or JOIN, or in a FROM list (a comma, then the
        # name and a lower-case alias; keywords are upper case in these bodies).
        read = re.findall(rf"(?:\bFROM|\bJOIN)\s+{name}\b|,\s*{name}\s+(?!AS\b)[a-z_]\w*", statement)
        counted = re.findall(rf"count\(\*\)(?:\s+INTO\s+\w+)?\s+FROM\s+{name}\b", statement)
        if read and len(read) == len(counted):
            claims.append(mutant.name)
    return claims


def _insert_order() -> list[str]:
    """lp_commit_deliveries's mutants of the order key of its INSERT's SELECT."""
    body = _shipped()["lp_commit_deliveries"].body
    start = body.index("INSERT INTO workflow_agent_deliveries")
    end = body.index("RETURNING", start)
    return [
        m.name
        for m in generated_mutants("delivery")
        if m.function == "lp_commit_deliveries"
        and m.mutation.operator in ("drop-order-key", "reverse-order-key")
        and start <= site_of(m.mutation, body) < end
    ]


def _in_cte(function: str, cte: str, before: str) -> list[str]:
    """`function`'s mutants that drop the conjunct `before` inside its CTE `cte`."""
    body = _shipped()[function].body
    start = body.index(f"{cte} AS ")
    end = body.index("\n    ), ", start)
    return [m for m in _where(function, "drop-conjunct", before) if start <= site_of(by_name(m).mutation, body) < end]


def _bound_of(function: str, left: str) -> list[str]:
    """`function`'s off-by-one mutants that lower the bound `left` 1 to 0 (`n >= 1` to `n >= 0`)."""
    body = _shipped()[function].body
    named = [(name, by_name(name).mutation) for name in _where(function, "off-by-one", "1")]
    return [name for name, m in named if m.after == "0" and body.endswith(left, 0, site_of(m, body))]


def _commit_limits(laterals: tuple[str, ...]) -> list[str]:
    """lp_commit_deliveries's mutants of `LIMIT 1` into `LIMIT 2` in the verdict's laterals named."""
    body = _shipped()["lp_commit_deliveries"].body
    claims = []
    for mutant in _where("lp_commit_deliveries", "off-by-one", "1"):
        mutation = by_name(mutant).mutation
        site = site_of(mutation, body)
        if (
            mutation.after == "2"
            and body.endswith("LIMIT ", 0, site)
            and any(body[site:].lstrip("1 \n").startswith(f") AS {lateral} ") for lateral in laterals)
        ):
            claims.append(mutant)
    return claims


def _enter_clock() -> list[str]:
    """The delivery machine's mutants of the clock lp_enter returns, if no delivery function
    reads it (one that selects `e.now` from lp_enter undoes the claim)."""
    shipped = _shipped()
    if any(re.search(r"\be\.now\b", shipped[f].body) for f in functions_of("delivery")):
        return []
    mutants = generated_mutants("delivery")
    return [m.name for m in mutants if m.function == "lp_enter" and "lp_now()" in m.mutation.before]


def _seeds() -> list[str]:
    keys = ("lp_fence_key", "lp_change_key", "lp_deletions_key", "lp_coordinate_key")
    return [m.name for m in generated_mutants() if m.function in keys and m.mutation.operator == "off-by-one"]


EQUIVALENT: dict[str, str] = {
    # -- delivery --------------------------------------------------------------------
    **dict.fromkeys(_seeds(), _SEED),
    "lp_commit_deliveries/off-by-one/3": _SEED,
    "lp_claim/off-by-one/1": _SEED,
    **_sweep_report(),
    "lp_delete_community/drop-conjunct/2": (
        "deleting a community already deleted again: its rows were purged when it was deleted and every write "
        "to a deleted community is refused, so the purge deletes nothing and the tombstone is written as it was"
    ),
    "lp_delete_community/drop-statement/2": (
        "the next statement deletes the community's runs, and their deliveries go with them (ON DELETE CASCADE "
        "from workflow_runs); the retired ids the cascade's deletions write are deleted last, as before"
    ),
    **dict.fromkeys(
        [
            *_where("lp_commit_deliveries", "drop-conjunct", "(SELECT e.state = 'active' FROM env e) AND"),
            *_where("lp_commit_deliveries", "drop-conjunct", "(SELECT e.state = 'active' FROM env e)"),
        ],
        _COMMIT_STATE_FIRST,
    ),
    "lp_commit_deliveries/drop-conjunct/12": (
        "the known events are then every event of the community; the verdict asks whether each target's "
        "message is among them, which a superset answers the same (the extra key-share locks only make a "
        "deletion of another event wait)"
    ),
    "lp_commit_deliveries/reverse-order-key/1": (
        "counting a repeated id's occurrences from the last flags another occurrence of the same id: the "
        "verdict reports the id (DeliveryIdTaken), the same for every occurrence, and inserts nothing"
    ),
    **dict.fromkeys(
        ["lp_commit_deliveries/drop-order-key/3", "lp_commit_deliveries/drop-order-key/4"],
        "the target CTE is materialised in unnest's order (a function scan WITH ORDINALITY), and a scan of it "
        "returns its rows in that order, so LIMIT 1 takes the first target in order without ORDER BY too",
    ),
    **dict.fromkeys(_commit_limits(("mismatch", "missing", "used")), _FIRST_OF_A_REFUSAL),
    **dict.fromkeys(_insert_order(), _INSERT_ORDER),
    **dict.fromkeys(
        _in_cte("lp_claim", "retried", "AND (SELECT e.state = 'active' FROM env e)"), _ANSWER_REFUSES_FIRST
    ),
    **dict.fromkeys(_where("lp_claim", "drop-conjunct", "AND d.cause_kind = p_cause_kind"), _CAUSE_KIND_FROM_COLUMNS),
    **dict.fromkeys(
        [*_bound_of("lp_commit_deliveries", "n >= "), *_bound_of("lp_resume_run", "p_run >= ")],
        _DELIVERY_BOUNDS,
    ),
    "lp_delete_community/drop-statement/3": (
        "the next statement deletes the community's workflows, and their runs go with them (ON DELETE CASCADE "
        "from workflows); the deliveries were deleted by the statement before"
    ),
    "lp_sweep/flip-comparison/2": _TRIES_MORE_FENCES,
    **dict.fromkeys(_enter_clock(), _ENTER_CLOCK),
    **dict.fromkeys(_lease_only_while_claimed(), _LEASE_ONLY_WHILE_CLAIMED),
    **dict.fromkeys(_only_counted(), _ONLY_COUNTED),
    "lp_sweep/drop-conjunct/4": _TRIES_MORE_FENCES,
    "lp_claim/drop-conjunct/5": (
        "a foreign wake's answer joined to every row instead of none: every row says ClaimMiss, and the store "
        "reads the outcome of the first row only (a miss carries no row)"
    ),
    "lp_claim/drop-conjunct/7": (
        "without a request key, `d.claim_key = p_request_key` compares with NULL, which is not true: no row "
        "is found either way"
    ),
    **dict.fromkeys(
        [*_where("lp_set_community_state", "drop-conjunct", "state <> p_state")],
        "a change to the state the community already has then takes the fence exclusively and writes the same "
        "state again: nothing a later operation reads differs",
    ),
    **dict.fromkeys(_where("lp_now", "drop-conjunct", "pinned IS NOT NULL AND"), _TEST_CLOCK),
    **dict.fromkeys(_where("lp_now", "drop-conjunct", "AND lp_test_hooks()"), _TEST_CLOCK),
    # -- lifecycle -------------------------------------------------------------------
    **dict.fromkeys(
        [
            *_where("lp_save_definition", "drop-conjunct", "FOUND AND"),
        ],
        _NULL_HEAD,
    ),
    "lp_save_definition/drop-conjunct/12": _CUTOFF_BEHIND_HEAD,
    "lp_delete_definition/drop-statement/1": (
        "the next statement deletes the head, and the runtime row goes with it (ON DELETE CASCADE from "
        "definition_heads)"
    ),
    "lp_admit/drop-conjunct/7": _ENABLED_IN_HASH,
    "lp_admit/drop-conjunct/9": _INCARNATION,
    "lp_admit/drop-conjunct/10": _INCARNATION,
    "lp_resume_run/drop-conjunct/9": _REVISION,
    "lp_resume_run/drop-conjunct/10": _REVISION,
    "lp_resume_run/drop-conjunct/13": _REVISION,
    "lp_resume_run/drop-conjunct/14": _REVISION,
    "lifecycle:lp_set_community_state/drop-assignment/2": (
        "the lifecycle machine never deletes a community (its commands create, activate, quiesce and fence "
        "them), so the branch for a deleted community is never taken; the delivery machine's mutant of the "
        "same line is not claimed"
    ),
    "lp_sweep/left-join/1": (
        "the WHERE clause keeps `c.state = 'active'`, which is not true of a row the LEFT JOIN extends with "
        "NULLs, and every delivery has its community (a foreign key): the same rows are reaped"
    ),
    "lp_sweep/drop-distinct/1": (
        "without DISTINCT a community appears once per expired row: its fence is try-locked again (an "
        "advisory lock is taken again by the transaction that holds it), and `= ANY (fenced)` answers the same "
        "for a repeated element; only the report of skipped communities would repeat one"
    ),
    "lp_resume_run/drop-conjunct/11": _ENABLED_IN_HASH,
    "lp_resume_run/drop-conjunct/12": _REVISION,
    "lp_resume_run/drop-conjunct/15": _REVISION,
    "lp_resume_run/drop-conjunct/16": _REVISION,
    "lp_admit/drop-order-key/1": _ORDINALITY,
    "lp_resume_run/drop-order-key/1": _ORDINALITY,
    "lp_definition_hash/drop-order-key/1": _ORDINALITY,
    **dict.fromkeys(
        [
            "lp_valid_actions/drop-disjunct/1",
            "lp_valid_actions/drop-disjunct/2",
            "lp_valid_actions/drop-disjunct/3",
            "lp_valid_actions/off-by-one/2",
            "lp_valid_actions/off-by-one/3",
            "lp_valid_actions/off-by-one/7",
        ],
        _BOUNDS,
    ),
}
