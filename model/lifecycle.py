"""The workflow definition lifecycle and atomic run admission: the executable spec.

A workflow definition is a signed, replaceable event addressed by its coordinate
(community, workflow UUID), authored by its owner and scoped to one channel; the runtime
keeps a projection of the current head. Replicas cache enabled records for up to
`CACHE_TTL` without cross-replica invalidation, so one may select a stale record: a run is
admitted only if the *selected* record still matches the current row in every field that
identifies a revision, and then runs exactly that record, now and on every later resume.

`step(state, command)` returns the next state and exactly one outcome; a
`Rejection` never changes the state. Checks run in a fixed order:
  1. value rules (at construction);
  2. the community: unknown, or not `active` (refuses every write);
  3. the operation's own lookups, authority and ordering rules.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

import attrs

from leaseproof.model.binding import is_instant, is_key, is_uuid, short_key, to_utc
from leaseproof.model.delivery import (
    COMMUNITY_NOT_ACTIVE,
    COMMUNITY_UNKNOWN,
    AdvanceClock,
    CommunityNotWritable,
    CommunityState,
    CreateCommunity,
    NotFound,
    Ok,
    Rejection,
    SetCommunityState,
    UnknownCommunity,
    _instance_of,
    community_refusal,
    refused,
)
from leaseproof.model.errors import InvalidValue
from leaseproof.model.frozenmap import FrozenMap
from leaseproof.model.rules import Decision, Rule, decider

# How long a replica serves its cache before it reloads (the seed's ten seconds).
CACHE_TTL = dt.timedelta(seconds=10)
MAX_ACTIONS = 8
DOORS = ("event", "schedule", "manual", "webhook")
# The deletion paths the lifecycle rejects: each would split head and runtime.
ALTERNATE_DELETIONS = (
    "name",
    "numeric-alias",
    "event-id-target",
    "admin",
    "report-enforcement",
    "report-enforcement-retry",
)


def _one_of(choices: tuple[str, ...]) -> Any:
    def validator(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices:
            raise InvalidValue(attribute.name, value, f"must be one of {', '.join(choices)}")

    return validator


def _as_tuple(value: Any) -> Any:
    """Lists become tuples; anything else (a string, a number) is left for the validator to refuse."""
    return tuple(value) if isinstance(value, list) else value


def _actions(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not 0 < len(value) <= MAX_ACTIONS:
        raise InvalidValue(attribute.name, value, f"must be 1 to {MAX_ACTIONS} actions")
    for action in value:
        if not isinstance(action, str) or not action.strip() or len(action) > 64 or "\x00" in action:
            raise InvalidValue(attribute.name, value, "each action must be non-blank text of at most 64 characters")
        try:
            action.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidValue(attribute.name, value, "each action must be valid Unicode text") from None


def _optional_bool(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise InvalidValue(attribute.name, value, "must be true, false or omitted")


def _run_id(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidValue(attribute.name, value, "must be a positive integer")


# -- values ----------------------------------------------------------------


@attrs.frozen
class Definition:
    """A definition's content: what a run executes, and its `enabled` value
    (omitted means enabled)."""

    actions: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_actions)
    enabled: bool | None = attrs.field(default=None, validator=_optional_bool)

    @property
    def is_enabled(self) -> bool:
        return self.enabled is not False

    @property
    def hash(self) -> bytes:
        """The definition hash: SHA-256 of the canonical JSON of the content."""
        content = {"actions": list(self.actions), "enabled": self.enabled}
        return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).digest()


@attrs.frozen
class DefinitionEvent:
    """A signed save of one coordinate (kind 30620)."""

    event_id: bytes = attrs.field(validator=is_key, repr=short_key)
    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)
    author: bytes = attrs.field(validator=is_key, repr=short_key)
    channel_id: uuid.UUID = attrs.field(validator=is_uuid)
    created_at: dt.datetime = attrs.field(converter=to_utc, validator=is_instant)
    definition: Definition = attrs.field(validator=_instance_of(Definition))


@attrs.frozen
class Head:
    """The signed head of a coordinate: the newest accepted save."""

    event_id: bytes = attrs.field(validator=is_key, repr=short_key)
    author: bytes = attrs.field(validator=is_key, repr=short_key)
    channel_id: uuid.UUID = attrs.field(validator=is_uuid)
    created_at: dt.datetime = attrs.field(converter=to_utc, validator=is_instant)
    definition: Definition = attrs.field(validator=_instance_of(Definition))


@attrs.frozen
class Record:
    """The runtime projection of a head: what replicas cache and runs pin.

    `incarnation` is the `created_at` of the save that (re)created the
    coordinate, so an identical recreation is still a different record.
    `revision` is the event id of the head it projects: every accepted save
    is a new revision, even one that restores earlier content.
    """

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)
    owner: bytes = attrs.field(validator=is_key, repr=short_key)
    channel_id: uuid.UUID = attrs.field(validator=is_uuid)
    hash: bytes = attrs.field(validator=is_key, repr=short_key)
    enabled: bool = attrs.field(validator=_instance_of(bool))
    incarnation: dt.datetime = attrs.field(converter=to_utc, validator=is_instant)
    actions: tuple[str, ...] = attrs.field(converter=_as_tuple, validator=_actions)
    revision: bytes = attrs.field(validator=is_key, repr=short_key)

    @property
    def coordinate(self) -> tuple[uuid.UUID, uuid.UUID]:
        return (self.community_id, self.workflow_id)


@attrs.frozen
class Cache:
    """One replica's cache of enabled records, loaded at `loaded_at`."""

    loaded_at: dt.datetime
    records: FrozenMap[tuple[uuid.UUID, uuid.UUID], Record] = FrozenMap()


@attrs.frozen
class Run:
    """An admitted run, pinned to the exact record it was admitted for."""

    run_id: int
    door: str
    record: Record
    admitted_at: dt.datetime


# -- commands --------------------------------------------------------------


@attrs.frozen
class SetAuthority:
    """Grant (`active=True`) or revoke a member's authority in a channel."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    channel_id: uuid.UUID = attrs.field(validator=is_uuid)
    member: bytes = attrs.field(validator=is_key, repr=short_key)
    active: bool = attrs.field(validator=_instance_of(bool))


@attrs.frozen
class SaveDefinition:
    """Create, update, enable or disable: one signed event."""

    event: DefinitionEvent = attrs.field(validator=_instance_of(DefinitionEvent))


@attrs.frozen
class DeleteDefinition:
    """The canonical deletion, signed by the definition's author at `created_at`."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)
    author: bytes = attrs.field(validator=is_key, repr=short_key)
    created_at: dt.datetime = attrs.field(converter=to_utc, validator=is_instant)


@attrs.frozen
class AlternateDelete:
    """A deletion through a path other than the author's canonical one."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)
    path: str = attrs.field(validator=_one_of(ALTERNATE_DELETIONS))


@attrs.frozen
class RefreshCache:
    replica: str = attrs.field(validator=_instance_of(str))


@attrs.frozen
class Fire:
    """A trigger through one door on one replica, for one coordinate."""

    replica: str = attrs.field(validator=_instance_of(str))
    door: str = attrs.field(validator=_one_of(DOORS))
    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)


@attrs.frozen
class ResumeRun:
    """Continue an admitted run (for example after an approval wait)."""

    run_id: int = attrs.field(validator=_run_id)


Command: TypeAlias = (
    CreateCommunity
    | SetCommunityState
    | SetAuthority
    | SaveDefinition
    | DeleteDefinition
    | AlternateDelete
    | RefreshCache
    | Fire
    | ResumeRun
    | AdvanceClock
)


# -- outcomes --------------------------------------------------------------


@attrs.frozen
class Created:
    """The save (re)created the coordinate as a new incarnation."""

    incarnation: dt.datetime


@attrs.frozen
class Updated:
    """The save replaced the head; `enabled` is the projected value."""

    enabled: bool


@attrs.frozen
class Superseded:
    """The event is not newer than the head: nothing changed."""

    head_created_at: dt.datetime


@attrs.frozen
class BeforeCutoff:
    """The coordinate was deleted at `cutoff`; an event at or before it cannot revive it."""

    cutoff: dt.datetime


@attrs.frozen
class Deleted:
    cutoff: dt.datetime


@attrs.frozen
class Admitted:
    """A run id, executing exactly the selected record."""

    run_id: int
    record: Record


@attrs.frozen
class NotSelected:
    """The replica's cache holds no enabled record for the coordinate: no run, no action."""


@attrs.frozen
class AdmissionRefused:
    """The selected record is not the current, enabled revision of an owner with
    active channel authority: no run, no action."""


@attrs.frozen
class Resumed:
    actions: tuple[str, ...]


@attrs.frozen
class ResumeRefused:
    """The pinned revision no longer passes the admission guard: fail closed."""


@attrs.frozen
class NoAuthority(Rejection):
    """The author lacks active authority in the channel."""

    channel_id: uuid.UUID
    member: bytes


@attrs.frozen
class NotAuthor(Rejection):
    """Only the definition's signing author manages it (and in its channel)."""

    workflow_id: uuid.UUID
    author: bytes


@attrs.frozen
class UnknownReplica(Rejection):
    replica: str


@attrs.frozen
class AlternateDeletionRejected(Rejection):
    path: str


@attrs.frozen
class UnknownRun(Rejection):
    run_id: int


Outcome: TypeAlias = Any

_COMMUNITY = ("UnknownCommunity", "CommunityNotWritable")
OUTCOME_VARIANTS: dict[type, tuple[str, ...]] = {
    CreateCommunity: ("Ok", "AlreadyExists"),
    SetCommunityState: ("Ok", "UnknownCommunity"),  # no command here deletes a community
    SetAuthority: ("Ok", *_COMMUNITY),
    SaveDefinition: ("Created", "Updated", "Superseded", "BeforeCutoff", *_COMMUNITY, "NoAuthority", "NotAuthor"),
    DeleteDefinition: ("Deleted", "Superseded", *_COMMUNITY, "NotFound", "NoAuthority", "NotAuthor"),
    AlternateDelete: ("AlternateDeletionRejected",),
    RefreshCache: ("Ok", "UnknownReplica"),
    Fire: ("Admitted", "NotSelected", "AdmissionRefused", "UnknownReplica", *_COMMUNITY),
    ResumeRun: ("Resumed", "ResumeRefused", "UnknownRun", "CommunityNotWritable"),
    AdvanceClock: ("Ok",),
}


def variant(outcome: Outcome) -> str:
    return type(outcome).__name__


# A coordinate's life: "live" has both head and record, "deleted" neither
# but a cutoff; `enabled` is a field of a live record, not a state. The
# rules that move a coordinate along each transition, as "Operation/guard".
ABSENT, LIVE, DELETED = "absent", "live", "deleted"
COORDINATE_TRANSITIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (ABSENT, LIVE): ("SaveDefinition/create",),
    (LIVE, LIVE): ("SaveDefinition/update",),
    (LIVE, DELETED): ("DeleteDefinition/delete",),
    (DELETED, LIVE): ("SaveDefinition/create",),
}


# -- state -----------------------------------------------------------------

Coordinate: TypeAlias = tuple[uuid.UUID, uuid.UUID]


@attrs.frozen
class LifecycleSystem:
    """Everything the lifecycle persists, the replicas' caches, and the clock."""

    now: dt.datetime = attrs.field(converter=to_utc, validator=is_instant)
    communities: FrozenMap[uuid.UUID, CommunityState] = FrozenMap()
    # (community, channel, member) of every member with active authority.
    authority: frozenset[tuple[uuid.UUID, uuid.UUID, bytes]] = frozenset()
    heads: FrozenMap[Coordinate, Head] = FrozenMap()
    runtime: FrozenMap[Coordinate, Record] = FrozenMap()
    cutoffs: FrozenMap[Coordinate, dt.datetime] = FrozenMap()
    runs: FrozenMap[int, Run] = FrozenMap()
    caches: FrozenMap[str, Cache] = FrozenMap()
    # Every run's executed actions, in order. Only the order within a run is
    # observable: runs on different connections execute concurrently, so no
    # order across runs is specified.
    executed: FrozenMap[int, tuple[str, ...]] = FrozenMap()


def initial_state(now: dt.datetime, replicas: tuple[str, ...] = ("r1", "r2")) -> LifecycleSystem:
    """Empty, with each replica's (empty) cache loaded now."""
    return LifecycleSystem(now=now, caches=FrozenMap({r: Cache(loaded_at=now) for r in replicas}))


def coordinate_status(s: LifecycleSystem, coordinate: Coordinate) -> str:
    if coordinate in s.heads:
        return LIVE
    return DELETED if coordinate in s.cutoffs else ABSENT


def _enabled_records(s: LifecycleSystem) -> FrozenMap[Coordinate, Record]:
    return FrozenMap((k, r) for k, r in s.runtime.items() if r.enabled)


# -- the rules (see `rules`; the first rule whose guard holds decides) -------

_COMMUNITY_RULES = (
    Rule(COMMUNITY_UNKNOWN, "the community was never created", ("UnknownCommunity",)),
    Rule(COMMUNITY_NOT_ACTIVE, "the community is quiescing or fenced", ("CommunityNotWritable",)),
)
_RELOAD = "an expired cache (loaded at least CACHE_TTL ago) is reloaded first"


def _refusals(outcome: str, effect: str, changes: tuple[str, ...]) -> tuple[Rule, ...]:
    """The admission guard's checks, in order: each refuses with `outcome`."""
    return (
        Rule("gone", "the coordinate has no current row (deleted)", (outcome,), effect, changes),
        Rule("disabled", "the current row is disabled", (outcome,), effect, changes),
        Rule(
            "changed",
            "the current row's owner, channel, hash, incarnation or actions differ from the record's",
            (outcome,),
            effect,
            changes,
        ),
        Rule(
            "unauthorised",
            "the row's owner no longer holds active authority in its channel",
            (outcome,),
            effect,
            changes,
        ),
    )


RULES: dict[type, tuple[Rule, ...]] = {
    CreateCommunity: (
        Rule("exists", "the community already exists", ("AlreadyExists",)),
        Rule("new", "otherwise", ("Ok",), "the community is created active", ("communities",)),
    ),
    SetCommunityState: (
        _COMMUNITY_RULES[0],
        Rule("set", "otherwise", ("Ok",), "the community takes the requested state", ("communities",)),
    ),
    SetAuthority: (
        *_COMMUNITY_RULES,
        Rule(
            "set", "otherwise", ("Ok",), "the member's authority in the channel is granted or revoked", ("authority",)
        ),
    ),
    SaveDefinition: (
        *_COMMUNITY_RULES,
        Rule("no-authority", "the author lacks active authority in the event's channel", ("NoAuthority",)),
        Rule("not-author", "a head exists with another author or channel", ("NotAuthor",)),
        Rule("not-newer", "a head exists and the event's created_at <= the head's", ("Superseded",)),
        Rule(
            "before-cutoff", "no head exists and the event's created_at <= the coordinate's cutoff", ("BeforeCutoff",)
        ),
        Rule(
            "create",
            "no head exists",
            ("Created",),
            "the event becomes the head, projected to a runtime record whose incarnation is the event's created_at",
            ("heads", "runtime"),
        ),
        Rule(
            "update",
            "otherwise",
            ("Updated",),
            "the event becomes the head and its projection the runtime record, keeping the incarnation",
            ("heads", "runtime"),
        ),
    ),
    DeleteDefinition: (
        *_COMMUNITY_RULES,
        Rule("no-head", "the coordinate has no head", ("NotFound",)),
        Rule("not-author", "the deleter is not the head's author", ("NotAuthor",)),
        Rule("no-authority", "the author lacks active authority in the head's channel", ("NoAuthority",)),
        Rule("older", "the deletion's created_at < the head's", ("Superseded",)),
        Rule(
            "delete",
            "otherwise",
            ("Deleted",),
            "head and runtime record are removed together; the cutoff becomes the deletion's created_at",
            ("heads", "runtime", "cutoffs"),
        ),
    ),
    AlternateDelete: (
        Rule("always", "always: only the author's canonical deletion exists", ("AlternateDeletionRejected",)),
    ),
    RefreshCache: (
        Rule("unknown-replica", "no replica has this name", ("UnknownReplica",)),
        Rule("reload", "otherwise", ("Ok",), "the cache holds every enabled record, loaded now", ("caches",)),
    ),
    Fire: (
        Rule("unknown-replica", "no replica has this name", ("UnknownReplica",)),
        *_COMMUNITY_RULES,
        Rule(
            "not-selected",
            "the replica's cache holds no enabled record for the coordinate",
            ("NotSelected",),
            f"{_RELOAD}; no run",
            ("caches",),
        ),
        *_refusals("AdmissionRefused", f"{_RELOAD}; no run", ("caches",)),
        Rule(
            "admit",
            "otherwise",
            ("Admitted",),
            f"{_RELOAD}; a run with the next id is admitted, pinned to the current row, and executes its actions",
            ("caches", "runs", "executed"),
        ),
    ),
    ResumeRun: (
        Rule("unknown-run", "no run has this id", ("UnknownRun",)),
        Rule(COMMUNITY_NOT_ACTIVE, "the run's community is quiescing or fenced", ("CommunityNotWritable",)),
        *_refusals("ResumeRefused", "nothing changes: fail closed", ()),
        Rule("revised", "the current row is a later revision, even with the same content", ("ResumeRefused",)),
        Rule("resume", "otherwise", ("Resumed",), "the run executes its pinned actions again", ("executed",)),
    ),
    AdvanceClock: (Rule("always", "always", ("Ok",), "now moves forward by `by`", ("now",)),),
}

Step: TypeAlias = tuple[LifecycleSystem, Outcome]
Decided: TypeAlias = tuple[LifecycleSystem, Outcome, str]  # ... and the guard of the rule that decided it


def _create_community(s: LifecycleSystem, c: CreateCommunity) -> Decided:
    from leaseproof.model.delivery import AlreadyExists

    if c.community_id in s.communities:
        return s, AlreadyExists("community", c.community_id, c.community_id), "exists"
    return attrs.evolve(s, communities=s.communities.set(c.community_id, CommunityState.ACTIVE)), Ok(), "new"


def _set_community_state(s: LifecycleSystem, c: SetCommunityState) -> Decided:
    if c.community_id not in s.communities:
        return s, UnknownCommunity(c.community_id), COMMUNITY_UNKNOWN
    return attrs.evolve(s, communities=s.communities.set(c.community_id, c.state)), Ok(), "set"


def _set_authority(s: LifecycleSystem, c: SetAuthority) -> Decided:
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    member = (c.community_id, c.channel_id, c.member)
    authority = s.authority | {member} if c.active else s.authority - {member}
    return attrs.evolve(s, authority=authority), Ok(), "set"


def project(e: DefinitionEvent, incarnation: dt.datetime) -> Record:
    """The runtime record an accepted save writes."""
    return Record(
        community_id=e.community_id,
        workflow_id=e.workflow_id,
        owner=e.author,
        channel_id=e.channel_id,
        hash=e.definition.hash,
        enabled=e.definition.is_enabled,
        incarnation=incarnation,
        actions=e.definition.actions,
        revision=e.event_id,
    )


def _save(s: LifecycleSystem, c: SaveDefinition) -> Decided:
    e = c.event
    coordinate = (e.community_id, e.workflow_id)
    if refusal := community_refusal(s.communities, e.community_id):
        return refused(s, refusal)
    if (e.community_id, e.channel_id, e.author) not in s.authority:
        return s, NoAuthority(e.channel_id, e.author), "no-authority"
    head = s.heads.get(coordinate)
    if head is not None and (head.author, head.channel_id) != (e.author, e.channel_id):
        return s, NotAuthor(e.workflow_id, e.author), "not-author"
    if head is not None and e.created_at <= head.created_at:
        return s, Superseded(head.created_at), "not-newer"
    cutoff = s.cutoffs.get(coordinate)
    if head is None and cutoff is not None and e.created_at <= cutoff:
        return s, BeforeCutoff(cutoff), "before-cutoff"
    # An update keeps the incarnation; a (re)creation starts a new one.
    incarnation = e.created_at if head is None else s.runtime[coordinate].incarnation
    record = project(e, incarnation)
    new_head = Head(e.event_id, e.author, e.channel_id, e.created_at, e.definition)
    s = attrs.evolve(s, heads=s.heads.set(coordinate, new_head), runtime=s.runtime.set(coordinate, record))
    if head is None:
        return s, Created(incarnation), "create"
    return s, Updated(record.enabled), "update"


def _delete(s: LifecycleSystem, c: DeleteDefinition) -> Decided:
    coordinate = (c.community_id, c.workflow_id)
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    head = s.heads.get(coordinate)
    if head is None:
        return s, NotFound("workflow", c.community_id, c.workflow_id), "no-head"
    if head.author != c.author:
        return s, NotAuthor(c.workflow_id, c.author), "not-author"
    if (c.community_id, head.channel_id, c.author) not in s.authority:
        return s, NoAuthority(head.channel_id, c.author), "no-authority"
    if c.created_at < head.created_at:
        return s, Superseded(head.created_at), "older"
    # Tombstone, runtime removal and cutoff, together.
    doomed = lambda k, _: k == coordinate  # noqa: E731
    return (
        attrs.evolve(
            s,
            heads=s.heads.remove_where(doomed),
            runtime=s.runtime.remove_where(doomed),
            cutoffs=s.cutoffs.set(coordinate, c.created_at),
        ),
        Deleted(c.created_at),
        "delete",
    )


def _alternate_delete(s: LifecycleSystem, c: AlternateDelete) -> Decided:
    return s, AlternateDeletionRejected(c.path), "always"


def _refresh(s: LifecycleSystem, c: RefreshCache) -> Decided:
    if c.replica not in s.caches:
        return s, UnknownReplica(c.replica), "unknown-replica"
    return attrs.evolve(s, caches=s.caches.set(c.replica, Cache(s.now, _enabled_records(s)))), Ok(), "reload"


def _admission_fields(record: Record) -> tuple[Any, ...]:
    """What admission matches, as the seed's admission does: everything but the revision."""
    return (record.owner, record.channel_id, record.hash, record.incarnation, record.actions)


def _admission_refusal(s: LifecycleSystem, record: Record) -> str | None:
    """The admission guard, as the guard of the first check that fails: the
    current row must exist, be enabled, hold the selected content and
    incarnation, and its owner must still hold active authority in its channel."""
    current = s.runtime.get(record.coordinate)
    if current is None:
        return "gone"
    if not current.enabled:  # checked before the content, whose hash would differ too
        return "disabled"
    if _admission_fields(current) != _admission_fields(record):
        return "changed"
    if (current.community_id, current.channel_id, current.owner) not in s.authority:
        return "unauthorised"
    return None


def _fire(s: LifecycleSystem, c: Fire) -> Decided:
    cache = s.caches.get(c.replica)
    if cache is None:
        return s, UnknownReplica(c.replica), "unknown-replica"
    if refusal := community_refusal(s.communities, c.community_id):
        return refused(s, refusal)
    if s.now - cache.loaded_at >= CACHE_TTL:  # an expired cache reloads before it serves
        cache = Cache(s.now, _enabled_records(s))
        s = attrs.evolve(s, caches=s.caches.set(c.replica, cache))
    selected = cache.records.get((c.community_id, c.workflow_id))
    if selected is None:
        return s, NotSelected(), "not-selected"
    if guard := _admission_refusal(s, selected):
        return s, AdmissionRefused(), guard
    # The run pins the row it was admitted against: the selected content, at its current revision.
    admitted = s.runtime[selected.coordinate]
    run_id = max(s.runs, default=0) + 1  # the next id; never one an implementation already used
    run = Run(run_id, c.door, admitted, s.now)
    executed = s.executed.set(run_id, admitted.actions)
    return attrs.evolve(s, runs=s.runs.set(run_id, run), executed=executed), Admitted(run_id, admitted), "admit"


def _resume(s: LifecycleSystem, c: ResumeRun) -> Decided:
    run = s.runs.get(c.run_id)
    if run is None:
        return s, UnknownRun(c.run_id), "unknown-run"
    state = s.communities[run.record.community_id]
    if state is not CommunityState.ACTIVE:
        return s, CommunityNotWritable(run.record.community_id, state), COMMUNITY_NOT_ACTIVE
    if guard := _admission_refusal(s, run.record):
        return s, ResumeRefused(), guard
    # Any accepted save since admission (even one restoring the same content) is a new revision.
    if s.runtime[run.record.coordinate] != run.record:
        return s, ResumeRefused(), "revised"
    executed = s.executed.set(run.run_id, s.executed[run.run_id] + run.record.actions)
    return attrs.evolve(s, executed=executed), Resumed(run.record.actions), "resume"


def _advance_clock(s: LifecycleSystem, c: AdvanceClock) -> Decided:
    return attrs.evolve(s, now=s.now + c.by), Ok(), "always"


_HANDLERS: dict[type, Callable[[LifecycleSystem, Any], Decided]] = {
    CreateCommunity: _create_community,
    SetCommunityState: _set_community_state,
    SetAuthority: _set_authority,
    SaveDefinition: _save,
    DeleteDefinition: _delete,
    AlternateDelete: _alternate_delete,
    RefreshCache: _refresh,
    Fire: _fire,
    ResumeRun: _resume,
    AdvanceClock: _advance_clock,
}

decide: Callable[[LifecycleSystem, Command], Decision[LifecycleSystem]] = decider(
    RULES, _HANDLERS, variant, OUTCOME_VARIANTS, "lifecycle"
)


def step(state: LifecycleSystem, command: Command) -> Step:
    """Apply one command: the next state and the command's one outcome."""
    decision = decide(state, command)
    return decision.state, decision.outcome
