"""The PostgreSQL delivery store.

Each public method is one operation of the model: commands in, outcomes
out. Each calls the one database function that performs the operation
(`impl/migrations/0006_database_api.sql`: `lp_claim`, `lp_finish`, ...), one
statement and one round trip, its own transaction (the connection is in
autocommit). The functions check the caller's scope, the arguments, the
community's write fence and the lease, and make exactly the model's
transition; the application role may call them and may touch no table
(impl/grants.sql). A refused request raises `Refused(rejection)` and writes
nothing. The calls are named class attributes (`SQL_CLAIM`, ...), so that a
tool which waits for one (the statement gate of `impl/hooks/gate.py`) can name
it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import psycopg
from psycopg import pq
from psycopg.rows import tuple_row

from leaseproof.impl.connection import connect
from leaseproof.impl.errors import ConnectionLost, Forbidden, Unavailable
from leaseproof.impl.migrate import Addition, Patch
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, Cause, EventCause, ScheduleCause, WebhookCause
from leaseproof.model.errors import Refused
from leaseproof.model.frozenmap import FrozenMap

# SQLSTATE raised by the community write fence trigger.
FENCE_SQLSTATE = "LP001"
# SQLSTATE of a call for a community the calling role does not act for (lp_require_scope).
SCOPE_SQLSTATE = "LP005"

_DELIVERY_COLUMNS = """
    community_id, id, workflow_id, run_id, step_id, target_pubkey,
    definition_event_id, message_event_id, cause_kind, cause_event_id,
    cause_scheduled_for, cause_invocation_id, status, lease_generation,
    lease_until, claimed_at, finished_at, created_at, claim_key
"""


def cause_columns(cause: Cause) -> dict[str, Any]:
    """The decomposed cause: its kind and exactly one identity column."""
    return {
        "cause_kind": cause.kind,
        "cause_event_id": cause.event_id if isinstance(cause, EventCause) else None,
        "cause_scheduled_for": cause.scheduled_for if isinstance(cause, ScheduleCause) else None,
        "cause_invocation_id": cause.invocation_id if isinstance(cause, WebhookCause) else None,
    }


def binding_columns(binding: Binding) -> dict[str, Any]:
    return {
        "community_id": binding.community_id,
        "workflow_id": binding.workflow_id,
        "run_id": binding.run_id,
        "step_id": binding.step_id,
        "target_pubkey": binding.target_pubkey,
        "definition_event_id": binding.definition_event_id,
        "message_event_id": binding.message_event_id,
        **cause_columns(binding.cause),
    }


def delivery_from_row(row: dict[str, Any]) -> m.Delivery:
    kind = row["cause_kind"]
    cause: Any
    if kind == "event":
        cause = EventCause(bytes(row["cause_event_id"]))
    elif kind == "schedule":
        cause = ScheduleCause(row["cause_scheduled_for"])
    else:
        cause = WebhookCause(row["cause_invocation_id"])
    binding = Binding(
        community_id=row["community_id"],
        workflow_id=row["workflow_id"],
        run_id=row["run_id"],
        step_id=row["step_id"],
        target_pubkey=bytes(row["target_pubkey"]),
        definition_event_id=bytes(row["definition_event_id"]),
        message_event_id=bytes(row["message_event_id"]),
        cause=cause,
    )
    return m.Delivery(
        id=row["id"],
        binding=binding,
        status=m.Status(row["status"]),
        lease_generation=row["lease_generation"],
        lease_until=row["lease_until"],
        claimed_at=row["claimed_at"],
        finished_at=row["finished_at"],
        created_at=row["created_at"],
        claim_key=row["claim_key"],
    )


def refuse_unless_active(community_id: uuid.UUID, state: str | None) -> None:
    """Refuse a write to `community_id`, whose state the fence read (None: no such community),
    unless it is active."""
    if state is None:
        raise Refused(m.UnknownCommunity(community_id))
    if (known := m.CommunityState(state)) is not m.CommunityState.ACTIVE:
        raise Refused(m.CommunityNotWritable(community_id, known))


def refuse_community(row: dict[str, Any], community_id: uuid.UUID) -> None:
    """Raise the community refusal a function's answer `row` carries, if it is one."""
    if row["outcome"] in ("UnknownCommunity", "CommunityNotWritable"):
        refuse_unless_active(community_id, row["state"])


_COMMUNITY_REFUSALS = ("UnknownCommunity", "CommunityNotWritable")
# Every outcome each function with one answers (a community's refusals beside the rest).
ANSWERS: dict[str, frozenset[str]] = {
    name: frozenset(outcomes) | frozenset(_COMMUNITY_REFUSALS)
    for name, outcomes in {
        "lp_create_community": ("Ok", "AlreadyExists"),
        "lp_set_community_state": ("Ok",),
        "lp_delete_community": ("Ok",),
        "lp_create_workflow": ("Ok", "AlreadyExists"),
        "lp_delete_workflow": ("Ok", "NotFound"),
        "lp_create_run": ("Ok", "AlreadyExists", "NotFound"),
        "lp_delete_run": ("Ok", "NotFound"),
        "lp_publish_event": ("Ok", "AlreadyExists"),
        "lp_delete_event": ("Ok", "NotFound"),
        "lp_commit_deliveries": ("Committed", "DeliveryIdTaken", "NotFound", "WorkflowMismatch"),
        "lp_claim": ("Claimed", "ClaimMiss"),
        "lp_renew": ("Renewed", "LeaseLost"),
        "lp_finish": ("Settled", "AlreadyTerminal", "LeaseLost"),
        "lp_get_delivery": ("Found", "NotFound"),
        "lp_set_authority": ("Ok",),
        "lp_save_definition": ("Created", "Updated", "Superseded", "BeforeCutoff", "NoAuthority", "NotAuthor"),
        "lp_delete_definition": ("Deleted", "Superseded", "NotFound", "NoAuthority", "NotAuthor"),
        "lp_fire_check": ("Ok",),
        "lp_admit": ("Admitted", "AdmissionRefused"),
        "lp_resume_run": ("Resumed", "ResumeRefused", "UnknownRun"),
    }.items()
}


class FencedWriter:
    """What every writer of a community's rows shares: one connection, calls of the
    database's functions (each its own transaction), and the typed errors."""

    # How the database functions this store calls differ from the shipped ones: not at
    # all. A variant of the store (a mutant, `impl/mutants/`) lists its edits here;
    # the test adapters put them in their database (`impl/hooks/functions.py`).
    FUNCTIONS: ClassVar[tuple[Patch | Addition, ...]] = ()
    # Every outcome each function answers (a variant whose functions answer more says so).
    ANSWERS: ClassVar[Mapping[str, frozenset[str]]] = ANSWERS

    def __init__(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        self.conn = conn

    def _one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        return self.conn.execute(sql, params).fetchone()

    def _call(self, sql: str, params: dict[str, Any]) -> dict[str, Any]:
        """The one row of `sql`, a call of a database function. Outside a transaction it
        is its own (autocommit): a connection lost while it ran leaves its outcome
        unknown, as a lost COMMIT does. An outcome the function does not answer
        (`ANSWERS`) is an error: the store reads no answer it does not know as success."""
        alone = self.conn.info.transaction_status == pq.TransactionStatus.IDLE
        try:
            row = self.conn.execute(sql, params).fetchone()
        except psycopg.OperationalError as exc:
            if alone and (self.conn.closed or self.conn.broken):
                raise _Committing(exc) from exc
            raise
        assert row is not None, "a call of a database function returns one row"
        known = self.ANSWERS.get(_called(sql))
        if known is not None and row["outcome"] not in known:
            raise UnknownAnswer(f"{_called(sql)} answered {row['outcome']!r}, none of {', '.join(sorted(known))}")
        return row

    @contextlib.contextmanager
    def typed_errors(self, operation: str, community_id: uuid.UUID | None = None) -> Iterator[None]:
        """Raise what a failure of the store call `operation` on this connection means:
        `Refused` for the database's own fence (when the call acts for `community_id`),
        the typed errors of `leaseproof.impl.errors` (`Unavailable`, `ConnectionLost`,
        `Forbidden`), or the error itself (a bug)."""
        try:
            yield
        except psycopg.errors.DatabaseError as exc:
            if exc.sqlstate == FENCE_SQLSTATE and community_id is not None:
                # The database's own fence fired: the same refusal.
                state = m.CommunityState(exc.diag.message_detail or "deleted")
                raise Refused(m.CommunityNotWritable(community_id, state)) from exc
            typed = typed_error(operation, exc, self.conn)
            if typed is None:
                raise
            raise typed from exc
        except _Committing as exc:
            raise ConnectionLost(operation, None, exc.cause) from exc.cause


class UnknownAnswer(Exception):
    """A database function answered an outcome it does not give: a bug of the function."""


@functools.cache
def _called(sql: str) -> str:
    """The database function a call statement calls."""
    found = re.search(r"\bFROM\s+(lp_\w+)\s*\(", sql)
    return found.group(1) if found else ""


class _Committing(Exception):
    """The connection was lost while the call's commit was on its way (raised inside the store)."""

    def __init__(self, cause: psycopg.OperationalError) -> None:
        super().__init__(str(cause))
        self.cause = cause


# What the server says when it gives a transaction up and rolls it back: it may be sent again.
_GAVE_UP = {
    "55P03": "gave up waiting for a lock another client holds",  # lock_timeout
    "57014": "the statement ran past its bound",  # statement_timeout (or a cancel)
    "40P01": "the server broke a deadlock by rolling it back",
    "40001": "the server rolled it back (a serialization failure)",
}
# What the server says when the calling role may not do what it asked.
_FORBIDDEN = {SCOPE_SQLSTATE, "42501"}  # the role's scope; a privilege (EXECUTE) it lacks


def typed_error(operation: str, exc: psycopg.Error, conn: Any) -> BaseException | None:
    """The typed error (`leaseproof.impl.errors`) for `exc`, raised by a store call
    on `conn` before any COMMIT (a lost COMMIT is `_Committing`); None if it is
    none of them (a bug, raised as it is)."""
    if conn.closed or conn.broken:
        return ConnectionLost(operation, False, exc)  # the session is gone (ended by the server, cut)
    sqlstate = exc.sqlstate if isinstance(exc, psycopg.errors.DatabaseError) else None
    if reason := _GAVE_UP.get(sqlstate or ""):
        return Unavailable(operation, f"{reason} ({sqlstate}: {str(exc).strip()})")
    if sqlstate in _FORBIDDEN:
        return Forbidden(operation, str(exc).strip())
    return None


@attrs.frozen
class Sweep:
    """What one sweep of the reaper did: how many expired leases it reaped; the
    (community, delivery) of each it left for the next sweep, held locked by another
    transaction; and each community it skipped, whose write fence another session held
    (a change of its state in flight, or a session stalled inside one)."""

    reaped: int
    left: tuple[tuple[uuid.UUID, uuid.UUID], ...] = ()
    skipped: tuple[uuid.UUID, ...] = ()


class PostgresDeliveryStore(FencedWriter):
    """The delivery machine on PostgreSQL. One connection; not thread-safe."""

    def __init__(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        super().__init__(conn)
        self._decoded_rows: dict[tuple[Any, ...], m.Delivery] = {}

    # -- the calls ----------------------------------------------------------

    SQL_CREATE_COMMUNITY = "SELECT outcome FROM lp_create_community(%(community_id)s)"
    SQL_SET_COMMUNITY_STATE = "SELECT outcome, state FROM lp_set_community_state(%(community_id)s, %(state)s)"
    SQL_DELETE_COMMUNITY = "SELECT outcome FROM lp_delete_community(%(community_id)s)"
    SQL_CREATE_WORKFLOW = "SELECT outcome, state FROM lp_create_workflow(%(community_id)s, %(workflow_id)s)"
    SQL_DELETE_WORKFLOW = "SELECT outcome, state FROM lp_delete_workflow(%(community_id)s, %(workflow_id)s)"
    SQL_CREATE_RUN = "SELECT outcome, state FROM lp_create_run(%(community_id)s, %(workflow_id)s, %(run_id)s)"
    SQL_DELETE_RUN = "SELECT outcome, state FROM lp_delete_run(%(community_id)s, %(run_id)s)"
    SQL_PUBLISH_EVENT = "SELECT outcome, state FROM lp_publish_event(%(community_id)s, %(event_id)s)"
    SQL_DELETE_EVENT = "SELECT outcome, state FROM lp_delete_event(%(community_id)s, %(event_id)s)"
    # The arrays are built by the server from one parameter an element: psycopg dumps a
    # list element by element in Python (about 135 µs a call for the twelve, against 53).
    SQL_COMMIT_DELIVERIES = """
        SELECT * FROM lp_commit_deliveries(
            %(community_id)s, %(run_id)s, %(step_id)s, ARRAY[{ids}]::uuid[], ARRAY[{workflows}]::uuid[],
            ARRAY[{targets}]::bytea[], ARRAY[{definitions}]::bytea[], ARRAY[{messages}]::bytea[],
            ARRAY[{cause_kinds}]::delivery_cause_kind[], ARRAY[{cause_events}]::bytea[],
            ARRAY[{cause_times}]::timestamptz[], ARRAY[{cause_invocations}]::uuid[])
    """

    SQL_CLAIM = """
        SELECT * FROM lp_claim(
            %(community_id)s, %(target_pubkey)s, %(lease_seconds)s, %(delivery_id)s,
            %(expected)s, %(expected_community)s, %(expected_target)s,
            %(workflow_id)s, %(run_id)s, %(step_id)s, %(definition_event_id)s, %(message_event_id)s,
            %(cause_kind)s, %(cause_event_id)s, %(cause_scheduled_for)s, %(cause_invocation_id)s,
            %(request_key)s)
    """
    SQL_RENEW = """
        SELECT outcome, state, lease_until FROM lp_renew(
            %(community_id)s, %(delivery_id)s, %(target_pubkey)s, %(lease_generation)s, %(lease_seconds)s)
    """
    SQL_FINISH = """
        SELECT outcome, state, status FROM lp_finish(
            %(community_id)s, %(delivery_id)s, %(target_pubkey)s, %(lease_generation)s, %(outcome)s)
    """
    SQL_SWEEP = "SELECT reaped, left_communities, left_deliveries, skipped FROM lp_sweep()"
    SQL_GET_DELIVERY = "SELECT * FROM lp_get_delivery(%(community_id)s, %(delivery_id)s)"

    # -- dispatch -------------------------------------------------------------

    def execute(self, command: m.Command) -> m.Outcome:
        """Run one model command; a refusal is raised as `Refused`."""
        handler = getattr(self, _METHOD_FOR[type(command)])
        with self.typed_errors(type(command).__name__, _community_of(command)):
            outcome: m.Outcome = handler(command)
        return outcome

    def sweep(self) -> Sweep:
        """The reaper's sweep as a service runs it: the model's Reap, and a report of
        what it left for the next sweep (see `Sweep`)."""
        with self.typed_errors("Sweep", None):
            row = self._call(self.SQL_SWEEP, {})
        left = tuple(zip(row["left_communities"], row["left_deliveries"], strict=True))
        return Sweep(row["reaped"], left, tuple(row["skipped"]))

    # -- communities, workflows, runs, events ----------------------------------

    def create_community(self, c: m.CreateCommunity) -> m.Ok:
        row = self._call(self.SQL_CREATE_COMMUNITY, {"community_id": c.community_id})
        if row["outcome"] == "AlreadyExists":
            raise Refused(m.AlreadyExists("community", c.community_id, c.community_id))
        return m.Ok()

    def set_community_state(self, c: m.SetCommunityState) -> m.Ok:
        row = self._call(self.SQL_SET_COMMUNITY_STATE, {"community_id": c.community_id, "state": c.state.value})
        refuse_community(row, c.community_id)
        return m.Ok()

    def delete_community(self, c: m.DeleteCommunity) -> m.Ok:
        row = self._call(self.SQL_DELETE_COMMUNITY, {"community_id": c.community_id})
        if row["outcome"] == "UnknownCommunity":
            raise Refused(m.UnknownCommunity(c.community_id))
        return m.Ok()

    def create_workflow(self, c: m.CreateWorkflow) -> m.Ok:
        row = self._call(self.SQL_CREATE_WORKFLOW, {"community_id": c.community_id, "workflow_id": c.workflow_id})
        refuse_community(row, c.community_id)
        if row["outcome"] == "AlreadyExists":
            raise Refused(m.AlreadyExists("workflow", c.community_id, c.workflow_id))
        return m.Ok()

    def delete_workflow(self, c: m.DeleteWorkflow) -> m.Ok:
        row = self._call(self.SQL_DELETE_WORKFLOW, {"community_id": c.community_id, "workflow_id": c.workflow_id})
        refuse_community(row, c.community_id)
        if row["outcome"] == "NotFound":
            raise Refused(m.NotFound("workflow", c.community_id, c.workflow_id))
        return m.Ok()

    def create_run(self, c: m.CreateRun) -> m.Ok:
        params = {"community_id": c.community_id, "workflow_id": c.workflow_id, "run_id": c.run_id}
        row = self._call(self.SQL_CREATE_RUN, params)
        refuse_community(row, c.community_id)
        if row["outcome"] == "NotFound":
            raise Refused(m.NotFound("workflow", c.community_id, c.workflow_id))
        if row["outcome"] == "AlreadyExists":
            raise Refused(m.AlreadyExists("run", c.community_id, c.run_id))
        return m.Ok()

    def delete_run(self, c: m.DeleteRun) -> m.Ok:
        row = self._call(self.SQL_DELETE_RUN, {"community_id": c.community_id, "run_id": c.run_id})
        refuse_community(row, c.community_id)
        if row["outcome"] == "NotFound":
            raise Refused(m.NotFound("run", c.community_id, c.run_id))
        return m.Ok()

    def publish_event(self, c: m.PublishEvent) -> m.Ok:
        row = self._call(self.SQL_PUBLISH_EVENT, {"community_id": c.community_id, "event_id": c.event_id})
        refuse_community(row, c.community_id)
        if row["outcome"] == "AlreadyExists":
            raise Refused(m.AlreadyExists("event", c.community_id, c.event_id))
        return m.Ok()

    def delete_event(self, c: m.DeleteEvent) -> m.Ok:
        row = self._call(self.SQL_DELETE_EVENT, {"community_id": c.community_id, "event_id": c.event_id})
        refuse_community(row, c.community_id)
        if row["outcome"] == "NotFound":
            raise Refused(m.NotFound("event", c.community_id, c.event_id))
        return m.Ok()

    # -- deliveries -----------------------------------------------------------

    def commit_deliveries(self, c: m.CommitDeliveries) -> m.Committed:
        params: dict[str, Any] = {"community_id": c.community_id, "run_id": c.run_id, "step_id": c.step_id}
        for i, new in enumerate(c.deliveries):
            b = new.binding
            params.update(
                {
                    f"ids{i}": new.id,
                    f"workflows{i}": b.workflow_id,
                    f"targets{i}": b.target_pubkey,
                    f"definitions{i}": b.definition_event_id,
                    f"messages{i}": b.message_event_id,
                    **{f"{_CAUSE_ARRAYS[name]}{i}": value for name, value in cause_columns(b.cause).items()},
                }
            )
        sql = _commit_call(self.SQL_COMMIT_DELIVERIES, len(c.deliveries))
        for attempt in range(COMMIT_TRIES):
            try:
                row = self._call(sql, params)
                break
            except psycopg.errors.DatabaseError as exc:
                # A concurrent commit took one of the ids between the function's check and
                # its insert (a live id, or one retired meanwhile): the statement wrote
                # nothing, and the call sent again sees the id and answers DeliveryIdTaken.
                if not _id_taken_meanwhile(exc) or attempt + 1 == COMMIT_TRIES or not self._alone():
                    raise
        refuse_community(row, c.community_id)
        outcome = row["outcome"]
        if outcome == "NotFound":
            if row["event"] is None:
                raise Refused(m.NotFound("run", c.community_id, c.run_id))
            raise Refused(m.NotFound("event", c.community_id, bytes(row["event"])))
        if outcome == "WorkflowMismatch":
            raise Refused(m.WorkflowMismatch(c.run_id, row["run_workflow"], row["workflow"]))
        if outcome == "DeliveryIdTaken":
            raise Refused(m.DeliveryIdTaken(c.community_id, row["taken"]))
        return m.Committed(tuple(row["created"]), row["existed"])

    def _alone(self) -> bool:
        return self.conn.info.transaction_status == pq.TransactionStatus.IDLE

    def claim(self, c: m.Claim) -> m.Claimed | m.ClaimMiss:
        expected = c.expected
        params: dict[str, Any] = {
            "community_id": c.community_id,
            "target_pubkey": c.target_pubkey,
            "lease_seconds": c.lease_seconds,
            "delivery_id": c.delivery_id,
            "expected": expected is not None,
            "expected_community": None if expected is None else expected.community_id,
            "expected_target": None if expected is None else expected.target_pubkey,
            "request_key": c.request_key,
            **_expected_columns(expected),
        }
        row = self._call(self.SQL_CLAIM, params)
        refuse_community(row, c.community_id)
        if row["outcome"] == "ClaimMiss":
            return m.ClaimMiss()
        delivery = delivery_from_row(row)
        return m.Claimed(m.lease_of(delivery), delivery)

    def renew(self, c: m.Renew) -> m.Renewed | m.LeaseLost:
        row = self._call(self.SQL_RENEW, {**_lease_params(c.lease), "lease_seconds": c.lease_seconds})
        refuse_community(row, c.lease.community_id)
        return m.Renewed(row["lease_until"]) if row["outcome"] == "Renewed" else m.LeaseLost()

    def finish(self, c: m.Finish) -> m.Settled | m.AlreadyTerminal | m.LeaseLost:
        row = self._call(self.SQL_FINISH, {**_lease_params(c.lease), "outcome": c.outcome.value})
        refuse_community(row, c.lease.community_id)
        if row["outcome"] == "Settled":
            return m.Settled(m.Status(row["status"]))
        if row["outcome"] == "AlreadyTerminal":
            return m.AlreadyTerminal(m.Status(row["status"]))
        return m.LeaseLost()

    def reap(self, c: m.Reap | None = None) -> m.Reaped:
        return m.Reaped(self._call(self.SQL_SWEEP, {})["reaped"])

    def get_delivery(self, c: m.GetDelivery) -> m.Found:
        row = self._call(self.SQL_GET_DELIVERY, {"community_id": c.community_id, "delivery_id": c.delivery_id})
        if row["outcome"] == "NotFound":
            raise Refused(m.NotFound("delivery", c.community_id, c.delivery_id))
        return m.Found(delivery_from_row(row))

    # -- whole-state read (the harness's: it reads the tables, which takes a role that may) ----

    SNAPSHOT_QUERIES = (
        "SELECT lp_now()",
        "SELECT id, state FROM communities",
        "SELECT community_id, id FROM workflows",
        "SELECT community_id, workflow_id, id FROM workflow_runs",
        "SELECT community_id, id FROM events",
        f"SELECT {_DELIVERY_COLUMNS} FROM workflow_agent_deliveries",
        "SELECT community_id, id FROM retired_delivery_ids",
    )

    def snapshot(self) -> m.DeliverySystem:
        """Every persisted row and the DB clock, as the model's state value (one round trip)."""
        clock, communities, workflows, runs, events, deliveries, retired = read_consistently(
            self.conn, self.SNAPSHOT_QUERIES
        )
        return m.DeliverySystem(
            now=clock[0][0],
            communities=FrozenMap((cid, m.CommunityState(state)) for cid, state in communities),
            workflows=frozenset(workflows),
            runs=FrozenMap(((cid, rid), wid) for cid, wid, rid in runs),
            events=frozenset((cid, bytes(eid)) for cid, eid in events),
            deliveries=FrozenMap((d.key, d) for d in map(self._decoded, deliveries)),
            retired=frozenset(retired),
        )

    def _decoded(self, row: tuple[Any, ...]) -> m.Delivery:
        """The model value of one delivery row; a row seen before is not decoded (nor validated) again."""
        delivery = self._decoded_rows.get(row)
        if delivery is None:
            if len(self._decoded_rows) > _DECODED_ROWS_KEPT:
                self._decoded_rows.clear()
            delivery = delivery_from_row(dict(zip(_DELIVERY_COLUMN_NAMES, row, strict=True)))
            self._decoded_rows[row] = delivery
        return delivery


COMMIT_TRIES = 3  # a commit that met a concurrent taker of one of its ids is sent again, this often in all
_CAUSE_ARRAYS = {
    "cause_kind": "cause_kinds",
    "cause_event_id": "cause_events",
    "cause_scheduled_for": "cause_times",
    "cause_invocation_id": "cause_invocations",
}
_COMMIT_ARRAYS = ("ids", "workflows", "targets", "definitions", "messages", *_CAUSE_ARRAYS.values())


@functools.lru_cache(maxsize=64)
def _commit_call(template: str, targets: int) -> str:
    """The commit's call for `targets` targets: each array built from one placeholder an element."""
    return template.format(**{name: ", ".join(f"%({name}{i})s" for i in range(targets)) for name in _COMMIT_ARRAYS})


def _id_taken_meanwhile(exc: psycopg.errors.DatabaseError) -> bool:
    """Whether a commit's error says a concurrent commit or deletion took one of its ids."""
    constraint = exc.diag.constraint_name
    return constraint == "workflow_agent_deliveries_pkey" or constraint == "delivery_id_not_retired"


_DELIVERY_COLUMN_NAMES = tuple(c.strip() for c in _DELIVERY_COLUMNS.split(","))
_DECODED_ROWS_KEPT = 100_000


def returns_rows(cursor: psycopg.Cursor[Any]) -> bool:
    """Whether the cursor's current result holds rows (without building its description,
    a Column object a column, which costs more than the rows of a small result)."""
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def read_consistently(conn: psycopg.Connection[Any], queries: Sequence[str]) -> list[list[tuple[Any, ...]]]:
    """The rows of each query, all read from one snapshot, in one round trip.

    The queries take no parameters, so they travel as one simple-protocol
    message inside one read-only REPEATABLE READ transaction.
    """
    cursor = conn.cursor(row_factory=tuple_row)
    cursor.execute("; ".join(("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", *queries, "COMMIT")))
    results: list[list[tuple[Any, ...]]] = []
    while True:
        if returns_rows(cursor):  # BEGIN and COMMIT do not
            results.append(cursor.fetchall())
        if not cursor.nextset():
            break
    if len(results) != len(queries):
        raise RuntimeError(f"a consistent read returned {len(results)} results for {len(queries)} queries")
    return results


_METHOD_FOR: dict[type, str] = {
    m.CreateCommunity: "create_community",
    m.SetCommunityState: "set_community_state",
    m.DeleteCommunity: "delete_community",
    m.CreateWorkflow: "create_workflow",
    m.DeleteWorkflow: "delete_workflow",
    m.CreateRun: "create_run",
    m.DeleteRun: "delete_run",
    m.PublishEvent: "publish_event",
    m.DeleteEvent: "delete_event",
    m.CommitDeliveries: "commit_deliveries",
    m.Claim: "claim",
    m.Renew: "renew",
    m.Finish: "finish",
    m.Reap: "reap",
    m.GetDelivery: "get_delivery",
}


def _community_of(command: Any) -> uuid.UUID | None:
    """The one community a command writes to, if it names one."""
    if isinstance(command, m.Renew | m.Finish):
        return command.lease.community_id
    return getattr(command, "community_id", None)


def _lease_params(lease: m.Lease) -> dict[str, Any]:
    return {
        "community_id": lease.community_id,
        "delivery_id": lease.delivery_id,
        "target_pubkey": lease.target_pubkey,
        "lease_generation": lease.lease_generation,
    }


def _expected_columns(expected: Binding | None) -> dict[str, Any]:
    names = [
        "workflow_id",
        "run_id",
        "step_id",
        "definition_event_id",
        "message_event_id",
        "cause_kind",
        "cause_event_id",
        "cause_scheduled_for",
        "cause_invocation_id",
    ]
    if expected is None:
        return dict.fromkeys(names)
    columns = binding_columns(expected)
    return {name: columns[name] for name in names}


__all__: Sequence[str] = ("PostgresDeliveryStore", "connect", "delivery_from_row")
