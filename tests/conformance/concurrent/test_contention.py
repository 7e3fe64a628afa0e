"""The contention schedules: the bundled implementations pass every one, and they
catch race mutants that stress misses (they name none of them)."""

from __future__ import annotations

import attrs
import pytest

from leaseproof.conformance.concurrent import contention as ct
from leaseproof.conformance.concurrent.models import SPECS
from leaseproof.conformance.evidence import score as ms
from leaseproof.conformance.evidence.score import Budget, Task
from leaseproof.impl.mutants.generated.catalogue import by_name, generated_mutants

LOCKING = {machine: ct.locking_statements(machine) for machine in ct.MACHINES}
BUNDLED = {machine: ct.bundled(machine) for machine in ct.MACHINES}
STATEMENTS = [(m, s.name) for m in sorted(LOCKING) for each in LOCKING[m].values() for s in each]


@pytest.mark.parametrize("machine", sorted(ct.MACHINES))
def test_the_locking_statements_are_found_and_every_race_mutant_changes_one(machine: str) -> None:
    expected = {
        "delivery": {
            "lp_enter",
            "lp_claim",
            "lp_sweep",
            "lp_set_community_state",
            "lp_delete_run",
            "lp_commit_deliveries",
        },
        "lifecycle": {"lp_enter", "lp_admit", "lp_resume_run", "lp_save_definition", "lp_set_community_state"},
    }
    assert expected[machine] <= set(LOCKING[machine])
    # Named by function and ordinal; each holds a lock clause or an advisory lock.
    claim = [s.name for s in LOCKING["delivery"]["lp_claim"]] if machine == "delivery" else []
    assert machine != "delivery" or (len(claim) == 2 and "SKIP LOCKED" in LOCKING["delivery"]["lp_claim"][1].text)
    races = [m for m in generated_mutants(machine) if m.kind == "race"]
    assert races and all(m.function in LOCKING[machine] for m in races)


def test_the_spec_s_waits() -> None:
    assert not ct.may_wait("claim", "claim") and ct.may_wait("fence", "claim")
    assert ct.may_wait("keyed claim", "keyed claim") and not ct.may_wait("commit", "keyed claim")
    # A sweep waits for another only: it skips a community a change holds, and rows others hold.
    assert ct.may_wait("reap", "reap") and not ct.may_wait("delete run", "reap") and not ct.may_wait("fence", "reap")
    assert ct.may_wait("claim", "commit")
    lifecycle = ct.LIFECYCLE
    assert not lifecycle.may_wait("update", "refresh") and lifecycle.may_wait("update", "fire")


def _assert_passes(dsn: str, machine: str, statement: str, every: int = 1) -> None:
    verdicts = list(ct.schedules(dsn, machine, BUNDLED[machine], statement, every=every))
    assert verdicts, f"no operation of the catalogue runs {statement}"
    failed = [v for v in verdicts if not v.ok]
    assert not failed, "\n".join(f"{v.parked} ({v.where}) | {v.beside} | {v.observer}: {v.why}" for v in failed)


def test_a_sample_of_the_schedules_keeps_the_first_of_each_parked_operation_and_one_in_every(
    delivery_dsn: str,
) -> None:
    """The fast subset's equivalence claims run a fixed sample (`every`): each parked
    operation's first placement, which decides whether it gets there, then one in `every`."""

    def placed(every: int) -> list[tuple[str, str, str, str | None, bool]]:
        verdicts = ct.schedules(delivery_dsn, "lifecycle", BUNDLED["lifecycle"], "lp_admit:6", every=every)
        return [(v.parked, v.where, v.beside, v.observer, v.ran) for v in verdicts]

    full, sample = placed(1), placed(4)
    assert len(set(full)) == len(full) and set(sample) < set(full) and len(sample) < len(full) / 1.5
    firsts = {p[0]: (*p[:3], None, p[4]) for p in reversed(full)}
    assert set(firsts.values()) <= set(sample)
    assert [p for p in full if p in sample] == sample  # in the same order
    with pytest.raises(ValueError, match="give 1 or more"):
        next(ct.schedules(delivery_dsn, "lifecycle", BUNDLED["lifecycle"], "lp_admit:6", every=0))


@pytest.mark.evidence
@pytest.mark.parametrize(("machine", "statement"), STATEMENTS)
def test_the_bundled_implementation_passes_every_schedule(delivery_dsn: str, machine: str, statement: str) -> None:
    _assert_passes(delivery_dsn, machine, statement)


def test_the_bundled_claim_passes_its_schedules(delivery_dsn: str) -> None:
    """The claim's two locking statements (its fence and key, its SKIP LOCKED candidate), in
    the fast run, on the fast subset's fixed sample of their schedules (one in FAST_STRIDE,
    and the first of each parked operation; 316 schedules in all, 35 s): every schedule of
    them and of the others is in the evidence run."""
    _assert_passes(delivery_dsn, "delivery", "lp_claim", every=ms.FAST_STRIDE)


@pytest.mark.parametrize(
    ("mutant", "parked", "beside"),
    [
        # a claim that waits for a locked candidate instead of skipping it
        ("lp_claim/drop-skip-locked/1", "claim", "claim"),
        # a state change that does not wait for the writers in flight (its exclusive fence
        # a try): a sweep holds the fence, the change commits under it, and a read after
        # the change still sees the expired row the sweep has reaped but not committed
        ("lp_set_community_state/try-advisory-lock/2", "reap", "fence"),
        # a sweep that waits for a deletion's rows instead of skipping them
        ("lp_sweep/drop-skip-locked/1", "delete run", "reap"),
        # a state change that does not take its turn (its change lock a try): two changes
        # of one community both hold its fence shared (lp_enter) and deadlock upgrading it,
        # found by the schedules of lp_enter, which the function calls
        pytest.param(  # 241 schedules, 25 s
            "lp_set_community_state/try-advisory-lock/1", "fence", "fence", marks=pytest.mark.evidence
        ),
        # two saves of one new coordinate that do not take turns: both are told Created
        # (stress kills this one too, the others above it never)
        pytest.param(  # 89 schedules, 8 s: the lifecycle's kills in CI are the fast subset's and the observer's
            "lp_save_definition/try-advisory-lock/1",
            "create W2",
            "create W2",
            marks=pytest.mark.evidence,
        ),
    ],
)
def test_a_schedule_catches_a_race_mutant(delivery_dsn: str, mutant: str, parked: str, beside: str) -> None:
    generated = by_name(mutant)
    verdicts = ct.schedules(
        delivery_dsn, generated.machine, generated.classes(), generated.function, stop_at_first=True
    )
    found = next(v for v in verdicts if not v.ok)
    assert (found.parked, found.beside) == (parked, beside), found


def test_an_observer_catches_what_only_real_time_shows(delivery_dsn: str) -> None:
    """A save that checked its author's authority without holding it is parked; the
    authority is revoked, and a replica's refresh, begun after the revocation returned,
    sees no save; then the save is told Updated. Every serial order of the save and the
    revocation explains the two; only the third, in real time, rules them out."""
    generated = by_name("lp_save_definition/drop-lock/1")
    verdicts = ct.schedules(delivery_dsn, "lifecycle", generated.classes(), generated.function, stop_at_first=True)
    found = next(v for v in verdicts if not v.ok)
    assert (found.parked, found.beside, found.observer) == ("update", "revoke", "refresh"), found
    assert found.why.startswith("not linearizable"), found


def test_a_read_after_a_sweep_sees_the_expired_rows_a_deletion_holds(
    delivery_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's deletion has cascaded to its deliveries and is parked before its COMMIT;
    a sweep skips the expired delivery it holds and returns; a read, begun after the
    sweep returned, still finds that delivery claimed and expired; then the deletion
    commits. With every sweep one moment no order explains it (before the deletion, the
    sweep would have reaped the row; after it, the read would not have found it); the
    checker's sweep may leave what an overlapping operation held (`models.Swept`)."""
    schedule = ct.Verdict("delete run", "reap", "lp_sweep:4", "before commit", True, "", observer="read", ran=False)
    verdict = ct.again(delivery_dsn, "delivery", BUNDLED["delivery"], schedule)
    assert verdict is not None and verdict.waited == "finished", verdict
    assert verdict.ok, verdict.why
    _one_moment(monkeypatch)
    verdict = ct.again(delivery_dsn, "delivery", BUNDLED["delivery"], schedule)
    assert verdict is not None and not verdict.ok, verdict


def _one_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Judge with every claim and sweep one moment, as the model's step: without what
    skip locked lets them pass over."""
    monkeypatch.setitem(SPECS, "delivery", attrs.evolve(SPECS["delivery"], allowances=None, step_allowed=None))


def test_a_contention_kill_is_a_schedule_the_bundled_implementation_passes(
    delivery_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation score counts a contention kill only after the bundled implementation
    passed the very schedule that killed (`score._confirm`); a schedule the bundled one
    fails too (here judged by a checker without the skip-locked allowances) stops the run instead."""
    mutant = "lp_claim/drop-skip-locked/1"  # killed by the first schedules
    result = ms.run_task(Task(mutant, ms.CONTENTION, None), delivery_dsn, Budget())
    assert result.killed, result
    disagreement = ct.Verdict(
        "delete run", "reap", "lp_sweep:4", "before commit", False, "", observer="read", ran=False
    )
    _one_moment(monkeypatch)  # a checker that the bundled implementation fails on this schedule
    control = ct.again(delivery_dsn, "delivery", BUNDLED["delivery"], disagreement)
    assert control is not None and not control.ok, control
    with pytest.raises(RuntimeError, match="the bundled implementation fails it too"):
        ms._confirm(delivery_dsn, by_name("lp_sweep/drop-skip-locked/1"), disagreement)
