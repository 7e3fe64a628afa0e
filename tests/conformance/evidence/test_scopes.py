"""The scope check of the mutation score (`conformance/evidence/scopes.py`): the bundled
functions keep every scope, a mutant of who may call is caught with what it let through,
and the roles the check makes are gone afterwards."""

from __future__ import annotations

import psycopg
import pytest

from leaseproof.conformance.evidence import scopes
from leaseproof.impl.mutants.generated.catalogue import SCOPE_FUNCTIONS, by_name, generated_mutants


def _roles_left(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'lp\\_scope\\_%'")]


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
