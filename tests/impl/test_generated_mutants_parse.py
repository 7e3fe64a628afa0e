"""Every generated mutant is a statement PostgreSQL accepts, and builds a working adapter.

A mutant the server refuses to parse is killed by any test that runs it, so
it would inflate a suite's score without saying anything about the suite.
Each statement is checked the way the server reads it: psycopg placeholders
become `$n`, then `PREPARE` (parse and analysis against the migrated schema)
and `EXPLAIN (GENERIC_PLAN)` (planning too: some refusals, such as locking
the nullable side of an outer join, come only from the planner).
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
from leaseproof.impl.mutants.generated.catalogue import (
    MACHINES,
    by_name,
    generated_mutants,
    statements,
)
from leaseproof.impl.mutants.generated.sql import server_text
from leaseproof.model import delivery as m


@pytest.fixture
def server(delivery_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(delivery_dsn, autocommit=True) as conn:
        yield conn


def refusal(conn: psycopg.Connection[tuple[object, ...]], sql: str) -> str | None:
    """Why the server refuses `sql` (parse, analysis or planning), or None if it accepts it."""
    text = server_text(sql)
    try:
        conn.execute(f"PREPARE lp_mutant AS {text}")
        conn.execute("DEALLOCATE lp_mutant")
        conn.execute(f"EXPLAIN (GENERIC_PLAN) {text}")
    except psycopg.Error as exc:
        conn.execute("DEALLOCATE ALL")
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def test_server_text_numbers_each_placeholder_once() -> None:
    sql = "SELECT %(a)s::int, %(b)s::text, %(a)s::int WHERE 7 %% 2 = 1"
    assert server_text(sql) == "SELECT $1::int, $2::text, $1::int WHERE 7 % 2 = 1"
    # As psycopg does it: its placeholders are not SQL-aware, literals included.
    assert server_text("SELECT 'x%%', %s, %s") == "SELECT 'x%', $1, $2"


def test_the_method_is_sound(server: psycopg.Connection[tuple[object, ...]]) -> None:
    """Every original statement prepares and plans, and a broken one does not."""
    originals = [
        (f"{s.owner.__name__}.{s.attribute}", text)
        for machine in MACHINES
        for s in statements(machine)
        for _, text in s.texts()
    ]
    assert len(originals) > 40
    refused = {name: why for name, text in originals if (why := refusal(server, text)) is not None}
    assert refused == {}
    assert refusal(server, "SELECT state FROM communities WHERE id = %(community_id)s FOR SHARE FOR") is not None
    assert refusal(server, "SELECT no_such_column FROM communities") is not None
    # Planner-only refusal: PREPARE alone accepts it.
    locked_outer = (
        "SELECT 1 FROM definition_runtime d LEFT JOIN channel_authority a ON a.community_id = d.community_id FOR SHARE"
    )
    assert "nullable side" in (refusal(server, locked_outer) or "")


def test_every_generated_mutant_is_accepted_by_postgresql(server: psycopg.Connection[tuple[object, ...]]) -> None:
    mutants = generated_mutants()
    refused = {mutant.name: why for mutant in mutants if (why := refusal(server, mutant.mutation.sql)) is not None}
    assert refused == {}, "\n".join(f"{name}: {why}" for name, why in refused.items())
    per_machine = Counter(mutant.machine for mutant in mutants)
    per_operator = Counter((mutant.machine, mutant.mutation.operator) for mutant in mutants)
    print(f"\ngenerated mutants: {dict(per_machine)}; by operator: {dict(sorted(per_operator.items()))}")
    assert set(per_machine) == {"delivery", "lifecycle"}


def _other_keys(cls: type, base: type) -> set[str]:
    return set(vars(cls)) - {"__module__", "__doc__"} if cls is not base else set()


def test_delivery_mutant_adapter_differs_in_its_one_attribute(delivery_dsn: str) -> None:
    mutant = by_name("PostgresDeliveryStore.SQL_RENEW/drop-conjunct/8")
    assert mutant.mutation.before == "AND lease_until >= lp_now()"
    adapter = mutant.adapter(delivery_dsn)
    try:
        assert isinstance(adapter, PostgresDeliveryAdapter)
        store_class = adapter.store_class
        assert store_class.__bases__ == (PostgresDeliveryStore,)
        assert _other_keys(store_class, PostgresDeliveryStore) == {"SQL_RENEW"}
        assert store_class.SQL_RENEW == mutant.mutation.sql != PostgresDeliveryStore.SQL_RENEW
        adapter.reset(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
        assert adapter.execute(m.CreateCommunity(uuid.uuid4())) == m.Ok()
    finally:
        adapter.close()


def test_inherited_statement_is_mutated_in_every_class_that_runs_it(delivery_dsn: str) -> None:
    """FencedWriter's fence check is one lifecycle mutant, installed in every lifecycle writer."""
    mutant = by_name("lifecycle:FencedWriter.SQL_COMMUNITY_STATE/drop-lock/1")
    assert (mutant.machine, mutant.owner, mutant.kind) == ("lifecycle", "FencedWriter", "race")
    adapter = mutant.adapter(delivery_dsn)
    try:
        assert isinstance(adapter, PostgresLifecycleAdapter)
        for cls, base in (
            (adapter.store_class, LifecycleStore),
            (adapter.resumer_class, RunResumer),
            (type(adapter.engines["r1"]), ReplicaEngine),
            (adapter.communities_class, PostgresDeliveryStore),
        ):
            assert cls.__bases__ == (base,)
            assert _other_keys(cls, base) == {"SQL_COMMUNITY_STATE"}
            assert "FOR SHARE" not in cls.SQL_COMMUNITY_STATE
    finally:
        adapter.close()
    # The delivery machine's own mutant of the same site is another mutant.
    assert by_name("FencedWriter.SQL_COMMUNITY_STATE/drop-lock/1").machine == "delivery"


def test_borrowed_and_tuple_statements(delivery_dsn: str) -> None:
    borrowed = by_name("lifecycle:PostgresDeliveryStore.SQL_CREATE_COMMUNITY/drop-on-conflict/1")
    adapter = borrowed.adapter(delivery_dsn)
    try:
        assert (adapter.store_class, adapter.resumer_class) == (LifecycleStore, RunResumer)
        assert type(adapter.engines["r1"]) is ReplicaEngine
        assert _other_keys(adapter.communities_class, PostgresDeliveryStore) == {"SQL_CREATE_COMMUNITY"}
        adapter.reset(dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
        community = uuid.uuid4()
        assert adapter.execute(m.CreateCommunity(community)) == m.Ok()
        # The mutant is live: a duplicate now raises instead of being refused.
        with pytest.raises(psycopg.errors.UniqueViolation):
            adapter.execute(m.CreateCommunity(community))
    finally:
        adapter.close()

    dropped = by_name("LifecycleStore.SQL_DELETE[2]/drop-statement/1")
    adapter = dropped.adapter(delivery_dsn)
    try:
        value = adapter.store_class.SQL_DELETE
        assert len(value) == len(LifecycleStore.SQL_DELETE)
        assert value[:2] == LifecycleStore.SQL_DELETE[:2] and value[2] == "SELECT 1"
        assert _other_keys(adapter.store_class, LifecycleStore) == {"SQL_DELETE"}
    finally:
        adapter.close()
