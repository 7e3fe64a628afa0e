"""The lifecycle machine's invariants, as code (see `invariants` for the delivery machine)."""

from __future__ import annotations

from collections.abc import Iterator

from leaseproof.model.delivery import CommunityState, Rejection
from leaseproof.model.lifecycle import Admitted, LifecycleSystem, Resumed
from leaseproof.model.rules import Invariants

INVARIANTS = Invariants()
Violations = Iterator[str]


# -- every reachable state ----------------------------------------------------


@INVARIANTS.state
def head_and_runtime_live_together(s: LifecycleSystem) -> Violations:
    """A coordinate has a signed head exactly when it has a runtime record."""
    if s.heads.keys() != s.runtime.keys():
        split = sorted(map(str, s.heads.keys() ^ s.runtime.keys()))
        yield f"head and runtime split for {split}: both present or both absent"


@INVARIANTS.state
def the_runtime_projects_its_head(s: LifecycleSystem) -> Violations:
    """A runtime record holds its head's author, channel, hash, enabled value, actions and event id
    (as owner, channel, hash, enabled, actions and revision), and its incarnation is not newer than the head."""
    for coordinate, head in s.heads.items():
        record = s.runtime.get(coordinate)
        if record is None:
            continue
        agreed = (record.owner, record.channel_id, record.hash, record.enabled, record.actions, record.revision) == (
            head.author,
            head.channel_id,
            head.definition.hash,
            head.definition.is_enabled,
            head.definition.actions,
            head.event_id,
        )
        if not agreed:
            yield f"{coordinate}: the runtime record disagrees with the head"
        if record.incarnation > head.created_at:
            yield f"{coordinate}: incarnation {record.incarnation} is newer than its head"


@INVARIANTS.state
def heads_live_after_their_cutoff(s: LifecycleSystem) -> Violations:
    """A head is newer than its coordinate's deletion cutoff."""
    for coordinate, head in s.heads.items():
        cutoff = s.cutoffs.get(coordinate)
        if cutoff is not None and head.created_at <= cutoff:
            yield f"{coordinate}: a head at {head.created_at} lives at or before its cutoff {cutoff}"


@INVARIANTS.state
def definitions_live_in_live_communities(s: LifecycleSystem) -> Violations:
    """Every head belongs to a community that exists."""
    for coordinate in s.heads:
        if s.communities.get(coordinate[0]) in (None, CommunityState.DELETED):
            yield f"{coordinate}: its community is gone but the definition lives"


@INVARIANTS.state
def run_ids_count_admissions(s: LifecycleSystem) -> Violations:
    """Run ids are 1..n in admission order."""
    for run_id, run in s.runs.items():
        if run.run_id != run_id or not 1 <= run_id <= len(s.runs):
            yield f"run {run_id}: ids must be 1..n in admission order"


@INVARIANTS.state
def only_admitted_runs_execute(s: LifecycleSystem) -> Violations:
    """Actions are executed only for admitted runs."""
    for run_id in s.executed:
        if run_id not in s.runs:
            yield f"an action was executed for run {run_id}, which was never admitted"


# -- every step ------------------------------------------------------------------


def _new_actions(before: LifecycleSystem, after: LifecycleSystem) -> tuple[tuple[int, str], ...]:
    new: tuple[tuple[int, str], ...] = ()
    for run_id, actions in after.executed.items():
        new += tuple((run_id, a) for a in actions[len(before.executed.get(run_id, ())) :])
    return new


@INVARIANTS.step
def rejections_change_nothing(before: LifecycleSystem, after: LifecycleSystem, outcome: object) -> Violations:
    """A rejection leaves the state unchanged."""
    if isinstance(outcome, Rejection) and after != before:
        yield f"the rejection {outcome!r} changed the state"


@INVARIANTS.step
def the_clock_never_goes_back(before: LifecycleSystem, after: LifecycleSystem, outcome: object) -> Violations:
    """The clock never goes back."""
    if after.now < before.now:
        yield "the clock went back"


@INVARIANTS.step
def executed_actions_are_append_only(before: LifecycleSystem, after: LifecycleSystem, outcome: object) -> Violations:
    """A run's executed actions are only ever appended to, and no run's record of them disappears."""
    for run_id, actions in after.executed.items():
        earlier = before.executed.get(run_id, ())
        if actions[: len(earlier)] != earlier:
            yield f"the executed actions of run {run_id} were rewritten"
    if before.executed.keys() - after.executed.keys():
        yield "the executed actions of a run disappeared"


@INVARIANTS.step
def admission_runs_exactly_the_current_record(
    before: LifecycleSystem, after: LifecycleSystem, outcome: object
) -> Violations:
    """An admitted run's record was current, enabled and authorised, and the admission executed exactly its actions."""
    if isinstance(outcome, Admitted):
        current = before.runtime.get(outcome.record.coordinate)
        owner = (outcome.record.community_id, outcome.record.channel_id, outcome.record.owner)
        if current != outcome.record or not current.enabled or owner not in before.authority:
            yield f"run {outcome.run_id} was admitted for a record that was not current, enabled and authorised"
        if _new_actions(before, after) != tuple((outcome.run_id, a) for a in outcome.record.actions):
            yield f"run {outcome.run_id} did not execute exactly its admitted record"


@INVARIANTS.step
def a_resume_runs_exactly_its_pinned_current_record(
    before: LifecycleSystem, after: LifecycleSystem, outcome: object
) -> Violations:
    """A resume executes the actions of one run, exactly its pinned record's, and only while that record is current."""
    if isinstance(outcome, Resumed):
        new_actions = _new_actions(before, after)
        runs = {run_id for run_id, _ in new_actions}
        for run_id in runs:
            run = before.runs[run_id]
            if before.runtime.get(run.record.coordinate) != run.record:
                yield f"run {run_id} resumed a revision that is no longer current"
            if new_actions != tuple((run_id, a) for a in run.record.actions):
                yield f"run {run_id} did not execute exactly its pinned record"
        if len(runs) != 1:
            yield f"a resume executed the actions of {len(runs)} runs"


@INVARIANTS.step
def only_admission_and_resume_execute(before: LifecycleSystem, after: LifecycleSystem, outcome: object) -> Violations:
    """No step but an admission or a resume executes actions."""
    new_actions = _new_actions(before, after)
    if new_actions and not isinstance(outcome, Admitted | Resumed):
        yield f"actions executed without an admission or a resume: {new_actions}"


@INVARIANTS.step
def admitted_runs_stay(before: LifecycleSystem, after: LifecycleSystem, outcome: object) -> Violations:
    """An admitted run never disappears."""
    if before.runs.keys() - after.runs.keys():
        yield "an admitted run disappeared"


@INVARIANTS.step
def cutoffs_are_never_revived(before: LifecycleSystem, after: LifecycleSystem, outcome: object) -> Violations:
    """A deleted coordinate is never revived by an event at or before its cutoff."""
    for coordinate, cutoff in before.cutoffs.items():
        if (
            coordinate not in before.heads
            and coordinate in after.heads
            and after.heads[coordinate].created_at <= cutoff
        ):
            yield f"{coordinate} was revived by an event at or before its cutoff"


state_violations = INVARIANTS.state_violations
step_violations = INVARIANTS.step_violations
