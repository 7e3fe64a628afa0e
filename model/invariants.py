"""The delivery machine's invariants, as code.

Each invariant is one function whose docstring states it and which yields a
readable sentence per violation. `state_violations(state)` must be empty in
every reachable state; `step_violations(before, after, outcome)` must be
empty for every step. `INVARIANTS` lists them for the generated spec.
"""

from __future__ import annotations

from collections.abc import Iterator

from leaseproof.model.delivery import (
    TRANSITIONS,
    AlreadyTerminal,
    ClaimMiss,
    CommunityState,
    Delivery,
    DeliverySystem,
    Found,
    LeaseLost,
    Rejection,
    Status,
)
from leaseproof.model.rules import Invariants

INVARIANTS = Invariants()
Violations = Iterator[str]


def _where(d: Delivery) -> str:
    return f"delivery {d.id} of community {d.key[0]}"


# -- every reachable state ----------------------------------------------------


@INVARIANTS.state
def rows_are_stored_under_their_key(s: DeliverySystem) -> Violations:
    """Every delivery is stored under its own key, (community, id)."""
    for key, d in s.deliveries.items():
        if key != d.key:
            yield f"{_where(d)}: stored under {key}, not its own key"


@INVARIANTS.state
def lease_fields_are_set_exactly_while_claimed(s: DeliverySystem) -> Violations:
    """`lease_until` and `claimed_at` are set exactly while a row is claimed."""
    for d in s.deliveries.values():
        claimed = d.status is Status.CLAIMED
        if (d.lease_until is not None) != claimed or (d.claimed_at is not None) != claimed:
            yield f"{_where(d)}: lease fields must be set iff claimed (status {d.status.value})"


@INVARIANTS.state
def a_claim_key_is_held_only_while_claimed_and_once_per_live_lease(s: DeliverySystem) -> Violations:
    """`claim_key` is set only while a row is claimed, and no two unexpired claims of one
    community and target hold the same key."""
    live: dict[tuple[object, bytes, str], object] = {}
    for d in s.deliveries.values():
        if d.claim_key is None:
            continue
        if d.status is not Status.CLAIMED:
            yield f"{_where(d)}: a claim key must be set only while claimed (status {d.status.value})"
        elif d.lease_until is not None and d.lease_until >= s.now:
            where = (d.key[0], d.binding.target_pubkey, d.claim_key)
            if where in live:
                yield f"{_where(d)}: claim key {d.claim_key!r} also holds the live lease of {live[where]}"
            live[where] = d.id


@INVARIANTS.state
def finished_at_is_set_exactly_while_terminal(s: DeliverySystem) -> Violations:
    """`finished_at` is set exactly while a row is finished or failed."""
    for d in s.deliveries.values():
        if (d.finished_at is not None) != d.status.terminal:
            yield f"{_where(d)}: finished_at must be set iff terminal (status {d.status.value})"


@INVARIANTS.state
def generations_are_possible(s: DeliverySystem) -> Violations:
    """A generation is never negative, and at least 1 while claimed (a claim moved it)."""
    for d in s.deliveries.values():
        if d.lease_generation < 0 or (d.status is Status.CLAIMED and d.lease_generation < 1):
            yield f"{_where(d)}: generation {d.lease_generation} impossible while {d.status.value}"


@INVARIANTS.state
def no_timestamp_lies_in_the_future(s: DeliverySystem) -> Violations:
    """`created_at`, `claimed_at` and `finished_at` are not after now; `claimed_at` is not after `lease_until`."""
    for d in s.deliveries.values():
        if d.claimed_at and d.lease_until and not (d.claimed_at <= s.now and d.claimed_at <= d.lease_until):
            yield f"{_where(d)}: claimed_at must not lie after now or after lease_until"
        if d.created_at > s.now or (d.finished_at is not None and d.finished_at > s.now):
            yield f"{_where(d)}: a timestamp lies in the future"


@INVARIANTS.state
def rows_reference_live_parents(s: DeliverySystem) -> Violations:
    """A delivery's run exists and belongs to the binding's workflow, and its message event exists."""
    for key, d in s.deliveries.items():
        b = d.binding
        if s.runs.get((key[0], b.run_id)) != b.workflow_id:
            yield f"{_where(d)}: its run {b.run_id} of workflow {b.workflow_id} does not exist"
        if (key[0], b.message_event_id) not in s.events:
            yield f"{_where(d)}: its message event does not exist"


@INVARIANTS.state
def identities_are_unique(s: DeliverySystem) -> Violations:
    """No two deliveries share an identity (community, run, step, target)."""
    identities: dict[tuple[object, ...], object] = {}
    for key, d in s.deliveries.items():
        identity = (key[0], d.binding.run_id, d.binding.step_id, d.binding.target_pubkey)
        if identity in identities:
            yield f"{_where(d)}: shares (community, run, step, target) with delivery {identities[identity]}"
        identities[identity] = d.id


@INVARIANTS.state
def retired_ids_are_not_live(s: DeliverySystem) -> Violations:
    """No delivery id is both live and retired."""
    for key in s.retired & s.deliveries.keys():
        yield f"delivery {key[1]} of community {key[0]} is both live and retired"


@INVARIANTS.state
def runs_reference_live_workflows(s: DeliverySystem) -> Violations:
    """Every run's workflow exists."""
    for community, run in s.runs:
        if (community, s.runs[(community, run)]) not in s.workflows:
            yield f"run {run} of community {community}: its workflow does not exist"


@INVARIANTS.state
def only_live_communities_own_rows(s: DeliverySystem) -> Violations:
    """Only a live (not unknown, not deleted) community owns workflows, runs, events or retired ids."""
    owners = [k[0] for k in s.workflows] + [k[0] for k in s.runs] + [k[0] for k in s.events]
    owners += [k[0] for k in s.retired]
    for community in owners:
        if s.communities.get(community) in (None, CommunityState.DELETED):
            yield f"community {community} is {s.communities.get(community)} but still owns rows"


# -- every step ------------------------------------------------------------------


@INVARIANTS.step
def refusals_and_no_ops_change_nothing(before: DeliverySystem, after: DeliverySystem, outcome: object) -> Violations:
    """A rejection, `ClaimMiss`, `LeaseLost`, `AlreadyTerminal` or `Found` leaves the state unchanged."""
    if isinstance(outcome, Rejection | ClaimMiss | LeaseLost | AlreadyTerminal | Found) and after != before:
        kind = "rejection" if isinstance(outcome, Rejection) else "no-op outcome"
        yield f"the {kind} {outcome!r} changed the state"


@INVARIANTS.step
def the_clock_never_goes_back(before: DeliverySystem, after: DeliverySystem, outcome: object) -> Violations:
    """The clock never goes back."""
    if after.now < before.now:
        yield f"the clock went back from {before.now} to {after.now}"


@INVARIANTS.step
def retired_ids_stay_retired(before: DeliverySystem, after: DeliverySystem, outcome: object) -> Violations:
    """A retired id stays retired, unless its community is purged."""
    for key in before.retired - after.retired:
        if after.communities.get(key[0]) is not CommunityState.DELETED:
            yield f"delivery id {key[1]} of community {key[0]} was un-retired"


@INVARIANTS.step
def rows_move_only_along_the_transitions(before: DeliverySystem, after: DeliverySystem, outcome: object) -> Violations:
    """A row changes status, or disappears, only along the declared row transitions."""
    allowed = set(TRANSITIONS)
    for key, old in before.deliveries.items():
        new = after.deliveries.get(key)
        if new is None and (old.status, None) not in allowed:
            yield f"{_where(old)}: removed from status {old.status.value}"
        elif new is not None and new.status is not old.status and (old.status, new.status) not in allowed:
            yield f"{_where(old)}: illegal transition {old.status.value} -> {new.status.value}"


@INVARIANTS.step
def exactly_claim_and_reap_move_the_fence(before: DeliverySystem, after: DeliverySystem, outcome: object) -> Violations:
    """The generation never falls, and rises by exactly one on pending → claimed
    and claimed → pending, and only then."""
    for key, old in before.deliveries.items():
        new = after.deliveries.get(key)
        if new is None:
            continue
        moved = (old.status, new.status) in ((Status.PENDING, Status.CLAIMED), (Status.CLAIMED, Status.PENDING))
        if new.lease_generation < old.lease_generation:
            yield f"{_where(old)}: generation fell from {old.lease_generation} to {new.lease_generation}"
        elif new.lease_generation - old.lease_generation != int(moved):
            yield (
                f"{_where(old)}: generation went {old.lease_generation} -> {new.lease_generation}"
                f" on {old.status.value} -> {new.status.value}"
            )


@INVARIANTS.step
def bindings_never_change(before: DeliverySystem, after: DeliverySystem, outcome: object) -> Violations:
    """A row's binding and `created_at` never change, and a terminal row never changes at all."""
    for key, old in before.deliveries.items():
        new = after.deliveries.get(key)
        if new is None:
            continue
        if (new.binding, new.created_at) != (old.binding, old.created_at):
            yield f"{_where(old)}: binding or created_at changed"
        if old.status.terminal and new != old:
            yield f"{_where(old)}: a terminal row changed"


@INVARIANTS.step
def only_active_communities_change(before: DeliverySystem, after: DeliverySystem, outcome: object) -> Violations:
    """The rows of a community that is not active do not change, except when the community is purged."""
    for key, old in before.deliveries.items():
        new = after.deliveries.get(key)
        community_state = before.communities.get(key[0])
        if community_state is not CommunityState.ACTIVE and new != old:
            purged = new is None and after.communities.get(key[0]) is CommunityState.DELETED
            if not purged:
                yield f"{_where(old)}: changed while its community was {community_state}"


@INVARIANTS.step
def rows_are_born_pending(before: DeliverySystem, after: DeliverySystem, outcome: object) -> Violations:
    """A new row is pending at generation 0, in an active community."""
    for key, new in after.deliveries.items():
        if key not in before.deliveries:
            if new.status is not Status.PENDING or new.lease_generation != 0:
                yield f"delivery {new.id}: born {new.status.value} at generation {new.lease_generation}"
            if before.communities.get(key[0]) is not CommunityState.ACTIVE:
                yield f"delivery {new.id}: created in a community that is not active"


state_violations = INVARIANTS.state_violations
step_violations = INVARIANTS.step_violations
