"""The adapter protocols (conformance/boundary/protocols.py): every implementation that ships
is one, checked twice. The tables below are checked by mypy (CI runs it over tests/): a
class that loses a member, or changes a signature, no longer type-checks. The tests build
real ones and check what the harness reads off them at run time."""

from __future__ import annotations

import shlex
import sys
import types
from pathlib import Path

import pytest

from leaseproof.conformance.boundary.protocols import (
    ALL_OPERATIONS,
    Adapter,
    Announcing,
    Concurrent,
    DeliveryAdapter,
    LifecycleAdapter,
    NotAnAdapter,
    Offering,
    Restartable,
    Versioned,
    announced_database,
    as_adapter,
    offered_operations,
    takes_request_keys,
)
from leaseproof.conformance.boundary.wire import SubprocessAdapter
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep.core import ChecksItself
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.conformance.queues.protocol import QueueAdapter
from leaseproof.conformance.queues.subjects.bundled import BundledQueue
from leaseproof.conformance.queues.subjects.graphile_queue import GraphileQueue
from leaseproof.conformance.queues.subjects.pgboss_queue import PgBossQueue
from leaseproof.conformance.queues.subjects.pgqueuer_queue import PgQueuerQueue
from leaseproof.conformance.queues.subjects.procrastinate_queue import ProcrastinateQueue
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.mutants.faults import FAULT_MUTANTS

# -- what mypy checks ---------------------------------------------------------------------

DELIVERY: tuple[type[DeliveryAdapter], ...] = (PostgresDeliveryAdapter, SubprocessAdapter)
LIFECYCLE: tuple[type[LifecycleAdapter], ...] = (PostgresLifecycleAdapter,)
CONCURRENT: tuple[type[Concurrent], ...] = (PostgresDeliveryAdapter, PostgresLifecycleAdapter, SubprocessAdapter)
WIRE: tuple[type[Versioned], type[Offering], type[Restartable]] = (SubprocessAdapter,) * 3
FORKED: type[ChecksItself] = ForkedAdapter
QUEUES: tuple[type[QueueAdapter], ...] = (BundledQueue, ProcrastinateQueue, PgQueuerQueue, GraphileQueue, PgBossQueue)


# -- what the harness reads at run time -----------------------------------------------------


def test_the_bundled_adapters_are_adapters_in_process(delivery_dsn: str, scratch_dsn: str) -> None:
    delivery, lifecycle = PostgresDeliveryAdapter(delivery_dsn), PostgresLifecycleAdapter(scratch_dsn)
    try:
        for adapter in (delivery, lifecycle):
            assert isinstance(adapter, Adapter) and isinstance(adapter, Concurrent)
            assert not isinstance(adapter, Versioned | Offering | Announcing | ChecksItself)
            assert takes_request_keys(adapter) and offered_operations(adapter) == ALL_OPERATIONS
            assert announced_database(adapter, "delivery") is None
    finally:
        delivery.close()
        lifecycle.close()


def test_a_fault_mutant_adapter_is_still_an_adapter(delivery_dsn: str) -> None:
    adapter = FAULT_MUTANTS[0].adapter(delivery_dsn)
    try:
        assert isinstance(adapter, Adapter) and isinstance(adapter, Concurrent)
    finally:
        adapter.close()


def test_the_wire_client_offers_what_its_hello_says(pg_server: Server) -> None:
    serve = f"{shlex.quote(sys.executable)} -m leaseproof.conformance.boundary.serve --dsn {shlex.quote(pg_server.dsn)}"
    adapter = SubprocessAdapter(serve)
    try:
        assert isinstance(adapter, Adapter) and isinstance(adapter, Concurrent)
        assert isinstance(adapter, Versioned | Offering) and isinstance(adapter, Restartable)
        assert takes_request_keys(adapter) and offered_operations(adapter) == adapter.operations
        assert announced_database(adapter, "delivery") == adapter.databases["delivery"]
        assert announced_database(adapter, "no such machine") is None
    finally:
        adapter.close()


def test_an_older_wire_version_takes_no_request_keys() -> None:
    versioned = [types.SimpleNamespace(name="wire", protocol=version) for version in (1, 2, 3)]
    assert [takes_request_keys(adapter) for adapter in versioned] == [False, False, True]


def test_the_forked_adapter_stands_for_one_but_is_not_one(delivery_dsn: str) -> None:
    forked = ForkedAdapter(lambda: PostgresDeliveryAdapter(delivery_dsn), "delivery")
    try:
        assert isinstance(forked, ChecksItself) and not isinstance(forked, Adapter)
        assert forked.name == "postgres:PostgresDeliveryStore"
        assert offered_operations(forked) == ALL_OPERATIONS  # what the adapter it runs offers
    finally:
        forked.close()


class _NoSnapshot:
    name = "half an adapter"

    def reset(self, start: object) -> None: ...

    def execute(self, command: object) -> object: ...

    def close(self) -> None: ...


def test_what_a_factory_returns_is_checked_by_name() -> None:
    with pytest.raises(NotAnAdapter, match=r"which lacks snapshot$"):
        as_adapter(_NoSnapshot())
    with pytest.raises(NotAnAdapter, match=r"which lacks name, reset, execute, snapshot, close$"):
        as_adapter(object())
    whole = types.SimpleNamespace(**dict.fromkeys(("name", "reset", "execute", "snapshot", "close")))
    assert as_adapter(whole) is whole


def test_verify_names_what_an_adapter_lacks(tmp_path: Path) -> None:
    from helpers import leaseproof

    (tmp_path / "half.py").write_text(
        "class Half:\n    name = 'half'\n    def reset(self, start): pass\n    def close(self): pass\n"
        "def make():\n    return Half()\n"
    )
    run = leaseproof("verify", "--adapter", "half:make", "--max-examples", "1", cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--adapter half:make: the factory returned <half.Half object" in run.stderr
    assert "which lacks execute, snapshot" in run.stderr
