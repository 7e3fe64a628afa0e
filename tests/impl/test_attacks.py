"""Proof by attack: the bundled implementation's roles, attacked with their own credentials.

A production database is made as impl/roles.sql says (the roles and the database with psql,
the migrations as the owner, impl/grants.sql with psql, a tenant role per community with
impl/tenants.sql), and its data through the stores as the application role. Then every
attempt of `ATTEMPTS` runs as one transaction of the attacking role (the application role,
a tenant role, or the reaper), and it is judged as issues 35 and 40 judge it:

- refused: the attempt ends in an error of the kind it names (a missing privilege, a scope
  refusal, an argument out of the model's bounds, ...), or, where the attempt is a call of
  an operation function, in the model's own refusal (LeaseLost, CommunityNotWritable, ...);
- unchanged: a superuser-side fingerprint of the database (`production.fingerprint`: every
  row of every table, the sequences, pg_db_role_setting, triggers, the functions'
  definitions and privileges, tables' privileges, default privileges, large objects, the
  roles) is the same after it as before; and every session an attempt might signal (the
  reaper's, the application's, another tenant's) is still alive.

An attempt that is not refused, or changes anything, fails its test (and the database is
made again for the next). One that fails because of a known flaw of migration 0006 is
marked xfail(strict=True), naming the flaw. The attempts are data: `PYTHONPATH=tests python
tests/impl/test_attacks.py` prints how many there are per class without a server, and the
run prints how many were tried and refused per class at its end.

Each attempt runs in a transaction that is rolled back when it fails, on one database per
kind (the production one on the real clock, and one marked a test database whose clock is
pinned, for the attacks on the clock): about 20 ms an attempt, fingerprints included.
Making a database again (the scripts, the migrations and the world) takes about a second.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import psycopg
import pytest
from production import Production, changed, fingerprint, provision
from psycopg.rows import dict_row

from leaseproof.conformance.harness.server import Server
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc
from leaseproof.model.binding import Binding, EventCause

# -- the world -------------------------------------------------------------------------------------

A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)  # active; tenant A's and tenant B's
F, Q, D = uuid.UUID(int=0xF), uuid.UUID(int=0xE), uuid.UUID(int=0xD)  # fenced (tenant F's), quiescing, deleted
C = uuid.UUID(int=0xC)  # no community, bound to no tenant
WORKFLOW, RUN, OTHER_RUN = uuid.UUID(int=0x100), uuid.UUID(int=0x200), uuid.UUID(int=0x201)
T1, T2 = b"\x01" * 32, b"\x02" * 32
MESSAGE, DEFINITION, CAUSE = b"\x03" * 32, b"\x04" * 32, b"\x05" * 32
PENDING, CLAIMED, FINISHED, FAILED, RETIRED = (uuid.UUID(int=0xD0 + i) for i in range(5))
PENDING_B, CLAIMED_B, PENDING_F, PENDING_Q = (uuid.UUID(int=0xE0 + i) for i in range(4))
CHANNEL = uuid.UUID(int=0x300)
AUTHOR, STRANGER = b"\x06" * 32, b"\x07" * 32
SAVE_EVENT = b"\x09" * 32
DEFINED, STALE, CUT = uuid.UUID(int=0x400), uuid.UUID(int=0x401), uuid.UUID(int=0x402)
SAVED_AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)  # the pinned clock's start
LEASE = {False: 86_400, True: 3_600}  # the world's leases on the real clock and on the pinned one
TENANTS = {A: "ta", B: "tb", F: "tf"}


def _binding(community: uuid.UUID, run: uuid.UUID, step: str) -> Binding:
    return Binding(community, WORKFLOW, run, step, T1, DEFINITION, MESSAGE, EventCause(CAUSE))


def _event(community: uuid.UUID, workflow: uuid.UUID, at: dt.datetime, *actions: str) -> lc.SaveDefinition:
    event_id = bytes([0x40 + int(at.timestamp()) % 100]) * 31 + bytes([workflow.int % 256])
    return lc.SaveDefinition(
        lc.DefinitionEvent(event_id, community, workflow, AUTHOR, CHANNEL, at, lc.Definition(actions))
    )


def make_world(production: Production, pinned: bool) -> dict[str, str]:
    """The world every attempt attacks, made through the stores as the application role;
    returns what the attempts need that the world assigned (run ids, a record's hash)."""
    lease = LEASE[pinned]
    with connect(production.app) as conn:
        store = PostgresDeliveryStore(conn)

        def ok(command: Any) -> Any:
            outcome = store.execute(command)
            assert not isinstance(outcome, m.ClaimMiss), command
            return outcome

        for community in (A, B, F, Q, D):
            ok(m.CreateCommunity(community))
        for community in (A, B, F, Q):
            ok(m.CreateWorkflow(community, WORKFLOW))
            ok(m.CreateRun(community, WORKFLOW, RUN))
            ok(m.PublishEvent(community, MESSAGE))
        ok(m.CreateRun(A, WORKFLOW, OTHER_RUN))
        for community, deliveries in ((A, (PENDING, CLAIMED, FINISHED, FAILED)), (B, (PENDING_B, CLAIMED_B))):
            for i, delivery in enumerate(deliveries):
                binding = _binding(community, RUN, f"s{i}")
                ok(m.CommitDeliveries(community, RUN, f"s{i}", [m.NewDelivery(delivery, binding)]))
        for community, delivery in ((F, PENDING_F), (Q, PENDING_Q)):
            ok(m.CommitDeliveries(community, RUN, "s0", [m.NewDelivery(delivery, _binding(community, RUN, "s0"))]))
        ok(m.CommitDeliveries(A, OTHER_RUN, "s9", [m.NewDelivery(RETIRED, _binding(A, OTHER_RUN, "s9"))]))
        ok(m.DeleteRun(A, OTHER_RUN))  # retires RETIRED
        for community, delivery, outcome in (
            (A, CLAIMED, None),
            (A, FINISHED, m.Status.FINISHED),
            (A, FAILED, m.Status.FAILED),
            (B, CLAIMED_B, None),
        ):
            claimed = ok(m.Claim(community, T1, lease, delivery_id=delivery))
            if outcome is not None:
                assert ok(m.Finish(claimed.lease, outcome)) == m.Settled(outcome)
        ok(m.SetCommunityState(F, m.CommunityState.FENCED))
        ok(m.SetCommunityState(Q, m.CommunityState.QUIESCING))
        ok(m.DeleteCommunity(D))

        writer, engine = LifecycleStore(conn), ReplicaEngine(conn, "r1")
        for community in (A, B):
            writer.set_authority(lc.SetAuthority(community, CHANNEL, AUTHOR, True))
            writer.save(_event(community, DEFINED, SAVED_AT, "a", "b"))
        writer.save(_event(A, STALE, SAVED_AT, "x"))
        writer.save(_event(A, CUT, SAVED_AT, "c"))
        writer.delete(lc.DeleteDefinition(A, CUT, AUTHOR, SAVED_AT + dt.timedelta(seconds=1)))
        engine.refresh()
        runs = {}
        for name, community, workflow in (("run_a", A, DEFINED), ("run_b", B, DEFINED), ("run_stale", A, STALE)):
            admitted = engine.fire(lc.Fire("r1", "manual", community, workflow))
            assert isinstance(admitted, lc.Admitted), admitted
            runs[name] = str(admitted.run_id)
        writer.save(_event(A, STALE, SAVED_AT + dt.timedelta(seconds=5), "y"))  # run_stale's revision is gone
        record = engine.cache.records[(A, DEFINED)]
    return {
        **runs,
        "hash_a": _key(record.hash),
        "incarnation_a": f"'{record.incarnation.isoformat()}'::timestamptz",
    }


# -- SQL of the attempts -----------------------------------------------------------------------------


def _key(value: bytes) -> str:
    return f"'\\x{value.hex()}'::bytea"


def _u(value: uuid.UUID) -> str:
    return f"'{value}'::uuid"


def claim(community: uuid.UUID, lease: object = 60, delivery: str = "NULL", key: str = "NULL") -> str:
    return (
        f"SELECT outcome FROM lp_claim({_u(community)}, {_key(T1)}, {lease}, {delivery},"
        f" false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, {key})"
    )


def renew(community: uuid.UUID = A, delivery: uuid.UUID = CLAIMED, seconds: object = 60, generation: object = 1) -> str:
    return f"SELECT outcome FROM lp_renew({_u(community)}, {_u(delivery)}, {_key(T1)}, {generation}, {seconds})"


def finish(
    community: uuid.UUID = A,
    delivery: uuid.UUID = CLAIMED,
    generation: object = 1,
    outcome: str = "'finished'",
    target: bytes = T1,
) -> str:
    return f"SELECT outcome FROM lp_finish({_u(community)}, {_u(delivery)}, {_key(target)}, {generation}, {outcome})"


def commit(
    community: uuid.UUID = A,
    *,
    run: uuid.UUID = RUN,
    step: str = "'fresh'",
    ids: str = "gen_random_uuid()",
    workflow: uuid.UUID = WORKFLOW,
    target: str = _key(T2),
    kind: str = "'event'",
    cause_event: str = _key(CAUSE),
    cause_time: str = "NULL",
    invocation: str = "NULL",
    extra: str = "",
) -> str:
    """A commit of one new target (`extra`: a suffix inside every array but the ids')."""
    return (
        f"SELECT outcome FROM lp_commit_deliveries({_u(community)}, {_u(run)}, {step}, ARRAY[{ids}]::uuid[],"
        f" ARRAY[{_u(workflow)}{extra}]::uuid[], ARRAY[{target}{extra and ', ' + _key(T1)}]::bytea[],"
        f" ARRAY[{_key(DEFINITION)}]::bytea[], ARRAY[{_key(MESSAGE)}]::bytea[],"
        f" ARRAY[{kind}]::delivery_cause_kind[], ARRAY[{cause_event}]::bytea[],"
        f" ARRAY[{cause_time}]::timestamptz[], ARRAY[{invocation}]::uuid[])"
    )


def save(
    community: uuid.UUID = A,
    workflow: uuid.UUID = DEFINED,
    *,
    author: bytes = AUTHOR,
    at: str = "'2026-06-01T00:00:00Z'",
    actions: str = "ARRAY['a']",
) -> str:
    return (
        f"SELECT outcome FROM lp_save_definition({_key(SAVE_EVENT)}, {_u(community)}, {_u(workflow)},"
        f" {_key(author)}, {_u(CHANNEL)}, {at}, {actions}, NULL)"
    )


def admit(community: uuid.UUID = A, hash_: str = "<hash_a>", door: str = "'manual'") -> str:
    return (
        f"SELECT outcome FROM lp_admit({_u(community)}, {_u(DEFINED)}, {door}, {_key(AUTHOR)}, {_u(CHANNEL)},"
        f" {hash_}, <incarnation_a>)"
    )


# -- the attempts ------------------------------------------------------------------------------------

PRIVILEGE = frozenset({"42501"})  # insufficient_privilege
SCOPE = frozenset({"LP005"})  # a community outside the caller's scope
BOUND = frozenset({"23514", "22023"})  # a domain's check, lp_require
GUARD = frozenset({"LP003", "LP004"})  # migration 0004's guards


class Lab:
    """What a callable step of an attempt may use (see `Databases`)."""

    superuser: psycopg.Connection[Any]
    values: dict[str, str]


Step = str | Callable[["Lab", psycopg.Connection[Any]], None]


@attrs.frozen
class Attempt:
    """One attack: `steps` (SQL, with <name> placeholders for what the world assigned, or
    callables) run in one transaction as `attacker`, on the production database or, with
    `pinned`, on the test database whose clock is pinned. Refused: an error whose SQLSTATE
    is in `errors`, or (for calls of operation functions, which answer the model's
    refusals) every `outcome` the steps returned is in `outcomes`."""

    name: str
    kind: str
    steps: tuple[Step, ...]
    errors: frozenset[str] = frozenset()
    outcomes: frozenset[str] = frozenset()
    attacker: str = "app"
    pinned: bool = False
    isolation: str = "READ COMMITTED"
    # The steps before the last are legal writes (a claim) and the last is the attack: only its
    # outcome is judged, and the transaction is rolled back.
    attack_is_last: bool = False
    flaw: str | None = None  # a known flaw of migration 0006 that lets it through: xfail(strict)

    def param(self) -> Any:
        marks = [pytest.mark.xfail(strict=True, reason=self.flaw)] if self.flaw else []
        return pytest.param(self, id=f"{self.kind}: {self.name}", marks=marks)


def _attempt(kind: str, name: str, *steps: Step, **options: Any) -> Attempt:
    return Attempt(name, kind, steps, **options)


# The tables the catalog shows (test_the_lists_are_the_catalogs checks them against it): every
# attacking role tries every write, read and lock on each.
TABLES = (
    "admitted_runs",
    "channel_authority",
    "communities",
    "definition_cutoffs",
    "definition_heads",
    "definition_runtime",
    "events",
    "executed_actions",
    "lp_clock",
    "lp_reaper",
    "lp_role_scope",
    "lp_schema_migrations",
    "retired_delivery_ids",
    "workflow_agent_deliveries",
    "workflow_runs",
    "workflows",
)
SEQUENCES = ("admitted_runs_id_seq", "executed_actions_seq_seq")
# Every function of the schema the application role may not execute (each called with NULLs:
# EXECUTE is checked before any argument is looked at), with its number of arguments.
HELPERS = {
    "lp_change_key": 1,
    "lp_clock_guard": 0,
    "lp_community_guard": 0,
    "lp_community_write_fence": 0,
    "lp_coordinate_key": 2,
    "lp_definition_hash": 2,
    "lp_deletions_key": 1,
    "lp_delivery_created": 0,
    "lp_delivery_shape": 10,
    "lp_delivery_transition": 0,
    "lp_enter": 1,
    "lp_fence_key": 1,
    "lp_head_runtime_together": 0,
    "lp_is_fleet": 0,
    "lp_json_string": 1,
    "lp_may_act": 1,
    "lp_refusal": 1,
    "lp_require": 2,
    "lp_require_fleet": 0,
    "lp_require_read_committed": 0,
    "lp_require_scope": 1,
    "lp_retire_delivery_id": 0,
    "lp_retired_delivery_id_guard": 0,
    "lp_scope_refused": 1,
    "lp_sweep": 0,
    "lp_test_hooks": 0,
    "lp_truncate_guard": 0,
    "lp_valid_actions": 1,
}
# The operations (impl/grants.sql grants them to api): every one, as tenant A, for community B.
OPERATIONS = (
    "lp_admit",
    "lp_claim",
    "lp_commit_deliveries",
    "lp_create_community",
    "lp_create_run",
    "lp_create_workflow",
    "lp_delete_community",
    "lp_delete_definition",
    "lp_delete_event",
    "lp_delete_run",
    "lp_delete_workflow",
    "lp_enabled_records",
    "lp_finish",
    "lp_fire_check",
    "lp_get_delivery",
    "lp_now",
    "lp_publish_event",
    "lp_renew",
    "lp_resume_run",
    "lp_save_definition",
    "lp_set_authority",
    "lp_set_community_state",
)
# A strict function called with a NULL is folded away before its privilege is checked: these get values.
_ARGUMENTS = {"lp_json_string": "'x'"}
ADVISORY = (
    "pg_advisory_lock(<fence_b>)",
    "pg_advisory_lock(1, 2)",
    "pg_advisory_lock_shared(<fence_b>)",
    "pg_advisory_lock_shared(1, 2)",
    "pg_advisory_xact_lock(<fence_b>)",
    "pg_advisory_xact_lock(1, 2)",
    "pg_advisory_xact_lock_shared(<fence_b>)",
    "pg_advisory_xact_lock_shared(1, 2)",
    "pg_try_advisory_lock(<fence_b>)",
    "pg_try_advisory_lock(1, 2)",
    "pg_try_advisory_lock_shared(<fence_b>)",
    "pg_try_advisory_lock_shared(1, 2)",
    "pg_try_advisory_xact_lock(<fence_b>)",
    "pg_try_advisory_xact_lock(1, 2)",
    "pg_try_advisory_xact_lock_shared(<fence_b>)",
    "pg_try_advisory_xact_lock_shared(1, 2)",
    "pg_advisory_unlock(<fence_b>)",
    "pg_advisory_unlock(1, 2)",
    "pg_advisory_unlock_shared(<fence_b>)",
    "pg_advisory_unlock_shared(1, 2)",
    "pg_advisory_unlock_all()",
)


def _table_attempts(attacker: str) -> list[Attempt]:
    kind = "every table" if attacker == "app" else f"every table, as {attacker}"
    found = []
    for table in TABLES:
        for what, statement in (
            ("insert", f"INSERT INTO {table} DEFAULT VALUES"),
            ("update", f"UPDATE {table} SET {_FIRST_COLUMN[table]} = {_FIRST_COLUMN[table]}"),
            ("delete", f"DELETE FROM {table}"),
            ("truncate", f"TRUNCATE {table}"),
            ("read", f"SELECT count(*) FROM {table}"),
            ("lock its rows", f"SELECT 1 FROM {table} FOR UPDATE"),
            ("lock it (access share)", f"LOCK TABLE {table} IN ACCESS SHARE MODE"),
            ("lock it (access exclusive)", f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
        ):
            found.append(_attempt(kind, f"{what} {table}", statement, errors=PRIVILEGE, attacker=attacker))
    return found


_FIRST_COLUMN = {
    "admitted_runs": "door",
    "channel_authority": "member",
    "communities": "state",
    "definition_cutoffs": "cutoff",
    "definition_heads": "actions",
    "definition_runtime": "enabled",
    "events": "id",
    "executed_actions": "action",
    "lp_clock": "pinned_at",
    "lp_reaper": "singleton",
    "lp_role_scope": "community_id",
    "lp_schema_migrations": "applied_at",
    "retired_delivery_ids": "id",
    "workflow_agent_deliveries": "lease_until",
    "workflow_runs": "workflow_id",
    "workflows": "id",
}


def _update(table: str, assignments: str, where: str) -> str:
    return f"UPDATE {table} SET {assignments} WHERE {where}"


def _delivery(community: uuid.UUID, delivery: uuid.UUID) -> str:
    return f"community_id = {_u(community)} AND id = {_u(delivery)}"


def _move_clock(by: dt.timedelta) -> Callable[[Lab, psycopg.Connection[Any]], None]:
    """A step: another connection (the superuser's) moves the pinned clock by `by`, and commits;
    the lab moves it back once the attempt has ended."""

    def move(lab: Lab, conn: psycopg.Connection[Any]) -> None:
        PinnedClock(lab.superuser).advance(by)
        lab.values["_moved"] = str(by.total_seconds() + float(lab.values.get("_moved", "0")))

    return move


_LATE = _move_clock(dt.timedelta(hours=2))  # past every lease of the pinned world (an hour)


def _copy_in(lab: Lab, conn: psycopg.Connection[Any]) -> None:
    with conn.cursor().copy("COPY workflow_agent_deliveries (community_id, id) FROM STDIN") as copy:
        copy.write_row((A, uuid.uuid4()))


ATTEMPTS: list[Attempt] = [
    *_table_attempts("app"),
    *_table_attempts("tenant A"),
    *_table_attempts("reaper"),
    *(
        _attempt("every sequence", f"{what} {sequence}", statement.format(s=sequence), errors=PRIVILEGE)
        for sequence in SEQUENCES
        for what, statement in (("nextval", "SELECT nextval('{s}')"), ("setval", "SELECT setval('{s}', 1000)"))
    ),
    _attempt("every table", "COPY into workflow_agent_deliveries", _copy_in, errors=PRIVILEGE),
    # -- the writes issue 35 found accepted, as the rows they would write --------------------------
    _attempt(
        "illegal writes",
        "a reap that keeps the generation",
        _update(
            "workflow_agent_deliveries",
            "status = 'pending', lease_until = NULL, claimed_at = NULL",
            _delivery(A, CLAIMED),
        ),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a claim at the generation of the lease before it (two holders, one token)",
        _update(
            "workflow_agent_deliveries",
            "status = 'pending', lease_until = NULL, claimed_at = NULL",
            _delivery(A, CLAIMED),
        ),
        claim(A, delivery=_u(CLAIMED)),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a lease extended ten years without Renew",
        _update("workflow_agent_deliveries", "lease_until = lease_until + interval '10 years'", _delivery(A, CLAIMED)),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a pending delivery deleted outside any cascade",
        f"DELETE FROM workflow_agent_deliveries WHERE {_delivery(A, PENDING)}",
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a retired id inserted again",
        f"INSERT INTO workflow_agent_deliveries (community_id, id, workflow_id, run_id, step_id, target_pubkey,"
        f" definition_event_id, message_event_id, cause_kind, cause_event_id, created_at) VALUES ({_u(A)},"
        f" {_u(RETIRED)}, {_u(WORKFLOW)}, {_u(RUN)}, 'again', {_key(T1)}, {_key(DEFINITION)}, {_key(MESSAGE)},"
        f" 'event', {_key(CAUSE)}, now())",
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a retirement forgotten",
        f"DELETE FROM retired_delivery_ids WHERE {_delivery(A, RETIRED)}",
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a fenced tenant's row claimed directly",
        _update(
            "workflow_agent_deliveries",
            "status = 'claimed', lease_generation = 1, claimed_at = now(), lease_until = now() + interval '1 hour'",
            _delivery(F, PENDING_F),
        ),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a fenced tenant made active directly",
        _update("communities", "state = 'active'", f"id = {_u(F)}"),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a deleted community revived",
        _update("communities", "state = 'active'", f"id = {_u(D)}"),
        errors=PRIVILEGE,
    ),
    _attempt("illegal writes", "a tombstone removed", f"DELETE FROM communities WHERE id = {_u(D)}", errors=PRIVILEGE),
    _attempt(
        "illegal writes",
        "a pending delivery settled without a claim",
        _update("workflow_agent_deliveries", "status = 'finished', finished_at = now()", _delivery(A, PENDING)),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a generation lowered",
        _update("workflow_agent_deliveries", "lease_generation = 0", _delivery(A, CLAIMED)),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a finished delivery failed",
        _update("workflow_agent_deliveries", "status = 'failed'", _delivery(A, FINISHED)),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a binding rewritten",
        _update("workflow_agent_deliveries", f"target_pubkey = {_key(T2)}", _delivery(A, PENDING)),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "another tenant's claimed row changed (tenant A)",
        _update("workflow_agent_deliveries", "lease_until = lease_until + interval '1 day'", _delivery(B, CLAIMED_B)),
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "illegal writes",
        "the clock pinned",
        "INSERT INTO lp_clock (pinned_at) VALUES ('2000-01-01T00:00:00Z')",
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a tenant made a fleet role (its own scope widened)",
        "INSERT INTO lp_role_scope (role_name, community_id) VALUES (session_user, NULL)",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "illegal writes",
        "a tenant bound to another tenant's community",
        f"INSERT INTO lp_role_scope (role_name, community_id) VALUES (session_user, {_u(B)})",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "illegal writes",
        "an admitted run forged",
        f"INSERT INTO admitted_runs (community_id, workflow_id, door, owner, channel_id, hash, enabled, incarnation,"
        f" actions, revision, admitted_at) VALUES ({_u(A)}, {_u(DEFINED)}, 'manual', {_key(STRANGER)},"
        f" {_u(CHANNEL)}, {_key(STRANGER)}, true, now(), ARRAY['rm'], {_key(STRANGER)}, now())",
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "an action executed outside a run",
        "INSERT INTO executed_actions (run_id, action) VALUES (<run_a>, 'rm -rf')",
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a cutoff moved back",
        _update("definition_cutoffs", "cutoff = '2000-01-01T00:00:00Z'", f"community_id = {_u(A)}"),
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "an authority granted directly",
        f"INSERT INTO channel_authority VALUES ({_u(A)}, {_u(CHANNEL)}, {_key(STRANGER)})",
        errors=PRIVILEGE,
    ),
    _attempt(
        "illegal writes",
        "a head's runtime record rewritten (its hash, its actions)",
        _update("definition_runtime", f"hash = {_key(STRANGER)}, actions = ARRAY['rm']", f"community_id = {_u(A)}"),
        errors=PRIVILEGE,
    ),
    # -- shadowing what the functions and the guards read ----------------------------------------
    _attempt(
        "shadowing",
        "a temporary communities that says the fenced tenant is active, then a claim there",
        "CREATE TEMP TABLE communities (id uuid PRIMARY KEY, state community_state)",
        f"INSERT INTO communities VALUES ({_u(F)}, 'active')",
        claim(F),
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "a temporary, empty retired_delivery_ids, then a commit of a retired id",
        "CREATE TEMP TABLE retired_delivery_ids (community_id uuid, id uuid)",
        commit(ids=_u(RETIRED)),
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "a temporary workflow_agent_deliveries",
        "CREATE TEMP TABLE workflow_agent_deliveries (LIKE pg_catalog.pg_class)",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "a temporary lp_role_scope that makes the tenant a fleet role",
        "CREATE TEMP TABLE lp_role_scope (role_name name, community_id uuid)",
        "INSERT INTO lp_role_scope VALUES (session_user, NULL)",
        claim(B),
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "shadowing",
        "a temporary lp_clock that moves the clock back",
        "CREATE TEMP TABLE lp_clock (singleton boolean, pinned_at timestamptz)",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "a temporary view named communities",
        f"CREATE TEMP VIEW communities AS SELECT {_u(F)} AS id, 'active'::community_state AS state",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "a temporary table by SELECT INTO",
        "SELECT 'active'::community_state AS state INTO TEMP communities",
        errors=PRIVILEGE,
    ),
    _attempt("shadowing", "a temporary sequence", "CREATE TEMP SEQUENCE admitted_runs_id_seq", errors=PRIVILEGE),
    # Every table and every function of the schema, shadowed by a temporary one of its name (and
    # the session's search_path made to find it first), then an operation that reads it.
    *(
        _attempt(
            "shadowing",
            f"a temporary {table}",
            "SET LOCAL search_path = pg_temp, public",
            f"CREATE TEMP TABLE {table} (community_id uuid, id uuid, state text)",
            claim(F, delivery=_u(PENDING_F)),
            errors=PRIVILEGE,
            attacker=attacker,
        )
        for table in TABLES
        for attacker in ("app", "tenant A")
    ),
    *(
        _attempt(
            "shadowing",
            f"a temporary {name}()",
            f"CREATE FUNCTION pg_temp.{name}() RETURNS boolean LANGUAGE sql AS $$ SELECT true $$",
            renew(B, CLAIMED_B),
            errors=PRIVILEGE,
            attacker="tenant A",
        )
        for name in (*HELPERS, *OPERATIONS)
    ),
    _attempt(
        "shadowing",
        "a temporary lp_now()",
        "CREATE FUNCTION pg_temp.lp_now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT now() - interval '1 day' $$",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "a temporary lp_may_act()",
        "CREATE FUNCTION pg_temp.lp_may_act(uuid) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "shadowing",
        "lp_may_act replaced",
        "CREATE OR REPLACE FUNCTION lp_may_act(uuid) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN RETURN true; END $$",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "shadowing",
        "an overload of lp_refusal in public",
        "CREATE FUNCTION public.lp_refusal(text) RETURNS text LANGUAGE sql AS $$ SELECT NULL::text $$",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "an operator = on uuid in public",
        "CREATE OPERATOR public.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = uuid_ne)",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "an operator = on uuid in pg_temp",
        "CREATE OPERATOR pg_temp.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = uuid_ne)",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "an operator >= on timestamptz in public (a lease never expires)",
        "CREATE OPERATOR public.>= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = timestamptz_le)",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "a type named community_state in pg_temp",
        "CREATE TYPE pg_temp.community_state AS ENUM ('active')",
        errors=PRIVILEGE,
    ),
    _attempt(
        "shadowing",
        "a schema named for the role ($user comes first in the default search_path)",
        "CREATE SCHEMA AUTHORIZATION CURRENT_USER",
        errors=PRIVILEGE,
    ),
    _attempt("shadowing", "a schema of its own", "CREATE SCHEMA lp_mine", errors=PRIVILEGE),
    _attempt(
        "shadowing",
        "search_path = pg_temp first, then a claim of the fenced tenant's row",
        "SET LOCAL search_path = pg_temp, public",
        claim(F),
        outcomes=frozenset({"CommunityNotWritable"}),
    ),
    _attempt(
        "shadowing",
        "search_path without public, then a renew after a settle",
        "SET LOCAL search_path = pg_catalog",
        f"SELECT outcome FROM public.lp_renew({_u(A)}, {_u(FINISHED)}, {_key(T1)}, 1, 60)",
        outcomes=frozenset({"LeaseLost"}),
    ),
    _attempt(
        "shadowing",
        "a cast of its own (text to community_state)",
        "CREATE CAST (text AS community_state) WITH INOUT AS IMPLICIT",
        errors=PRIVILEGE,
    ),
    _attempt("shadowing", "an extension (a trusted one)", "CREATE EXTENSION hstore SCHEMA public", errors=PRIVILEGE),
    # -- arguments out of the model's bounds, refused where the write happens -------------------
    *(
        _attempt("out of bounds", name, statement, errors=BOUND)
        for name, statement in (
            ("a claim of 10^9 s", claim(A, lease=10**9)),
            ("a claim of 86,401 s", claim(A, lease=86_401)),
            ("a claim of 0 s", claim(A, lease=0)),
            ("a claim of -5 s", claim(A, lease=-5)),
            ("a claim without a lease", claim(A, lease="NULL")),
            ("a claim with a blank request key", claim(A, key="' '")),
            ("a claim with a request key of 65 characters", claim(A, key="'" + "k" * 65 + "'")),
            ("a claim with a request key that ends in a space", claim(A, key="'key '")),
            ("a renew of ten years", renew(seconds=10 * 365 * 86_400)),
            ("a renew of -5 s", renew(seconds=-5)),
            ("a renew of 0 s", renew(seconds=0)),
            ("a renew of 86,401 s", renew(seconds=86_401)),
            ("a renew without a lease length", renew(seconds="NULL")),
            ("a renew at generation -1", renew(generation=-1)),
            ("a finish as pending", finish(outcome="'pending'")),
            ("a finish as claimed", finish(outcome="'claimed'")),
            ("a finish at generation -1", finish(generation=-1)),
            ("a commit of a blank step", commit(step="' '")),
            ("a commit of a step of 65 characters", commit(step="'" + "s" * 65 + "'")),
            ("a commit to a target of 31 bytes", commit(target=_key(b"\x02" * 31))),
            ("a commit of an event cause without its event", commit(cause_event="NULL")),
            (
                "a commit of an event cause with a schedule too",
                commit(cause_time="'2026-01-01T00:00:00Z'"),
            ),
            (
                "a commit of a schedule off the whole second",
                commit(kind="'schedule'", cause_event="NULL", cause_time="'2026-01-01T00:00:00.5Z'"),
            ),
            ("a commit whose arrays differ in length", commit(extra=f", {_u(WORKFLOW)}")),
            ("a commit of no target", commit(ids="")),
            ("a commit with a NULL id", commit(ids="NULL")),
            ("a state of deleted (DeleteCommunity's alone)", f"SELECT lp_set_community_state({_u(A)}, 'deleted')"),
            ("a community without an id", "SELECT lp_create_community(NULL)"),
            ("an event id of 31 bytes", f"SELECT lp_publish_event({_u(A)}, {_key(MESSAGE[:31])})"),
            ("a save of 9 actions", save(actions="ARRAY['a','b','c','d','e','f','g','h','i']")),
            ("a save of a blank action", save(actions="ARRAY['a', ' ']")),
            ("a save of an action of 65 characters", save(actions="ARRAY['" + "a" * 65 + "']")),
            ("a save of no action", save(actions="ARRAY[]::text[]")),
            ("a save signed at infinity", save(at="'infinity'")),
            ("a save signed after 9999", save(at="'10000-01-01T00:00:00Z'")),
            (
                "a deletion signed at infinity",
                f"SELECT lp_delete_definition({_u(A)}, {_u(DEFINED)}, {_key(AUTHOR)}, 'infinity')",
            ),
            ("an admission at an unknown door", admit(door="'backdoor'")),
            ("a resume of run 0", "SELECT lp_resume_run(0)"),
            ("a resume of run -1", "SELECT lp_resume_run(-1)"),
            (
                "an authority of a 31-byte member",
                f"SELECT lp_set_authority({_u(A)}, {_u(CHANNEL)}, {_key(AUTHOR[:31])}, true)",
            ),
        )
    ),
    # -- shapes the model never produces, asked of the functions -------------------------------
    *(
        _attempt("never the model's", name, statement, outcomes=frozenset(outcomes.split()))
        for name, statement, outcomes in (
            ("a finish without a claim", finish(delivery=PENDING, generation=0), "LeaseLost"),
            ("a finish at the next generation", finish(generation=2), "LeaseLost"),
            ("a finish for another target", finish(target=T2), "LeaseLost"),
            ("a second finish of a failed delivery", finish(delivery=FAILED), "AlreadyTerminal"),
            (
                "a finish of a finished delivery at another generation",
                finish(delivery=FINISHED, generation=2),
                "LeaseLost",
            ),
            ("a renew of a pending delivery", renew(delivery=PENDING, generation=0), "LeaseLost"),
            ("a renew of a finished delivery", renew(delivery=FINISHED), "LeaseLost"),
            ("a renew at the generation before", renew(generation=0), "LeaseLost"),
            ("a renew at the next generation (a reaped lease's token)", renew(generation=2), "LeaseLost"),
            ("a claim of a fenced tenant's row", claim(F, delivery=_u(PENDING_F)), "CommunityNotWritable"),
            ("a claim in a quiescing community", claim(Q, delivery=_u(PENDING_Q)), "CommunityNotWritable"),
            ("a claim in a deleted community", claim(D), "CommunityNotWritable"),
            ("a claim of a claimed row", claim(A, delivery=_u(CLAIMED)), "ClaimMiss"),
            ("a claim of a finished row", claim(A, delivery=_u(FINISHED)), "ClaimMiss"),
            ("a claim of a retired id", claim(A, delivery=_u(RETIRED)), "ClaimMiss"),
            ("a commit of a retired id", commit(ids=_u(RETIRED)), "DeliveryIdTaken"),
            ("a commit of a live id", commit(ids=_u(PENDING)), "DeliveryIdTaken"),
            ("a commit to another workflow's run", commit(workflow=DEFINED), "WorkflowMismatch"),
            ("a commit to a deleted run", commit(run=OTHER_RUN), "NotFound"),
            ("a commit in a fenced community", commit(F), "CommunityNotWritable"),
            (
                "a deleted community revived",
                f"SELECT outcome FROM lp_set_community_state({_u(D)}, 'active')",
                "CommunityNotWritable",
            ),
            ("a deleted community created again", f"SELECT outcome FROM lp_create_community({_u(D)})", "AlreadyExists"),
            (
                "a workflow in a deleted community",
                f"SELECT outcome FROM lp_create_workflow({_u(D)}, {_u(DEFINED)})",
                "CommunityNotWritable",
            ),
            ("an admission of a forged record", admit(hash_=_key(STRANGER)), "AdmissionRefused"),
            ("an admission in a fenced community", admit(F), "CommunityNotWritable"),
            (
                "a resume of a run whose revision is gone",
                "SELECT outcome FROM lp_resume_run(<run_stale>)",
                "ResumeRefused",
            ),
            ("a resume of an unknown run", "SELECT outcome FROM lp_resume_run(1000000)", "UnknownRun"),
            ("a save by another author", save(author=STRANGER), "NoAuthority"),
            ("a save before the cutoff", save(workflow=CUT, at="'2026-01-01T00:00:00Z'"), "BeforeCutoff"),
            ("a save older than the head", save(at="'2025-01-01T00:00:00Z'"), "Superseded"),
            (
                "a deletion by another author",
                f"SELECT outcome FROM lp_delete_definition({_u(A)}, {_u(DEFINED)},"
                f" {_key(STRANGER)}, '2026-06-01T00:00:00Z')",
                "NotAuthor",
            ),
        )
    ),
    # -- tenant isolation: tenant A, for community B ---------------------------------------------
    *(
        _attempt("another tenant's community", name, statement, errors=SCOPE, attacker="tenant A")
        for name, statement in (
            ("CreateCommunity of an unbound community", f"SELECT lp_create_community({_u(C)})"),
            ("SetCommunityState (fence B)", f"SELECT lp_set_community_state({_u(B)}, 'fenced')"),
            ("DeleteCommunity", f"SELECT lp_delete_community({_u(B)})"),
            ("CreateWorkflow", f"SELECT lp_create_workflow({_u(B)}, {_u(DEFINED)})"),
            ("DeleteWorkflow", f"SELECT lp_delete_workflow({_u(B)}, {_u(WORKFLOW)})"),
            ("CreateRun", f"SELECT lp_create_run({_u(B)}, {_u(WORKFLOW)}, {_u(OTHER_RUN)})"),
            ("DeleteRun", f"SELECT lp_delete_run({_u(B)}, {_u(RUN)})"),
            ("PublishEvent", f"SELECT lp_publish_event({_u(B)}, {_key(T2)})"),
            ("DeleteEvent", f"SELECT lp_delete_event({_u(B)}, {_key(MESSAGE)})"),
            ("CommitDeliveries", commit(B)),
            ("Claim", claim(B, delivery=_u(PENDING_B))),
            ("Renew of B's claimed row", renew(B, CLAIMED_B)),
            ("Renew of B's claimed row for ten hours", renew(B, CLAIMED_B, seconds=36_000)),
            ("Finish of B's claimed row", finish(B, CLAIMED_B)),
            ("GetDelivery", f"SELECT * FROM lp_get_delivery({_u(B)}, {_u(CLAIMED_B)})"),
            ("SetAuthority", f"SELECT lp_set_authority({_u(B)}, {_u(CHANNEL)}, {_key(STRANGER)}, true)"),
            ("SetAuthority revoked", f"SELECT lp_set_authority({_u(B)}, {_u(CHANNEL)}, {_key(AUTHOR)}, false)"),
            ("SaveDefinition", save(B)),
            (
                "DeleteDefinition",
                f"SELECT lp_delete_definition({_u(B)}, {_u(DEFINED)}, {_key(AUTHOR)}, '2026-06-01T00:00:00Z')",
            ),
            ("Fire (its start)", f"SELECT lp_fire_check({_u(B)})"),
            ("Fire (admission)", admit(B)),
        )
    ),
    _attempt(
        "another tenant's community",
        "ResumeRun of B's run: unknown to A, as a run that does not exist",
        "SELECT outcome FROM lp_resume_run(<run_b>)",
        outcomes=frozenset({"UnknownRun"}),
        attacker="tenant A",
    ),
    _attempt(
        "another tenant's community",
        "Claim of B's row, sent for A with B as the expected binding",
        f"SELECT outcome FROM lp_claim({_u(A)}, {_key(T1)}, 60, {_u(PENDING_B)}, true, {_u(B)}, {_key(T1)},"
        f" {_u(WORKFLOW)}, {_u(RUN)}, 's0', {_key(DEFINITION)}, {_key(MESSAGE)}, 'event', {_key(CAUSE)},"
        " NULL, NULL, NULL)",
        outcomes=frozenset({"ClaimMiss"}),
        attacker="tenant A",
    ),
    _attempt(
        "another tenant's community",
        "Renew of B's claimed row, sent for A",
        renew(A, CLAIMED_B),
        outcomes=frozenset({"LeaseLost"}),
        attacker="tenant A",
    ),
    _attempt(
        "another tenant's community",
        "Finish of B's claimed row, sent for A",
        finish(A, CLAIMED_B),
        outcomes=frozenset({"LeaseLost"}),
        attacker="tenant A",
    ),
    _attempt("another tenant's community", "the sweep", "SELECT lp_sweep()", errors=PRIVILEGE, attacker="tenant A"),
    _attempt(
        "another tenant's community",
        "the application role's privileges taken (SET ROLE)",
        "SET ROLE <app>",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "another tenant's community",
        "another login (SET SESSION AUTHORIZATION)",
        "SET SESSION AUTHORIZATION <tenant_b>",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "another tenant's community",
        "SET ROLE api, then a call for B (the scope is the login role's)",
        "SET ROLE <api>",  # refused from PostgreSQL 16 on (roles.sql grants api WITH SET FALSE)
        renew(B, CLAIMED_B),
        errors=PRIVILEGE | SCOPE,
        attacker="tenant A",
    ),
    _attempt(
        "another tenant's community",
        "the fenced tenant makes its community active again",
        f"SELECT outcome FROM lp_set_community_state({_u(F)}, 'active')",
        claim(F, delivery=_u(PENDING_F)),
        errors=SCOPE,
        outcomes=frozenset({"CommunityNotWritable"}),
        attacker="tenant F",
    ),
    # -- signals: no role of the application ends or cancels another's session ----------------
    *(
        _attempt(
            "signals",
            f"{function} of {victim}'s session, as {attacker}",
            f"SELECT {function}(<{victim.replace(' ', '_')}_pid>)",
            errors=PRIVILEGE,
            attacker=attacker,
        )
        for attacker, victims in (("app", ("reaper", "tenant B")), ("tenant A", ("reaper", "app", "tenant B")))
        for victim in victims
        for function in ("pg_cancel_backend", "pg_terminate_backend")
    ),
    # -- locks a session might hold to stop the reaper, or another tenant ------------------------
    *(
        _attempt("locks", f"{call} as {attacker}", f"SELECT {call}", errors=PRIVILEGE, attacker=attacker)
        for call in ADVISORY
        for attacker in ("app", "tenant A")
    ),
    _attempt(
        "locks",
        "the sweeps' turn (lp_reaper) held",
        "SELECT 1 FROM lp_reaper FOR UPDATE",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "locks",
        "another tenant's row locked",
        f"SELECT 1 FROM workflow_agent_deliveries WHERE {_delivery(B, CLAIMED_B)} FOR UPDATE",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "locks",
        "another tenant's community row locked",
        f"SELECT 1 FROM communities WHERE id = {_u(B)} FOR KEY SHARE",
        errors=PRIVILEGE,
        attacker="tenant A",
    ),
    _attempt(
        "locks",
        "a prepared transaction holding a community's fence past the session",
        f"SELECT lp_fire_check({_u(A)})",
        "PREPARE TRANSACTION 'lp_attack'",
        errors=frozenset({"55000", "42501"}),  # max_prepared_transactions = 0, or not the role's to prepare
        attacker="tenant A",
    ),
    # -- the catalog: every function the application role may not call, and the database --------
    *(
        _attempt(
            "every function",
            f"{name}()",
            f"SELECT public.{name}({_ARGUMENTS.get(name, ', '.join(['NULL'] * arguments))})",
            errors=PRIVILEGE,
            attacker=attacker,
        )
        for name, arguments in HELPERS.items()
        for attacker in ("app", "tenant A")
    ),
    *(
        _attempt(
            "every function", f"{name}() as the reaper", f"SELECT public.{name}()", errors=PRIVILEGE, attacker="reaper"
        )
        for name in ("lp_now", "lp_enabled_records")
    ),
    _attempt("every function", "lp_claim as the reaper", claim(A), errors=PRIVILEGE, attacker="reaper"),
    _attempt("every function", "lp_sweep as the application role", "SELECT lp_sweep()", errors=PRIVILEGE),
    *(
        _attempt("the database", name, statement, errors=errors)
        for name, statement, errors in (
            ("mark it a test database", "ALTER DATABASE <db> SET leaseproof.test_hooks = on", PRIVILEGE),
            ("give it to the role", "ALTER DATABASE <db> OWNER TO CURRENT_USER", PRIVILEGE),
            (
                "its sessions' isolation level",
                "ALTER DATABASE <db> SET default_transaction_isolation = 'serializable'",
                PRIVILEGE,
            ),
            ("a grant of a table to itself", "GRANT ALL ON workflow_agent_deliveries TO CURRENT_USER", PRIVILEGE),
            ("a grant of a function to PUBLIC", "GRANT EXECUTE ON FUNCTION lp_sweep() TO PUBLIC", PRIVILEGE),
            (
                "the advisory locks given back to PUBLIC",
                "GRANT EXECUTE ON FUNCTION pg_advisory_lock(bigint) TO PUBLIC",
                PRIVILEGE,
            ),
            ("the reaper's role taken", "GRANT <reaper> TO CURRENT_USER", PRIVILEGE),
            ("the owner's role taken", "SET ROLE <owner>", PRIVILEGE),
            (
                "another role's defaults (the reaper's lock_timeout)",
                "ALTER ROLE <reaper> SET lock_timeout = 0",
                PRIVILEGE,
            ),
            ("the triggers switched off", "SET session_replication_role = replica", PRIVILEGE),
            ("a trigger disabled", "ALTER TABLE workflow_agent_deliveries DISABLE TRIGGER USER", PRIVILEGE),
            (
                "a trigger dropped",
                "DROP TRIGGER workflow_agent_deliveries_retire ON workflow_agent_deliveries",
                PRIVILEGE,
            ),
            ("a check dropped", "ALTER TABLE workflow_agent_deliveries DROP CONSTRAINT delivery_shape", PRIVILEGE),
            ("a function made the invoker's", "ALTER FUNCTION lp_claim SECURITY INVOKER", PRIVILEGE),
            ("a function's search_path changed", "ALTER FUNCTION lp_renew RESET search_path", PRIVILEGE),
            (
                "lp_now() replaced",
                "CREATE OR REPLACE FUNCTION lp_now() RETURNS timestamptz LANGUAGE sql"
                " AS $$ SELECT '2000-01-01T00:00:00Z'::timestamptz $$",
                PRIVILEGE,
            ),
            ("a domain widened", "ALTER DOMAIN lp_lease_seconds DROP CONSTRAINT lp_lease_seconds_check", PRIVILEGE),
            ("an index dropped", "DROP INDEX workflow_agent_deliveries_claim", PRIVILEGE),
            ("a table renamed", "ALTER TABLE communities RENAME TO old_communities", PRIVILEGE),
            ("row security enabled", "ALTER TABLE communities ENABLE ROW LEVEL SECURITY", PRIVILEGE),
            ("a policy", "CREATE POLICY p ON communities USING (false)", PRIVILEGE),
            ("a rule", "CREATE RULE r AS ON UPDATE TO communities DO INSTEAD NOTHING", PRIVILEGE),
            ("a table", "CREATE TABLE public.lp_mine (x int)", PRIVILEGE),
            ("a comment", "COMMENT ON TABLE communities IS 'mine'", PRIVILEGE),
            ("a reindex", "REINDEX TABLE workflow_agent_deliveries", PRIVILEGE),
            ("a cluster", "CLUSTER workflow_agent_deliveries USING workflow_agent_deliveries_pkey", PRIVILEGE),
            ("a publication", "CREATE PUBLICATION lp_leak FOR TABLE communities", PRIVILEGE),
            ("an event trigger", "CREATE EVENT TRIGGER lp_e ON ddl_command_start EXECUTE FUNCTION lp_now()", PRIVILEGE),
            ("a large object", "SELECT lo_create(0)", PRIVILEGE),
            ("a large object from bytes", "SELECT lo_from_bytea(0, '\\x00')", PRIVILEGE),
            ("a large object (lo_creat)", "SELECT lo_creat(-1)", PRIVILEGE),
            ("a server file read", "SELECT pg_read_file('postgresql.conf')", PRIVILEGE),
            ("a program run", "COPY communities FROM PROGRAM 'true'", PRIVILEGE),
        )
    ),
    # -- operations of several statements are atomic --------------------------------------------
    _attempt(
        "atomic operations",
        "a community's rows deleted without its tombstone (deliveries)",
        f"DELETE FROM workflow_agent_deliveries WHERE community_id = {_u(A)}",
        errors=PRIVILEGE,
    ),
    _attempt(
        "atomic operations",
        "a community's rows deleted without its tombstone (workflows, events)",
        f"DELETE FROM events WHERE community_id = {_u(A)}",
        f"DELETE FROM workflows WHERE community_id = {_u(A)}",
        errors=PRIVILEGE,
    ),
    _attempt(
        "atomic operations",
        "a deletion of a community, then its tombstone taken back, in one transaction",
        f"SELECT lp_delete_community({_u(Q)})",
        _update("communities", "state = 'active'", f"id = {_u(Q)}"),
        errors=PRIVILEGE,
    ),
    _attempt(
        "atomic operations",
        "a run deleted, then its deliveries' retirement forgotten, in one transaction",
        f"SELECT lp_delete_run({_u(A)}, {_u(RUN)})",
        f"DELETE FROM retired_delivery_ids WHERE community_id = {_u(A)}",
        errors=PRIVILEGE,
    ),
    _attempt(
        "atomic operations",
        "a head without its runtime record",
        f"DELETE FROM definition_runtime WHERE community_id = {_u(A)}",
        errors=PRIVILEGE,
    ),
    _attempt(
        "atomic operations",
        "a definition deleted without its cutoff",
        f"SELECT lp_delete_definition({_u(A)}, {_u(DEFINED)}, {_key(AUTHOR)}, '2026-06-01T00:00:00Z')",
        f"DELETE FROM definition_cutoffs WHERE community_id = {_u(A)}",
        errors=PRIVILEGE,
    ),
    _attempt(
        "atomic operations",
        "an admitted run without its actions",
        "DELETE FROM executed_actions WHERE run_id = <run_a>",
        errors=PRIVILEGE,
    ),
    # -- the clock a transaction carries (the test database: its clock is pinned) --------------
    *(
        _attempt(
            "the clock a transaction carries",
            f"{what} after the deadline, in a {isolation.lower()} transaction begun before it",
            "SELECT lp_now()",
            _LATE,
            call,
            outcomes=frozenset({"LeaseLost"}),
            pinned=True,
            isolation=isolation,
            # The operations run at read committed only: at another level they refuse to run.
            errors=frozenset() if isolation == "READ COMMITTED" else frozenset({"25001"}),
        )
        for isolation in ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")
        for what, call in (("a renew", renew()), ("a finish", finish()))
    ),
    _attempt(
        "the clock a transaction carries",
        "a renew after the deadline, in a transaction that claimed before it",
        claim(A, lease=60, delivery=_u(PENDING)),
        _LATE,
        renew(delivery=PENDING),
        outcomes=frozenset({"LeaseLost"}),
        pinned=True,
        attack_is_last=True,
    ),
]


# Attempts PostgreSQL itself accepts from any role: a role's defaults for its own sessions and
# its own password (ALTER ROLE of itself), and default privileges of objects it would create
# (it creates none). No grant can refuse them; what they change is the attacker's own entries,
# which no function reads (test_a_role_may_change_only_its_own_defaults).
OWN_ENTRIES = {
    "its own timeouts, 0": "ALTER ROLE CURRENT_USER SET statement_timeout = 0",
    "its own lock_timeout, 0": "ALTER ROLE CURRENT_USER SET lock_timeout = 0",
    "its own idle_in_transaction_session_timeout, 0": "ALTER ROLE CURRENT_USER SET"
    " idle_in_transaction_session_timeout = 0",
    "its own search_path, pg_temp first": "ALTER ROLE CURRENT_USER SET search_path = pg_temp, public",
    "its own isolation level": "ALTER ROLE CURRENT_USER SET default_transaction_isolation = 'repeatable read'",
    "its own password": "ALTER ROLE CURRENT_USER PASSWORD 'lp-attack'",
    "default privileges of what it would create": "ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO PUBLIC",
    # ... and of what a role whose privileges it has would create: api, which creates nothing
    # (NOLOGIN, no CREATE anywhere, and from PostgreSQL 16 on no role may SET ROLE to it).
    "default privileges of what api would create": "ALTER DEFAULT PRIVILEGES FOR ROLE <api> GRANT SELECT ON TABLES"
    " TO PUBLIC",
}


def counts() -> Mapping[str, int]:
    """How many attempts each class has."""
    return collections.Counter(attempt.kind for attempt in ATTEMPTS)


# -- running them ------------------------------------------------------------------------------------


@attrs.frozen
class Verdict:
    refused: bool
    error: str | None  # the SQLSTATE of the error that ended it
    outcomes: tuple[str, ...]  # the outcomes its calls returned
    changed: tuple[str, ...]  # the fingerprint's components that changed
    ended: tuple[str, ...]  # the sessions it ended

    def holds(self) -> bool:
        return self.refused and not self.changed and not self.ended


class Database(Lab):
    """One production database (made again when an attempt changed it), its world, a
    connection per attacking role, and one idle session per role an attempt might signal."""

    def __init__(self, server: Server, pinned: bool) -> None:
        self.server, self.pinned = server, pinned
        self.stack = contextlib.ExitStack()
        try:
            self._make()
        except BaseException:
            self.stack.close()  # the roles and the database go, made or half made
            raise
        self.dirty = False

    def _make(self) -> None:
        self.production = self.stack.enter_context(
            provision(self.server, TENANTS, test_database=self.pinned, prefix="lpa")
        )
        pinned = self.pinned
        p = self.production
        self.superuser = self.stack.enter_context(psycopg.connect(p.superuser, autocommit=True))
        if pinned:
            PinnedClock(self.superuser).pin(T0)
        world = make_world(p, pinned)
        dsns = {"app": p.app, "tenant A": p.tenant(A), "tenant F": p.tenant(F), "reaper": p.reaper}
        self.attackers = {
            role: self.stack.enter_context(
                psycopg.connect(dsn, autocommit=True, row_factory=dict_row, prepare_threshold=None)
            )
            for role, dsn in dsns.items()
        }
        self.victims = {
            role: self.stack.enter_context(psycopg.connect(dsn, autocommit=True))
            for role, dsn in (("reaper", p.reaper), ("app", p.app), ("tenant B", p.tenant(B)))
        }
        names = p.names
        fence_b = self.superuser.execute("SELECT lp_fence_key(%s)", (B,)).fetchone()
        assert fence_b is not None
        self.values = {
            **world,
            **{f"{role.replace(' ', '_')}_pid": str(conn.info.backend_pid) for role, conn in self.victims.items()},
            "app": names.app,
            "api": names.api,
            "owner": names.owner,
            "reaper": names.reaper,
            "tenant_b": names.tenants[1],
            "db": names.database,
            "fence_b": str(fence_b[0]),
        }
        self.baseline = self.fingerprint()

    def fingerprint(self) -> dict[str, str]:
        return fingerprint(self.superuser, self.production.names.roles())

    def sql(self, text: str) -> str:
        for name, value in self.values.items():
            text = text.replace(f"<{name}>", value)
        assert not re.search(r"<[a-z_A-Z]+>", text), f"a placeholder without a value: {text}"
        return text

    def alive(self) -> set[str]:
        pids = {int(conn.info.backend_pid): role for role, conn in self.victims.items()}
        rows = self.superuser.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY (%s)", (list(pids),))
        return {pids[pid] for (pid,) in rows}

    def run(self, attempt: Attempt) -> Verdict:
        conn = self.attackers[attempt.attacker]
        error: str | None = None
        outcomes: list[str] = []
        try:
            conn.execute(f"BEGIN ISOLATION LEVEL {attempt.isolation}")
            for step in attempt.steps:
                if callable(step):
                    step(self, conn)
                    continue
                cursor = conn.execute(self.sql(step).encode())
                row = cursor.fetchone() if cursor.description else None
                if row is not None and "outcome" in row:
                    outcomes.append(row["outcome"])
            conn.execute("ROLLBACK" if attempt.attack_is_last else "COMMIT")
        except psycopg.DatabaseError as exc:
            error = exc.sqlstate or "?"
            if not conn.closed and not conn.broken:
                conn.execute("ROLLBACK")
        finally:
            moved = float(self.values.pop("_moved", "0"))
            if moved:
                PinnedClock(self.superuser).advance(dt.timedelta(seconds=-moved))
            if not conn.closed and not conn.broken:
                conn.execute("DISCARD ALL")
        judged = outcomes[-1:] if attempt.attack_is_last else outcomes
        refused = (error in attempt.errors) if error is not None else bool(judged) and set(judged) <= attempt.outcomes
        verdict = Verdict(
            refused,
            error,
            tuple(outcomes),
            tuple(changed(self.baseline, self.fingerprint())),
            tuple(sorted(set(self.victims) - self.alive())),
        )
        if not verdict.holds() or conn.closed or conn.broken:
            self.dirty = True
        return verdict

    def close(self) -> None:
        # A prepared transaction (an attempt that got one through) would keep the database from
        # being dropped.
        for (gid,) in self.superuser.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall():
            self.superuser.execute(f"ROLLBACK PREPARED '{gid}'")
        self.stack.close()


class Databases:
    """The module's two databases, each made again (from scratch, by the scripts) when an
    attempt changed it; and the tally the run prints at its end."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.open: dict[bool, Database] = {}
        self.broken: dict[bool, Exception] = {}
        self.tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def database(self, pinned: bool) -> Database:
        if pinned in self.broken:  # made once and failed: fail at once, not by making it again
            raise RuntimeError(f"the {'pinned' if pinned else 'production'} database could not be made") from (
                self.broken[pinned]
            )
        current = self.open.get(pinned)
        if current is not None and current.dirty:
            current.close()
            current = None
        if current is None:
            try:
                current = self.open[pinned] = Database(self.server, pinned)
            except Exception as exc:
                self.broken[pinned] = exc
                raise
        return current

    def record(self, kind: str, verdict: Verdict) -> None:
        self.tally[kind]["tried"] += 1
        self.tally[kind]["refused"] += verdict.holds()

    def summary(self) -> str:
        lines = [f"{'class':<40} {'tried':>6} {'refused':>8}"]
        lines += [f"{k:<40} {self.tally[k]['tried']:>6} {self.tally[k]['refused']:>8}" for k in sorted(self.tally)]
        total = sum((t for t in self.tally.values()), collections.Counter[str]())
        lines.append(f"{'all':<40} {total['tried']:>6} {total['refused']:>8}")
        return "\n".join(lines)

    def close(self) -> None:
        for database in self.open.values():
            database.close()


@pytest.fixture(scope="module")
def databases(pg_server: Server, pytestconfig: pytest.Config) -> Iterator[Databases]:
    lab = Databases(pg_server)
    try:
        yield lab
    finally:
        lab.close()
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None and lab.tally:
            with capture.global_and_fixture_disabled():
                reporter.write_line("")
                reporter.write_line("attacks tried, and refused with the database unchanged (test_attacks.py):")
                for line in lab.summary().splitlines():
                    reporter.write_line(line)


@pytest.mark.parametrize("attempt", [a.param() for a in ATTEMPTS])
def test_each_attack_is_refused_and_changes_nothing(databases: Databases, attempt: Attempt) -> None:
    verdict = databases.database(attempt.pinned).run(attempt)
    databases.record(attempt.kind, verdict)
    assert verdict.refused, f"accepted: {verdict}"
    assert not verdict.changed, f"the database changed: {verdict}"
    assert not verdict.ended, f"sessions ended: {verdict}"


def test_the_lists_are_the_catalogs(databases: Databases) -> None:
    """The tables, sequences and functions the attempts cover are every one the catalog shows."""
    conn = databases.database(False).superuser
    relations = dict(
        conn.execute(
            "SELECT relname::text, relkind::text FROM pg_class"
            " WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p', 'v', 'm', 'S', 'f')"
        ).fetchall()
    )
    assert sorted(r for r, k in relations.items() if k != "S") == sorted(TABLES)
    assert sorted(r for r, k in relations.items() if k == "S") == sorted(SEQUENCES)
    functions = dict(
        conn.execute(
            "SELECT proname::text, pronargs::int FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
        ).fetchall()
    )
    assert functions == {**HELPERS, **{name: functions.get(name) for name in OPERATIONS}}
    assert set(OPERATIONS) <= set(functions)
    # ... and the application role may execute the operations alone.
    app = databases.database(False).production.names.app
    executable = {
        name
        for (name,) in conn.execute(
            "SELECT proname::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
            " AND has_function_privilege(%s, oid, 'EXECUTE')",
            (app,),
        )
    }
    assert executable == set(OPERATIONS)
    # Every operation has an attempt of tenant A's for another community (lp_now and
    # lp_enabled_records act for no community: test_tenants.py shows the records are its own).
    scoped = {a.steps[0] for a in ATTEMPTS if a.kind == "another tenant's community" and isinstance(a.steps[0], str)}
    for name in set(OPERATIONS) - {"lp_now", "lp_enabled_records"}:
        assert any(name + "(" in step for step in scoped), name


def test_there_are_enough_attempts_of_every_class() -> None:
    found = counts()
    assert sum(found.values()) >= 60
    for kind in (
        "every table",
        "illegal writes",
        "shadowing",
        "out of bounds",
        "never the model's",
        "another tenant's community",
        "signals",
        "locks",
        "every function",
        "the database",
        "atomic operations",
        "the clock a transaction carries",
    ):
        assert found[kind] >= 2, kind


@pytest.mark.parametrize("name", list(OWN_ENTRIES))
def test_a_role_may_change_only_its_own_entries(databases: Databases, name: str) -> None:
    """What PostgreSQL lets every role do to itself is accepted, and changes the attacker's own
    entries alone: its role, its settings, its default privileges (and api's, see OWN_ENTRIES).
    Harmless: a session may SET the same itself, and test_reaper_under_locks.py shows that one
    whose three timeouts are 0 stops nothing but its own community. The database is made
    again afterwards."""
    database = databases.database(False)
    names = database.production.names
    tenant = names.tenants[0]
    others = tuple(r for r in names.roles() if r != tenant)
    default_acl = "SELECT defaclrole::regrole::text, defaclacl::text FROM pg_default_acl ORDER BY 1, 2"
    before = fingerprint(database.superuser, others), database.superuser.execute(default_acl).fetchall()
    verdict = database.run(_attempt("own entries", name, OWN_ENTRIES[name], attacker="tenant A"))
    database.dirty = True
    assert verdict.error is None and not verdict.ended, verdict
    assert verdict.changed and set(verdict.changed) <= {"pg_db_role_setting", "roles", "default_privileges"}, verdict
    after = fingerprint(database.superuser, others), database.superuser.execute(default_acl).fetchall()
    assert changed(before[0], after[0]) in ([], ["default_privileges"])
    assert {row for row in after[1] if row[0] not in (tenant, names.api)} == {
        row for row in before[1] if row[0] not in (tenant, names.api)
    }


# -- the clock: the moment it is read, not the transaction's or the statement's start ----------------


def test_the_clock_is_the_moment_it_is_read_not_the_transactions_start(databases: Databases) -> None:
    """On the real clock, the second statement of a transaction (at each isolation level) reads
    transaction_timestamp() < statement_timestamp() <= lp_now() <= clock_timestamp(), as the
    application role."""
    database = databases.database(False)
    conn = database.attackers["app"]
    for isolation in ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"):
        conn.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        try:
            conn.execute("SELECT 1")
            row = conn.execute(
                "SELECT lp_now() AS now, statement_timestamp() AS statement, transaction_timestamp() AS began,"
                " clock_timestamp() AS after"
            ).fetchone()
        finally:
            conn.execute("ROLLBACK")
        assert row is not None
        assert row["began"] < row["statement"] <= row["now"] <= row["after"], (isolation, row)


def test_a_statement_carries_no_clock_past_a_deadline(databases: Databases) -> None:
    """A finish sent after its lease's deadline settles nothing, even from inside a statement
    that began before it. The application role's DO block waits (for a change of another
    community, which the test holds back) while the lease's deadline passes (the superuser
    brings it to the present: the real clock is not moved), then finishes the lease."""
    database = databases.database(False)
    conn = database.attackers["app"]
    superuser = database.superuser
    holder = psycopg.connect(database.production.superuser, autocommit=True)
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(lp_change_key(%s))", (Q,))
        result: dict[str, Any] = {}

        def late_finish() -> None:
            try:
                conn.execute("BEGIN")
                conn.execute(
                    f"""DO $$ BEGIN
                        PERFORM lp_set_community_state({_u(Q)}, 'quiescing');
                        IF (SELECT outcome FROM lp_finish({_u(A)}, {_u(CLAIMED)}, {_key(T1)}, 1, 'finished'))
                           <> 'LeaseLost' THEN
                            RAISE EXCEPTION 'settled after the deadline' USING ERRCODE = 'LP999';
                        END IF;
                    END $$""".encode()
                )
                conn.execute("ROLLBACK")
                result["outcome"] = "LeaseLost"
            except psycopg.DatabaseError as exc:
                result["outcome"] = exc.sqlstate
                conn.execute("ROLLBACK")

        thread = threading.Thread(target=late_finish)
        thread.start()
        _wait_for_lock_wait(superuser, conn.info.backend_pid)
        # The deadline passes while the statement waits: the lease now ends before this instant.
        superuser.execute(
            f"UPDATE workflow_agent_deliveries SET lease_until = clock_timestamp() WHERE {_delivery(A, CLAIMED)}"
        )
        database.dirty = True
        holder.execute("ROLLBACK")
        thread.join(timeout=30)
        assert not thread.is_alive()
    finally:
        holder.close()
    refused = result["outcome"] == "LeaseLost"
    databases.record("the clock a statement carries", Verdict(refused, None, (result["outcome"],), (), ()))
    assert refused, result


def _wait_for_lock_wait(superuser: psycopg.Connection[Any], pid: int, timeout: float = 30) -> None:
    """Until the backend `pid` waits for a lock another backend holds (bounded)."""
    deadline = time.monotonic() + timeout
    while superuser.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", (pid,)).fetchone() != (True,):
        assert time.monotonic() < deadline, f"backend {pid} never waited for a lock"
        time.sleep(0.01)  # the poll interval of a condition, not a wait for time to pass


if __name__ == "__main__":
    for kind, count in sorted(counts().items()):
        print(f"{kind:<40} {count:>5}")
    print(f"{'all':<40} {sum(counts().values()):>5}")
    sys.exit(0)
