"""The database API itself (migration 0006): its bounds are the model's, its definition hash is
the model's, every function runs with a fixed search_path and none is PUBLIC's, and the
catalogue of shipped functions the variants are built from is what the database holds."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.connection import connect
from leaseproof.impl.hooks.functions import install
from leaseproof.impl.migrate import Addition, Patch, functions, migrate, patched
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc
from leaseproof.model.binding import LATEST_INSTANT, STEP_ID_MAX_CHARS, require_step_id
from leaseproof.model.errors import InvalidValue


@pytest.fixture(scope="module")
def conn(pg_server: Server) -> Iterator[psycopg.Connection[Any]]:
    """A migrated database the module's queries share: each only casts and computes."""
    with scratch_database(pg_server, prefix="lp_api") as dsn, connect(dsn) as connection:
        migrate(connection)
        yield connection


_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _accepted(conn: psycopg.Connection[Any], sql: str, value: Any) -> bool:
    try:
        with conn.transaction():
            conn.execute(sql, (value,) if "%s" in sql else None)
    except (psycopg.errors.CheckViolation, psycopg.errors.InvalidParameterValue):
        return False
    return True


def _model_accepts(check: Any) -> bool:
    try:
        check()
    except InvalidValue:
        return False
    return True


# -- the bounds the model states are the database's -------------------------------------------


@_SETTINGS
@given(seconds=st.one_of(st.integers(-5, 5), st.integers(86_395, 86_405), st.integers(-(2**31), 2**31 - 1)))
@example(seconds=10**9)
def test_a_lease_length_is_bounded_as_the_model_bounds_it(conn: psycopg.Connection[Any], seconds: int) -> None:
    model = _model_accepts(lambda: m.Claim(uuid.uuid4(), b"\x01" * 32, seconds))
    assert _accepted(conn, "SELECT %s::integer::lp_lease_seconds", seconds) is model


_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=70)


@_SETTINGS
@given(step=st.one_of(_TEXT, st.sampled_from(["", " ", "\t\v", "v", "x" * 64, "x" * 65, "\u3000", " a "])))
def test_a_step_id_is_bounded_as_the_model_bounds_it(conn: psycopg.Connection[Any], step: str) -> None:
    model = _model_accepts(lambda: require_step_id("step_id", step))
    assert _accepted(conn, "SELECT %s::text::lp_step_id", step) is model
    assert STEP_ID_MAX_CHARS == 64


@_SETTINGS
@given(key=st.one_of(_TEXT, st.sampled_from(["k", " k", "k\u3000", "\u2028", "x" * 64, "x" * 65, "a b"])))
def test_a_request_key_is_bounded_as_the_model_bounds_it(conn: psycopg.Connection[Any], key: str) -> None:
    model = _model_accepts(lambda: m.Claim(uuid.uuid4(), b"\x01" * 32, 30, request_key=key))
    assert _accepted(conn, "SELECT %s::text::lp_request_key", key) is model


@_SETTINGS
@given(size=st.integers(0, 40))
def test_a_key_is_32_bytes(conn: psycopg.Connection[Any], size: int) -> None:
    model = _model_accepts(lambda: m.PublishEvent(uuid.uuid4(), b"\x07" * size))
    assert _accepted(conn, "SELECT %s::bytea::lp_key", b"\x07" * size) is model


@_SETTINGS
@given(actions=st.lists(st.one_of(_TEXT, st.sampled_from([" ", "\u3000\t", "a", "x" * 64, "x" * 65])), max_size=10))
def test_a_definitions_actions_are_bounded_as_the_model_bounds_them(
    conn: psycopg.Connection[Any], actions: list[str]
) -> None:
    model = _model_accepts(lambda: lc.Definition(tuple(actions)))
    row = conn.execute("SELECT lp_valid_actions(%s::text[]) AS ok", (actions,)).fetchone()
    assert row is not None and row["ok"] is model


@pytest.mark.parametrize(
    ("instant", "accepted"),
    [
        (LATEST_INSTANT, True),
        (LATEST_INSTANT + dt.timedelta(microseconds=1), False),
        (dt.datetime(1970, 1, 1, tzinfo=dt.UTC), True),
    ],
)
def test_a_signed_instant_ends_where_the_models_do(
    conn: psycopg.Connection[Any], instant: dt.datetime, accepted: bool
) -> None:
    assert _accepted(conn, "SELECT %s::timestamptz::lp_instant", instant) is accepted
    assert _accepted(conn, "SELECT 'infinity'::timestamptz::lp_instant", None) is False


# -- the definition hash is the model's ---------------------------------------------------------


@_SETTINGS
@given(
    actions=st.lists(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=64).filter(str.strip),
        min_size=1,
        max_size=8,
    ),
    enabled=st.sampled_from([None, True, False]),
)
@example(actions=['"quote" \\ back\nslash\t\x01\x1f\x7f', "é", "😀 astral", "\u2028x"], enabled=None)
def test_the_database_hashes_a_definition_as_the_model_does(
    conn: psycopg.Connection[Any], actions: list[str], enabled: bool | None
) -> None:  # fmt: skip
    row = conn.execute("SELECT lp_definition_hash(%s::text[], %s) AS hash", (actions, enabled)).fetchone()
    assert row is not None and bytes(row["hash"]) == lc.Definition(tuple(actions), enabled).hash


# -- every function is fixed to its schema, and none is PUBLIC's ----------------------------------


def test_every_function_runs_with_a_fixed_search_path_and_none_is_executable_by_public(
    conn: psycopg.Connection[Any],
) -> None:
    rows = conn.execute(
        "SELECT proname::text AS name, proconfig, has_function_privilege('public', oid, 'EXECUTE') AS public"
        " FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'lp\\_%'"
    ).fetchall()
    assert {row["name"] for row in rows} == set(functions())
    unfixed = [row["name"] for row in rows if "search_path=pg_catalog, public, pg_temp" not in (row["proconfig"] or [])]
    assert unfixed == []
    assert [row["name"] for row in rows if row["public"]] == []


def test_the_catalogue_of_shipped_functions_is_what_a_migrated_database_holds(delivery_dsn: str) -> None:
    with connect(delivery_dsn) as database:
        assert install(database) == []  # nothing differs: nothing is created again
        shipped = functions()["lp_renew"]
        renamed = Patch("lp_renew", "make_interval(secs => p_lease_seconds)", "make_interval(secs => 1)")
        assert install(database, [renamed]) == ["lp_renew"]
        body = database.execute("SELECT prosrc FROM pg_proc WHERE proname = 'lp_renew'").fetchone()
        assert body is not None and body["prosrc"] == renamed.apply(shipped).body
        assert install(database) == ["lp_renew"]  # the shipped body back


def test_a_patch_must_name_its_text_exactly_once_and_an_addition_a_new_function() -> None:
    with pytest.raises(ValueError, match="occurs 0 times"):
        patched([Patch("lp_renew", "no such text", "x")])
    with pytest.raises(ValueError, match="occurs 2 times"):
        patched([Patch("lp_finish", "AND d.target_pubkey = p_target", "")])
    with pytest.raises(ValueError, match="no shipped function"):
        patched([Patch("lp_nothing", "a", "b")])
    existing = functions()["lp_now"].definition
    with pytest.raises(ValueError, match="defined already"):
        patched([Addition(existing)])
    added = Addition("CREATE FUNCTION lp_test_one() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")
    assert patched([added])["lp_test_one"].body == " SELECT 1 "
