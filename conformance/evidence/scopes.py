"""The scope check: who may call what, on the bundled implementation's database API.

The model has no roles, so no lockstep program can see a bug in the code that
decides which communities a session acts for (`lp_may_act`, `lp_is_fleet`, the
operations' scope conditions). This check can. On a migrated database it makes
three roles for the time of the check (cluster-wide, named after the process,
dropped at the end): a fleet role, a tenant of community A and a role with no
scope, each with EXECUTE on the functions and nothing else. It acts as each
through the stores (`SET SESSION AUTHORIZATION`: the functions judge
`session_user`, so it needs a superuser) and judges that each may do exactly
what its scope allows (docs/search-power.md lists what is judged). `judge`
returns None when all of that holds, else the first thing that did not.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psycopg
from psycopg import sql

from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.adapter import reset_database
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.errors import Forbidden
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.impl.hooks.functions import install, patches_of
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc
from leaseproof.model.binding import Binding, EventCause
from leaseproof.model.errors import Refused

A, B, C = uuid.UUID(int=0xA), uuid.UUID(int=0xB), uuid.UUID(int=0xC)
WORKFLOW, RUN = uuid.UUID(int=0x100), uuid.UUID(int=0x200)
TARGET, MESSAGE, DEFINITION, CAUSE = b"\x01" * 32, b"\x03" * 32, b"\x04" * 32, b"\x05" * 32
CHANNEL, AUTHOR = uuid.UUID(int=0x300), b"\x06" * 32
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

# The store classes the check drives, by the class each must be (a variant subclasses it).
ROLES: Mapping[str, type[Any]] = {
    "store_class": PostgresDeliveryStore,
    "engine_class": ReplicaEngine,
    "resumer_class": RunResumer,
    "lifecycle_class": LifecycleStore,
}


def _by_role(classes: Mapping[str, type[Any]] | None) -> dict[str, type[Any]]:
    """Each role's class among `classes` (an adapter's keyword arguments, of either machine),
    the bundled one where none is a subclass of it."""
    given = list((classes or {}).values())
    return {role: next((c for c in given if issubclass(c, base)), base) for role, base in ROLES.items()}


class ScopeBroken(Exception):
    """What the check saw that a correct scope does not do."""


class _Roles:
    """The three roles of one check: `fleet`, `tenant` (of A) and `nobody` (no scope)."""

    def __init__(self, prefix: str) -> None:
        self.fleet, self.tenant, self.nobody = (f"{prefix}_{name}" for name in ("fleet", "tenant", "nobody"))

    def all(self) -> tuple[str, str, str]:
        return (self.fleet, self.tenant, self.nobody)


@contextlib.contextmanager
def _roles(conn: psycopg.Connection[Any]) -> Iterator[_Roles]:
    """The check's roles, named after its database (`role_prefix`): a run killed before its
    `finally` leaves roles whose names say which database, and so which run, made them."""
    roles = _Roles(role_prefix(conn.info.dbname))
    try:
        for name in roles.all():
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {}").format(sql.Identifier(name)))
        conn.execute(
            "INSERT INTO lp_role_scope (role_name, community_id) VALUES (%s, NULL), (%s, %s)",
            (roles.fleet, roles.tenant, A),
        )
        yield roles
    finally:
        conn.execute("RESET SESSION AUTHORIZATION")
        conn.execute("DELETE FROM lp_role_scope WHERE role_name = ANY(%s)", (list(roles.all()),))
        made = conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (list(roles.all()),)).fetchall()
        for name in (row["rolname"] for row in made):
            conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))  # its grants
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def role_prefix(database: str) -> str:
    """The names of the roles a check on `database` makes start with this."""
    prefix = f"lp_scope_{database}"
    if len(prefix.encode()) > 63 - len("_nobody"):
        raise ValueError(f"database name {database!r} too long to name the scope check's roles after it")
    return prefix


def drop_roles(dsn: str, database_prefix: str) -> None:
    """Drop every role a scope check on a database whose name starts with `database_prefix`
    made and left (a worker killed mid-check); run after those databases are dropped."""
    pattern = role_prefix(database_prefix).replace("_", "\\_") + "\\_%"
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for (name,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (pattern,)).fetchall():
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def _become(conn: psycopg.Connection[Any], role: str | None) -> None:
    if role is None:
        conn.execute("RESET SESSION AUTHORIZATION")
    else:
        conn.execute(sql.SQL("SET SESSION AUTHORIZATION {}").format(sql.Identifier(role)))


def _event(community: uuid.UUID, at: dt.datetime, *actions: str) -> lc.SaveDefinition:
    event_id = bytes([community.int]) * 31 + bytes([int(at.timestamp()) % 256])
    return lc.SaveDefinition(
        lc.DefinitionEvent(event_id, community, WORKFLOW, AUTHOR, CHANNEL, at, lc.Definition(actions))
    )


def _answered(what: str, call: Callable[[], Any], wanted: object) -> None:
    """`call()` answers `wanted`; a refusal of the role (Forbidden) is what the check saw too."""
    try:
        got = call()
    except Forbidden as forbidden:
        raise ScopeBroken(f"{what}: Forbidden ({forbidden})") from forbidden
    _expect(what, got, wanted)


def _expect(what: str, got: object, wanted: object) -> None:
    if got != wanted:
        raise ScopeBroken(f"{what}: {got!r}, not {wanted!r}")


class Probe:
    """Both machines' operations through the stores on one connection, as whoever its
    session is (`classes`: an adapter's keyword arguments; the bundled ones if None)."""

    def __init__(self, conn: psycopg.Connection[Any], classes: Mapping[str, type[Any]] | None = None) -> None:
        classes = _by_role(classes)
        self.conn = conn
        self.delivery: PostgresDeliveryStore = classes["store_class"](conn)
        self.lifecycle: LifecycleStore = classes["lifecycle_class"](conn)
        self.classes = classes

    def run_both_machines(self, community: uuid.UUID, who: str) -> dict[str, Any]:
        """Both machines' whole life on `community`, every answer the model's."""
        store = self.delivery
        for command in (
            m.CreateWorkflow(community, WORKFLOW),
            m.CreateRun(community, WORKFLOW, RUN),
            m.PublishEvent(community, MESSAGE),
        ):
            _expect(f"{who}: {command}", store.execute(command), m.Ok())
        done: dict[str, Any] = {}
        for step in ("s1", "s2"):
            delivery = uuid.uuid5(community, step)
            binding = Binding(community, WORKFLOW, RUN, step, TARGET, DEFINITION, MESSAGE, EventCause(CAUSE))
            commit = m.CommitDeliveries(community, RUN, step, [m.NewDelivery(delivery, binding)])
            _expect(f"{who}: CommitDeliveries", store.execute(commit), m.Committed((delivery,), False))
            claimed = store.execute(m.Claim(community, TARGET, 30, delivery_id=delivery))
            if not isinstance(claimed, m.Claimed):
                raise ScopeBroken(f"{who}: a claim of its own pending delivery: {claimed!r}")
            done[step] = claimed.lease
        lease = done["s1"]
        if not isinstance(store.execute(m.Renew(lease, 120)), m.Renewed):
            raise ScopeBroken(f"{who}: a renew of its own live lease was not Renewed")
        _expect(f"{who}: Finish", store.execute(m.Finish(lease, m.Status.FINISHED)), m.Settled(m.Status.FINISHED))
        found = store.execute(m.GetDelivery(community, lease.delivery_id))
        if not isinstance(found, m.Found) or found.delivery.status is not m.Status.FINISHED:
            raise ScopeBroken(f"{who}: GetDelivery of its own finished delivery: {found!r}")
        self.lifecycle.set_authority(lc.SetAuthority(community, CHANNEL, AUTHOR, True))
        saved = self.lifecycle.save(_event(community, T0, "a", "b"))
        if not isinstance(saved, lc.Created):
            raise ScopeBroken(f"{who}: a save of its own first definition: {saved!r}")
        engine = self.classes["engine_class"](self.conn, "r1")
        engine.refresh()
        admitted = engine.fire(lc.Fire("r1", "manual", community, WORKFLOW))
        if not isinstance(admitted, lc.Admitted):
            raise ScopeBroken(f"{who}: a fire of its own live definition: {admitted!r}")
        resumed = self.classes["resumer_class"](self.conn).resume(lc.ResumeRun(admitted.run_id))
        _expect(f"{who}: ResumeRun", resumed, lc.Resumed(("a", "b")))
        return {"lease": done["s2"], "run": admitted.run_id}

    def cached(self) -> set[tuple[uuid.UUID, uuid.UUID]]:
        engine = self.classes["engine_class"](self.conn, "r2")
        with engine.typed_errors("refresh"):
            engine.refresh()
        return set(engine.cache.records)

    def commands_for(self, community: uuid.UUID, lease: m.Lease) -> dict[str, Callable[[], Any]]:
        """Every operation of both machines on `community` (the lease one of its)."""
        binding = Binding(community, WORKFLOW, RUN, "s9", TARGET, DEFINITION, MESSAGE, EventCause(CAUSE))
        store, writer = self.delivery, self.lifecycle
        later = T0 + dt.timedelta(hours=1)

        def delivery(command: Any) -> Callable[[], Any]:
            return lambda: store.execute(command)

        def lifecycle(call: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                with writer.typed_errors("call"):
                    return call()

            return run

        engine = self.classes["engine_class"](self.conn, "r9")
        revoke = lc.SetAuthority(community, CHANNEL, AUTHOR, False)
        deletion = lc.DeleteDefinition(community, WORKFLOW, AUTHOR, later)
        return {
            "CreateWorkflow": delivery(m.CreateWorkflow(community, uuid.UUID(int=0x101))),
            "DeleteWorkflow": delivery(m.DeleteWorkflow(community, WORKFLOW)),
            "CreateRun": delivery(m.CreateRun(community, WORKFLOW, uuid.UUID(int=0x201))),
            "DeleteRun": delivery(m.DeleteRun(community, RUN)),
            "PublishEvent": delivery(m.PublishEvent(community, b"\x09" * 32)),
            "DeleteEvent": delivery(m.DeleteEvent(community, MESSAGE)),
            "CommitDeliveries": delivery(
                m.CommitDeliveries(community, RUN, "s9", [m.NewDelivery(uuid.UUID(int=0x999), binding)])
            ),
            "Claim": delivery(m.Claim(community, TARGET, 60)),
            "Renew": delivery(m.Renew(lease, 3600)),
            "Finish": delivery(m.Finish(lease, m.Status.FAILED)),
            "GetDelivery": delivery(m.GetDelivery(community, lease.delivery_id)),
            "SetAuthority": lifecycle(lambda: writer.set_authority(revoke)),
            "SaveDefinition": lifecycle(lambda: writer.save(_event(community, later, "x"))),
            "DeleteDefinition": lifecycle(lambda: writer.delete(deletion)),
            "Fire": lifecycle(lambda: engine.fire(lc.Fire("r9", "manual", community, WORKFLOW))),
        }

    def community_life(self, community: uuid.UUID) -> dict[str, Callable[[], Any]]:
        """The fleet's operations on a community's own life."""
        store = self.delivery
        return {
            "CreateCommunity": lambda: store.execute(m.CreateCommunity(community)),
            "SetCommunityState": lambda: store.execute(m.SetCommunityState(community, m.CommunityState.FENCED)),
            "DeleteCommunity": lambda: store.execute(m.DeleteCommunity(community)),
            "Sweep": lambda: store.execute(m.Reap()),
        }

    def forbidden(self, who: str, calls: Mapping[str, Callable[[], Any]]) -> None:
        for name, call in calls.items():
            try:
                answer = call()
            except Forbidden:
                continue
            except Refused as refused:
                raise ScopeBroken(f"{who}: {name} was answered {refused.rejection!r}, not Forbidden") from refused
            raise ScopeBroken(f"{who}: {name} was answered {answer!r}, not Forbidden")

    def resume_is_unknown(self, who: str, run: int) -> None:
        resumer = self.classes["resumer_class"](self.conn)
        try:
            with resumer.typed_errors("ResumeRun"):
                answer = resumer.resume(lc.ResumeRun(run))
        except Refused as refused:
            _expect(f"{who}: a resume of another community's run", refused.rejection, lc.UnknownRun(run))
            return
        except Forbidden as forbidden:
            # It would tell that the run exists: a run of another community is unknown.
            raise ScopeBroken(
                f"{who}: a resume of another community's run was Forbidden, not UnknownRun"
            ) from forbidden
        raise ScopeBroken(f"{who}: a resume of another community's run was answered {answer!r}")

    def refused_outside_read_committed(self, who: str) -> None:
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            answer = self.delivery.claim(m.Claim(A, TARGET, 60))
        except psycopg.errors.DatabaseError as exc:
            if exc.sqlstate != "25001":
                raise ScopeBroken(f"{who}: a claim at repeatable read failed with {exc.sqlstate}, not 25001") from exc
            return
        finally:
            self.conn.execute("ROLLBACK")
        raise ScopeBroken(f"{who}: a claim at repeatable read was answered {answer!r}, not refused (25001)")


def judge(dsn: str, classes: Mapping[str, type[Any]] | None = None) -> str | None:
    """None if the implementation's functions (the shipped ones with the patches `classes`
    list, on the migrated database `dsn`) keep every scope, else what broke."""
    chosen = _by_role(classes)
    with connect(dsn) as conn:
        role = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if role is None or not role["rolsuper"]:
            raise RuntimeError(
                "the scope check acts as roles it makes (SET SESSION AUTHORIZATION): it needs a superuser"
            )
        install(conn, patches_of(*chosen.values()))
        reset_database(conn, T0)
        with _roles(conn) as roles:
            probe = Probe(conn, chosen)
            try:
                _check(conn, probe, roles)
            except ScopeBroken as broken:
                return str(broken)
            except (Forbidden, Refused, psycopg.errors.DatabaseError) as exc:
                return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
            finally:
                _become(conn, None)
    return None


def _check(conn: psycopg.Connection[Any], probe: Probe, roles: _Roles) -> None:
    _become(conn, roles.fleet)
    for community in (A, B):
        _expect(
            f"the fleet: CreateCommunity({community})", probe.delivery.execute(m.CreateCommunity(community)), m.Ok()
        )
    done_b = probe.run_both_machines(B, "the fleet on B")
    _become(conn, roles.tenant)
    probe.run_both_machines(A, "tenant A on A")
    _expect("tenant A: its replica's records", probe.cached(), {(A, WORKFLOW)})
    probe.forbidden("tenant A on B", probe.commands_for(B, done_b["lease"]))
    probe.resume_is_unknown("tenant A", done_b["run"])
    probe.forbidden("tenant A on A's life", probe.community_life(A))
    probe.refused_outside_read_committed("tenant A")
    _become(conn, roles.nobody)
    probe.forbidden("a role with no scope on B", probe.commands_for(B, done_b["lease"]))
    probe.forbidden("a role with no scope on its life", probe.community_life(B))
    cached: set[Any] | str
    try:
        cached = probe.cached()
    except Forbidden:
        cached = set()
    _expect("a role with no scope: its replica's records", cached, set())
    _become(conn, roles.fleet)
    _expect("the fleet: its replica's records", probe.cached(), {(A, WORKFLOW), (B, WORKFLOW)})
    _become(conn, None)
    PinnedClock(conn).advance(dt.timedelta(seconds=60))  # both communities' 30 s leases expired
    _become(conn, roles.fleet)
    _expect("the fleet: Reap", probe.delivery.execute(m.Reap()), m.Reaped(2))
    _expect("the fleet: CreateCommunity(C)", probe.delivery.execute(m.CreateCommunity(C)), m.Ok())
    _expect(
        "the fleet: SetCommunityState(C, fenced)",
        probe.delivery.execute(m.SetCommunityState(C, m.CommunityState.FENCED)),
        m.Ok(),
    )
    _expect("the fleet: DeleteCommunity(C)", probe.delivery.execute(m.DeleteCommunity(C)), m.Ok())
    # The database's owner (a superuser here) acts for the fleet without a row of its own.
    _become(conn, None)
    _answered("the owner: Reap", lambda: probe.delivery.execute(m.Reap()), m.Reaped(0))
    quiesce = m.SetCommunityState(A, m.CommunityState.QUIESCING)
    _answered("the owner: SetCommunityState(A, quiescing)", lambda: probe.delivery.execute(quiesce), m.Ok())


__all__ = ["Probe", "drop_roles", "judge", "role_prefix"]
