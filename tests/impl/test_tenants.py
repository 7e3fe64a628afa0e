"""Tenant isolation keyed to the role itself (issue 35, 3): two tenant roles, each bound to its
community by impl/tenants.sql, and two fleet roles (the application role, the reaper).

Each tenant runs both machines on its own community through the bundled stores, as its own
login role; every operation it sends for the other tenant's community is refused
(`Forbidden`, SQLSTATE LP005) and changes nothing; the records its replica caches are its
own; the reaper sweeps both tenants' expired leases, which neither tenant may do; and no
role's session can signal another's. The database is made by the scripts as written
(`production.provision`) and marked a test database, so that the clock is pinned.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from production import Production, fingerprint, provision

from leaseproof.conformance.evidence.scopes import Probe
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.connection import connect
from leaseproof.impl.delivery.adapter import reset_database
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.errors import Forbidden
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc
from leaseproof.model.binding import Binding, EventCause
from leaseproof.model.errors import Refused

A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)
WORKFLOW, RUN = uuid.UUID(int=0x100), uuid.UUID(int=0x200)
TARGET, MESSAGE, DEFINITION, CAUSE = b"\x01" * 32, b"\x03" * 32, b"\x04" * 32, b"\x05" * 32
DELIVERY = {A: uuid.UUID(int=0xDA), B: uuid.UUID(int=0xDB)}
EXPIRING = {A: uuid.UUID(int=0xEA), B: uuid.UUID(int=0xEB)}
CHANNEL, AUTHOR = uuid.UUID(int=0x300), b"\x06" * 32
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
# LP005, from lp_require_scope (or lp_require_fleet, for a community's own life: see test_attacks.py)
OUTSIDE_SCOPE = "does not act for community|not for the fleet"


@pytest.fixture(scope="module")
def production(pg_server: Server) -> Iterator[Production]:
    with provision(pg_server, {A: "ta", B: "tb"}, test_database=True, prefix="lpt") as made:
        yield made


@pytest.fixture
def fresh(production: Production) -> Production:
    with connect(production.superuser) as superuser:
        reset_database(superuser, T0)
    return production


def _event(community: uuid.UUID, at: dt.datetime, *actions: str) -> lc.SaveDefinition:
    return lc.SaveDefinition(
        lc.DefinitionEvent(
            bytes([community.int]) * 32, community, WORKFLOW, AUTHOR, CHANNEL, at, lc.Definition(actions)
        )
    )


def _run_both_machines(production: Production, community: uuid.UUID) -> dict[str, Any]:
    """Everything a tenant does on its own community, through the stores as its own role (the
    community made by the application role: a community's life is the fleet's)."""
    with connect(production.app) as conn:
        assert PostgresDeliveryStore(conn).execute(m.CreateCommunity(community)) == m.Ok()
    with connect(production.tenant(community)) as conn:
        store = PostgresDeliveryStore(conn)
        for command in (
            m.CreateWorkflow(community, WORKFLOW),
            m.CreateRun(community, WORKFLOW, RUN),
            m.PublishEvent(community, MESSAGE),
        ):
            assert store.execute(command) == m.Ok()
        for step, delivery in (("s1", DELIVERY[community]), ("s2", EXPIRING[community])):
            binding = Binding(community, WORKFLOW, RUN, step, TARGET, DEFINITION, MESSAGE, EventCause(CAUSE))
            assert store.execute(m.CommitDeliveries(community, RUN, step, [m.NewDelivery(delivery, binding)])) == (
                m.Committed((delivery,), False)
            )
        claimed = store.execute(m.Claim(community, TARGET, 60, delivery_id=DELIVERY[community]))
        assert isinstance(claimed, m.Claimed)
        assert isinstance(store.execute(m.Renew(claimed.lease, 120)), m.Renewed)
        assert store.execute(m.Finish(claimed.lease, m.Status.FINISHED)) == m.Settled(m.Status.FINISHED)
        expiring = store.execute(m.Claim(community, TARGET, 30, delivery_id=EXPIRING[community]))
        assert isinstance(expiring, m.Claimed)
        found = store.execute(m.GetDelivery(community, DELIVERY[community]))
        assert isinstance(found, m.Found) and found.delivery.status is m.Status.FINISHED

        writer, engine, resumer = LifecycleStore(conn), ReplicaEngine(conn, "r1"), RunResumer(conn)
        writer.set_authority(lc.SetAuthority(community, CHANNEL, AUTHOR, True))
        assert isinstance(writer.save(_event(community, T0, "a", "b")), lc.Created)
        engine.refresh()
        admitted = engine.fire(lc.Fire("r1", "manual", community, WORKFLOW))
        assert isinstance(admitted, lc.Admitted)
        assert resumer.resume(lc.ResumeRun(admitted.run_id)) == lc.Resumed(("a", "b"))
        return {"lease": expiring.lease, "run": admitted.run_id, "cache": engine.cache}


def test_each_tenant_runs_both_machines_on_its_own_community(fresh: Production) -> None:
    done = {community: _run_both_machines(fresh, community) for community in (A, B)}
    # A replica's cache holds the records of the communities its role acts for, and no other.
    assert set(done[A]["cache"].records) == {(A, WORKFLOW)}
    assert set(done[B]["cache"].records) == {(B, WORKFLOW)}
    with connect(fresh.app) as conn:
        engine = ReplicaEngine(conn, "fleet")
        engine.refresh()
        assert set(engine.cache.records) == {(A, WORKFLOW), (B, WORKFLOW)}


def typed(
    make: Callable[[psycopg.Connection[Any]], Any], call: Callable[[Any], Any]
) -> Callable[[psycopg.Connection[Any]], Any]:
    """A lifecycle call as the adapter sends it: the writer's typed errors around it."""

    def run(conn: psycopg.Connection[Any]) -> Any:
        writer = make(conn)
        with writer.typed_errors("call"):
            return call(writer)

    return run


def test_no_tenant_acts_for_the_others_community(fresh: Production) -> None:
    """Tenant A sends every operation for B (and B for A), through the stores: each is
    Forbidden, and the database is unchanged; a resume of the other's run is answered as one of a
    run that does not exist (UnknownRun), so it tells nothing of the other's runs."""
    done = {community: _run_both_machines(fresh, community) for community in (A, B)}
    roles = fresh.names.roles()
    with psycopg.connect(fresh.superuser, autocommit=True) as superuser:
        before = fingerprint(superuser, roles)
        for attacker, victim in ((A, B), (B, A)):
            with connect(fresh.tenant(attacker)) as conn:
                # Every operation of both machines for the victim's community (the scope
                # check's list: conformance/evidence/scopes.py), the sweep apart (below).
                probe = Probe(conn)
                life = {name: call for name, call in probe.community_life(victim).items() if name != "Sweep"}
                commands = {**life, **probe.commands_for(victim, done[victim]["lease"])}
                for name, command in commands.items():
                    with pytest.raises(Forbidden, match=OUTSIDE_SCOPE):
                        command()
                    assert fingerprint(superuser, roles) == before, name
                with pytest.raises(Refused) as unknown:
                    typed(RunResumer, functools.partial(RunResumer.resume, c=lc.ResumeRun(done[victim]["run"])))(conn)
                assert unknown.value.rejection == lc.UnknownRun(done[victim]["run"])
        assert fingerprint(superuser, roles) == before
    assert len(commands) == 18


def test_the_reaper_sweeps_every_tenant_and_no_tenant_sweeps(fresh: Production) -> None:
    for community in (A, B):
        _run_both_machines(fresh, community)
    with connect(fresh.superuser) as superuser:
        PinnedClock(superuser).advance(dt.timedelta(seconds=60))  # both 30 s leases expired
    for dsn in (fresh.tenant(A), fresh.tenant(B), fresh.app):
        with connect(dsn) as conn, pytest.raises(Forbidden):
            PostgresDeliveryStore(conn).sweep()
    with connect(fresh.reaper) as conn:
        swept = PostgresDeliveryStore(conn).sweep()
    assert (swept.reaped, swept.left, swept.skipped) == (2, (), ())
    for community in (A, B):
        with connect(fresh.tenant(community)) as conn:
            found = PostgresDeliveryStore(conn).execute(m.GetDelivery(community, EXPIRING[community]))
        assert isinstance(found, m.Found)
        assert (found.delivery.status, found.delivery.lease_generation) == (m.Status.PENDING, 2)


@pytest.mark.parametrize("signal", ["pg_cancel_backend", "pg_terminate_backend"])
def test_no_role_signals_another_roles_session(production: Production, signal: str) -> None:
    """Login roles share api's privileges, not each other's: none may cancel or end a session of
    another (the reaper's, the application's, a tenant's)."""
    dsns = {
        "app": production.app,
        "reaper": production.reaper,
        "tenant A": production.tenant(A),
        "tenant B": production.tenant(B),
    }
    sessions = {name: psycopg.connect(dsn, autocommit=True) for name, dsn in dsns.items()}
    try:
        for attacker, conn in sessions.items():
            for victim, other in sessions.items():
                if victim == attacker:
                    continue
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(f"SELECT {signal}(%s)", (other.info.backend_pid,))
        for conn in sessions.values():
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        for conn in sessions.values():
            conn.close()
