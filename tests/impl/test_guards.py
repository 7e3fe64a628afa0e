"""The database guards its own invariants (migrations 0004 and 0006), whoever writes.

The application role of a production database writes no table (impl/grants.sql: it
executes the operation functions, and tests/impl/test_attacks.py attacks it). The guards
are the next line: direct SQL, as the database's owner and as a role with far more than
impl/grants.sql gives (SELECT, INSERT, UPDATE, DELETE on every table, EXECUTE on every
function, a fleet role's scope), tries each invariant violation issue 10 found accepted and
each one the CHECK constraints (now domains and one shape check) refuse: each is refused
with its own SQLSTATE and constraint name, and the database is unchanged afterwards. The
same role tries every way to move the clock, and `lp_now()` does not move. And a role that
may even create temporary objects shadows every table and function the functions read:
their fixed search_path finds the real ones. Roles are cluster-wide: each is named
uniquely and dropped afterwards.
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
from psycopg.rows import tuple_row

from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.store import PostgresDeliveryStore
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


def create_role(server: Server, dsn: str, grants: tuple[str, ...], community: uuid.UUID | None = None) -> str:
    """A uniquely named login role, granted `grants` in the database of `dsn`, acting for
    `community` (lp_role_scope), or for every community when it is None."""
    name = f"lp_app_{secrets.token_hex(6)}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for grant in grants:
            conn.execute(sql.SQL(grant).format(role=sql.Identifier(name)))
        conn.execute("INSERT INTO lp_role_scope (role_name, community_id) VALUES (%s, %s)", (name, community))
    return name


def drop_role(server: Server, dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute("DELETE FROM lp_role_scope WHERE role_name = %s", (name,))
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
        "delivery_lease_until_after_claimed_at",  # raised by the delivery_shape check, under its old name
    ),
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

# The CHECKs of 0001, now the domains of 0006 (lp_step_id, lp_key, lp_whole_second) and its shape check.
REFUSED_BY_0001 = {
    "a blank step_id": (_insert(step_id="' \t'"), CHECK, "lp_step_id_check"),
    "a step_id of 65 characters": (_insert(step_id="'" + "x" * 65 + "'"), CHECK, "lp_step_id_check"),
    "a target_pubkey of 31 bytes": (_insert(target_pubkey="'\\x" + "01" * 31 + "'"), CHECK, "lp_key_check"),
    "a cause with two identity columns": (
        _insert(cause_scheduled_for="'2026-01-01T00:00:00Z'"),
        CHECK,
        "delivery_cause_exactly_one",
    ),
    "a scheduled cause off the whole second": (
        _insert(cause_kind="'schedule'", cause_event_id="NULL", cause_scheduled_for="'2026-01-01T00:00:00.5Z'"),
        CHECK,
        "lp_whole_second_check",
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
    assert len(ACCEPTED_BEFORE_0004) >= 12  # (a created_at off the clock: no guard since 0006, no INSERT either)


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


# -- shadowing: even a role that may create temporary objects finds the real ones --------------------

SHADOWING_GRANTS = (
    "GRANT USAGE ON SCHEMA public TO {role}",
    "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role}",
)


@pytest.fixture(scope="module")
def shadowers(pg_server: Server, production: Roles) -> Iterator[dict[str, str]]:
    """Two roles that may create temporary objects (TEMP on the database, which impl/roles.sql
    takes from PUBLIC), EXECUTE on every function, no table: a fleet role, and one acting for
    community A alone."""
    database = sql.Identifier(str(conninfo_to_dict(production.owner)["dbname"]))
    names = {
        "fleet": create_role(pg_server, production.owner, SHADOWING_GRANTS),
        "tenant": create_role(pg_server, production.owner, SHADOWING_GRANTS, community=A),
    }
    with psycopg.connect(production.owner, autocommit=True) as conn:
        for name in names.values():
            conn.execute(sql.SQL("GRANT TEMP ON DATABASE {} TO {}").format(database, sql.Identifier(name)))
    try:
        yield {kind: as_role(production.owner, name) for kind, name in names.items()}
    finally:
        for name in names.values():
            with psycopg.connect(production.owner, autocommit=True) as conn:
                conn.execute(sql.SQL("REVOKE TEMP ON DATABASE {} FROM {}").format(database, sql.Identifier(name)))
            drop_role(pg_server, production.owner, name)


def _shadowed(conn: psycopg.Connection[Any], *statements: str) -> None:
    """pg_temp first on the search_path, and a temporary object for each of `statements`."""
    conn.execute("SET search_path = pg_temp, public")
    for statement in statements:
        conn.execute(statement.encode())


def test_a_temporary_table_shadows_nothing_a_function_reads(production: Roles, shadowers: dict[str, str]) -> None:
    """Temporary communities, retired_delivery_ids, workflow_agent_deliveries, lp_clock and
    lp_role_scope, and temporary functions, found first on the session's search_path: the
    functions (fixed search_path: pg_catalog, public, pg_temp) read the real ones, and the
    database is unchanged."""
    with psycopg.connect(production.owner, autocommit=True) as owner:
        before = _dump(owner)
    with connect(shadowers["fleet"]) as conn:
        _shadowed(
            conn,
            "CREATE TEMP TABLE communities (id uuid PRIMARY KEY, state community_state)",
            f"INSERT INTO communities VALUES ('{B}', 'active'), ('{A}', 'active')",
            "CREATE TEMP TABLE retired_delivery_ids (community_id uuid, id uuid)",
            "CREATE TEMP TABLE workflow_agent_deliveries (community_id uuid, id uuid, status text)",
            f"INSERT INTO workflow_agent_deliveries VALUES ('{A}', '{PENDING}', 'finished')",
            "CREATE TEMP TABLE lp_clock (singleton boolean, pinned_at timestamptz)",
            "INSERT INTO lp_clock VALUES (true, '2000-01-01T00:00:00Z')",
            "CREATE FUNCTION pg_temp.lp_now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT 'epoch'::timestamptz $$",
            "CREATE FUNCTION pg_temp.lp_refusal(community_state) RETURNS text LANGUAGE sql AS $$ SELECT NULL::text $$",
            "CREATE OPERATOR pg_temp.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = uuid_ne)",
        )
        # ... and every other table and function of the schema, shadowed by an empty or a lying one.
        for table in (
            conn.cursor(row_factory=tuple_row)
            .execute(
                "SELECT relname::text FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'"
                " AND relname NOT IN ('communities', 'retired_delivery_ids', 'workflow_agent_deliveries', 'lp_clock')"
            )
            .fetchall()
        ):
            conn.execute(sql.SQL("CREATE TEMP TABLE {} (community_id uuid, id uuid)").format(sql.Identifier(table[0])))
        for function in (
            conn.cursor(row_factory=tuple_row)
            .execute(
                "SELECT DISTINCT proname::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
                " AND proname NOT IN ('lp_now', 'lp_refusal')"
            )
            .fetchall()
        ):
            conn.execute(
                sql.SQL("CREATE FUNCTION pg_temp.{}() RETURNS boolean LANGUAGE sql AS $$ SELECT true $$").format(
                    sql.Identifier(function[0])
                )
            )
        store = PostgresDeliveryStore(conn)
        # A delivery's whole life, as the model has it (rolled back afterwards).
        with conn.transaction(force_rollback=True):
            fresh = uuid.UUID(int=0xF5)
            committed = store.execute(
                m.CommitDeliveries(A, RUN, "shadowed", [m.NewDelivery(fresh, _binding(A, RUN, "shadowed"))])
            )
            assert committed == m.Committed((fresh,), False)
            claimed = store.execute(m.Claim(A, T1, 60, delivery_id=fresh))
            assert isinstance(claimed, m.Claimed) and claimed.lease.lease_generation == 1
            assert isinstance(store.execute(m.Renew(claimed.lease, 120)), m.Renewed)
            assert store.execute(m.Finish(claimed.lease, m.Status.FAILED)) == m.Settled(m.Status.FAILED)
        # B is deleted: the temporary communities, which says active, is not what the fence reads.
        with pytest.raises(Refused) as refused:
            store.execute(m.CreateWorkflow(B, uuid.UUID(int=0x999)))
        assert refused.value.rejection == m.CommunityNotWritable(B, m.CommunityState.DELETED)
        # RETIRED is retired: the empty temporary retired_delivery_ids is not what the commit reads.
        with pytest.raises(Refused) as refused:
            store.execute(m.CommitDeliveries(A, RUN, "shadow", [m.NewDelivery(RETIRED, _binding(A, RUN, "shadow"))]))
        assert refused.value.rejection == m.DeliveryIdTaken(A, RETIRED)
        # PENDING is pending, whatever the temporary table says; and the clock is the statement's.
        found = store.execute(m.GetDelivery(A, PENDING))
        assert isinstance(found, m.Found) and found.delivery.status is m.Status.PENDING
        now = conn.execute(
            "SELECT statement_timestamp() <= public.lp_now() AND public.lp_now() <= clock_timestamp() AS now"
        )
        assert now.fetchone() == {"now": True}
    with connect(shadowers["tenant"]) as conn:
        _shadowed(
            conn,
            "CREATE TEMP TABLE lp_role_scope (role_name name, community_id uuid)",
            "INSERT INTO lp_role_scope VALUES (session_user, NULL)",
            "CREATE FUNCTION pg_temp.lp_may_act(uuid) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$",
        )
        with pytest.raises(psycopg.DatabaseError) as forbidden:
            conn.execute(f"SELECT * FROM lp_get_delivery('{B}', '{PENDING}')")
        assert forbidden.value.sqlstate == "LP005"
    with psycopg.connect(production.owner, autocommit=True) as owner:
        assert _dump(owner) == before


def test_truncate_is_refused_outside_a_test_database(production: Roles) -> None:
    with psycopg.connect(production.owner, autocommit=True) as owner:
        before = _dump(owner)
        for table in ("communities", "workflow_agent_deliveries", "retired_delivery_ids"):
            with pytest.raises(psycopg.DatabaseError) as refused:
                owner.execute(sql.SQL("TRUNCATE {} CASCADE").format(sql.Identifier(table)))
            assert (refused.value.sqlstate, refused.value.diag.constraint_name) == (GUARD, "lp_no_truncate")
        assert _dump(owner) == before


# -- the clock authority -----------------------------------------------------------------------------


def _clock_is_the_real_time(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT statement_timestamp() <= lp_now() AND lp_now() <= clock_timestamp(), lp_test_hooks()"
        ).fetchone()
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
    # Whatever it did, the clock is the statement time: for the owner, and for the role, in a new session.
    assert _clock_is_the_real_time(production.owner)
    assert _clock_is_the_real_time(production.app)
    with psycopg.connect(production.owner) as owner:
        assert owner.execute("SELECT count(*) FROM lp_clock").fetchone() == (0,)
        assert not is_test_database(owner)


def test_not_even_the_owner_pins_the_clock_of_a_production_database(production: Roles) -> None:
    with psycopg.connect(production.owner, autocommit=True) as owner:
        with pytest.raises(psycopg.DatabaseError) as refused:
            PinnedClock(owner).pin(T0)
        assert (refused.value.sqlstate, refused.value.diag.constraint_name) == ("LP004", "lp_clock_test_database_only")
    assert _clock_is_the_real_time(production.owner)


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
