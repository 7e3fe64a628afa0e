"""The database guards its own invariants (migration 0004), whoever writes.

Direct SQL, as the database's owner and as an application role with the
ordinary grants (SELECT, INSERT, UPDATE, DELETE on every table), tries each
invariant violation the issue found accepted and each one the CHECK
constraints of 0001 already refused: each is refused with its own SQLSTATE
and constraint name, and the database is unchanged afterwards. The same
application role tries every way to move the clock, and `lp_now()` does not
move. Roles are cluster-wide: each is named uniquely and dropped afterwards.
"""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leaseproof.conformance.harness.provision import Server, scratch_database
from leaseproof.impl.delivery.store import PostgresDeliveryStore, connect
from leaseproof.impl.hooks.clock import PinnedClock, is_test_database, mark_test_database
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, EventCause
from leaseproof.model.errors import Refused

A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)
WORKFLOW, RUN, OTHER_RUN = uuid.UUID(int=0x100), uuid.UUID(int=0x200), uuid.UUID(int=0x201)
T1, T2 = b"\x01" * 32, b"\x02" * 32
MESSAGE, DEFINITION = b"\x03" * 32, b"\x04" * 32
PENDING, CLAIMED, FINISHED, FAILED, RETIRED = (uuid.UUID(int=0xD0 + i) for i in range(5))
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

TABLES = ("communities", "workflows", "workflow_runs", "events", "workflow_agent_deliveries", "retired_delivery_ids")


def _binding(community: uuid.UUID, run: uuid.UUID, step: str) -> Binding:
    return Binding(community, WORKFLOW, run, step, T1, DEFINITION, MESSAGE, EventCause(b"\x05" * 32))


def _world(dsn: str) -> None:
    """Community A with a delivery in each status and a retired id; community B deleted.
    Made by the store, on the database's real clock: a production database."""
    with connect(dsn) as conn:
        store = PostgresDeliveryStore(conn)
        for community in (A, B):
            store.execute(m.CreateCommunity(community))
        store.execute(m.CreateWorkflow(A, WORKFLOW))
        for run in (RUN, OTHER_RUN):
            store.execute(m.CreateRun(A, WORKFLOW, run))
        store.execute(m.PublishEvent(A, MESSAGE))
        for i, delivery in enumerate((PENDING, CLAIMED, FINISHED, FAILED)):
            store.execute(m.CommitDeliveries(A, RUN, f"s{i}", [m.NewDelivery(delivery, _binding(A, RUN, f"s{i}"))]))
        store.execute(m.CommitDeliveries(A, OTHER_RUN, "s9", [m.NewDelivery(RETIRED, _binding(A, OTHER_RUN, "s9"))]))
        store.execute(m.DeleteRun(A, OTHER_RUN))  # retires RETIRED
        for delivery, outcome in ((CLAIMED, None), (FINISHED, m.Status.FINISHED), (FAILED, m.Status.FAILED)):
            claimed = store.execute(m.Claim(A, T1, 300, delivery_id=delivery))
            assert isinstance(claimed, m.Claimed)
            if outcome is not None:
                assert store.execute(m.Finish(claimed.lease, outcome)) == m.Settled(outcome)
        store.execute(m.DeleteCommunity(B))


def _dump(conn: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """Every row of the delivery machine's tables, and the clock table."""
    return {
        table: [
            row[0]
            for row in conn.execute(
                sql.SQL("SELECT to_jsonb(t)::text FROM {} t ORDER BY 1").format(sql.Identifier(table))
            ).fetchall()
        ]
        for table in (*TABLES, "lp_clock")
    }


@attrs.frozen
class Roles:
    owner: str  # the DSN of the database's owner (the test server's superuser)
    app: str  # the DSN of the application role
    app_name: str


ORDINARY_GRANTS = (
    "GRANT USAGE ON SCHEMA public TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
    "GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}",
    "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role}",
)


def create_role(server: Server, dsn: str, grants: tuple[str, ...]) -> str:
    """A uniquely named login role, granted `grants` in the database of `dsn`."""
    name = f"lp_app_{secrets.token_hex(6)}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for grant in grants:
            conn.execute(sql.SQL(grant).format(role=sql.Identifier(name)))
    return name


def drop_role(server: Server, dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def as_role(dsn: str, role: str) -> str:
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None and k != "password"}
    params["user"] = role
    return make_conninfo("", **params)


@pytest.fixture(scope="module")
def production(pg_server: Server, delivery_template: str) -> Iterator[Roles]:
    """A migrated database that is not a test database, its world, and an application role."""
    with scratch_database(pg_server, template=delivery_template) as dsn:
        _world(dsn)
        name = create_role(pg_server, dsn, ORDINARY_GRANTS)
        try:
            yield Roles(dsn, as_role(dsn, name), name)
        finally:
            drop_role(pg_server, dsn, name)


# -- direct SQL against every invariant ---------------------------------------------------------

_COLUMNS = (
    "community_id, id, workflow_id, run_id, step_id, target_pubkey, definition_event_id, message_event_id,"
    " cause_kind, cause_event_id, cause_scheduled_for, cause_invocation_id, status, lease_generation, created_at"
)


def _insert(**values: str) -> str:
    """An INSERT of a delivery of community A, run RUN: a well-formed pending row but for `values`."""
    row = {
        "community_id": f"'{A}'",
        "id": "gen_random_uuid()",
        "workflow_id": f"'{WORKFLOW}'",
        "run_id": f"'{RUN}'",
        "step_id": "'fresh'",
        "target_pubkey": "'\\x" + "01" * 32 + "'",
        "definition_event_id": "'\\x" + "04" * 32 + "'",
        "message_event_id": "'\\x" + "03" * 32 + "'",
        "cause_kind": "'event'",
        "cause_event_id": "'\\x" + "05" * 32 + "'",
        "cause_scheduled_for": "NULL",
        "cause_invocation_id": "NULL",
        "status": "'pending'",
        "lease_generation": "0",
        "created_at": "lp_now()",
        **values,
    }
    values_sql = ", ".join(row[c.strip()] for c in _COLUMNS.split(","))
    return f"INSERT INTO workflow_agent_deliveries ({_COLUMNS}) VALUES ({values_sql})"


def _update(delivery: uuid.UUID, assignments: str) -> str:
    return f"UPDATE workflow_agent_deliveries SET {assignments} WHERE community_id = '{A}' AND id = '{delivery}'"


GUARD, CHECK = "LP003", "23514"

# name: (statement, SQLSTATE, constraint)
ACCEPTED_BEFORE_0004 = {
    "lower a generation": (
        _update(CLAIMED, "lease_generation = lease_generation - 1"),
        GUARD,
        "delivery_generation_monotone",
    ),
    "flip finished to failed": (_update(FINISHED, "status = 'failed'"), GUARD, "delivery_terminal_once"),
    "return failed to pending": (
        _update(FAILED, "status = 'pending', finished_at = NULL"),
        GUARD,
        "delivery_terminal_once",
    ),
    "settle a pending row without a claim": (
        _update(PENDING, "status = 'finished', finished_at = lp_now()"),
        GUARD,
        "delivery_settled_only_when_claimed",
    ),
    "lease_until before claimed_at": (
        _update(CLAIMED, "lease_until = claimed_at - interval '1 second'"),
        CHECK,
        "delivery_lease_until_after_claimed_at",
    ),
    "created_at in the future": (_insert(created_at="lp_now() + interval '1 hour'"), GUARD, "delivery_created_now"),
    "change target_pubkey": (
        _update(PENDING, "target_pubkey = '\\x" + "02" * 32 + "'"),
        GUARD,
        "delivery_binding_immutable",
    ),
    "change step_id": (_update(PENDING, "step_id = 'renamed'"), GUARD, "delivery_binding_immutable"),
    "retire a live id": (
        f"INSERT INTO retired_delivery_ids (community_id, id) VALUES ('{A}', '{PENDING}')",
        GUARD,
        "retired_delivery_id_not_live",
    ),
    "insert a retired id": (_insert(id=f"'{RETIRED}'"), GUARD, "delivery_id_not_retired"),
    "revive a deleted community": (
        f"UPDATE communities SET state = 'active' WHERE id = '{B}'",
        GUARD,
        "community_deleted_for_good",
    ),
    "remove a deleted community's tombstone": (
        f"DELETE FROM communities WHERE id = '{B}'",
        GUARD,
        "community_tombstone_kept",
    ),
    # Beyond the list, the same invariants by another door:
    "forget a retired id": (
        f"DELETE FROM retired_delivery_ids WHERE community_id = '{A}' AND id = '{RETIRED}'",
        GUARD,
        "retired_delivery_id_kept",
    ),
    "create a delivery already settled": (
        _insert(status="'finished'", lease_generation="1", created_at="lp_now()")
        .replace("status, lease_generation, created_at)", "status, lease_generation, created_at, finished_at)")
        .replace("lp_now())", "lp_now(), lp_now())"),
        GUARD,
        "delivery_created_pending",
    ),
    "delete a live community": (f"DELETE FROM communities WHERE id = '{A}'", GUARD, "community_tombstone_kept"),
}

REFUSED_BY_0001 = {
    "a blank step_id": (_insert(step_id="' \t'"), CHECK, "workflow_agent_deliveries_step_id_check"),
    "a step_id of 65 characters": (
        _insert(step_id="'" + "x" * 65 + "'"),
        CHECK,
        "workflow_agent_deliveries_step_id_check",
    ),
    "a target_pubkey of 31 bytes": (
        _insert(target_pubkey="'\\x" + "01" * 31 + "'"),
        CHECK,
        "workflow_agent_deliveries_target_pubkey_check",
    ),
    "a cause with two identity columns": (
        _insert(cause_scheduled_for="'2026-01-01T00:00:00Z'"),
        CHECK,
        "delivery_cause_exactly_one",
    ),
    "a scheduled cause off the whole second": (
        _insert(cause_kind="'schedule'", cause_event_id="NULL", cause_scheduled_for="'2026-01-01T00:00:00.5Z'"),
        CHECK,
        "workflow_agent_deliveries_cause_scheduled_for_check",
    ),
    "a negative generation": (
        _insert(lease_generation="-1"),
        CHECK,
        "workflow_agent_deliveries_lease_generation_check",
    ),
    "claimed without a lease": (
        _update(PENDING, "status = 'claimed', lease_generation = 1"),
        CHECK,
        "delivery_lease_iff_claimed",
    ),
    "settled without finished_at": (
        _update(CLAIMED, "status = 'finished', lease_until = NULL, claimed_at = NULL"),
        CHECK,
        "delivery_finished_iff_terminal",
    ),
}

VIOLATIONS = {**ACCEPTED_BEFORE_0004, **REFUSED_BY_0001}


def test_the_lists_hold_what_they_claim() -> None:
    assert len(REFUSED_BY_0001) == 8
    assert len(ACCEPTED_BEFORE_0004) >= 12


@pytest.mark.parametrize("acting", ["owner", "application role"])
@pytest.mark.parametrize("violation", list(VIOLATIONS))
def test_each_violation_is_refused_and_changes_nothing(production: Roles, violation: str, acting: str) -> None:
    statement, sqlstate, constraint = VIOLATIONS[violation]
    dsn = production.owner if acting == "owner" else production.app
    with psycopg.connect(production.owner, autocommit=True) as owner:
        before = _dump(owner)
        with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.DatabaseError) as refused:
            conn.execute(statement)
        assert (refused.value.sqlstate, refused.value.diag.constraint_name) == (sqlstate, constraint), str(
            refused.value
        )
        assert _dump(owner) == before


def test_a_revived_community_stays_unwritable(production: Roles) -> None:
    """After the refused revival, the store refuses a workflow there as the model does."""
    with connect(production.app) as conn:
        with pytest.raises(psycopg.DatabaseError):
            conn.execute(f"UPDATE communities SET state = 'active' WHERE id = '{B}'")
        with pytest.raises(Refused) as refused:
            PostgresDeliveryStore(conn).execute(m.CreateWorkflow(B, uuid.UUID(int=0x999)))
    assert refused.value.rejection == m.CommunityNotWritable(B, m.CommunityState.DELETED)


def test_truncate_is_refused_outside_a_test_database(production: Roles) -> None:
    with psycopg.connect(production.owner, autocommit=True) as owner:
        before = _dump(owner)
        for table in ("communities", "workflow_agent_deliveries", "retired_delivery_ids"):
            with pytest.raises(psycopg.DatabaseError) as refused:
                owner.execute(sql.SQL("TRUNCATE {} CASCADE").format(sql.Identifier(table)))
            assert (refused.value.sqlstate, refused.value.diag.constraint_name) == (GUARD, "lp_no_truncate")
        assert _dump(owner) == before


# -- the clock authority -----------------------------------------------------------------------------


def _clock_is_the_transaction_time(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT lp_now() = now(), lp_test_hooks()").fetchone()
    return row == (True, False)


def _attempts(conn: psycopg.Connection[Any], database: str, role: str) -> list[tuple[str, str]]:
    """Every way an application role might move the clock: each attempt's (what, SQLSTATE)."""
    attempts = {
        "INSERT lp_clock": "INSERT INTO lp_clock (pinned_at) VALUES ('2000-01-01T00:00:00Z')"
        " ON CONFLICT (singleton) DO UPDATE SET pinned_at = excluded.pinned_at",
        "UPDATE lp_clock": "UPDATE lp_clock SET pinned_at = '2000-01-01T00:00:00Z'",
        "DELETE lp_clock": "DELETE FROM lp_clock",
        "TRUNCATE lp_clock": "TRUNCATE lp_clock",
        "SET leaseproof.test_hooks, then INSERT": "SET leaseproof.test_hooks = on;"
        " INSERT INTO lp_clock (pinned_at) VALUES ('2000-01-01T00:00:00Z')",
        "ALTER DATABASE SET": f'ALTER DATABASE "{database}" SET leaseproof.test_hooks = on',
        "SET session_replication_role": "SET session_replication_role = replica",
        "DISABLE TRIGGER": "ALTER TABLE lp_clock DISABLE TRIGGER ALL",
        "replace lp_now()": "CREATE OR REPLACE FUNCTION lp_now() RETURNS timestamptz LANGUAGE sql"
        " AS $$ SELECT '2000-01-01T00:00:00Z'::timestamptz $$",
        "replace lp_test_hooks()": "CREATE OR REPLACE FUNCTION lp_test_hooks() RETURNS boolean LANGUAGE sql"
        " AS $$ SELECT true $$",
    }
    hooks = {
        "mark_test_database": lambda: mark_test_database(conn),
        "PinnedClock.pin": lambda: PinnedClock(conn).pin(T0),
        "PinnedClock.advance": lambda: PinnedClock(conn).advance(dt.timedelta(hours=-1)),
        "PinnedClock.unpin": lambda: PinnedClock(conn).unpin(),
    }
    outcomes = []
    for what, statement in attempts.items():
        outcomes.append((what, _sqlstate(lambda statement=statement: conn.execute(statement))))
    for what, hook in hooks.items():
        outcomes.append((what, _sqlstate(hook)))
    # A role may set its own defaults in a database: the guard reads only the database's own.
    outcomes.append(
        (
            "ALTER ROLE ... IN DATABASE SET",
            _sqlstate(
                lambda: conn.execute(f'ALTER ROLE "{role}" IN DATABASE "{database}" SET leaseproof.test_hooks = on')
            ),
        )
    )
    return outcomes


def _sqlstate(attempt: Any) -> str:
    try:
        attempt()
    except psycopg.DatabaseError as exc:
        return exc.sqlstate or "?"
    except RuntimeError:  # PinnedClock.advance: "the clock is not pinned"
        return "not pinned"
    return "ok"


# What the application role may do at all without moving the clock: an unpin of an empty
# table, an advance that finds no pin, its own role's defaults.
_HARMLESS = {"ok", "not pinned"}


def test_the_application_role_cannot_move_the_clock_of_a_production_database(production: Roles) -> None:
    database = conninfo_to_dict(production.owner)["dbname"]
    with psycopg.connect(production.app, autocommit=True) as conn:
        outcomes = _attempts(conn, str(database), production.app_name)
    refused = dict(outcomes)
    assert refused["INSERT lp_clock"] == "LP004"
    assert refused["SET leaseproof.test_hooks, then INSERT"] == "LP004"
    assert refused["PinnedClock.pin"] == "LP004"
    for what in (
        "ALTER DATABASE SET",
        "SET session_replication_role",
        "DISABLE TRIGGER",
        "TRUNCATE lp_clock",
        "replace lp_now()",
        "replace lp_test_hooks()",
        "mark_test_database",
    ):
        assert refused[what] == "42501", (what, refused[what])  # insufficient_privilege
    assert {state for _, state in outcomes} <= {"LP004", "42501"} | _HARMLESS, outcomes
    # Whatever it did, the clock is the transaction time: for the owner, and for the role, in a new session.
    assert _clock_is_the_transaction_time(production.owner)
    assert _clock_is_the_transaction_time(production.app)
    with psycopg.connect(production.owner) as owner:
        assert owner.execute("SELECT count(*) FROM lp_clock").fetchone() == (0,)
        assert not is_test_database(owner)


def test_not_even_the_owner_pins_the_clock_of_a_production_database(production: Roles) -> None:
    with psycopg.connect(production.owner, autocommit=True) as owner:
        with pytest.raises(psycopg.DatabaseError) as refused:
            PinnedClock(owner).pin(T0)
        assert (refused.value.sqlstate, refused.value.diag.constraint_name) == ("LP004", "lp_clock_test_database_only")
    assert _clock_is_the_transaction_time(production.owner)


@pytest.fixture
def test_database(pg_server: Server, delivery_template: str) -> Iterator[Roles]:
    """A test database (marked by its owner, the clock pinned at T0) and an application role."""
    with scratch_database(pg_server, template=delivery_template) as dsn:
        with psycopg.connect(dsn, autocommit=True) as owner:
            mark_test_database(owner)
            PinnedClock(owner).pin(T0)
        name = create_role(pg_server, dsn, ORDINARY_GRANTS)
        try:
            yield Roles(dsn, as_role(dsn, name), name)
        finally:
            drop_role(pg_server, dsn, name)


def test_in_a_test_database_only_the_owner_moves_the_clock(test_database: Roles) -> None:
    database = conninfo_to_dict(test_database.owner)["dbname"]
    with psycopg.connect(test_database.app, autocommit=True) as conn:
        outcomes = dict(_attempts(conn, str(database), test_database.app_name))
    for what in (
        "INSERT lp_clock",
        "UPDATE lp_clock",
        "DELETE lp_clock",
        "PinnedClock.pin",
        "PinnedClock.advance",
        "PinnedClock.unpin",
    ):
        assert outcomes[what] == "LP004", (what, outcomes[what])
    for what in ("TRUNCATE lp_clock", "ALTER DATABASE SET", "replace lp_now()"):
        assert outcomes[what] == "42501", (what, outcomes[what])
    for dsn in (test_database.owner, test_database.app):
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT lp_now()").fetchone() == (T0,)
    with psycopg.connect(test_database.owner, autocommit=True) as owner:  # the owner still can
        PinnedClock(owner).advance(dt.timedelta(seconds=5))
        assert owner.execute("SELECT lp_now()").fetchone() == (T0 + dt.timedelta(seconds=5),)
