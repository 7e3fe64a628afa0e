"""The PostgreSQL delivery store.

Each public method is one transaction and takes or returns only model
values: commands in, outcomes out. The lease operations a worker runs in a
loop (an unkeyed claim, a renew, a finish) are each one statement, its own
transaction (the connection is in autocommit), with the community's write
fence folded in (`FENCE_CTE`); the rest run their statements inside an
explicit transaction. A
refused request raises `Refused(rejection)` and writes nothing. The SQL
statements are named class attributes, so that a variant of the store (for
example a mutant that reintroduces a review finding) differs from the real
one in exactly the statement it names.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.rows import dict_row, tuple_row

from leaseproof.impl.errors import ConnectionLost, Unavailable
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, Cause, EventCause, ScheduleCause, WebhookCause
from leaseproof.model.errors import Refused
from leaseproof.model.frozenmap import FrozenMap

# SQLSTATE raised by the community write fence trigger.
FENCE_SQLSTATE = "LP001"

_DELIVERY_COLUMNS = """
    community_id, id, workflow_id, run_id, step_id, target_pubkey,
    definition_event_id, message_event_id, cause_kind, cause_event_id,
    cause_scheduled_for, cause_invocation_id, status, lease_generation,
    lease_until, claimed_at, finished_at, created_at, claim_key
"""


@attrs.frozen
class Waits:
    """How long a store call may wait, in seconds, each bound enforced by the server
    (one client stalled inside a transaction must not stop every other):

    - `lock`: for a row or advisory lock another client holds (lock_timeout);
    - `statement`: for any one statement (statement_timeout);
    - `idle_in_transaction`: how long a client of the store may sit inside an
      open transaction before the server ends its session and releases its
      locks (idle_in_transaction_session_timeout): the bound on how long a
      stalled client can hold up the others.

    A call that waits past `lock` or `statement` raises `Unavailable`.
    """

    lock: float = 5.0
    statement: float = 30.0
    idle_in_transaction: float = 60.0

    def settings(self) -> str:
        """The SET statements that apply these bounds to a session (in milliseconds)."""
        return "; ".join(
            f"SET {name} = {round(seconds * 1000)}"
            for name, seconds in (
                ("lock_timeout", self.lock),
                ("statement_timeout", self.statement),
                ("idle_in_transaction_session_timeout", self.idle_in_transaction),
            )
        )


WAITS = Waits()


def connect(dsn: str, waits: Waits = WAITS) -> psycopg.Connection[dict[str, Any]]:
    """A connection as the store expects it: autocommit, UTC, dict rows, bounded waits
    (one round trip sets them all)."""
    conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
    conn.execute(f"SET TIME ZONE 'UTC'; {waits.settings()}".encode())
    return conn


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


class RefusedAfterWriting(Refused):
    """A refusal decided after the call wrote: its transaction rolls back (`_transaction`)."""


def refuse_unless_active(community_id: uuid.UUID, state: str | None) -> None:
    """Refuse a write to `community_id`, whose state the fence read (None: no such community),
    unless it is active."""
    if state is None:
        raise Refused(m.UnknownCommunity(community_id))
    if (known := m.CommunityState(state)) is not m.CommunityState.ACTIVE:
        raise Refused(m.CommunityNotWritable(community_id, known))


class FencedWriter:
    """What every writer of a community's rows shares: the explicit write-fence
    check, under a share lock that a concurrent state change must wait for."""

    SQL_COMMUNITY_STATE = "SELECT state FROM communities WHERE id = %(community_id)s FOR SHARE"

    def __init__(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        self.conn = conn

    def _writable(self, community_id: uuid.UUID) -> None:
        """Refuse unless the community exists and is active; holds it share-locked."""
        row = self.conn.execute(self.SQL_COMMUNITY_STATE, {"community_id": community_id}).fetchone()
        refuse_unless_active(community_id, None if row is None else row["state"])

    def _one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        return self.conn.execute(sql, params).fetchone()

    def _fenced(self, sql: str, params: dict[str, Any], community_id: uuid.UUID) -> dict[str, Any]:
        """The row of `sql`, a statement that checks its community's write fence itself
        (`FENCE_CTE`: it writes only while the community is active), as its own
        transaction unless one is open. Raises the refusal its fence gives, and takes
        it again while its fence says the community changed after its snapshot (only
        `FENCE_CTE` can say so; the other fences are always steady)."""
        for _ in range(STEADY_TRIES):
            row = self._statement(sql, params)
            refuse_unless_active(community_id, row["community_state"])
            if row["steady"]:
                return row
        # Only a statement taken again (a claim's) gets here.
        raise Unavailable("Claim", f"community {community_id} changed state under each of {STEADY_TRIES} tries")

    def _statement(self, sql: str, params: dict[str, Any]) -> dict[str, Any]:
        """The one row of `sql`. Outside a transaction it is its own (autocommit): a
        connection lost while it ran leaves its outcome unknown, as a lost COMMIT does."""
        alone = self.conn.info.transaction_status == pq.TransactionStatus.IDLE
        try:
            row = self.conn.execute(sql, params).fetchone()
        except psycopg.OperationalError as exc:
            if alone and (self.conn.closed or self.conn.broken):
                raise _Committing(exc) from exc
            raise
        assert row is not None, "a fenced statement returns one row"
        return row

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """`conn.transaction()`, telling a connection lost while committing (the
        outcome is unknown) from one lost before (nothing took effect).

        A refusal ends its transaction with COMMIT, not ROLLBACK: it is raised
        before the call writes anything (its reads and locks commit as they would
        roll back), and psycopg answers every ROLLBACK by dropping the connection's
        prepared statements (one DEALLOCATE ALL round trip, then every statement
        parsed and planned anew until it is prepared again; psycopg issue #1105).
        Measured on the lockstep's refusal-heavy programs: the adapter's calls took
        1.28x the time of their bare SQL, 1.05x after. The one refusal that follows
        a write raises `RefusedAfterWriting` and rolls back; any other exception
        rolls back too."""
        transaction = self.conn.transaction()
        transaction.__enter__()
        try:
            yield
        except BaseException as exc:
            if isinstance(exc, Refused) and not isinstance(exc, RefusedAfterWriting):
                with contextlib.suppress(psycopg.OperationalError):  # nothing was written: the refusal stands
                    transaction.__exit__(None, None, None)
            else:
                transaction.__exit__(type(exc), exc, exc.__traceback__)  # rolls back, or finds the connection gone
            raise
        try:
            transaction.__exit__(None, None, None)  # the COMMIT
        except psycopg.OperationalError as exc:
            raise _Committing(exc) from exc

    @contextlib.contextmanager
    def typed_errors(self, operation: str, community_id: uuid.UUID | None = None) -> Iterator[None]:
        """Raise what a failure of the store call `operation` on this connection means:
        `Refused` for the database's own fence (when the call acts for `community_id`),
        the typed errors of `leaseproof.impl.errors` (`Unavailable`, `ConnectionLost`),
        or the error itself (a bug)."""
        try:
            yield
        except psycopg.errors.DatabaseError as exc:
            if exc.sqlstate == FENCE_SQLSTATE and community_id is not None:
                # The database's own fence fired (a concurrent state change
                # won the race with our explicit check): the same refusal.
                state = m.CommunityState(exc.diag.message_detail or "deleted")
                raise Refused(m.CommunityNotWritable(community_id, state)) from exc
            typed = typed_error(operation, exc, self.conn)
            if typed is None:
                raise
            raise typed from exc
        except _Committing as exc:
            raise ConnectionLost(operation, None, exc.cause) from exc.cause


class _Committing(Exception):
    """The connection was lost while the COMMIT was on its way (raised inside the store)."""

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


def typed_error(operation: str, exc: psycopg.Error, conn: Any) -> BaseException | None:
    """The typed error (`leaseproof.impl.errors`) for `exc`, raised by a store call
    on `conn` before any COMMIT (a lost COMMIT is `_Committing`); None if it is
    none of them (a bug, raised as it is)."""
    if conn.closed or conn.broken:
        return ConnectionLost(operation, False, exc)  # the session is gone (ended by the server, cut)
    if isinstance(exc, psycopg.errors.DatabaseError) and (reason := _GAVE_UP.get(exc.sqlstate or "")):
        return Unavailable(operation, f"{reason} ({exc.sqlstate}: {str(exc).strip()})")
    return None


@attrs.frozen
class Sweep:
    """What one sweep of the reaper did: how many expired leases it reaped, and the
    (community, delivery) of each it left for the next sweep."""

    reaped: int
    left: tuple[tuple[uuid.UUID, uuid.UUID], ...] = ()


# The write fence of an operation that is one statement (its own transaction):
# the community's row, share-locked before the statement's write (its write is
# gated on `(SELECT ... FROM fence)`, a one-time filter the executor evaluates
# before it reads a row), so that a change of the community's state waits for
# the statement, as it waits for a transaction that checked `_writable`.
# `state` is the row's newest version (a locking read waits for a concurrent
# change and reads what it committed); NULL: no such community. `steady`: that
# version is the one the statement's snapshot sees. A claim (which writes what
# its snapshot chose, or finds nothing there) is taken again when the community
# changed after its snapshot: the snapshot may predate the change, and the rows
# the change let in (a delivery committed once the community was active again).
FENCE_CTE = """fence AS MATERIALIZED (
            SELECT state, xmin = (SELECT xmin FROM communities WHERE id = %(community_id)s) AS steady
            FROM communities WHERE id = %(community_id)s
            FOR SHARE
        )"""
# The same fence for a statement whose answer rests only on the row it writes or
# not (a renew, a finish): a row its snapshot shows unchanged is rechecked at its
# newest version before it is written, so the snapshot's age does not matter.
WRITE_FENCE_CTE = """fence AS MATERIALIZED (
            SELECT state, true AS steady FROM communities WHERE id = %(community_id)s
            FOR SHARE
        )"""
# The fence of a statement that only reads (a finish's reconciliation): the
# community's state in the statement's own snapshot, with the rows it reads. One
# snapshot is one instant, so a read needs no lock to answer as of it.
READ_FENCE_CTE = """fence AS MATERIALIZED (
            SELECT state, true AS steady FROM communities WHERE id = %(community_id)s
        )"""
FENCED = "fence.state AS community_state, fence.steady"  # a fenced statement's first columns
FENCED_FROM = "(SELECT) AS one LEFT JOIN fence ON true"  # one row, whether or not the community exists
STEADY_TRIES = 5  # how often a fenced statement is taken again while its community keeps changing


class PostgresDeliveryStore(FencedWriter):
    """The delivery machine on PostgreSQL. One connection; not thread-safe."""

    def __init__(self, conn: psycopg.Connection[dict[str, Any]]) -> None:
        super().__init__(conn)
        self._decoded_rows: dict[tuple[Any, ...], m.Delivery] = {}

    # -- named statements ---------------------------------------------------

    SQL_LOCK_IDENTITY = """
        SELECT pg_advisory_xact_lock(hashtextextended(
            jsonb_build_array(%(community_id)s::text, %(run_id)s::text, %(step_id)s::text)::text, 0))
    """

    SQL_IDENTITY_EXISTS = """
        SELECT EXISTS (
            SELECT 1 FROM workflow_agent_deliveries
            WHERE community_id = %(community_id)s AND run_id = %(run_id)s AND step_id = %(step_id)s
        ) AS existed
    """

    SQL_RUN_WORKFLOW = """
        SELECT workflow_id FROM workflow_runs
        WHERE community_id = %(community_id)s AND id = %(run_id)s FOR KEY SHARE
    """

    SQL_KNOWN_EVENTS = """
        SELECT id FROM events WHERE community_id = %(community_id)s AND id = ANY(%(event_ids)s) FOR KEY SHARE
    """

    SQL_RETIRED_IDS = """
        SELECT id FROM retired_delivery_ids WHERE community_id = %(community_id)s AND id = ANY(%(ids)s)
    """

    SQL_IDENTITY_TAKEN = """
        SELECT 1 FROM workflow_agent_deliveries
        WHERE community_id = %(community_id)s AND run_id = %(run_id)s
          AND step_id = %(step_id)s AND target_pubkey = %(target_pubkey)s
    """

    SQL_INSERT_DELIVERY = """
        INSERT INTO workflow_agent_deliveries (
            community_id, id, workflow_id, run_id, step_id, target_pubkey,
            definition_event_id, message_event_id, cause_kind, cause_event_id,
            cause_scheduled_for, cause_invocation_id, created_at)
        VALUES (
            %(community_id)s, %(id)s, %(workflow_id)s, %(run_id)s, %(step_id)s, %(target_pubkey)s,
            %(definition_event_id)s, %(message_event_id)s, %(cause_kind)s, %(cause_event_id)s,
            %(cause_scheduled_for)s, %(cause_invocation_id)s, lp_now())
        ON CONFLICT ON CONSTRAINT delivery_identity DO NOTHING
        RETURNING id
    """

    # The oldest pending candidate of this (community, target) that matches
    # the requested id and every field of the expected binding, skipping
    # rows another claimer holds locked; claimed only while the community is
    # writable and did not change since the statement's snapshot (FENCE).
    SQL_CLAIM = f"""
        WITH {FENCE_CTE}, candidate AS (
            SELECT community_id, id FROM workflow_agent_deliveries
            WHERE (SELECT state = 'active' AND steady FROM fence)
              AND community_id = %(community_id)s
              AND target_pubkey = %(target_pubkey)s
              AND status = 'pending'
              AND (%(delivery_id)s::uuid IS NULL OR id = %(delivery_id)s::uuid)
              AND (NOT %(match)s OR (
                    workflow_id = %(workflow_id)s::uuid
                AND run_id = %(run_id)s::uuid
                AND step_id = %(step_id)s::text
                AND definition_event_id = %(definition_event_id)s::bytea
                AND message_event_id = %(message_event_id)s::bytea
                AND cause_kind = %(cause_kind)s::delivery_cause_kind
                AND cause_event_id IS NOT DISTINCT FROM %(cause_event_id)s::bytea
                AND cause_scheduled_for IS NOT DISTINCT FROM %(cause_scheduled_for)s::timestamptz
                AND cause_invocation_id IS NOT DISTINCT FROM %(cause_invocation_id)s::uuid))
            ORDER BY created_at, id
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE workflow_agent_deliveries d
            SET status = 'claimed',
                lease_generation = d.lease_generation + 1,
                lease_until = lp_now() + make_interval(secs => %(lease_seconds)s),
                claimed_at = lp_now(),
                claim_key = %(request_key)s::text
            FROM candidate
            WHERE d.community_id = candidate.community_id AND d.id = candidate.id
            RETURNING {", ".join("d." + c.strip() for c in _DELIVERY_COLUMNS.split(","))}
        )
        SELECT {FENCED}, claimed.* FROM {FENCED_FROM} LEFT JOIN claimed ON true
    """

    # A claim with a request key: claims under one key take turns (the second
    # waits for the first to commit, then finds its lease), and the lease a
    # key holds is returned again while it is unexpired.
    SQL_LOCK_CLAIM_KEY = """
        SELECT pg_advisory_xact_lock(hashtextextended(
            jsonb_build_array('claim', %(community_id)s::text, encode(%(target_pubkey)s, 'hex'), %(request_key)s::text)::text,
            0))
    """
    SQL_CLAIM_RETRIED = f"""
        SELECT {_DELIVERY_COLUMNS} FROM workflow_agent_deliveries
        WHERE community_id = %(community_id)s AND target_pubkey = %(target_pubkey)s
          AND claim_key = %(request_key)s::text
          AND status = 'claimed' AND lease_until >= lp_now()
    """

    # A lease governs its row only while the row is claimed, at the lease's
    # generation, for the lease's target, and unexpired on the DB clock.
    LEASE_HELD = """
        community_id = %(community_id)s AND id = %(delivery_id)s
        AND target_pubkey = %(target_pubkey)s
        AND lease_generation = %(lease_generation)s
        AND status = 'claimed'
        AND lease_until >= lp_now()
    """

    SQL_RENEW = f"""
        WITH {WRITE_FENCE_CTE}, renewed AS (
            UPDATE workflow_agent_deliveries
            SET lease_until = lp_now() + make_interval(secs => %(lease_seconds)s)
            WHERE (SELECT state = 'active' FROM fence)
              AND {LEASE_HELD}
            RETURNING lease_until
        )
        SELECT {FENCED}, renewed.lease_until FROM {FENCED_FROM} LEFT JOIN renewed ON true
    """

    SQL_FINISH = f"""
        WITH {WRITE_FENCE_CTE}, settled AS (
            UPDATE workflow_agent_deliveries
            SET status = %(outcome)s::delivery_status, finished_at = lp_now(),
                lease_until = NULL, claimed_at = NULL, claim_key = NULL
            WHERE (SELECT state = 'active' FROM fence)
              AND {LEASE_HELD}
            RETURNING status
        )
        SELECT {FENCED}, settled.status FROM {FENCED_FROM} LEFT JOIN settled ON true
    """

    # Reconciliation of an uncertain completion, fenced like the lease: only
    # the same holder (generation and target) is told the recorded terminal.
    # Its own statement after a finish that settled nothing, so that a terminal
    # committed by a concurrent retry of the same holder is visible; it reads the
    # community's state from its own snapshot (READ_FENCE_CTE).
    SQL_FINISH_RECONCILE = f"""
        WITH {READ_FENCE_CTE}, recorded AS (
            SELECT status FROM workflow_agent_deliveries
            WHERE community_id = %(community_id)s AND id = %(delivery_id)s
              AND target_pubkey = %(target_pubkey)s
              AND lease_generation = %(lease_generation)s
              AND status IN ('finished', 'failed')
        )
        SELECT {FENCED}, recorded.status FROM {FENCED_FROM} LEFT JOIN recorded ON true
    """

    # Fleet-wide, but only communities that still allow writes; their rows
    # are share-locked so a concurrent fence waits for the sweep rather than
    # aborting it half way. An expired row another transaction holds locked
    # (a client stalled between its UPDATE and its COMMIT) is skipped, left
    # for the next sweep: one stalled client must not stop the reaping of
    # every other row and tenant.
    SQL_REAP = """
        WITH expired AS (
            SELECT DISTINCT community_id FROM workflow_agent_deliveries
            WHERE status = 'claimed' AND lease_until < lp_now()
        ), writable AS (
            SELECT c.id FROM communities c JOIN expired e ON e.community_id = c.id
            WHERE c.state = 'active'
            FOR SHARE OF c
        ), due AS (
            SELECT d.community_id, d.id FROM workflow_agent_deliveries d JOIN writable w ON w.id = d.community_id
            WHERE d.status = 'claimed' AND d.lease_until < lp_now()
            FOR UPDATE OF d SKIP LOCKED
        ), reaped AS (
            UPDATE workflow_agent_deliveries d
            SET status = 'pending', lease_generation = d.lease_generation + 1,
                lease_until = NULL, claimed_at = NULL, claim_key = NULL
            FROM due
            WHERE d.community_id = due.community_id AND d.id = due.id
            RETURNING 1
        )
        SELECT count(*) AS reaped FROM reaped
    """

    # Sweeps take turns. A sweep whose statement waited (on a community row a
    # fence holds) after its snapshot may then lock an expired row of its
    # snapshot that an overlapping sweep has since returned to pending: the
    # lock is taken on the newest version, the re-check fails, the row is
    # left, and yet stays locked until this sweep commits, so a claimer
    # (which skips locked rows) passes over the oldest pending row. SKIP
    # LOCKED does not prevent it (the row is no longer locked when met);
    # taking turns does (schedules.py, a_second_sweep_then_a_claim).
    SQL_ONE_SWEEP_AT_A_TIME = "SELECT pg_advisory_xact_lock(hashtextextended('leaseproof reaper', 0))"

    # What a sweep left, read after it in its transaction (so its own reaps are
    # gone and the clock is the same): expired leases of writable communities
    # that another transaction holds locked. Outside the model (its Reap
    # reports a count), so the conformance checks never run it.
    SQL_SWEEP_LEFT = """
        SELECT d.community_id, d.id FROM workflow_agent_deliveries d
        JOIN communities c ON c.id = d.community_id
        WHERE d.status = 'claimed' AND d.lease_until < lp_now() AND c.state = 'active'
        ORDER BY d.community_id, d.id
    """

    SQL_GET_DELIVERY = f"""
        SELECT {_DELIVERY_COLUMNS} FROM workflow_agent_deliveries
        WHERE community_id = %(community_id)s AND id = %(delivery_id)s
    """

    SQL_CREATE_COMMUNITY = "INSERT INTO communities (id) VALUES (%(community_id)s) ON CONFLICT DO NOTHING RETURNING id"
    SQL_COMMUNITY_FOR_UPDATE = "SELECT state FROM communities WHERE id = %(community_id)s FOR UPDATE"
    SQL_SET_COMMUNITY_STATE = "UPDATE communities SET state = %(state)s::community_state WHERE id = %(community_id)s"
    # FK-safe purge order; the write fence admits deletes of a deleted community.
    SQL_PURGE_COMMUNITY = (
        "DELETE FROM workflow_agent_deliveries WHERE community_id = %(community_id)s",
        "DELETE FROM workflow_runs WHERE community_id = %(community_id)s",
        "DELETE FROM workflows WHERE community_id = %(community_id)s",
        "DELETE FROM events WHERE community_id = %(community_id)s",
        "DELETE FROM retired_delivery_ids WHERE community_id = %(community_id)s",
    )
    SQL_CREATE_WORKFLOW = """
        INSERT INTO workflows (community_id, id) VALUES (%(community_id)s, %(workflow_id)s)
        ON CONFLICT DO NOTHING RETURNING id
    """
    SQL_DELETE_WORKFLOW = """
        DELETE FROM workflows WHERE community_id = %(community_id)s AND id = %(workflow_id)s RETURNING id
    """
    SQL_WORKFLOW_EXISTS = """
        SELECT 1 FROM workflows WHERE community_id = %(community_id)s AND id = %(workflow_id)s FOR KEY SHARE
    """
    SQL_CREATE_RUN = """
        INSERT INTO workflow_runs (community_id, workflow_id, id)
        VALUES (%(community_id)s, %(workflow_id)s, %(run_id)s)
        ON CONFLICT DO NOTHING RETURNING id
    """
    # Deletions of one community take turns. Their cascades overlap (a workflow's
    # runs' deliveries, a message's deliveries) and lock the same rows in
    # different orders, so two at once could deadlock, and the server would
    # roll one back; `leaseproof stress`, racing deletions, found it.
    SQL_LOCK_DELETIONS = """
        SELECT pg_advisory_xact_lock(hashtextextended(
            jsonb_build_array('deletions', %(community_id)s::text)::text, 0))
    """
    SQL_DELETE_RUN = "DELETE FROM workflow_runs WHERE community_id = %(community_id)s AND id = %(run_id)s RETURNING id"
    SQL_PUBLISH_EVENT = """
        INSERT INTO events (community_id, id) VALUES (%(community_id)s, %(event_id)s)
        ON CONFLICT DO NOTHING RETURNING id
    """
    SQL_DELETE_EVENT = "DELETE FROM events WHERE community_id = %(community_id)s AND id = %(event_id)s RETURNING id"

    # -- dispatch -------------------------------------------------------------

    def execute(self, command: m.Command) -> m.Outcome:
        """Run one model command; a refusal is raised as `Refused`."""
        handler = getattr(self, _METHOD_FOR[type(command)])
        with self.typed_errors(type(command).__name__, _community_of(command)):
            outcome: m.Outcome = handler(command)
        return outcome

    def sweep(self) -> Sweep:
        """The reaper's sweep as a service runs it: the model's Reap, and a report of
        the expired leases it left, each held locked by another transaction (a
        holder between its write and its COMMIT) or in a community that became
        writable during the sweep; the next sweep takes them."""
        with self.typed_errors("Sweep", None), self._transaction():
            self.conn.execute(self.SQL_ONE_SWEEP_AT_A_TIME)
            row = self._one(self.SQL_REAP, {})
            left = self.conn.execute(self.SQL_SWEEP_LEFT).fetchall()
        return Sweep(row["reaped"], tuple((r["community_id"], r["id"]) for r in left))  # type: ignore[index]  # the statement always returns one row

    # -- communities, workflows, runs, events ----------------------------------

    def create_community(self, c: m.CreateCommunity) -> m.Ok:
        with self._transaction():
            if self._one(self.SQL_CREATE_COMMUNITY, {"community_id": c.community_id}) is None:
                raise Refused(m.AlreadyExists("community", c.community_id, c.community_id))
        return m.Ok()

    def set_community_state(self, c: m.SetCommunityState) -> m.Ok:
        params = {"community_id": c.community_id, "state": c.state.value}
        with self._transaction():
            row = self._one(self.SQL_COMMUNITY_FOR_UPDATE, params)
            if row is None:
                raise Refused(m.UnknownCommunity(c.community_id))
            if row["state"] == m.CommunityState.DELETED.value:
                raise Refused(m.CommunityNotWritable(c.community_id, m.CommunityState.DELETED))
            self.conn.execute(self.SQL_SET_COMMUNITY_STATE, params)
        return m.Ok()

    def delete_community(self, c: m.DeleteCommunity) -> m.Ok:
        params = {"community_id": c.community_id, "state": m.CommunityState.DELETED.value}
        with self._transaction():
            if self._one(self.SQL_COMMUNITY_FOR_UPDATE, params) is None:
                raise Refused(m.UnknownCommunity(c.community_id))
            self.conn.execute(self.SQL_SET_COMMUNITY_STATE, params)
            for sql in self.SQL_PURGE_COMMUNITY:
                self.conn.execute(sql, params)
        return m.Ok()

    def create_workflow(self, c: m.CreateWorkflow) -> m.Ok:
        params = {"community_id": c.community_id, "workflow_id": c.workflow_id}
        with self._transaction():
            self._writable(c.community_id)
            if self._one(self.SQL_CREATE_WORKFLOW, params) is None:
                raise Refused(m.AlreadyExists("workflow", c.community_id, c.workflow_id))
        return m.Ok()

    def delete_workflow(self, c: m.DeleteWorkflow) -> m.Ok:
        params = {"community_id": c.community_id, "workflow_id": c.workflow_id}
        with self._transaction():
            self._writable(c.community_id)
            self.conn.execute(self.SQL_LOCK_DELETIONS, params)
            if self._one(self.SQL_DELETE_WORKFLOW, params) is None:
                raise Refused(m.NotFound("workflow", c.community_id, c.workflow_id))
        return m.Ok()

    def create_run(self, c: m.CreateRun) -> m.Ok:
        params = {"community_id": c.community_id, "workflow_id": c.workflow_id, "run_id": c.run_id}
        with self._transaction():
            self._writable(c.community_id)
            if self._one(self.SQL_WORKFLOW_EXISTS, params) is None:
                raise Refused(m.NotFound("workflow", c.community_id, c.workflow_id))
            if self._one(self.SQL_CREATE_RUN, params) is None:
                raise Refused(m.AlreadyExists("run", c.community_id, c.run_id))
        return m.Ok()

    def delete_run(self, c: m.DeleteRun) -> m.Ok:
        params = {"community_id": c.community_id, "run_id": c.run_id}
        with self._transaction():
            self._writable(c.community_id)
            self.conn.execute(self.SQL_LOCK_DELETIONS, params)
            if self._one(self.SQL_DELETE_RUN, params) is None:
                raise Refused(m.NotFound("run", c.community_id, c.run_id))
        return m.Ok()

    def publish_event(self, c: m.PublishEvent) -> m.Ok:
        params = {"community_id": c.community_id, "event_id": c.event_id}
        with self._transaction():
            self._writable(c.community_id)
            if self._one(self.SQL_PUBLISH_EVENT, params) is None:
                raise Refused(m.AlreadyExists("event", c.community_id, c.event_id))
        return m.Ok()

    def delete_event(self, c: m.DeleteEvent) -> m.Ok:
        params = {"community_id": c.community_id, "event_id": c.event_id}
        with self._transaction():
            self._writable(c.community_id)
            self.conn.execute(self.SQL_LOCK_DELETIONS, params)
            if self._one(self.SQL_DELETE_EVENT, params) is None:
                raise Refused(m.NotFound("event", c.community_id, c.event_id))
        return m.Ok()

    # -- deliveries -----------------------------------------------------------

    def commit_deliveries(self, c: m.CommitDeliveries) -> m.Committed:
        params = {"community_id": c.community_id, "run_id": c.run_id, "step_id": c.step_id}
        with self._transaction():
            self._writable(c.community_id)
            self.conn.execute(self.SQL_LOCK_IDENTITY, params)
            existed = self._one(self.SQL_IDENTITY_EXISTS, params)["existed"]  # type: ignore[index]  # the statement always returns one row
            run = self._one(self.SQL_RUN_WORKFLOW, params)
            if run is None:
                raise Refused(m.NotFound("run", c.community_id, c.run_id))
            for new in c.deliveries:
                if new.binding.workflow_id != run["workflow_id"]:
                    raise Refused(m.WorkflowMismatch(c.run_id, run["workflow_id"], new.binding.workflow_id))
            wanted = [new.binding.message_event_id for new in c.deliveries]
            rows = self.conn.execute(self.SQL_KNOWN_EVENTS, {**params, "event_ids": wanted}).fetchall()
            known = {bytes(r["id"]) for r in rows}
            for event_id in wanted:
                if event_id not in known:
                    raise Refused(m.NotFound("event", c.community_id, event_id))
            ids = [new.id for new in c.deliveries]
            retired = {r["id"] for r in self.conn.execute(self.SQL_RETIRED_IDS, {**params, "ids": ids})}
            created = [self._insert(new, retired) for new in c.deliveries]
        return m.Committed(tuple(i for i in created if i is not None), existed)

    def _insert(self, new: m.NewDelivery, retired: set[uuid.UUID]) -> uuid.UUID | None:
        columns = binding_columns(new.binding)
        if new.id in retired:
            if self._one(self.SQL_IDENTITY_TAKEN, columns) is not None:
                return None  # a producer retry of a live identity: a no-op, as ever
            # The enclosing transaction rolls back every target of the step inserted before.
            raise RefusedAfterWriting(m.DeliveryIdTaken(new.binding.community_id, new.id))
        try:
            row = self._one(self.SQL_INSERT_DELIVERY, {"id": new.id, **columns})
        except pg_errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "workflow_agent_deliveries_pkey":
                raise
            # The enclosing transaction (aborted by the error) rolls back every target of the step.
            raise RefusedAfterWriting(m.DeliveryIdTaken(new.binding.community_id, new.id)) from exc
        return None if row is None else row["id"]

    def claim(self, c: m.Claim) -> m.Claimed | m.ClaimMiss:
        expected = c.expected
        if expected is not None and (
            expected.community_id != c.community_id or expected.target_pubkey != c.target_pubkey
        ):
            return m.ClaimMiss()  # a foreign wake: refused before any lookup
        params: dict[str, Any] = {
            "community_id": c.community_id,
            "target_pubkey": c.target_pubkey,
            "delivery_id": c.delivery_id,
            "lease_seconds": c.lease_seconds,
            "match": expected is not None,
            "request_key": c.request_key,
            **_expected_columns(expected),
        }
        if c.request_key is None:
            row: dict[str, Any] | None = self._fenced(self.SQL_CLAIM, params, c.community_id)
        else:
            # Claims under one key take turns, and a retry finds the lease its key holds.
            with self._transaction():
                self._writable(c.community_id)
                self.conn.execute(self.SQL_LOCK_CLAIM_KEY, params)
                row = self._one(self.SQL_CLAIM_RETRIED, params)
                if row is None:
                    row = self._fenced(self.SQL_CLAIM, params, c.community_id)
        if row is None or row["id"] is None:
            return m.ClaimMiss()
        delivery = delivery_from_row(row)
        return m.Claimed(m.lease_of(delivery), delivery)

    def renew(self, c: m.Renew) -> m.Renewed | m.LeaseLost:
        params = {**_lease_params(c.lease), "lease_seconds": c.lease_seconds}
        row = self._fenced(self.SQL_RENEW, params, c.lease.community_id)
        return m.LeaseLost() if row["lease_until"] is None else m.Renewed(row["lease_until"])

    def finish(self, c: m.Finish) -> m.Settled | m.AlreadyTerminal | m.LeaseLost:
        params = {**_lease_params(c.lease), "outcome": c.outcome.value}
        row = self._fenced(self.SQL_FINISH, params, c.lease.community_id)
        if row["status"] is not None:
            return m.Settled(m.Status(row["status"]))
        # A fresh statement, so a terminal committed by a concurrent
        # retry of the same holder is visible (READ COMMITTED).
        row = self._fenced(self.SQL_FINISH_RECONCILE, params, c.lease.community_id)
        return m.LeaseLost() if row["status"] is None else m.AlreadyTerminal(m.Status(row["status"]))

    def reap(self, c: m.Reap | None = None) -> m.Reaped:
        with self._transaction():
            self.conn.execute(self.SQL_ONE_SWEEP_AT_A_TIME)
            row = self._one(self.SQL_REAP, {})
        return m.Reaped(row["reaped"])  # type: ignore[index]  # the statement always returns one row

    def get_delivery(self, c: m.GetDelivery) -> m.Found:
        row = self._one(self.SQL_GET_DELIVERY, {"community_id": c.community_id, "delivery_id": c.delivery_id})
        if row is None:
            raise Refused(m.NotFound("delivery", c.community_id, c.delivery_id))
        return m.Found(delivery_from_row(row))

    # -- whole-state read -------------------------------------------------------

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
