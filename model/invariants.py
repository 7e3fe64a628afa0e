"""The delivery machine's invariants, as code.

`state_violations(state)` must be empty in every reachable state;
`step_violations(before, after, outcome)` must be empty for every step.
Each returns readable sentences, so a failure explains itself.
"""

from __future__ import annotations

from leaseproof.model.delivery import (
    TRANSITIONS,
    AlreadyTerminal,
    ClaimMiss,
    CommunityState,
    DeliverySystem,
    Found,
    LeaseLost,
    Rejection,
    Status,
)


def state_violations(s: DeliverySystem) -> list[str]:
    found: list[str] = []
    identities: dict[tuple, object] = {}
    for key, d in s.deliveries.items():
        where = f"delivery {d.id} of community {key[0]}"
        b = d.binding
        if key != d.key:
            found.append(f"{where}: stored under {key}, not its own key")
        claimed = d.status is Status.CLAIMED
        if (d.lease_until is not None) != claimed or (d.claimed_at is not None) != claimed:
            found.append(f"{where}: lease fields must be set iff claimed (status {d.status.value})")
        if (d.finished_at is not None) != d.status.terminal:
            found.append(f"{where}: finished_at must be set iff terminal (status {d.status.value})")
        if d.lease_generation < 0 or (claimed and d.lease_generation < 1):
            found.append(f"{where}: generation {d.lease_generation} impossible while {d.status.value}")
        if claimed and d.claimed_at and d.lease_until and not (d.claimed_at <= s.now and d.claimed_at <= d.lease_until):
            found.append(f"{where}: claimed_at must not lie after now or after lease_until")
        if d.created_at > s.now or (d.finished_at is not None and d.finished_at > s.now):
            found.append(f"{where}: a timestamp lies in the future")
        if s.runs.get((key[0], b.run_id)) != b.workflow_id:
            found.append(f"{where}: its run {b.run_id} of workflow {b.workflow_id} does not exist")
        if (key[0], b.message_event_id) not in s.events:
            found.append(f"{where}: its message event does not exist")
        identity = (key[0], b.run_id, b.step_id, b.target_pubkey)
        if identity in identities:
            found.append(f"{where}: shares (community, run, step, target) with delivery {identities[identity]}")
        identities[identity] = d.id
    for key in s.retired & s.deliveries.keys():
        found.append(f"delivery {key[1]} of community {key[0]} is both live and retired")
    for community, run in s.runs:
        if (community, s.runs[(community, run)]) not in s.workflows:
            found.append(f"run {run} of community {community}: its workflow does not exist")
    owners = [k[0] for k in s.workflows] + [k[0] for k in s.runs] + [k[0] for k in s.events]
    owners += [k[0] for k in s.retired]
    for community in owners:
        if s.communities.get(community) in (None, CommunityState.DELETED):
            found.append(f"community {community} is {s.communities.get(community)} but still owns rows")
    return found


def step_violations(before: DeliverySystem, after: DeliverySystem, outcome: object) -> list[str]:
    found: list[str] = []
    if isinstance(outcome, Rejection | ClaimMiss | LeaseLost | AlreadyTerminal | Found) and after != before:
        kind = "rejection" if isinstance(outcome, Rejection) else "no-op outcome"
        found.append(f"the {kind} {outcome!r} changed the state")
    if after.now < before.now:
        found.append(f"the clock went back from {before.now} to {after.now}")
    for key in before.retired - after.retired:
        if after.communities.get(key[0]) is not CommunityState.DELETED:  # only a purge forgets them
            found.append(f"delivery id {key[1]} of community {key[0]} was un-retired")
    allowed = set(TRANSITIONS)
    for key, old in before.deliveries.items():
        new = after.deliveries.get(key)
        where = f"delivery {old.id} of community {key[0]}"
        if new is None:
            if (old.status, None) not in allowed:
                found.append(f"{where}: removed from status {old.status.value}")
        else:
            if new.status is not old.status and (old.status, new.status) not in allowed:
                found.append(f"{where}: illegal transition {old.status.value} -> {new.status.value}")
            # Exactly claim and reap move the fence, by one each.
            moved = (old.status, new.status) in ((Status.PENDING, Status.CLAIMED), (Status.CLAIMED, Status.PENDING))
            if new.lease_generation < old.lease_generation:
                found.append(f"{where}: generation fell from {old.lease_generation} to {new.lease_generation}")
            elif new.lease_generation - old.lease_generation != int(moved):
                found.append(
                    f"{where}: generation went {old.lease_generation} -> {new.lease_generation}"
                    f" on {old.status.value} -> {new.status.value}"
                )
            if (new.binding, new.created_at) != (old.binding, old.created_at):
                found.append(f"{where}: binding or created_at changed")
            if old.status.terminal and new != old:
                found.append(f"{where}: a terminal row changed")
        community_state = before.communities.get(key[0])
        if community_state is not CommunityState.ACTIVE and new != old:
            purged = new is None and after.communities.get(key[0]) is CommunityState.DELETED
            if not purged:
                found.append(f"{where}: changed while its community was {community_state}")
    for key, new in after.deliveries.items():
        if key not in before.deliveries:
            if new.status is not Status.PENDING or new.lease_generation != 0:
                found.append(f"delivery {new.id}: born {new.status.value} at generation {new.lease_generation}")
            if before.communities.get(key[0]) is not CommunityState.ACTIVE:
                found.append(f"delivery {new.id}: created in a community that is not active")
    return found
