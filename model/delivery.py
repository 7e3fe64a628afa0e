"""The durable workflow agent delivery machine: the executable spec.

A workflow step addresses a message to managed agents (targets): each (community, run,
step, target) gets exactly one durable delivery row, which the target must claim, may
renew, and finally settles (finished or failed); a reap returns an expired claim to
pending and bumps its generation. `step(state, command)` is the whole machine: it returns
the next state and exactly one outcome, reads no clock and does no I/O (time moves only
by `AdvanceClock`). A `Rejection` outcome never changes the state.

Checks run in a fixed order, and the order is part of the spec:
  1. value rules (at construction: an invalid command cannot exist);
  2. for claim only, the expected binding's own scope (a mismatch is a miss before any lookup);
  3. the community: unknown, or not `active` (refuses every write);
  4. the operation's own lookups and fences.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

import attrs

from leaseproof.model.binding import (
    Binding,
    is_instant,
    is_key,
    is_uuid,
    require_step_id,
    require_uuid,
    short_key,
    to_utc,
)
from leaseproof.model.errors import InvalidValue
from leaseproof.model.frozenmap import FrozenMap
from leaseproof.model.rules import Decision, Resend, Rule, changed_fields, decider

MAX_LEASE_SECONDS = 86_400
MAX_ADVANCE = dt.timedelta(days=366)  # the longest single clock move


class Status(enum.Enum):
    PENDING = "pending"
    CLAIMED = "claimed"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (Status.FINISHED, Status.FAILED)


class CommunityState(enum.Enum):
    ACTIVE = "active"
    QUIESCING = "quiescing"
    FENCED = "fenced"
    DELETED = "deleted"


def _lease_seconds(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidValue(attribute.name, value, "must be an integer number of seconds")
    if not 0 < value <= MAX_LEASE_SECONDS:
        raise InvalidValue(attribute.name, value, f"must be positive and at most {MAX_LEASE_SECONDS}")


def _step_id(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    require_step_id(attribute.name, value)


MAX_REQUEST_KEY = 64  # characters


def _request_key(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REQUEST_KEY or value.strip() != value:
        raise InvalidValue(
            attribute.name, value, f"must be None or 1 to {MAX_REQUEST_KEY} characters without surrounding whitespace"
        )


def _optional_uuid(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        require_uuid(attribute.name, value)


def _instance_of(*types: type) -> Any:
    def validator(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise InvalidValue(attribute.name, value, f"must be {names}")

    return validator


# -- records ---------------------------------------------------------------


@attrs.frozen
class Delivery:
    """One delivery row, every persisted field."""

    id: uuid.UUID = attrs.field(validator=is_uuid)
    binding: Binding = attrs.field(validator=_instance_of(Binding))
    status: Status
    lease_generation: int
    lease_until: dt.datetime | None
    claimed_at: dt.datetime | None
    finished_at: dt.datetime | None
    created_at: dt.datetime
    # the request key of the claim that holds it, while claimed (adapter protocol 3 and later)
    claim_key: str | None = attrs.field(default=None, metadata={"since": 3})

    @property
    def key(self) -> tuple[uuid.UUID, uuid.UUID]:
        return (self.binding.community_id, self.id)


@attrs.frozen
class Lease:
    """A target-scoped capability to act on one delivery at one generation."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    delivery_id: uuid.UUID = attrs.field(validator=is_uuid)
    target_pubkey: bytes = attrs.field(validator=is_key, repr=short_key)
    lease_generation: int = attrs.field()
    lease_until: dt.datetime = attrs.field(converter=to_utc, validator=is_instant)

    @lease_generation.validator
    def _generation(self, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidValue("lease_generation", value, "must be a non-negative integer")


@attrs.frozen
class NewDelivery:
    """One target of a commit: the producer-chosen id and its binding."""

    id: uuid.UUID = attrs.field(validator=is_uuid)
    binding: Binding = attrs.field(validator=_instance_of(Binding))


# -- commands --------------------------------------------------------------


@attrs.frozen
class CreateCommunity:
    community_id: uuid.UUID = attrs.field(validator=is_uuid)


@attrs.frozen
class SetCommunityState:
    """Move a live community between active, quiescing and fenced."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    state: CommunityState = attrs.field()

    @state.validator
    def _not_deleted(self, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, CommunityState) or value is CommunityState.DELETED:
            raise InvalidValue("state", value, "must be active, quiescing or fenced (use DeleteCommunity)")


@attrs.frozen
class DeleteCommunity:
    """Mark the community deleted and purge every row it owns."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)


@attrs.frozen
class CreateWorkflow:
    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)


@attrs.frozen
class DeleteWorkflow:
    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)


@attrs.frozen
class CreateRun:
    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)
    run_id: uuid.UUID = attrs.field(validator=is_uuid)


@attrs.frozen
class DeleteRun:
    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    run_id: uuid.UUID = attrs.field(validator=is_uuid)


@attrs.frozen
class PublishEvent:
    """Record a (message) event that deliveries may reference."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    event_id: bytes = attrs.field(validator=is_key, repr=short_key)


@attrs.frozen
class DeleteEvent:
    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    event_id: bytes = attrs.field(validator=is_key, repr=short_key)


def _as_tuple(value: Iterable[NewDelivery]) -> tuple[NewDelivery, ...]:
    # `converter=tuple` itself would leave the element type unknown to mypy.
    return tuple(value)


@attrs.frozen
class CommitDeliveries:
    """The only insert path: every target of one step, all or nothing."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    run_id: uuid.UUID = attrs.field(validator=is_uuid)
    step_id: str = attrs.field(validator=_step_id)
    deliveries: tuple[NewDelivery, ...] = attrs.field(converter=_as_tuple)

    @deliveries.validator
    def _same_step(self, attribute: attrs.Attribute[Any], value: tuple[NewDelivery, ...]) -> None:
        if not value:
            raise InvalidValue("deliveries", value, "must name at least one delivery")
        for index, new in enumerate(value):
            if not isinstance(new, NewDelivery):
                raise InvalidValue(f"deliveries[{index}]", new, "must be a NewDelivery")
            for field in ("community_id", "run_id", "step_id"):
                if getattr(new.binding, field) != getattr(self, field):
                    raise InvalidValue(
                        f"deliveries[{index}].binding.{field}",
                        getattr(new.binding, field),
                        f"must equal the commit's {field}",
                    )


@attrs.frozen
class Claim:
    """Claim the oldest matching pending delivery for an authenticated target.

    `request_key`, chosen by the client, names this claim request: sent again (its
    answer was lost) while the lease it took is still held, it returns that lease
    instead of claiming another delivery."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    target_pubkey: bytes = attrs.field(validator=is_key, repr=short_key)
    lease_seconds: int = attrs.field(validator=_lease_seconds)
    delivery_id: uuid.UUID | None = attrs.field(default=None, validator=_optional_uuid)
    expected: Binding | None = attrs.field(default=None, validator=attrs.validators.optional(_instance_of(Binding)))
    request_key: str | None = attrs.field(default=None, validator=_request_key, metadata={"since": 3})


@attrs.frozen
class Renew:
    lease: Lease = attrs.field(validator=_instance_of(Lease))
    lease_seconds: int = attrs.field(validator=_lease_seconds)


@attrs.frozen
class Finish:
    lease: Lease = attrs.field(validator=_instance_of(Lease))
    outcome: Status = attrs.field()

    @outcome.validator
    def _terminal(self, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, Status) or not value.terminal:
            raise InvalidValue("outcome", value, "must be finished or failed")


@attrs.frozen
class Reap:
    """Fleet-wide: return every expired claim of a writable community to pending."""


@attrs.frozen
class AdvanceClock:
    by: dt.timedelta = attrs.field()

    @by.validator
    def _positive(self, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
            raise InvalidValue("by", value, "must be a positive timedelta")
        if value > MAX_ADVANCE:
            raise InvalidValue("by", value, "must be at most 366 days")


@attrs.frozen
class GetDelivery:
    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    delivery_id: uuid.UUID = attrs.field(validator=is_uuid)


Command: TypeAlias = (
    CreateCommunity
    | SetCommunityState
    | DeleteCommunity
    | CreateWorkflow
    | DeleteWorkflow
    | CreateRun
    | DeleteRun
    | PublishEvent
    | DeleteEvent
    | CommitDeliveries
    | Claim
    | Renew
    | Finish
    | Reap
    | AdvanceClock
    | GetDelivery
)


# -- outcomes --------------------------------------------------------------


@attrs.frozen
class Ok:
    """The operation took effect; it has nothing else to report."""


@attrs.frozen
class Committed:
    created: tuple[uuid.UUID, ...]
    identity_existed: bool


@attrs.frozen
class Claimed:
    lease: Lease
    delivery: Delivery


@attrs.frozen
class ClaimMiss:
    """No candidate: nothing pending matched, or the wake was forged/stale."""


@attrs.frozen
class Renewed:
    lease_until: dt.datetime


@attrs.frozen
class Settled:
    status: Status


@attrs.frozen
class AlreadyTerminal:
    """The same holder retried finish; the recorded terminal never flips."""

    status: Status


@attrs.frozen
class LeaseLost:
    """The lease no longer confers authority: expired, reaped, superseded or foreign."""


@attrs.frozen
class Reaped:
    count: int


@attrs.frozen
class Found:
    delivery: Delivery


class Rejection:
    """Marker base: a refused request; the state is unchanged."""


@attrs.frozen
class UnknownCommunity(Rejection):
    community_id: uuid.UUID


@attrs.frozen
class CommunityNotWritable(Rejection):
    community_id: uuid.UUID
    state: CommunityState


@attrs.frozen
class AlreadyExists(Rejection):
    entity: str
    community_id: uuid.UUID
    key: uuid.UUID | bytes


@attrs.frozen
class NotFound(Rejection):
    entity: str
    community_id: uuid.UUID
    key: uuid.UUID | bytes


@attrs.frozen
class WorkflowMismatch(Rejection):
    """A binding names a workflow other than the one its run belongs to."""

    run_id: uuid.UUID
    run_workflow_id: uuid.UUID
    binding_workflow_id: uuid.UUID


@attrs.frozen
class DeliveryIdTaken(Rejection):
    """The producer's id names a delivery with another identity, or a deleted one."""

    community_id: uuid.UUID
    delivery_id: uuid.UUID


Outcome: TypeAlias = Any

# Every outcome variant each operation can produce; `variant()` names them.
_COMMUNITY = ("UnknownCommunity", "CommunityNotWritable")
OUTCOME_VARIANTS: dict[type, tuple[str, ...]] = {
    CreateCommunity: ("Ok", "AlreadyExists"),
    SetCommunityState: ("Ok", *_COMMUNITY),
    DeleteCommunity: ("Ok", "UnknownCommunity"),
    CreateWorkflow: ("Ok", *_COMMUNITY, "AlreadyExists"),
    DeleteWorkflow: ("Ok", *_COMMUNITY, "NotFound"),
    CreateRun: ("Ok", *_COMMUNITY, "NotFound", "AlreadyExists"),
    DeleteRun: ("Ok", *_COMMUNITY, "NotFound"),
    PublishEvent: ("Ok", *_COMMUNITY, "AlreadyExists"),
    DeleteEvent: ("Ok", *_COMMUNITY, "NotFound"),
    CommitDeliveries: ("Committed", *_COMMUNITY, "NotFound", "WorkflowMismatch", "DeliveryIdTaken"),
    Claim: ("Claimed", "ClaimMiss", *_COMMUNITY),
    Renew: ("Renewed", "LeaseLost", *_COMMUNITY),
    Finish: (
        "Settled(finished)",
        "Settled(failed)",
        "AlreadyTerminal(finished)",
        "AlreadyTerminal(failed)",
        "LeaseLost",
        *_COMMUNITY,
    ),
    Reap: ("Reaped",),
    AdvanceClock: ("Ok",),
    GetDelivery: ("Found", "NotFound"),
}

# The lifecycle's row transitions, named as the spec draws them.
TRANSITIONS: tuple[tuple[Status | None, Status | None], ...] = (
    (None, Status.PENDING),  # commit
    (Status.PENDING, Status.CLAIMED),  # claim
    (Status.CLAIMED, Status.CLAIMED),  # renew
    (Status.CLAIMED, Status.FINISHED),  # finish
    (Status.CLAIMED, Status.FAILED),  # finish
    (Status.CLAIMED, Status.PENDING),  # reap
    (Status.PENDING, None),  # cascade or purge
    (Status.CLAIMED, None),
    (Status.FINISHED, None),
    (Status.FAILED, None),
)


# The rules that move a row along each transition, as "Operation/guard".
_REMOVALS = ("DeleteRun/cascade", "DeleteWorkflow/cascade", "DeleteEvent/cascade", "DeleteCommunity/purge")
TRANSITION_RULES: dict[tuple[Status | None, Status | None], tuple[str, ...]] = {
    (None, Status.PENDING): ("CommitDeliveries/commit",),
    (Status.PENDING, Status.CLAIMED): ("Claim/oldest-pending",),
    (Status.CLAIMED, Status.CLAIMED): ("Renew/held",),
    (Status.CLAIMED, Status.FINISHED): ("Finish/held",),
    (Status.CLAIMED, Status.FAILED): ("Finish/held",),
    (Status.CLAIMED, Status.PENDING): ("Reap/sweep",),
    **{(status, None): _REMOVALS for status in Status},
}
assert tuple(TRANSITION_RULES) == TRANSITIONS


def status_name(status: Status | None) -> str:
    """A row's status as the transitions name it; `absent` is no row."""
    return "absent" if status is None else status.value


def variant(outcome: Outcome) -> str:
    name = type(outcome).__name__
    if isinstance(outcome, Settled | AlreadyTerminal):
        return f"{name}({outcome.status.value})"
    return name


# -- state -----------------------------------------------------------------

CommunityKey: TypeAlias = tuple[uuid.UUID, uuid.UUID]  # (community, workflow | run | delivery)


@attrs.frozen
class DeliverySystem:
    """Everything the machine persists, and the clock."""

    now: dt.datetime = attrs.field(converter=to_utc, validator=is_instant)
    communities: FrozenMap[uuid.UUID, CommunityState] = FrozenMap()
    workflows: frozenset[CommunityKey] = frozenset()
    runs: FrozenMap[CommunityKey, uuid.UUID] = FrozenMap()  # (community, run) -> workflow
    events: frozenset[tuple[uuid.UUID, bytes]] = frozenset()
    deliveries: FrozenMap[CommunityKey, Delivery] = FrozenMap()
    # Ids of deleted deliveries. An id is never reused within its community:
    # generations restart with each row, so a lease on a deleted row could
    # otherwise govern a new row under the same id and generation.
    retired: frozenset[CommunityKey] = frozenset()

    def without_deliveries(self, doomed: Callable[[Delivery], bool]) -> DeliverySystem:
        gone = frozenset(key for key, d in self.deliveries.items() if doomed(d))
        return attrs.evolve(
            self,
            deliveries=self.deliveries.remove_where(lambda key, _: key in gone),
            retired=self.retired | gone,
        )

    def with_delivery(self, delivery: Delivery) -> DeliverySystem:
        return attrs.evolve(self, deliveries=self.deliveries.set(delivery.key, delivery))


def initial_state(now: dt.datetime) -> DeliverySystem:
    return DeliverySystem(now=now)


def community_refusal(communities: Mapping[uuid.UUID, CommunityState], community_id: uuid.UUID) -> Rejection | None:
    """The write fence, for every machine: unknown, or not active, refuses."""
    current = communities.get(community_id)
    if current is None:
        return UnknownCommunity(community_id)
    if current is not CommunityState.ACTIVE:
        return CommunityNotWritable(community_id, current)
    return None


# -- the rules -------------------------------------------------------------
#
# Each operation's guarded cases, in check order: the first rule whose guard
# holds decides the step (see `rules`). The step functions below name the
# rule they applied; `decide` refuses any answer the table does not declare.

COMMUNITY_UNKNOWN, COMMUNITY_NOT_ACTIVE = "community-unknown", "community-not-active"
_COMMUNITY_RULES = (
    Rule(COMMUNITY_UNKNOWN, "the community was never created", ("UnknownCommunity",)),
    Rule(COMMUNITY_NOT_ACTIVE, "the community is quiescing, fenced or deleted", ("CommunityNotWritable",)),
)
_GONE = ("deliveries", "retired")
_NONE = "nothing changes"


def _create(entity: str, field: str) -> tuple[Rule, ...]:
    return (
        *_COMMUNITY_RULES,
        Rule("exists", f"the {entity} already exists", ("AlreadyExists",)),
        Rule("new", "otherwise", ("Ok",), f"the {entity} is added", (field,)),
    )


def _delete(entity: str, fields: tuple[str, ...], cascade: str) -> tuple[Rule, ...]:
    return (
        *_COMMUNITY_RULES,
        Rule("missing", f"the {entity} does not exist", ("NotFound",)),
        Rule("cascade", "otherwise", ("Ok",), f"the {entity} is removed, {cascade}; their ids are retired", fields),
    )


RULES: dict[type, tuple[Rule, ...]] = {
    CreateCommunity: (
        Rule("exists", "the id was ever created (a deleted community stays as a tombstone)", ("AlreadyExists",)),
        Rule("new", "otherwise", ("Ok",), "the community is created active", ("communities",)),
    ),
    SetCommunityState: (
        _COMMUNITY_RULES[0],
        Rule("deleted", "the community is deleted", ("CommunityNotWritable",)),
        Rule("set", "otherwise", ("Ok",), "the community takes the requested state", ("communities",)),
    ),
    DeleteCommunity: (
        _COMMUNITY_RULES[0],
        Rule(
            "purge",
            "otherwise (also when already deleted)",
            ("Ok",),
            "the community becomes a deleted tombstone; every workflow, run, event, delivery and retired id it "
            "owns is purged",
            ("communities", "workflows", "runs", "events", *_GONE),
        ),
    ),
    CreateWorkflow: _create("workflow", "workflows"),
    DeleteWorkflow: _delete("workflow", ("workflows", "runs", *_GONE), "with its runs and their deliveries"),
    CreateRun: (
        *_COMMUNITY_RULES,
        Rule("no-workflow", "the workflow does not exist", ("NotFound",)),
        Rule("exists", "the run already exists", ("AlreadyExists",)),
        Rule("new", "otherwise", ("Ok",), "the run is added under the workflow", ("runs",)),
    ),
    DeleteRun: _delete("run", ("runs", *_GONE), "with its deliveries"),
    PublishEvent: _create("event", "events"),
    DeleteEvent: _delete("event", ("events", *_GONE), "with the deliveries whose message it is"),
    CommitDeliveries: (
        *_COMMUNITY_RULES,
        Rule("no-run", "the run does not exist", ("NotFound",)),
        Rule("workflow-mismatch", "a binding names a workflow other than the run's", ("WorkflowMismatch",)),
        Rule("no-event", "a binding's message event does not exist", ("NotFound",)),
        Rule(
            "retry",
            "every target's identity (community, run, step, target) already exists",
            ("Committed",),
            f"{_NONE}: a producer retry; `created` is empty and `identity_existed` true",
        ),
        Rule(
            "id-taken",
            "a new identity's id is live or retired in the community",
            ("DeliveryIdTaken",),
            f"{_NONE}: every target rolls back",
        ),
        Rule(
            "commit",
            "otherwise",
            ("Committed",),
            "each new identity is inserted pending at generation 0, created now; existing identities are kept",
            ("deliveries",),
        ),
    ),
    Claim: (
        Rule(
            "out-of-scope",
            "the expected binding names another community or target (checked before the community)",
            ("ClaimMiss",),
        ),
        *_COMMUNITY_RULES,
        Rule(
            "retried",
            "the claim carries a request key, and a row of the community and target is claimed under that key "
            "with lease_until >= now (whatever the requested id and expected binding)",
            ("Claimed",),
            f"{_NONE}: that row's lease is returned again, at its generation and lease_until",
        ),
        Rule(
            "none-pending",
            "no pending delivery of the target matches the requested id and the expected binding",
            ("ClaimMiss",),
        ),
        Rule(
            "oldest-pending",
            "otherwise",
            ("Claimed",),
            "the oldest match by (created_at, id) becomes claimed: generation + 1, lease_until = now + "
            "lease_seconds, claimed_at = now, claim_key = the request key (or none)",
            ("deliveries",),
        ),
    ),
    Renew: (
        *_COMMUNITY_RULES,
        Rule(
            "not-held",
            "the row is not claimed at the lease's generation by its target, or its lease_until < now",
            ("LeaseLost",),
        ),
        Rule("held", "otherwise", ("Renewed",), "lease_until = now + lease_seconds", ("deliveries",)),
    ),
    Finish: (
        *_COMMUNITY_RULES,
        Rule(
            "held",
            "the row is claimed at the lease's generation by its target, and lease_until >= now",
            ("Settled(finished)", "Settled(failed)"),
            "the row takes the requested terminal status; finished_at = now; lease fields and claim_key cleared",
            ("deliveries",),
        ),
        Rule(
            "same-holder-settled",
            "the row is terminal at the lease's generation and target: the holder retries",
            ("AlreadyTerminal(finished)", "AlreadyTerminal(failed)"),
            f"{_NONE}: the recorded status is reported",
        ),
        Rule("not-held", "otherwise", ("LeaseLost",)),
    ),
    Reap: (
        Rule(
            "sweep",
            "always",
            ("Reaped",),
            "every claimed row of an active community with lease_until < now becomes pending: generation + 1, "
            "lease fields cleared; `count` says how many",
            ("deliveries",),
        ),
    ),
    AdvanceClock: (Rule("always", "always", ("Ok",), "now moves forward by `by`", ("now",)),),
    GetDelivery: (
        Rule("missing", "no live delivery has this key", ("NotFound",)),
        Rule("found", "otherwise", ("Found",), f"{_NONE}: the row is returned"),
    ),
}


# -- the steps -------------------------------------------------------------

Step: TypeAlias = tuple[DeliverySystem, Outcome]
Decided: TypeAlias = tuple[DeliverySystem, Outcome, str]  # ... and the guard of the rule that decided it


def refused(s: Any, refusal: Rejection) -> tuple[Any, Rejection, str]:
    """The step of a failed community check, with its rule's guard."""
    return s, refusal, COMMUNITY_UNKNOWN if isinstance(refusal, UnknownCommunity) else COMMUNITY_NOT_ACTIVE


def _create_community(s: DeliverySystem, c: CreateCommunity) -> Decided:
    if c.community_id in s.communities:
        return s, AlreadyExists("community", c.community_id, c.community_id), "exists"
    return attrs.evolve(s, communities=s.communities.set(c.community_id, CommunityState.ACTIVE)), Ok(), "new"


def _set_community_state(s: DeliverySystem, c: SetCommunityState) -> Decided:
    current = s.communities.get(c.community_id)
    if current is None:
        return s, UnknownCommunity(c.community_id), COMMUNITY_UNKNOWN
    if current is CommunityState.DELETED:
        return s, CommunityNotWritable(c.community_id, current), "deleted"
    return attrs.evolve(s, communities=s.communities.set(c.community_id, c.state)), Ok(), "set"


def _delete_community(s: DeliverySystem, c: DeleteCommunity) -> Decided:
    cid = c.community_id
    if cid not in s.communities:
        return s, UnknownCommunity(cid), COMMUNITY_UNKNOWN
    # The community row stays as a tombstone so its id is never reused.
    return (
        DeliverySystem(
            now=s.now,
            communities=s.communities.set(cid, CommunityState.DELETED),
            workflows=frozenset(k for k in s.workflows if k[0] != cid),
            runs=s.runs.remove_where(lambda k, _: k[0] == cid),
            events=frozenset(k for k in s.events if k[0] != cid),
            deliveries=s.deliveries.remove_where(lambda k, _: k[0] == cid),
            retired=frozenset(k for k in s.retired if k[0] != cid),  # the tombstone retires them all
        ),
        Ok(),
        "purge",
    )


def _create_workflow(s: DeliverySystem, c: CreateWorkflow) -> Decided:
    key = (c.community_id, c.workflow_id)
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    if key in s.workflows:
        return s, AlreadyExists("workflow", *key), "exists"
    return attrs.evolve(s, workflows=s.workflows | {key}), Ok(), "new"


def _delete_workflow(s: DeliverySystem, c: DeleteWorkflow) -> Decided:
    key = (c.community_id, c.workflow_id)
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    if key not in s.workflows:
        return s, NotFound("workflow", *key), "missing"
    # Cascades: the workflow's runs, and their deliveries.
    s = attrs.evolve(
        s,
        workflows=s.workflows - {key},
        runs=s.runs.remove_where(lambda k, w: k[0] == c.community_id and w == c.workflow_id),
    )
    return (
        s.without_deliveries(lambda d: d.key[0] == c.community_id and d.binding.workflow_id == c.workflow_id),
        Ok(),
        "cascade",
    )


def _create_run(s: DeliverySystem, c: CreateRun) -> Decided:
    key = (c.community_id, c.run_id)
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    if (c.community_id, c.workflow_id) not in s.workflows:
        return s, NotFound("workflow", c.community_id, c.workflow_id), "no-workflow"
    if key in s.runs:
        return s, AlreadyExists("run", *key), "exists"
    return attrs.evolve(s, runs=s.runs.set(key, c.workflow_id)), Ok(), "new"


def _delete_run(s: DeliverySystem, c: DeleteRun) -> Decided:
    key = (c.community_id, c.run_id)
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    if key not in s.runs:
        return s, NotFound("run", *key), "missing"
    s = attrs.evolve(s, runs=s.runs.remove_where(lambda k, _: k == key))
    return s.without_deliveries(lambda d: (d.key[0], d.binding.run_id) == key), Ok(), "cascade"


def _publish_event(s: DeliverySystem, c: PublishEvent) -> Decided:
    key = (c.community_id, c.event_id)
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    if key in s.events:
        return s, AlreadyExists("event", *key), "exists"
    return attrs.evolve(s, events=s.events | {key}), Ok(), "new"


def _delete_event(s: DeliverySystem, c: DeleteEvent) -> Decided:
    key = (c.community_id, c.event_id)
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    if key not in s.events:
        return s, NotFound("event", *key), "missing"
    s = attrs.evolve(s, events=s.events - {key})
    return s.without_deliveries(lambda d: (d.key[0], d.binding.message_event_id) == key), Ok(), "cascade"


def _commit_deliveries(s: DeliverySystem, c: CommitDeliveries) -> Decided:
    cid = c.community_id
    if refusal := community_refusal(s.communities, cid):
        return refused(s, refusal)
    run_workflow = s.runs.get((cid, c.run_id))
    if run_workflow is None:
        return s, NotFound("run", cid, c.run_id), "no-run"
    for new in c.deliveries:
        if new.binding.workflow_id != run_workflow:
            return s, WorkflowMismatch(c.run_id, run_workflow, new.binding.workflow_id), "workflow-mismatch"
    for new in c.deliveries:
        if (cid, new.binding.message_event_id) not in s.events:
            return s, NotFound("event", cid, new.binding.message_event_id), "no-event"

    def identity(b: Binding) -> tuple[Any, ...]:
        return (b.community_id, b.run_id, b.step_id, b.target_pubkey)

    step_identity = (cid, c.run_id, c.step_id)
    existed = any(identity(d.binding)[:3] == step_identity for d in s.deliveries.values())
    taken = {identity(d.binding) for d in s.deliveries.values()}
    if all(identity(new.binding) in taken for new in c.deliveries):
        return s, Committed((), existed), "retry"
    start = s
    created = []
    for new in c.deliveries:
        if identity(new.binding) in taken:
            continue  # a producer retry: that target is a no-op
        if (cid, new.id) in s.deliveries or (cid, new.id) in s.retired:
            return start, DeliveryIdTaken(cid, new.id), "id-taken"  # all targets roll back
        s = s.with_delivery(
            Delivery(
                id=new.id,
                binding=new.binding,
                status=Status.PENDING,
                lease_generation=0,
                lease_until=None,
                claimed_at=None,
                finished_at=None,
                created_at=s.now,
            )
        )
        taken.add(identity(new.binding))
        created.append(new.id)
    return s, Committed(tuple(created), existed), "commit"


def claim_order(s: DeliverySystem, c: Claim) -> list[Delivery]:
    """The pending deliveries `c` may claim, oldest first (by created_at, then id): it takes the first."""
    candidates = [
        d
        for d in s.deliveries.values()
        if d.key[0] == c.community_id
        and d.binding.target_pubkey == c.target_pubkey
        and d.status is Status.PENDING
        and (c.delivery_id is None or d.id == c.delivery_id)
        and (c.expected is None or d.binding == c.expected)
    ]
    return sorted(candidates, key=lambda d: (d.created_at, d.id))


def _claim(s: DeliverySystem, c: Claim) -> Decided:
    if c.expected is not None and (
        c.expected.community_id != c.community_id or c.expected.target_pubkey != c.target_pubkey
    ):
        return s, ClaimMiss(), "out-of-scope"
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    if c.request_key is not None:
        for d in s.deliveries.values():
            if (
                d.key[0] == c.community_id
                and d.binding.target_pubkey == c.target_pubkey
                and d.status is Status.CLAIMED
                and d.claim_key == c.request_key
                and d.lease_until is not None
                and d.lease_until >= s.now
            ):
                return s, Claimed(lease_of(d), d), "retried"
    candidates = claim_order(s, c)
    if not candidates:
        return s, ClaimMiss(), "none-pending"
    oldest = candidates[0]
    claimed = attrs.evolve(
        oldest,
        status=Status.CLAIMED,
        lease_generation=oldest.lease_generation + 1,
        lease_until=s.now + dt.timedelta(seconds=c.lease_seconds),
        claimed_at=s.now,
        claim_key=c.request_key,
    )
    return s.with_delivery(claimed), Claimed(lease_of(claimed), claimed), "oldest-pending"


def lease_of(row: Delivery) -> Lease:
    """The lease a claimed row stands for: its community, id, target, generation and deadline."""
    assert row.lease_until is not None
    return Lease(
        community_id=row.key[0],
        delivery_id=row.id,
        target_pubkey=row.binding.target_pubkey,
        lease_generation=row.lease_generation,
        lease_until=row.lease_until,
    )


def _held(s: DeliverySystem, lease: Lease) -> Delivery | None:
    """The row this lease still governs: claimed, same generation and target, unexpired."""
    row = s.deliveries.get((lease.community_id, lease.delivery_id))
    if (
        row is not None
        and row.status is Status.CLAIMED
        and row.lease_generation == lease.lease_generation
        and row.binding.target_pubkey == lease.target_pubkey
        and row.lease_until is not None
        and row.lease_until >= s.now
    ):
        return row
    return None


def _renew(s: DeliverySystem, c: Renew) -> Decided:
    if refusal := community_refusal(s.communities, c.lease.community_id):
        return refused(s, refusal)
    row = _held(s, c.lease)
    if row is None:
        return s, LeaseLost(), "not-held"
    lease_until = s.now + dt.timedelta(seconds=c.lease_seconds)
    renewed = attrs.evolve(row, lease_until=lease_until)
    return s.with_delivery(renewed), Renewed(lease_until), "held"


def _finish(s: DeliverySystem, c: Finish) -> Decided:
    lease = c.lease
    if refusal := community_refusal(s.communities, lease.community_id):
        return refused(s, refusal)
    row = _held(s, lease)
    if row is not None:
        done = attrs.evolve(row, status=c.outcome, finished_at=s.now, lease_until=None, claimed_at=None, claim_key=None)
        return s.with_delivery(done), Settled(c.outcome), "held"
    # Reconciliation of an uncertain completion: only the same holder (same
    # generation and target — finish never bumps the generation) is told
    # the recorded terminal; anyone else lost the lease.
    row = s.deliveries.get((lease.community_id, lease.delivery_id))
    if (
        row is not None
        and row.status.terminal
        and row.lease_generation == lease.lease_generation
        and row.binding.target_pubkey == lease.target_pubkey
    ):
        return s, AlreadyTerminal(row.status), "same-holder-settled"
    return s, LeaseLost(), "not-held"


def _reap(s: DeliverySystem, c: Reap) -> Decided:
    expired = [
        d
        for d in s.deliveries.values()
        if d.status is Status.CLAIMED
        and d.lease_until is not None
        and d.lease_until < s.now
        and s.communities.get(d.key[0]) is CommunityState.ACTIVE
    ]
    for d in expired:
        s = s.with_delivery(
            attrs.evolve(
                d,
                status=Status.PENDING,
                lease_generation=d.lease_generation + 1,
                lease_until=None,
                claimed_at=None,
                claim_key=None,
            )
        )
    return s, Reaped(len(expired)), "sweep"


def _advance_clock(s: DeliverySystem, c: AdvanceClock) -> Decided:
    return attrs.evolve(s, now=s.now + c.by), Ok(), "always"


def _get_delivery(s: DeliverySystem, c: GetDelivery) -> Decided:
    row = s.deliveries.get((c.community_id, c.delivery_id))
    if row is None:
        return s, NotFound("delivery", c.community_id, c.delivery_id), "missing"
    return s, Found(row), "found"


_HANDLERS: dict[type, Callable[[DeliverySystem, Any], Decided]] = {
    CreateCommunity: _create_community,
    SetCommunityState: _set_community_state,
    DeleteCommunity: _delete_community,
    CreateWorkflow: _create_workflow,
    DeleteWorkflow: _delete_workflow,
    CreateRun: _create_run,
    DeleteRun: _delete_run,
    PublishEvent: _publish_event,
    DeleteEvent: _delete_event,
    CommitDeliveries: _commit_deliveries,
    Claim: _claim,
    Renew: _renew,
    Finish: _finish,
    Reap: _reap,
    AdvanceClock: _advance_clock,
    GetDelivery: _get_delivery,
}

decide: Callable[[DeliverySystem, Command], Decision[DeliverySystem]] = decider(
    RULES, _HANDLERS, variant, OUTCOME_VARIANTS, "delivery"
)


# -- sending a command again ----------------------------------------------------------


_TELLS_EXISTS = ("AlreadyExists",)
_TELLS_GONE = ("NotFound",)
RESENDS: dict[type, Resend] = {
    CreateCommunity: Resend(True, ("Ok",), _TELLS_EXISTS, "the community exists"),
    SetCommunityState: Resend(True, ("Ok",), ("Ok",), "the state is already the one asked for"),
    DeleteCommunity: Resend(True, ("Ok",), ("Ok",), "the tombstone stays; its purge has nothing left to remove"),
    CreateWorkflow: Resend(True, ("Ok",), _TELLS_EXISTS, "the workflow exists"),
    DeleteWorkflow: Resend(True, ("Ok",), _TELLS_GONE, "the workflow is gone"),
    CreateRun: Resend(True, ("Ok",), _TELLS_EXISTS, "the run exists"),
    DeleteRun: Resend(True, ("Ok",), _TELLS_GONE, "the run is gone"),
    PublishEvent: Resend(True, ("Ok",), _TELLS_EXISTS, "the event exists"),
    DeleteEvent: Resend(True, ("Ok",), _TELLS_GONE, "the event is gone"),
    CommitDeliveries: Resend(
        True, ("Committed",), ("Committed",), "a producer retry: `created` is empty and `identity_existed` true"
    ),
    Claim: Resend(
        False,
        ("Claimed",),
        ("Claimed",),
        "without a request key, a second claim takes the next pending delivery (or misses): the first lease is "
        "orphaned until it expires and is reaped; with one, it returns the same lease, while that is held",
        safe_with="request_key",
    ),
    Renew: Resend(
        True, ("Renewed",), ("Renewed",), "the lease is extended from now again: at the same instant, to the same end"
    ),
    Finish: Resend(
        True,
        ("Settled(finished)", "Settled(failed)"),
        ("AlreadyTerminal(finished)", "AlreadyTerminal(failed)"),
        "the same holder is told the terminal it recorded (AlreadyTerminal of the same status)",
    ),
    Reap: Resend(True, ("Reaped",), ("Reaped",), "nothing expired is left to reap: Reaped(0)"),
    AdvanceClock: Resend(False, ("Ok",), (), "the test clock moves again"),
    GetDelivery: Resend(True, ("Found", "NotFound"), (), "a read"),
}
assert RESENDS.keys() == OUTCOME_VARIANTS.keys()


def resend_violations(after: DeliverySystem, command: Command, outcome: Outcome) -> list[str]:
    """How sending `command` again in `after`, the state its first sending left with
    `outcome`, breaks the command's resend rule (`RESENDS`); empty if it keeps it."""
    rule = RESENDS[type(command)]
    if not rule.safe_for(command):
        return []
    again = decide(after, command)
    problems = []
    if again.state != after:
        changed = ", ".join(changed_fields(after, again.state))
        problems.append(f"a resend changed {changed}: it is declared safe ({rule.why})")
    first, second = variant(outcome), variant(again.outcome)
    if first in rule.took_effect:
        told: tuple[str, ...] = rule.tells or (first,)
        if isinstance(outcome, Settled):
            told = (f"AlreadyTerminal({outcome.status.value})",)
        if second not in told:
            problems.append(f"a resend after {first} answered {second}, not {' or '.join(told)} ({rule.why})")
        if isinstance(outcome, Committed) and again.outcome != Committed((), True):
            problems.append(f"a resend of a commit answered {again.outcome}, not Committed((), True)")
        if isinstance(outcome, Claimed) and again.outcome != outcome:
            problems.append(f"a resend of a keyed claim answered {again.outcome}, not the same {outcome}")
        if isinstance(outcome, Reaped) and again.outcome != Reaped(0):
            problems.append(f"a resend of a sweep answered {again.outcome}, not Reaped(0)")
    return problems


def step(state: DeliverySystem, command: Command) -> Step:
    """Apply one command: the next state and the command's one outcome."""
    decision = decide(state, command)
    return decision.state, decision.outcome
