"""The lifecycle machine's invariants, as code (see `invariants` for the delivery machine)."""

from __future__ import annotations

from leaseproof.model.delivery import CommunityState, Rejection
from leaseproof.model.lifecycle import Admitted, LifecycleSystem, Resumed


def state_violations(s: LifecycleSystem) -> list[str]:
    found: list[str] = []
    if s.heads.keys() != s.runtime.keys():
        split = sorted(map(str, s.heads.keys() ^ s.runtime.keys()))
        found.append(f"head and runtime split for {split}: both present or both absent")
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
            found.append(f"{coordinate}: the runtime record disagrees with the head")
        if record.incarnation > head.created_at:
            found.append(f"{coordinate}: incarnation {record.incarnation} is newer than its head")
        cutoff = s.cutoffs.get(coordinate)
        if cutoff is not None and head.created_at <= cutoff:
            found.append(f"{coordinate}: a head at {head.created_at} lives at or before its cutoff {cutoff}")
        if s.communities.get(coordinate[0]) in (None, CommunityState.DELETED):
            found.append(f"{coordinate}: its community is gone but the definition lives")
    for run_id, run in s.runs.items():
        if run.run_id != run_id or not 1 <= run_id <= len(s.runs):
            found.append(f"run {run_id}: ids must be 1..n in admission order")
    for run_id in s.executed:
        if run_id not in s.runs:
            found.append(f"an action was executed for run {run_id}, which was never admitted")
    return found


def step_violations(before: LifecycleSystem, after: LifecycleSystem, outcome: object) -> list[str]:
    found: list[str] = []
    if isinstance(outcome, Rejection) and after != before:
        found.append(f"the rejection {outcome!r} changed the state")
    if after.now < before.now:
        found.append("the clock went back")
    new_actions: tuple[tuple[int, str], ...] = ()
    for run_id, actions in after.executed.items():
        earlier = before.executed.get(run_id, ())
        if actions[: len(earlier)] != earlier:
            found.append(f"the executed actions of run {run_id} were rewritten")
        new_actions += tuple((run_id, a) for a in actions[len(earlier) :])
    if before.executed.keys() - after.executed.keys():
        found.append("the executed actions of a run disappeared")
    if isinstance(outcome, Admitted):
        current = before.runtime.get(outcome.record.coordinate)
        owner = (outcome.record.community_id, outcome.record.channel_id, outcome.record.owner)
        if current != outcome.record or not current.enabled or owner not in before.authority:
            found.append(f"run {outcome.run_id} was admitted for a record that was not current, enabled and authorised")
        if new_actions != tuple((outcome.run_id, a) for a in outcome.record.actions):
            found.append(f"run {outcome.run_id} did not execute exactly its admitted record")
    elif isinstance(outcome, Resumed):
        runs = {run_id for run_id, _ in new_actions}
        for run_id in runs:
            run = before.runs[run_id]
            if before.runtime.get(run.record.coordinate) != run.record:
                found.append(f"run {run_id} resumed a revision that is no longer current")
            if new_actions != tuple((run_id, a) for a in run.record.actions):
                found.append(f"run {run_id} did not execute exactly its pinned record")
        if len(runs) != 1:
            found.append(f"a resume executed the actions of {len(runs)} runs")
    elif new_actions:
        found.append(f"actions executed without an admission or a resume: {new_actions}")
    if before.runs.keys() - after.runs.keys():
        found.append("an admitted run disappeared")
    for coordinate, cutoff in before.cutoffs.items():
        if coordinate not in before.heads and coordinate in after.heads and after.heads[coordinate].created_at <= cutoff:
            found.append(f"{coordinate} was revived by an event at or before its cutoff")
    return found
