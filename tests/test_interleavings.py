"""The seeds' races, forced deterministically with the statement gate (impl/gate.py).

Each test sets a world up in lockstep with the model, then runs concurrent
clients, each on its own gated connection to the same database: it parks one
client at a named point, runs the others (waiting, where the schedule needs
it, until one is blocked on a lock inside PostgreSQL), and lets it go on.

The history is then judged against the model. Every serial order of the
concurrent operations (each client's own operations keep their program
order) is run through the model's `step`:

- the bundled implementation must give exactly the outcomes and the full
  snapshot of the serial order the schedule implies;
- a race mutant must give a history that *no* serial order gives, so the
  test proves it catches the mutant rather than merely seeing a difference.

Each race mutant is also shown to pass a short sequential lockstep run: the
races are the only thing that catches them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from leaseproof.conformance import world as w
from leaseproof.conformance.delivery_machine import describe_state_difference
from leaseproof.conformance.lifecycle_machine import describe_difference
from leaseproof.conformance.verify import run_conformance
from leaseproof.impl.adapter import PostgresDeliveryAdapter
from leaseproof.impl.gate import Aborted, Client, Schedule
from leaseproof.impl.lifecycle_adapter import PostgresLifecycleAdapter
from leaseproof.impl.lifecycle_store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.impl.mutants import ReconcileUnfenced
from leaseproof.impl.race_mutants import (
    DELIVERY_RACE_MUTANTS,
    LIFECYCLE_RACE_MUTANTS,
    RACE_FINDINGS,
    AdmissionWithoutRowLock,
    ClaimReadThenUpdate,
    CommitWithoutIdentityLock,
    FinishCheckThenAct,
    ReapReadThenUpdate,
    ReconcileOutsideTransaction,
)
from leaseproof.impl.store import PinnedClock, PostgresDeliveryStore
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc
from leaseproof.model.errors import Refused

SECOND = dt.timedelta(seconds=1)
LEASE = 10  # seconds


# -- the sequential suite cannot see them ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(DELIVERY_RACE_MUTANTS))
def test_delivery_race_mutant_passes_sequential_lockstep(delivery_dsn: str, name: str) -> None:
    adapter = PostgresDeliveryAdapter(delivery_dsn, store_class=DELIVERY_RACE_MUTANTS[name])
    try:
        verdict = run_conformance(adapter, machine="delivery", max_examples=20, seed_value=1, scenarios=True)
    finally:
        adapter.close()
    assert verdict.conforms, f"{name} is visible sequentially:\n{verdict.failure}\n{verdict.counterexample}{verdict.fault}"


@pytest.mark.parametrize("name", sorted(LIFECYCLE_RACE_MUTANTS))
def test_lifecycle_race_mutant_passes_sequential_lockstep(delivery_dsn: str, name: str) -> None:
    adapter = PostgresLifecycleAdapter(delivery_dsn, **LIFECYCLE_RACE_MUTANTS[name])
    try:
        verdict = run_conformance(adapter, machine="lifecycle", max_examples=20, seed_value=1, scenarios=True)
    finally:
        adapter.close()
    assert verdict.conforms, f"{name} is visible sequentially:\n{verdict.failure}\n{verdict.counterexample}{verdict.fault}"


def test_every_race_mutant_names_its_bug_class() -> None:
    for name, store in DELIVERY_RACE_MUTANTS.items():
        assert store.__doc__ and RACE_FINDINGS[name]
    for name, classes in LIFECYCLE_RACE_MUTANTS.items():
        assert all(cls.__doc__ for cls in classes.values()) and RACE_FINDINGS[name]
