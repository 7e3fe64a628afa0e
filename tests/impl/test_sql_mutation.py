"""The SQL and PL/pgSQL mutation operators, on small texts and on the shipped functions.

No database here: `test_generated_mutants_parse.py` checks that PostgreSQL
accepts every generated mutant.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.lifecycle.store import LifecycleStore
from leaseproof.impl.migrate import functions
from leaseproof.impl.mutants.generated.catalogue import (
    MACHINES,
    RACE_OPERATORS,
    by_name,
    functions_of,
    generated_mutants,
    kind_of,
    not_mutated,
    statements,
)
from leaseproof.impl.mutants.generated.sql import (
    OPERATORS,
    Kind,
    Mutation,
    collapse_whitespace,
    mutations,
    schema_enums,
    tokenize,
    try_lock_outcomes,
)


def of(operator: str, sql: str) -> list[Mutation]:
    return [m for m in mutations(sql) if m.operator == operator]


def befores(operator: str, sql: str) -> list[str]:
    return [m.before for m in of(operator, sql)]


def afters(operator: str, sql: str) -> list[str]:
    return [m.after for m in of(operator, sql)]


def body(name: str) -> str:
    return functions()[name].body


def mutated_bodies() -> list[tuple[str, str]]:
    return [(name, body(name)) for name in dict.fromkeys(n for machine in MACHINES for n in functions_of(machine))]


# -- tokenizer -------------------------------------------------------------------------


def test_tokens_cover_the_text_and_know_literals_from_code() -> None:
    sql = (
        "SELECT 'it''s -- no comment', E'a\\'b', \"Odd \"\"name\"\"\", %(p)s, %% , x::int, 1.5e3, 42 -- c = 1\n"
        "/* lp_now() /* nested */ */ $$ body = 1 $$, $1 FROM t WHERE a <= b AND f(x => 1) <> 2"
    )
    tokens = tokenize(sql)
    assert "".join(t.text for t in tokens) == sql
    kinds = {t.text: t.kind for t in tokens}
    assert kinds["'it''s -- no comment'"] is Kind.STRING
    assert kinds["E'a\\'b'"] is Kind.STRING
    assert kinds['"Odd ""name"""'] is Kind.QUOTED
    assert kinds["%(p)s"] is Kind.PLACEHOLDER and kinds["$1"] is Kind.PLACEHOLDER
    assert kinds["%%"] is Kind.OPERATOR
    assert kinds["::"] is Kind.CAST
    assert kinds["1.5e3"] is Kind.NUMBER and kinds["42"] is Kind.NUMBER
    assert kinds["-- c = 1"] is Kind.COMMENT and kinds["/* lp_now() /* nested */ */"] is Kind.COMMENT
    assert kinds["$$ body = 1 $$"] is Kind.STRING
    assert kinds["<="] is Kind.OPERATOR and kinds["=>"] is Kind.OPERATOR and kinds["<>"] is Kind.OPERATOR


def test_nothing_inside_literals_comments_or_placeholders_is_mutated() -> None:
    sql = "SELECT 'lp_now() + 1 = 2', \"col1\" -- lp_now() = 3\nFROM t WHERE x = %(p1)s"
    found = mutations(sql)
    assert [(m.operator, m.before) for m in found] == [
        ("drop-conjunct", "x = %(p1)s"),
        ("flip-comparison", "x = %(p1)s"),
    ]


# -- each operator on small statements ---------------------------------------------------------


def test_drop_conjunct_at_any_depth_but_not_between() -> None:
    sql = "SELECT 1 FROM t WHERE a = 1 AND b BETWEEN 1 AND 2 AND (c OR d AND e)"
    assert befores("drop-conjunct", sql) == [
        "a = 1 AND",
        "AND b BETWEEN 1 AND 2",
        "AND (c OR d AND e)",
        "d AND",
        "AND e",
    ]
    assert of("drop-conjunct", sql)[1].sql == "SELECT 1 FROM t WHERE a = 1 AND (c OR d AND e)"
    assert of("drop-conjunct", sql)[3].sql == "SELECT 1 FROM t WHERE a = 1 AND b BETWEEN 1 AND 2 AND (c OR e)"


def test_drop_conjunct_of_a_single_predicate_makes_it_true() -> None:
    assert [m.sql for m in of("drop-conjunct", "DELETE FROM t WHERE id = %(id)s")] == ["DELETE FROM t WHERE true"]
    assert [m.sql for m in of("drop-conjunct", "SELECT 1 FROM t WHERE (a = 1)")] == ["SELECT 1 FROM t WHERE (true)"]


def test_join_on_and_having_are_conditions_on_conflict_is_not() -> None:
    join = "SELECT 1 FROM a JOIN b ON b.id = a.id AND b.x = 1 WHERE a.y = 2"
    assert befores("drop-conjunct", join) == ["b.id = a.id AND", "AND b.x = 1", "a.y = 2"]
    having = "SELECT k FROM t GROUP BY k HAVING count(*) > 1 AND k <> 0 ORDER BY k"
    assert befores("drop-conjunct", having) == ["count(*) > 1 AND", "AND k <> 0"]
    upsert = "INSERT INTO t (a, b) VALUES (1, 2) ON CONFLICT (a) DO UPDATE SET b = excluded.b"
    constraint = "INSERT INTO t (a) VALUES (1) ON CONFLICT ON CONSTRAINT t_a DO NOTHING"
    for sql in (upsert, constraint):
        assert of("drop-conjunct", sql) == of("flip-comparison", sql) == []


def test_drop_disjunct() -> None:
    sql = "SELECT 1 FROM t WHERE a OR (b AND c) OR d"
    assert befores("drop-disjunct", sql) == ["a OR", "OR (b AND c)", "OR d"]
    assert of("drop-disjunct", sql)[1].sql == "SELECT 1 FROM t WHERE a OR d"
    assert of("drop-disjunct", "SELECT 1 FROM t WHERE a AND b") == []


def test_flip_comparison_flips_every_comparison_both_ways() -> None:
    sql = (
        "SELECT 1 FROM t WHERE a < 1 AND b <= 1 AND c > 1 AND d >= 1 AND e = 1 AND f <> 1 AND g != 1"
        " AND h IS NULL AND i IS NOT NULL AND j IS DISTINCT FROM k AND l IS NOT DISTINCT FROM m"
    )
    assert afters("flip-comparison", sql) == [
        "a <= 1",
        "b < 1",
        "c >= 1",
        "d > 1",
        "e <> 1",
        "f = 1",
        "g = 1",
        "h IS NOT NULL",
        "i IS NULL",
        "j IS NOT DISTINCT FROM k",
        "l IS DISTINCT FROM m",
    ]


def test_flip_comparison_leaves_assignments_and_named_arguments() -> None:
    sql = "UPDATE t SET a = make_interval(secs => %(s)s), b = 2 WHERE c = 3 AND d = f(x => 1)"
    assert befores("flip-comparison", sql) == ["c = 3", "d = f(x => 1)"]
    assert of("flip-comparison", sql)[1].sql == sql.replace("d = f", "d <> f")
    upsert = "INSERT INTO t (a) VALUES (1) ON CONFLICT (a) DO UPDATE SET a = excluded.a WHERE t.a < 5"
    assert afters("flip-comparison", upsert) == ["t.a <= 5"]


def test_flip_comparison_in_case_when_and_subqueries() -> None:
    sql = "SELECT CASE WHEN a = 1 THEN 2 ELSE 3 END, (SELECT max(x) FROM u WHERE u.y > t.y) FROM t"
    assert befores("flip-comparison", sql) == ["a = 1", "u.y > t.y"]
    # A CASE WHEN condition is not one whose conjuncts drop-conjunct removes.
    assert befores("drop-conjunct", sql) == ["u.y > t.y"]


def test_flip_arithmetic_binary_only() -> None:
    sql = "SELECT a + 1, -b, 2 - c, '1 + 2', lp_now() + interval '1 day' FROM t WHERE x = -1"
    assert [(m.before, m.after) for m in of("flip-arithmetic", sql)] == [
        ("a + 1", "a - 1"),
        ("2 - c", "2 + c"),
        ("lp_now() + interval '1 day'", "lp_now() - interval '1 day'"),
    ]


def test_off_by_one() -> None:
    sql = "SELECT 0, 7, 'x1', col2, %(p1)s FROM t ORDER BY 1 LIMIT 1"
    assert [(m.before, m.after) for m in of("off-by-one", sql)] == [
        ("0", "1"),
        ("7", "8"),
        ("7", "6"),
        ("1", "2"),
        ("1", "0"),
    ]
    # ORDER BY 1 names a column: 0 is no column, so positions are never mutated.
    assert of("off-by-one", sql)[-1].sql.endswith("ORDER BY 1 LIMIT 0")


def test_shift_clock() -> None:
    assert [m.sql for m in of("shift-clock", "SELECT lp_now() AS now")] == [
        "SELECT (lp_now() + interval '1 microsecond') AS now",
        "SELECT (lp_now() - interval '1 microsecond') AS now",
    ]


def test_order_keys() -> None:
    sql = "SELECT a FROM t ORDER BY a, b DESC, c ASC NULLS LAST LIMIT 3"
    assert [m.sql for m in of("drop-order-key", sql)] == [
        "SELECT a FROM t ORDER BY b DESC, c ASC NULLS LAST LIMIT 3",
        "SELECT a FROM t ORDER BY a, c ASC NULLS LAST LIMIT 3",
        "SELECT a FROM t ORDER BY a, b DESC LIMIT 3",
    ]
    assert afters("reverse-order-key", sql) == ["a DESC", "b ASC", "c DESC NULLS LAST"]
    assert [m.sql for m in of("drop-order-key", "SELECT a FROM t ORDER BY a LIMIT 1")] == ["SELECT a FROM t LIMIT 1"]


def test_lock_operators() -> None:
    sql = "SELECT 1 FROM a JOIN b ON b.id = a.id FOR UPDATE OF a, b SKIP LOCKED"
    assert [m.sql for m in of("drop-lock", sql)] == ["SELECT 1 FROM a JOIN b ON b.id = a.id"]
    assert [m.sql for m in of("drop-skip-locked", sql)] == ["SELECT 1 FROM a JOIN b ON b.id = a.id FOR UPDATE OF a, b"]
    for clause in ("FOR NO KEY UPDATE NOWAIT", "FOR SHARE", "FOR KEY SHARE"):
        assert befores("drop-lock", f"SELECT x FROM t WHERE y {clause}") == [clause]
    assert of("drop-lock", "CREATE TRIGGER x AFTER DELETE ON t FOR EACH ROW EXECUTE FUNCTION f()") == []
    lock = "SELECT pg_advisory_xact_lock(hashtextextended('k', 0))"
    assert [m.sql for m in of("try-advisory-lock", lock)] == [
        "SELECT pg_try_advisory_xact_lock(hashtextextended('k', 0))"
    ]


def test_drop_assignment_keeps_the_old_value() -> None:
    sql = "UPDATE t AS x SET a = 1, b = x.b, c = (SELECT 1) FROM u WHERE u.id = x.id"
    assert afters("drop-assignment", sql) == ["a = x.a", "c = x.c"]
    assert afters("drop-assignment", "UPDATE ONLY s.t SET a = a + 1") == ["a = t.a"]
    upsert = "INSERT INTO heads (k, v) VALUES (1, 2) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
    assert afters("drop-assignment", upsert) == ["v = heads.v"]
    aliased = "INSERT INTO heads AS h (k, v) VALUES (1, 2) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
    assert afters("drop-assignment", aliased) == ["v = h.v"]
    # Not the SET of a session setting.
    assert of("drop-assignment", "SET TIME ZONE 'UTC'") == []


def test_replace_literal_cycles_the_schema_enums() -> None:
    assert dict(schema_enums()) == {
        "delivery_status": ("pending", "claimed", "finished", "failed"),
        "community_state": ("active", "quiescing", "fenced", "deleted"),
        "delivery_cause_kind": ("event", "schedule", "webhook"),
    }
    sql = "SELECT 'pending', 'failed', 'deleted'::community_state, 'webhook', 'other', 'active'::delivery_status"
    assert [(m.before, m.after) for m in of("replace-literal", sql)] == [
        ("'pending'", "'claimed'"),
        ("'failed'", "'pending'"),
        ("'deleted'", "'active'"),
        ("'webhook'", "'event'"),
    ]


def test_drop_in_element() -> None:
    sql = "SELECT 1 FROM t WHERE s IN ('a', 'b', 'c')"
    assert [m.sql for m in of("drop-in-element", sql)] == [
        "SELECT 1 FROM t WHERE s IN ('b', 'c')",
        "SELECT 1 FROM t WHERE s IN ('a', 'c')",
        "SELECT 1 FROM t WHERE s IN ('a', 'b')",
    ]
    for other in ("s IN ('a')", "s IN (SELECT x FROM u)", "s IN (%(a)s, %(b)s)"):
        assert of("drop-in-element", f"SELECT 1 FROM t WHERE {other}") == []


def test_drop_distinct() -> None:
    assert [m.sql for m in of("drop-distinct", "SELECT DISTINCT a, count(DISTINCT b) FROM t")] == [
        "SELECT a, count(DISTINCT b) FROM t",
        "SELECT DISTINCT a, count(b) FROM t",
    ]
    # DISTINCT ON goes with its list: a bare `ON (a)` would not parse.
    assert [m.sql for m in of("drop-distinct", "SELECT DISTINCT ON (a) a, b FROM t")] == ["SELECT a, b FROM t"]
    assert of("drop-distinct", "SELECT 1 FROM t WHERE a IS DISTINCT FROM b OR a IS NOT DISTINCT FROM c") == []


def test_left_join_only_where_the_lock_allows_it() -> None:
    assert afters("left-join", "SELECT 1 FROM a JOIN b ON b.id = a.id INNER JOIN c ON c.id = a.id") == [
        "LEFT JOIN",
        "LEFT JOIN",
    ]
    assert of("left-join", "SELECT 1 FROM a LEFT JOIN b ON b.id = a.id CROSS JOIN c") == []
    # PostgreSQL's planner refuses to lock the nullable side of an outer join
    # ("FOR SHARE cannot be applied to the nullable side of an outer join"):
    # such a mutant could never run, so none is generated.
    assert of("left-join", "SELECT 1 FROM a JOIN b x ON x.id = a.id FOR SHARE") == []
    assert of("left-join", "SELECT 1 FROM a JOIN b x ON x.id = a.id FOR SHARE OF x") == []
    assert afters("left-join", "SELECT 1 FROM a JOIN b x ON x.id = a.id FOR SHARE OF a") == ["LEFT JOIN"]
    # A lock inside a subquery is that subquery's, not the outer join's.
    assert afters("left-join", "SELECT 1 FROM a JOIN (SELECT id FROM b FOR SHARE) x ON x.id = a.id") == ["LEFT JOIN"]


def test_drop_on_conflict_only_do_nothing() -> None:
    assert [
        m.sql for m in of("drop-on-conflict", "INSERT INTO t (a) VALUES (1) ON CONFLICT DO NOTHING RETURNING a")
    ] == ["INSERT INTO t (a) VALUES (1) RETURNING a"]
    assert befores("drop-on-conflict", "INSERT INTO t (a) VALUES (1) ON CONFLICT ON CONSTRAINT k DO NOTHING") == [
        "ON CONFLICT ON CONSTRAINT k DO NOTHING"
    ]
    assert of("drop-on-conflict", "INSERT INTO t (a) VALUES (1) ON CONFLICT (a) DO UPDATE SET a = 2") == []


def test_drop_not() -> None:
    sql = (
        "SELECT 1 FROM t WHERE NOT a AND b NOT IN (1, 2) AND NOT EXISTS (SELECT 1 FROM u)"
        " AND c IS NOT NULL AND d IS NOT DISTINCT FROM e"
    )
    assert [(m.before, m.after) for m in of("drop-not", sql)] == [
        ("NOT a", "a"),
        ("b NOT IN (1, 2)", "b IN (1, 2)"),
        ("NOT EXISTS (SELECT 1 FROM u)", "EXISTS (SELECT 1 FROM u)"),
    ]
    assert of("drop-not", "CREATE TABLE t (a int NOT NULL)") == []


# -- PL/pgSQL ------------------------------------------------------------------------------

PLPGSQL = """
#variable_conflict use_column
DECLARE
    n integer := cardinality(p_ids);
BEGIN
    PERFORM 1 FROM t WHERE a = p_a FOR SHARE;
    IF NOT FOUND THEN
        outcome := 'NoAuthority';
        RETURN;
    ELSIF n > 1 AND p_b IS NOT TRUE THEN
        x := (code >> 10) + 1;
    END IF;
    DELETE FROM t WHERE a = p_a;
    outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'NotFound' END;
    RETURN EXISTS (SELECT 1 FROM u WHERE u.a = p_a) OR p_c;
END
"""


def test_plpgsql_tokens() -> None:
    tokens = tokenize(PLPGSQL)
    assert "".join(t.text for t in tokens) == PLPGSQL
    kinds = {t.text: t.kind for t in tokens}
    assert kinds["#variable_conflict use_column"] is Kind.COMMENT  # a directive: nothing to mutate
    assert kinds[":="] is Kind.OPERATOR and kinds[">>"] is Kind.OPERATOR
    # `#>` is still an operator, and `#` inside a line is not a directive.
    assert [t.text for t in tokenize("SELECT a #> b, c # d") if t.kind is Kind.OPERATOR] == ["#>", "#"]


def test_plpgsql_conditions_assignments_and_returns() -> None:
    assert befores("drop-conjunct", PLPGSQL) == [
        "a = p_a",
        "NOT FOUND",
        "n > 1 AND",
        "AND p_b IS NOT TRUE",
        "a = p_a",
        "u.a = p_a",
    ]
    assert afters("drop-conjunct", PLPGSQL)[:2] == ["true", "true"]  # a WHERE, an IF: their one predicate
    assert befores("drop-disjunct", PLPGSQL) == ["EXISTS (SELECT 1 FROM u WHERE u.a = p_a) OR", "OR p_c"]
    assert afters("flip-comparison", PLPGSQL) == ["a <> p_a", "n >= 1", "p_b IS TRUE", "a <> p_a", "u.a <> p_a"]
    assert afters("drop-not", PLPGSQL) == ["FOUND"]
    # A shift is arithmetic, not two comparisons; the select list of PERFORM and of EXISTS is never read.
    assert afters("flip-arithmetic", PLPGSQL) == ["(code >> 10) - 1"]
    assert [(m.before, m.after) for m in of("off-by-one", PLPGSQL)] == [
        ("1", "2"), ("1", "0"), ("10", "11"), ("10", "9"), ("1", "2"), ("1", "0")
    ]  # fmt: skip
    assert of("off-by-one", PLPGSQL)[0].sql.count("n > 2 AND") == 1


def test_negate_condition_takes_the_other_branch() -> None:
    found = of("negate-condition", PLPGSQL)
    assert [(m.before, m.after) for m in found] == [
        ("n > 1 AND p_b IS NOT TRUE", "NOT (n > 1 AND p_b IS NOT TRUE)"),
        ("FOUND", "NOT (FOUND)"),  # a CASE WHEN
    ]  # not IF NOT FOUND: drop-not's
    # Not the WHEN of a simple CASE, which names a value, nor a WHERE.
    assert of("negate-condition", "SELECT CASE kind WHEN 'a' THEN 1 END FROM t WHERE x") == []
    assert afters("negate-condition", "BEGIN WHILE i < 3 LOOP i := i + 1; EXIT WHEN i = 2; END LOOP; END") == [
        "NOT (i < 3)",
        "NOT (i = 2)",
    ]


def test_drop_assignment_return_and_statement() -> None:
    assert [(m.before, m.after) for m in of("drop-assignment", PLPGSQL)] == [
        (":= cardinality(p_ids)", ""),  # a declaration: the variable starts NULL
        ("outcome := 'NoAuthority';", ""),
        ("x := (code >> 10) + 1;", ""),
        ("outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'NotFound' END;", ""),
    ]
    dropped = of("drop-assignment", PLPGSQL)
    assert "    n integer;\n" in dropped[0].sql
    assert "IF NOT FOUND THEN\n        RETURN;" in dropped[1].sql
    assert [m.before for m in of("drop-return", PLPGSQL)] == ["RETURN;"]  # not RETURN EXISTS …
    assert [m.before for m in of("drop-statement", PLPGSQL)] == ["DELETE FROM t WHERE a = p_a;"]
    assert "END IF;\n    outcome := CASE" in of("drop-statement", PLPGSQL)[0].sql
    # A write inside a WITH is part of its statement, not one of its own.
    assert of("drop-statement", "BEGIN WITH d AS (DELETE FROM t RETURNING 1) SELECT count(*) INTO n FROM d; END") == []


# -- on the shipped functions ----------------------------------------------------------------


def test_renew_conjuncts() -> None:
    found = of("drop-conjunct", body("lp_renew"))
    assert [m.before for m in found] == [
        "lp_may_act(p_community)",  # the caller's scope (the fence's PERFORM)
        "NOT FOUND",
        "c.id = p_community",  # the community's state
        "e.state = 'active' AND",  # the write's gate
        "AND d.community_id = p_community",
        "AND d.id = p_delivery",
        "AND d.target_pubkey = p_target",
        "AND d.lease_generation = p_generation",
        "AND d.status = 'claimed'",
        "AND d.lease_until >= e.t",
    ]
    # The hand-written mutant RenewIgnoresExpiry is one of them, byte for byte.
    assert found[9].sql == body("lp_renew").replace("\n          AND d.lease_until >= e.t", "")
    assert by_name("lp_renew/drop-conjunct/10").stands_for == 'lp_renew: drops the conjunct "d.lease_until >= e.t"'


def test_claim_named_arguments_and_assignments_never_flip() -> None:
    claim = body("lp_claim")
    for m in of("flip-comparison", claim):
        assert m.sql.count("secs => p_lease_seconds") == 1
        assert "lease_generation = d.lease_generation + 1" in m.sql and "claimed_at = e.t" in m.sql
        assert "SET status = 'claimed'" in m.sql
    assert afters("flip-arithmetic", claim) == [
        "d.lease_generation - 1",
        "e.t - make_interval(secs => p_lease_seconds)",
    ]
    assert afters("drop-assignment", claim) == [
        "status = d.status",
        "lease_generation = d.lease_generation",
        "lease_until = d.lease_until",
        "claimed_at = d.claimed_at",
        "claim_key = d.claim_key",
    ]
    assert afters("reverse-order-key", claim) == ["d.created_at DESC", "d.id DESC"]
    assert befores("drop-lock", claim) == ["FOR UPDATE SKIP LOCKED"]
    assert befores("drop-skip-locked", claim) == ["SKIP LOCKED"]
    assert befores("try-advisory-lock", claim) == ["pg_advisory_xact_lock_shared(", "pg_advisory_xact_lock("]
    assert of("flip-comparison", body("lp_save_definition"))[-2].after == "p_enabled IS FALSE"


def test_sweep_locks_joins_and_the_purge() -> None:
    sweep = body("lp_sweep")
    assert befores("drop-lock", sweep) == ["FOR UPDATE", "FOR UPDATE OF d SKIP LOCKED"]
    assert befores("drop-skip-locked", sweep) == ["SKIP LOCKED"]
    assert len(of("left-join", sweep)) == 2  # the lock names the join's left side
    # Admission and resume lock every relation of their join: no LEFT JOIN mutant.
    assert of("left-join", body("lp_admit")) == of("left-join", body("lp_resume_run")) == []
    assert befores("drop-statement", body("lp_delete_community")) == [
        "UPDATE communities SET state = 'deleted' WHERE id = p_community;",
        "DELETE FROM workflow_agent_deliveries WHERE community_id = p_community;",
        "DELETE FROM workflow_runs WHERE community_id = p_community;",
        "DELETE FROM workflows WHERE community_id = p_community;",
        "DELETE FROM events WHERE community_id = p_community;",
        "DELETE FROM retired_delivery_ids WHERE community_id = p_community;",
    ]


def test_every_mutation_changes_its_site_only() -> None:
    for name, sql in mutated_bodies():
        found = mutations(sql)
        assert found == mutations(sql), name
        ranks = [OPERATORS.index(m.operator) for m in found]
        assert ranks == sorted(ranks), name
        for operator in {m.operator for m in found}:
            sites = [m.site for m in found if m.operator == operator]
            assert sites == list(range(1, len(sites) + 1)), name
            assert len({m.sql for m in found if m.operator == operator}) == len(sites), name
        assert all(m.sql != sql for m in found), name
        for m in found:
            assert one_site_replaced(sql, m), (name, m)


def unspaced(text: str) -> str:
    return "".join(text.split())


def one_site_replaced(sql: str, m: Mutation) -> bool:
    """Whether `m.sql` is `sql` with one occurrence of `m.before` made `m.after`, and
    every byte outside a stretch no longer than that site unchanged."""
    text = collapse_whitespace(sql)
    occurrences = [i for i in range(len(text)) if text.startswith(m.before, i)]
    candidates = {unspaced(text[:i] + m.after + text[i + len(m.before) :]) for i in occurrences}
    # Character by character on purpose: the common prefix and suffix of two texts, not of paths.
    prefix = len(os.path.commonprefix([sql, m.sql]))  # noqa: RUF071
    suffix = len(os.path.commonprefix([sql[prefix:][::-1], m.sql[prefix:][::-1]]))  # noqa: RUF071
    changed = sql[prefix : len(sql) - suffix]
    return unspaced(m.sql) in candidates and len(unspaced(changed)) <= len(unspaced(m.before))


# -- the catalogue ---------------------------------------------------------------------


def test_functions_each_machine_runs() -> None:
    delivery, lifecycle = functions_of("delivery"), functions_of("lifecycle")
    # The operations first (those the stores call), then their helpers.
    assert delivery[:3] == ("lp_create_community", "lp_set_community_state", "lp_delete_community")
    assert {"lp_claim", "lp_renew", "lp_finish", "lp_sweep", "lp_enter", "lp_may_act", "lp_now"} <= set(delivery)
    assert {"lp_save_definition", "lp_admit", "lp_resume_run", "lp_json_string", "lp_enter", "lp_now"} <= set(lifecycle)
    assert "lp_claim" not in lifecycle and "lp_admit" not in delivery
    # The lifecycle runs these of the delivery store's calls, and nothing else of it.
    borrowed = {s.attribute for s in statements("lifecycle") if s.owner is PostgresDeliveryStore}
    assert borrowed == {"SQL_CREATE_COMMUNITY", "SQL_SET_COMMUNITY_STATE"}
    assert any(s.owner is LifecycleStore for s in statements("lifecycle"))
    # The guards, the CHECK function and the test mark are left out, each with why.
    left = not_mutated()
    assert {"lp_delivery_transition", "lp_community_write_fence", "lp_delivery_shape", "lp_test_hooks"} <= set(left)
    assert not set(left) & (set(delivery) | set(lifecycle))
    assert all(len(why) > 40 for why in left.values())


def test_catalogue_names_kinds_and_patches() -> None:
    mutants = generated_mutants()
    names = [m.name for m in mutants]
    assert len(names) == len(set(names))
    assert mutants == generated_mutants("delivery") + generated_mutants("lifecycle")
    shared = set(functions_of("delivery")) & set(functions_of("lifecycle"))
    for m in mutants:
        assert m.kind == kind_of(m.mutation, m.function, body(m.function))
        if m.mutation.operator in RACE_OPERATORS:
            assert m.kind == "race"
        prefix = "lifecycle:" if m.machine == "lifecycle" and m.function in shared else ""
        assert m.name == f"{prefix}{m.function}/{m.mutation.operator}/{m.mutation.site}"
        assert "\n" not in m.stands_for and m.stands_for.startswith(m.function + ": ")
    # What only chooses a lock (a key's seed, whether to take the request key's lock) is a race
    # site; so is a dropped conjunct that reads whether the sweep's try-lock of a fence succeeded.
    assert {m.name for m in mutants if m.kind == "race" and m.mutation.operator not in RACE_OPERATORS} == {
        "lp_commit_deliveries/off-by-one/3", "lp_claim/flip-comparison/1", "lp_claim/off-by-one/1",
        "lp_claim/negate-condition/1",
        "lp_sweep/drop-conjunct/1", "lp_sweep/drop-conjunct/2", "lp_sweep/drop-conjunct/6", "lp_sweep/drop-conjunct/13",
    }  # fmt: skip
    # A comparison of the same conjunct flipped can show one operation at a time: it stays sequential.
    assert by_name("lp_sweep/flip-comparison/4").kind == "sequential"
    mutant = by_name("lifecycle:lp_enter/drop-not/1")
    assert (mutant.machine, mutant.function) == ("lifecycle", "lp_enter")
    assert by_name("lp_enter/drop-not/1").machine == "delivery"
    patch = mutant.patch
    assert (patch.function, patch.old, patch.new) == ("lp_enter", body("lp_enter"), mutant.mutation.sql)
    changed = [line for line in mutant.diff.splitlines()[2:] if line[:1] in "-+"]
    assert changed == ["-    IF NOT FOUND THEN", "+    IF FOUND THEN"]
    with pytest.raises(ValueError, match="unknown machine"):
        generated_mutants("billing")


def test_unknown_name_lists_near_names() -> None:
    with pytest.raises(ValueError, match=r"did you mean lp_renew/drop-conjunct/1, lp_renew/drop-conjunct/10"):
        by_name("lp_renew/drop-conjunct/11")
    with pytest.raises(ValueError, match="no generated mutant"):
        by_name("nothing like it")


def test_catalogue_order_does_not_depend_on_hashing() -> None:
    script = (
        "from leaseproof.impl.mutants.generated.catalogue import generated_mutants; "
        "print([m.name for m in generated_mutants()])"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert runs == {str([m.name for m in generated_mutants()]) + "\n"}


def test_the_outcome_of_a_try_lock_is_its_named_column_and_what_selects_it_into_variables() -> None:
    sql = """
    BEGIN
        SELECT coalesce(array_agg(c) FILTER (WHERE got), '{}'), count(*) INTO fenced, tried
        FROM (SELECT c, pg_try_advisory_xact_lock_shared(lp_fence_key(c)) AS got FROM x) AS t;
        SELECT count(*) INTO other FROM y WHERE z;
    END
    """
    assert try_lock_outcomes(sql) == {"got", "fenced", "tried"}
    assert try_lock_outcomes("BEGIN PERFORM pg_advisory_xact_lock(1); SELECT a INTO b FROM c; END") == frozenset()
