"""The contention schedules: the bundled store passes every one, and they catch
race mutants that stress misses (they name none of them)."""

from __future__ import annotations

import pytest

from leaseproof.conformance.concurrent import contention as ct
from leaseproof.conformance.evidence import score as ms
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.mutants.generated.catalogue import by_name, generated_mutants

LOCKING = ct.locking_statements(PostgresDeliveryStore)


def _contended() -> list[str]:
    """The statements of the race mutants the fast mutation subset (CI) runs these schedules for."""
    plan = ms.plan(fast=True)
    return sorted({by_name(t.mutant).attribute for t in plan.tasks if t.check == ms.CONTENTION})


def test_the_locking_statements_are_found_and_every_delivery_race_mutant_changes_one() -> None:
    assert {"SQL_CLAIM", "SQL_REAP", "SQL_COMMUNITY_STATE", "SQL_LOCK_DELETIONS"} <= set(LOCKING)
    races = [m for m in generated_mutants("delivery") if m.kind == "race"]
    assert races and all(m.attribute in LOCKING for m in races)


def test_the_spec_s_waits_and_known_disagreements() -> None:
    assert not ct.may_wait("claim", "claim") and ct.may_wait("fence", "claim")
    assert ct.may_wait("keyed claim", "keyed claim") and not ct.may_wait("commit", "keyed claim")
    assert ct.may_wait("reap", "reap") and not ct.may_wait("delete run", "reap")
    assert ct.may_wait("claim", "commit")
    assert ct.excluded("claim", "delete run") and ct.excluded("read", "keyed claim")
    assert not ct.excluded("reap", "delete run")


def _assert_passes(dsn: str, attribute: str) -> None:
    verdicts = list(ct.schedules(dsn, PostgresDeliveryStore, attribute))
    assert verdicts, f"no operation of the catalogue runs {attribute}"
    failed = [v for v in verdicts if not v.ok]
    assert not failed, "\n".join(f"{v.parked} ({v.where}) | {v.beside}: {v.why}" for v in failed)


@pytest.mark.parametrize("attribute", _contended())
def test_the_bundled_store_passes_the_schedules_ci_kills_mutants_with(delivery_dsn: str, attribute: str) -> None:
    _assert_passes(delivery_dsn, attribute)


@pytest.mark.evidence
@pytest.mark.parametrize("attribute", sorted(LOCKING))
def test_the_bundled_store_passes_every_schedule(delivery_dsn: str, attribute: str) -> None:
    _assert_passes(delivery_dsn, attribute)


@pytest.mark.parametrize(
    ("mutant", "parked", "beside"),
    [
        # a claim that waits for a locked candidate instead of skipping it
        ("PostgresDeliveryStore.SQL_CLAIM/drop-skip-locked/1", "claim", "claim"),
        # a state change that reads its community without the row lock: a deletion
        # lands between the read and the write, which then revives the community
        ("PostgresDeliveryStore.SQL_COMMUNITY_FOR_UPDATE/drop-lock/1", "fence", "delete community"),
        # a sweep that waits for a deletion's rows instead of skipping them
        ("PostgresDeliveryStore.SQL_REAP/drop-skip-locked/1", "delete run", "reap"),
    ],
)
def test_a_schedule_catches_a_race_mutant_stress_misses(
    delivery_dsn: str, mutant: str, parked: str, beside: str
) -> None:
    generated = by_name(mutant)
    store_class = generated.classes()["store_class"]
    verdicts = ct.schedules(delivery_dsn, store_class, generated.attribute, stop_at_first=True)
    found = next(v for v in verdicts if not v.ok)
    assert (found.parked, found.beside) == (parked, beside), found
