"""The scope check of the mutation score (`conformance/evidence/scopes.py`): the bundled
functions keep every scope, a mutant of who may call is caught with what it let through,
and the roles the check makes are gone afterwards."""

from __future__ import annotations

import psycopg
import psycopg.sql
import pytest

from leaseproof.conformance.evidence import scopes
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.mutants.generated.catalogue import SCOPE_FUNCTIONS, by_name, generated_mutants


def _roles_left(dsn: str) -> list[str]:
    """The roles a check on this database made and left (other tests' checks name theirs apart)."""
    with psycopg.connect(dsn) as conn:
        pattern = scopes.role_prefix(conn.info.dbname).replace("_", "\\_") + "\\_%"
        return [r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (pattern,))]


def test_the_bundled_functions_keep_every_scope_and_leave_no_role(delivery_dsn: str) -> None:
    assert scopes.judge(delivery_dsn) is None
    assert scopes.judge(delivery_dsn) is None  # again, on the same database
    assert _roles_left(delivery_dsn) == []


@pytest.mark.parametrize(
    ("mutant", "caught"),
    [
        ("lp_claim/drop-conjunct/1", "tenant A on B: Claim was answered ClaimMiss(), not Forbidden"),
        ("lp_may_act/flip-comparison/3", "does not act for community"),  # the tenant refused its own
        ("lp_is_fleet/drop-disjunct/2", "the owner"),
        ("lp_enabled_records/drop-conjunct/3", "a role with no scope: its replica's records"),
        ("lp_resume_run/drop-conjunct/2", "Forbidden, not UnknownRun"),
        ("lp_require_read_committed/drop-conjunct/1", "read committed"),
    ],
)
def test_a_mutant_of_who_may_call_is_caught_with_what_it_let_through(
    delivery_dsn: str, mutant: str, caught: str
) -> None:
    broken = scopes.judge(delivery_dsn, by_name(mutant).classes())
    assert broken is not None and caught in broken, broken
    assert scopes.judge(delivery_dsn) is None  # the shipped functions are back
    assert _roles_left(delivery_dsn) == []


def test_the_scope_mutants_are_those_of_who_may_call() -> None:
    scoped = [m for m in generated_mutants() if m.kind == "scope"]
    assert {m.function for m in scoped} >= SCOPE_FUNCTIONS - {"lp_scope_refused"}
    elsewhere = {m.function for m in scoped if m.function not in SCOPE_FUNCTIONS}
    # a condition that calls lp_may_act, or a site inside a group that reads session_user
    assert elsewhere == {
        "lp_commit_deliveries", "lp_claim", "lp_renew", "lp_finish", "lp_enter", "lp_enabled_records", "lp_resume_run"
    }  # fmt: skip
    assert by_name("lp_enabled_records/drop-conjunct/4").kind == "scope"  # s.community_id = r.community_id
    assert by_name("lp_claim/drop-conjunct/1").kind == "scope"
    assert by_name("lp_claim/flip-arithmetic/1").kind == "sequential"


def test_a_role_that_is_not_a_superuser_is_told_what_the_check_needs(delivery_dsn: str) -> None:
    with psycopg.connect(delivery_dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS lp_scope_test_plain")
        conn.execute("CREATE ROLE lp_scope_test_plain LOGIN")
    try:
        plain = psycopg.conninfo.make_conninfo(delivery_dsn, user="lp_scope_test_plain")
        with pytest.raises(RuntimeError, match="needs a superuser"):
            scopes.judge(plain)
    finally:
        with psycopg.connect(delivery_dsn, autocommit=True) as conn:
            conn.execute("DROP ROLE lp_scope_test_plain")


def test_kind_scope_without_generated_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from leaseproof.conformance.frontends.cli import main

    assert main(["mutants", "--kind", "scope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "leaseproof: --kind scope applies to --generated (the shipped mutants have no scope kind)\n"
    )


def test_the_roles_a_killed_check_left_are_dropped_by_the_runs_prefix(pg_server: Server) -> None:
    """A worker killed inside a check leaves its roles; they are named after its database, so the
    score's clean-up (`drop_roles` with the run's database prefix) finds them, and no other run's."""
    ours, theirs = (
        scopes.role_prefix("lp_mutation_1_ab") + "_tenant",
        scopes.role_prefix("lp_mutation_12_ab") + "_fleet",
    )
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        for name in (ours, theirs):
            conn.execute(psycopg.sql.SQL("CREATE ROLE {}").format(psycopg.sql.Identifier(name)))
    try:
        scopes.drop_roles(pg_server.dsn, "lp_mutation_1")
        with psycopg.connect(pg_server.dsn) as conn:
            left = {
                r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", ([ours, theirs],))
            }
        assert left == {theirs}
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            for name in (ours, theirs):
                conn.execute(psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(psycopg.sql.Identifier(name)))
