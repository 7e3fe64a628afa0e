"""Every generated mutant is a function PostgreSQL accepts, and builds a working adapter.

A mutant the server refuses to create is killed by any test that runs it, so
it would inflate a suite's score without saying anything about the suite.
Each mutated function is created again, as the adapters install it, inside a
transaction that is rolled back: PostgreSQL parses a PL/pgSQL body, each of its
SQL statements included, when the function is created, and analyses a SQL
function's statement against the migrated schema there too.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.impl.migrate import Patch, functions, migrate, patched
from leaseproof.impl.mutants.generated.catalogue import (
    MACHINES,
    by_name,
    functions_of,
    generated_mutants,
)
from leaseproof.model import delivery as m


@pytest.fixture
def server(delivery_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(delivery_dsn, autocommit=True) as conn:
        migrate(conn)
        yield conn


def refusal(conn: psycopg.Connection[tuple[object, ...]], definition: str) -> str | None:
    """Why the server refuses to create the function `definition`, or None if it accepts it."""
    try:
        with conn.transaction():
            conn.execute(definition.encode())
            raise psycopg.Rollback()
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def test_the_method_is_sound(server: psycopg.Connection[tuple[object, ...]]) -> None:
    """Every shipped function the mutants are made of is created again as it is, and a
    broken body is refused (PL/pgSQL's own syntax, an SQL statement inside it, a SQL
    function's column)."""
    names = sorted({name for machine in MACHINES for name in functions_of(machine)})
    assert len(names) > 30
    shipped = functions()
    refused = {name: why for name in names if (why := refusal(server, shipped[name].definition)) is not None}
    assert refused == {}
    enter = shipped["lp_enter"]
    assert refusal(server, enter.replaced(enter.body.replace("END IF;", "END;")).definition) is not None
    assert refusal(server, enter.replaced(enter.body.replace("FROM (SELECT)", "FROM FROM")).definition) is not None
    valid = shipped["lp_valid_actions"]
    assert refusal(server, valid.replaced(valid.body.replace("array_ndims", "no_such_function")).definition)


def test_every_generated_mutant_is_accepted_by_postgresql(server: psycopg.Connection[tuple[object, ...]]) -> None:
    mutants = generated_mutants()
    refused = {
        mutant.name: why
        for mutant in mutants
        if (why := refusal(server, patched([mutant.patch])[mutant.function].definition)) is not None
    }
    assert refused == {}, "\n".join(f"{name}: {why}" for name, why in refused.items())
    per_machine = Counter(mutant.machine for mutant in mutants)
    per_operator = Counter((mutant.machine, mutant.mutation.operator) for mutant in mutants)
    print(f"\ngenerated mutants: {dict(per_machine)}; by operator: {dict(sorted(per_operator.items()))}")
    assert set(per_machine) == {"delivery", "lifecycle"}


def _other_keys(cls: type, base: type) -> set[str]:
    return set(vars(cls)) - {"__module__", "__doc__"} if cls is not base else set()


def _body(dsn: str, name: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", (name,)).fetchone()
    assert row is not None
    return str(row[0])


def test_a_mutant_adapter_differs_in_one_function_and_the_next_adapter_puts_it_back(delivery_dsn: str) -> None:
    mutant = by_name("lp_renew/drop-conjunct/10")
    assert mutant.mutation.before == "AND d.lease_until >= e.t"
    adapter = mutant.adapter(delivery_dsn)
    try:
        assert isinstance(adapter, PostgresDeliveryAdapter)
        store_class = adapter.store_class
        assert store_class.__bases__ == (PostgresDeliveryStore,)
        assert _other_keys(store_class, PostgresDeliveryStore) == {"FUNCTIONS"}
        patches = store_class.FUNCTIONS
        assert patches == (Patch("lp_renew", functions()["lp_renew"].body, mutant.mutation.sql),)
        assert _body(delivery_dsn, "lp_renew") == mutant.mutation.sql
        assert _body(delivery_dsn, "lp_finish") == functions()["lp_finish"].body
        adapter.reset(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
        assert adapter.execute(m.CreateCommunity(uuid.uuid4())) == m.Ok()
    finally:
        adapter.close()
    PostgresDeliveryAdapter(delivery_dsn).close()  # the bundled store, on the same database
    assert _body(delivery_dsn, "lp_renew") == functions()["lp_renew"].body


def test_a_lifecycle_mutant_of_a_shared_function(delivery_dsn: str) -> None:
    """The lifecycle's own mutant of a function the delivery machine runs too: its
    adapter's store class carries it, and community creation (the delivery store's
    call) runs the mutated function."""
    mutant = by_name("lifecycle:lp_create_community/drop-on-conflict/1")
    assert (mutant.machine, mutant.kind) == ("lifecycle", "sequential")
    adapter = mutant.adapter(delivery_dsn)
    try:
        assert isinstance(adapter, PostgresLifecycleAdapter)
        assert _other_keys(adapter.store_class, LifecycleStore) == {"FUNCTIONS"}
        assert (adapter.communities_class, adapter.resumer_class) == (PostgresDeliveryStore, RunResumer)
        assert type(adapter.engines["r1"]) is ReplicaEngine
        adapter.reset(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
        community = uuid.uuid4()
        assert adapter.execute(m.CreateCommunity(community)) == m.Ok()
        # The mutant is live: a duplicate now raises instead of being refused.
        with pytest.raises(psycopg.errors.UniqueViolation):
            adapter.execute(m.CreateCommunity(community))
    finally:
        adapter.close()
    # The delivery machine's own mutant of the same site is another mutant.
    assert by_name("lp_create_community/drop-on-conflict/1").machine == "delivery"
