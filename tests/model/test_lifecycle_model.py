"""The lifecycle model alone: its values, saves, deletions, caches, admission, resume, invariants.

No database here. Every test drives `step(state, command)` (or constructs a
value) and asserts exact outcomes and exact state fields. The `apply` helper
also checks, on every step it takes, that the invariants hold, that a
rejection left the state unchanged, that the outcome is one the catalogue
lists and that the step is deterministic; and it records the (command,
variant) pair, so the catalogue test can prove every listed variant reachable.

The world: communities C1 and C2 are active; C_UNKNOWN was never created.
In C1, ALICE has authority in channels CH and CH2, BOB in CH; CAROL has none.
Replicas r1 and r2 exist (their empty caches loaded at T0); r3 does not. The
clock starts at T0 and only `AdvanceClock` moves it. Event times (`at(n)`,
n seconds after T0) are the signers' `created_at` and unrelated to the clock.

The stale-replica scenarios are the review findings of the seed (Jude's P1):
both replicas are warmed, then an update, a disable, a delete, a delete
followed by a changed recreation, or a delete followed by an identical
recreation lands; a fire on the stale replica, through every door, must admit
nothing and execute nothing. Carl's P1 (report-enforcement deletion split the
head from the runtime) is covered by `TestAlternateDeletion`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import inspect
import itertools
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import attrs
import pytest
from helpers import Stepping, raises_invalid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc
from leaseproof.model.delivery import (
    AdvanceClock,
    AlreadyExists,
    CommunityNotWritable,
    CommunityState,
    CreateCommunity,
    NotFound,
    Ok,
    Rejection,
    SetCommunityState,
    UnknownCommunity,
)
from leaseproof.model.frozenmap import FrozenMap
from leaseproof.model.lifecycle import (
    ALTERNATE_DELETIONS,
    CACHE_TTL,
    DOORS,
    MAX_ACTIONS,
    OUTCOME_VARIANTS,
    AdmissionRefused,
    Admitted,
    AlternateDelete,
    AlternateDeletionRejected,
    BeforeCutoff,
    Cache,
    Created,
    Definition,
    DefinitionEvent,
    Deleted,
    DeleteDefinition,
    Fire,
    Head,
    LifecycleSystem,
    NoAuthority,
    NotAuthor,
    NotSelected,
    Record,
    RefreshCache,
    Resumed,
    ResumeRefused,
    ResumeRun,
    Run,
    SaveDefinition,
    SetAuthority,
    Superseded,
    UnknownReplica,
    UnknownRun,
    Updated,
    initial_state,
    step,
    variant,
)
from leaseproof.model.lifecycle_invariants import state_violations, step_violations

# --------------------------------------------------------------------------
# The world

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SECOND = dt.timedelta(seconds=1)
MICROSECOND = dt.timedelta(microseconds=1)

C1, C2, C_UNKNOWN = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)
WF, WF2, WF_NEW = uuid.UUID(int=10), uuid.UUID(int=11), uuid.UUID(int=12)
CH, CH2 = uuid.UUID(int=20), uuid.UUID(int=21)
ALICE, BOB, CAROL = b"\xa1" * 32, b"\xb0" * 32, b"\xc0" * 32

ACTIONS = ("notify", "label")
ACTIONS_B = ("escalate",)
DEF_A = Definition(ACTIONS)  # `enabled` omitted: enabled
DEF_A_ON = Definition(ACTIONS, enabled=True)
DEF_A_OFF = Definition(ACTIONS, enabled=False)
DEF_B = Definition(ACTIONS_B)

ALL_COMMANDS = {
    CreateCommunity,
    SetCommunityState,
    SetAuthority,
    SaveDefinition,
    DeleteDefinition,
    AlternateDelete,
    RefreshCache,
    Fire,
    ResumeRun,
    AdvanceClock,
}


def _stable_id(value: object) -> str:
    """A test id that is the same in every process (a bare object's repr holds its address,
    which differs between pytest-xdist workers, and they must collect the same tests)."""
    return "object()" if type(value) is object else repr(value)


def at(seconds: float) -> dt.datetime:
    """An event's `created_at`: `seconds` after T0."""
    return T0 + dt.timedelta(seconds=seconds)


def event(
    created_at: dt.datetime,
    definition: Definition = DEF_A,
    *,
    author: bytes = ALICE,
    channel: uuid.UUID = CH,
    workflow: uuid.UUID = WF,
    community: uuid.UUID = C1,
) -> DefinitionEvent:
    """A signed save; its id is derived from everything it says."""
    event_id = hashlib.sha256(repr((community, workflow, author, channel, created_at, definition)).encode()).digest()
    return DefinitionEvent(event_id, community, workflow, author, channel, created_at, definition)


def record_of(e: DefinitionEvent, incarnation: dt.datetime | None = None) -> Record:
    """The runtime projection the save `e` must write."""
    return Record(
        community_id=e.community_id,
        workflow_id=e.workflow_id,
        owner=e.author,
        channel_id=e.channel_id,
        hash=e.definition.hash,
        enabled=e.definition.is_enabled,
        incarnation=e.created_at if incarnation is None else incarnation,
        actions=e.definition.actions,
        revision=e.event_id,
    )


def head_of(e: DefinitionEvent) -> Head:
    return Head(e.event_id, e.author, e.channel_id, e.created_at, e.definition)


# --------------------------------------------------------------------------
# Stepping, with invariant checks and catalogue recording


class Recorder:
    """The (command type, variant) pairs observed, split by where the state came from.

    `tainted` holds states built by hand (not reachable through `step` from
    `initial_state`) and every state stepped from one.
    """

    def __init__(self) -> None:
        self.reachable: set[tuple[type, str]] = set()
        self.handmade: set[tuple[type, str]] = set()
        self.tainted: set[LifecycleSystem] = set()


RECORDER = Recorder()


def handmade(s: LifecycleSystem) -> LifecycleSystem:
    """Mark `s` as built by hand: what it reaches does not prove reachability."""
    RECORDER.tainted.add(s)
    return s


def _catalogued(state: LifecycleSystem, command: Any, after: LifecycleSystem, outcome: Any) -> None:
    """The step's outcome is in the catalogue, is recorded, and is what stepping again gives."""
    pair = (type(command), variant(outcome))
    assert pair[1] in OUTCOME_VARIANTS[type(command)], pair
    if state in RECORDER.tainted:
        RECORDER.tainted.add(after)
        RECORDER.handmade.add(pair)
    else:
        RECORDER.reachable.add(pair)
    assert step(state, command) == (after, outcome)  # deterministic


# Every step checked: the invariants, a rejection leaving the state unchanged, and the catalogue.
STEPS = Stepping(step, state_violations, step_violations, observe=_catalogued)
apply, must, unchanged, tick = STEPS.apply, STEPS.must, STEPS.unchanged, STEPS.tick


def refresh(s: LifecycleSystem, replica: str) -> LifecycleSystem:
    return must(s, RefreshCache(replica), Ok())


def created(s: LifecycleSystem, e: DefinitionEvent) -> LifecycleSystem:
    return must(s, SaveDefinition(e), Created(e.created_at))


def fire(replica: str, door: str = "event", workflow: uuid.UUID = WF, community: uuid.UUID = C1) -> Fire:
    return Fire(replica, door, community, workflow)


def world() -> LifecycleSystem:
    """C1 and C2 active; ALICE holds authority in C1/CH and C1/CH2, BOB in C1/CH."""
    s = initial_state(T0)
    for command in (
        CreateCommunity(C1),
        CreateCommunity(C2),
        SetAuthority(C1, CH, ALICE, True),
        SetAuthority(C1, CH2, ALICE, True),
        SetAuthority(C1, CH, BOB, True),
    ):
        s = must(s, command, Ok())
    return s


E1 = event(at(1))  # ALICE creates C1/WF in CH with DEF_A


def one_workflow() -> LifecycleSystem:
    """World plus E1: C1/WF created at at(1), enabled, actions ACTIONS."""
    return created(world(), E1)


def warmed() -> LifecycleSystem:
    """One workflow, cached by both replicas at T0."""
    s = refresh(refresh(one_workflow(), "r1"), "r2")
    for replica in ("r1", "r2"):
        assert s.caches[replica] == Cache(T0, FrozenMap({(C1, WF): record_of(E1)}))
    return s


def with_community_state(s: LifecycleSystem, community: uuid.UUID, state: CommunityState) -> LifecycleSystem:
    """Hand-made: the lifecycle has no command that deletes a community."""
    return handmade(attrs.evolve(s, communities=s.communities.set(community, state)))


# ==========================================================================
# 1. Value validation


class TestDefinitionValues:
    @pytest.mark.parametrize(
        "bad",
        [
            (),
            tuple(f"a{n}" for n in range(MAX_ACTIONS + 1)),
            ("",),
            (" ",),
            ("\t\n",),
            ("a" * 65,),
            ("é" * 65,),
            ("a\x00b",),
            ("\x00",),
            ("\ud800",),
            ("ok", "x\udfffy"),
            ("ok", ""),
            ("ok", "a" * 65),
            (5,),
            ("ok", None),
            (b"notify",),
        ],
        ids=repr,
    )
    def test_bad_actions(self, bad: Any) -> None:
        raises_invalid("actions", lambda: Definition(bad))

    @pytest.mark.parametrize(
        "good",
        [("a",), ("a" * 64,), ("é" * 64,), tuple(f"a{n}" for n in range(MAX_ACTIONS)), ("x", "x")],
        ids=repr,
    )
    def test_actions_at_the_limits(self, good: tuple[str, ...]) -> None:
        assert Definition(good).actions == good

    def test_a_list_of_actions_becomes_a_tuple(self) -> None:
        assert Definition(["notify", "label"]) == DEF_A

    @pytest.mark.parametrize("bad", [1, 0, "true", "false", "", [], object()], ids=_stable_id)
    def test_enabled_must_be_bool_or_omitted(self, bad: Any) -> None:
        raises_invalid("enabled", lambda: Definition(ACTIONS, enabled=bad))

    @pytest.mark.parametrize(("enabled", "is_enabled"), [(None, True), (True, True), (False, False)])
    def test_omitted_enabled_means_enabled(self, enabled: bool | None, is_enabled: bool) -> None:
        definition = Definition(ACTIONS, enabled=enabled)
        assert definition.enabled is enabled
        assert definition.is_enabled is is_enabled

    def test_hash_is_sha256_of_the_canonical_content(self) -> None:
        canonical = b'{"actions":["notify","label"],"enabled":null}'
        assert DEF_A.hash == hashlib.sha256(canonical).digest()
        off = json.dumps({"actions": list(ACTIONS), "enabled": False}, sort_keys=True, separators=(",", ":"))
        assert DEF_A_OFF.hash == hashlib.sha256(off.encode()).digest()

    def test_hash_separates_contents(self) -> None:
        hashes = {DEF_A.hash, DEF_A_ON.hash, DEF_A_OFF.hash, DEF_B.hash, Definition(("label", "notify")).hash}
        assert len(hashes) == 5
        assert Definition(ACTIONS).hash == DEF_A.hash
        assert all(len(h) == 32 for h in hashes)


class TestEventValues:
    @pytest.mark.parametrize("field", ["event_id", "author"])
    @pytest.mark.parametrize("bad", [b"\x01" * 31, b"\x01" * 33, b"", "a1" * 16, None], ids=repr)
    def test_keys_must_be_32_bytes(self, field: str, bad: Any) -> None:
        raises_invalid(field, lambda: attrs.evolve(E1, **{field: bad}))

    @pytest.mark.parametrize("field", ["community_id", "workflow_id", "channel_id"])
    @pytest.mark.parametrize("bad", [str(C1), 1, None], ids=repr)
    def test_ids_must_be_uuids(self, field: str, bad: Any) -> None:
        raises_invalid(field, lambda: attrs.evolve(E1, **{field: bad}))

    @pytest.mark.parametrize("bad", [dt.datetime(2026, 1, 1), "2026-01-01T00:00:00Z", None, 1767225600], ids=repr)
    def test_created_at_must_be_an_aware_datetime(self, bad: Any) -> None:
        raises_invalid("created_at", lambda: attrs.evolve(E1, created_at=bad))

    def test_created_at_is_normalised_to_utc(self) -> None:
        plus_two = dt.timezone(dt.timedelta(hours=2))
        e = attrs.evolve(E1, created_at=dt.datetime(2026, 1, 1, 2, 0, 1, tzinfo=plus_two))
        assert e.created_at == at(1) and e.created_at.tzinfo == dt.UTC
        assert e == E1

    def test_the_valid_event(self) -> None:
        assert (E1.community_id, E1.workflow_id, E1.author, E1.channel_id, E1.created_at) == (C1, WF, ALICE, CH, at(1))
        assert E1.definition == DEF_A and len(E1.event_id) == 32


class TestCommandValues:
    @pytest.mark.parametrize("bad", ["cron", "", "EVENT", "events", None, 0], ids=repr)
    def test_fire_with_an_unknown_door(self, bad: Any) -> None:
        raises_invalid("door", lambda: Fire("r1", bad, C1, WF))

    @pytest.mark.parametrize("door", DOORS)
    def test_the_four_doors(self, door: str) -> None:
        assert Fire("r1", door, C1, WF).door == door
        assert DOORS == ("event", "schedule", "manual", "webhook")

    @pytest.mark.parametrize("field", ["community_id", "workflow_id"])
    def test_fire_ids_must_be_uuids(self, field: str) -> None:
        raises_invalid(field, lambda: attrs.evolve(fire("r1"), **{field: cast(Any, "x")}))

    @pytest.mark.parametrize("bad", ["canonical", "", "Admin", "report", "moderation", None], ids=repr)
    def test_alternate_delete_with_an_unknown_path(self, bad: Any) -> None:
        raises_invalid("path", lambda: AlternateDelete(C1, WF, bad))

    def test_the_alternate_paths(self) -> None:
        assert ALTERNATE_DELETIONS == (
            "name",
            "numeric-alias",
            "event-id-target",
            "admin",
            "report-enforcement",
            "report-enforcement-retry",
        )

    @pytest.mark.parametrize("bad", [0, -1, True, False, 1.0, "1", None], ids=repr)
    def test_resume_run_id_must_be_a_positive_integer(self, bad: Any) -> None:
        raises_invalid("run_id", lambda: ResumeRun(bad))

    def test_resume_run_id_one_is_fine(self) -> None:
        assert ResumeRun(1).run_id == 1

    def test_delete_values(self) -> None:
        raises_invalid("author", lambda: DeleteDefinition(C1, WF, b"\xa1" * 31, at(2)))
        raises_invalid("created_at", lambda: DeleteDefinition(C1, WF, ALICE, dt.datetime(2026, 1, 1)))
        raises_invalid("workflow_id", lambda: DeleteDefinition(C1, cast(Any, "wf"), ALICE, at(2)))

    def test_set_authority_member_must_be_a_key(self) -> None:
        raises_invalid("member", lambda: SetAuthority(C1, CH, b"short", True))

    @pytest.mark.parametrize(
        ("field", "make"),
        [
            # Deliberately ill-typed (cast(Any, ...)): the validators must refuse each.
            ("active", lambda: SetAuthority(C1, CH, ALICE, cast(Any, 1))),
            ("replica", lambda: RefreshCache(cast(Any, 5))),
            ("replica", lambda: Fire(cast(Any, None), "event", C1, WF)),
            ("actions", lambda: Definition(None)),
            ("actions", lambda: Definition(5)),
            ("actions", lambda: Definition("deploy")),
            ("event", lambda: SaveDefinition(cast(Any, "not an event"))),
            ("definition", lambda: attrs.evolve(E1, definition=cast(Any, ACTIONS))),
        ],
        ids=[
            "active=1",
            "replica=5",
            "fire-replica=None",
            "actions=None",
            "actions=5",
            "actions='deploy'",
            "event=str",
            "definition=tuple",
        ],
    )
    def test_every_malformed_field_raises_invalid_value(self, field: str, make: Callable[[], Any]) -> None:
        raises_invalid(field, make)


# ==========================================================================
# 2. Communities and authority


class TestCommunitiesAndAuthority:
    def test_world(self) -> None:
        s = world()
        assert s.now == T0
        assert dict(s.communities) == {C1: CommunityState.ACTIVE, C2: CommunityState.ACTIVE}
        assert s.authority == {(C1, CH, ALICE), (C1, CH2, ALICE), (C1, CH, BOB)}
        assert (s.heads, s.runtime, s.cutoffs, s.runs, s.executed) == (FrozenMap(),) * 5
        assert s.caches == FrozenMap({"r1": Cache(T0), "r2": Cache(T0)})

    def test_create_twice(self) -> None:
        unchanged(world(), CreateCommunity(C1), AlreadyExists("community", C1, C1))

    def test_set_state_of_an_unknown_community(self) -> None:
        unchanged(world(), SetCommunityState(C_UNKNOWN, CommunityState.FENCED), UnknownCommunity(C_UNKNOWN))

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED, CommunityState.ACTIVE])
    def test_set_state(self, state: CommunityState) -> None:
        s = must(world(), SetCommunityState(C1, state), Ok())
        assert s.communities[C1] is state
        s = must(s, SetCommunityState(C1, CommunityState.ACTIVE), Ok())
        assert s == world()

    def test_grant_and_revoke(self) -> None:
        s = must(world(), SetAuthority(C2, CH, CAROL, True), Ok())
        assert s.authority == world().authority | {(C2, CH, CAROL)}
        s = must(s, SetAuthority(C1, CH, ALICE, False), Ok())
        assert s.authority == {(C1, CH2, ALICE), (C1, CH, BOB), (C2, CH, CAROL)}

    def test_granting_twice_and_revoking_the_absent_change_nothing(self) -> None:
        unchanged(world(), SetAuthority(C1, CH, ALICE, True), Ok())
        unchanged(world(), SetAuthority(C1, CH, CAROL, False), Ok())

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    def test_authority_cannot_change_in_a_community_that_is_not_active(self, state: CommunityState) -> None:
        s = must(world(), SetCommunityState(C1, state), Ok())
        unchanged(s, SetAuthority(C1, CH, ALICE, False), CommunityNotWritable(C1, state))

    def test_authority_in_a_deleted_or_unknown_community(self) -> None:
        s = with_community_state(world(), C2, CommunityState.DELETED)
        unchanged(s, SetAuthority(C2, CH, ALICE, True), CommunityNotWritable(C2, CommunityState.DELETED))
        unchanged(world(), SetAuthority(C_UNKNOWN, CH, ALICE, True), UnknownCommunity(C_UNKNOWN))

    def test_the_clock(self) -> None:
        s = tick(world(), 5 * SECOND)
        assert s == attrs.evolve(world(), now=T0 + 5 * SECOND)


# ==========================================================================
# 3. Save


class TestSave:
    def test_create_projects_the_head(self) -> None:
        s = must(world(), SaveDefinition(E1), Created(incarnation=at(1)))
        assert dict(s.heads) == {(C1, WF): Head(E1.event_id, ALICE, CH, at(1), DEF_A)}
        assert dict(s.runtime) == {
            (C1, WF): Record(
                community_id=C1,
                workflow_id=WF,
                owner=ALICE,
                channel_id=CH,
                hash=DEF_A.hash,
                enabled=True,
                incarnation=at(1),
                actions=ACTIONS,
                revision=E1.event_id,
            )
        }
        assert s == attrs.evolve(world(), heads=s.heads, runtime=s.runtime)  # nothing else moved

    @pytest.mark.parametrize(("definition", "enabled"), [(DEF_A, True), (DEF_A_ON, True), (DEF_A_OFF, False)])
    def test_create_projects_enabled(self, definition: Definition, enabled: bool) -> None:
        s = must(world(), SaveDefinition(event(at(1), definition)), Created(at(1)))
        record = s.runtime[(C1, WF)]
        assert record.enabled is enabled
        assert record.hash == definition.hash
        assert s.heads[(C1, WF)].definition == definition

    def test_update_keeps_the_incarnation(self) -> None:
        e2 = event(at(2), DEF_B)
        s = must(one_workflow(), SaveDefinition(e2), Updated(enabled=True))
        assert s.heads[(C1, WF)] == head_of(e2)
        assert s.runtime[(C1, WF)] == record_of(e2, incarnation=at(1))
        assert s.runtime[(C1, WF)].hash == DEF_B.hash != DEF_A.hash

    def test_disable_then_enable(self) -> None:
        s = must(one_workflow(), SaveDefinition(event(at(2), DEF_A_OFF)), Updated(enabled=False))
        off = s.runtime[(C1, WF)]
        assert (off.enabled, off.hash, off.actions, off.incarnation) == (False, DEF_A_OFF.hash, ACTIONS, at(1))
        assert off.hash != DEF_A.hash
        s = must(s, SaveDefinition(event(at(3), DEF_A_ON)), Updated(enabled=True))
        on = s.runtime[(C1, WF)]
        assert (on.enabled, on.hash, on.incarnation) == (True, DEF_A_ON.hash, at(1))
        assert s.heads[(C1, WF)].created_at == at(3)

    def test_omitting_enabled_on_update_re_enables(self) -> None:
        s = must(one_workflow(), SaveDefinition(event(at(2), DEF_A_OFF)), Updated(False))
        s = must(s, SaveDefinition(event(at(3), DEF_A)), Updated(True))
        # Back to the first record's content, at a new revision.
        assert attrs.evolve(s.runtime[(C1, WF)], revision=E1.event_id) == record_of(E1)

    @pytest.mark.parametrize("created_at", [at(0), at(1) - MICROSECOND, at(1)], ids=["older", "1us-older", "equal"])
    def test_older_or_equal_saves_are_superseded(self, created_at: dt.datetime) -> None:
        unchanged(one_workflow(), SaveDefinition(event(created_at, DEF_B)), Superseded(head_created_at=at(1)))

    def test_the_newest_wins_whatever_the_arrival_order(self) -> None:
        s = must(one_workflow(), SaveDefinition(event(at(3), DEF_A_OFF)), Updated(False))
        unchanged(s, SaveDefinition(event(at(2), DEF_B)), Superseded(at(3)))
        assert s.runtime[(C1, WF)].enabled is False

    def test_no_authority(self) -> None:
        unchanged(world(), SaveDefinition(event(at(1), author=CAROL)), NoAuthority(CH, CAROL))

    def test_authority_in_another_channel_or_community_does_not_count(self) -> None:
        unchanged(world(), SaveDefinition(event(at(1), author=BOB, channel=CH2)), NoAuthority(CH2, BOB))
        unchanged(world(), SaveDefinition(event(at(1), community=C2)), NoAuthority(CH, ALICE))

    def test_no_authority_after_revocation(self) -> None:
        s = must(one_workflow(), SetAuthority(C1, CH, ALICE, False), Ok())
        unchanged(s, SaveDefinition(event(at(2), DEF_B)), NoAuthority(CH, ALICE))
        unchanged(s, SaveDefinition(event(at(2), DEF_A_OFF)), NoAuthority(CH, ALICE))

    def test_no_authority_is_checked_before_authorship(self) -> None:
        unchanged(one_workflow(), SaveDefinition(event(at(2), author=CAROL)), NoAuthority(CH, CAROL))

    def test_another_author_is_not_the_author(self) -> None:
        unchanged(one_workflow(), SaveDefinition(event(at(2), DEF_B, author=BOB)), NotAuthor(WF, BOB))

    def test_another_channel_is_not_the_author(self) -> None:
        unchanged(one_workflow(), SaveDefinition(event(at(2), DEF_B, channel=CH2)), NotAuthor(WF, ALICE))

    def test_not_author_is_checked_before_ordering(self) -> None:
        unchanged(one_workflow(), SaveDefinition(event(at(0), author=BOB)), NotAuthor(WF, BOB))

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    def test_a_community_that_is_not_active_refuses_saves(self, state: CommunityState) -> None:
        s = must(one_workflow(), SetCommunityState(C1, state), Ok())
        unchanged(s, SaveDefinition(event(at(2), DEF_B)), CommunityNotWritable(C1, state))
        unchanged(s, SaveDefinition(event(at(2), workflow=WF2)), CommunityNotWritable(C1, state))
        unchanged(s, SaveDefinition(event(at(2), author=CAROL)), CommunityNotWritable(C1, state))  # fence first

    def test_a_deleted_community_refuses_saves(self) -> None:
        s = with_community_state(world(), C2, CommunityState.DELETED)
        unchanged(s, SaveDefinition(event(at(1), community=C2)), CommunityNotWritable(C2, CommunityState.DELETED))

    def test_an_unknown_community(self) -> None:
        unchanged(world(), SaveDefinition(event(at(1), community=C_UNKNOWN)), UnknownCommunity(C_UNKNOWN))

    def test_coordinates_are_per_community(self) -> None:
        s = must(one_workflow(), SetAuthority(C2, CH, ALICE, True), Ok())
        e = event(at(5), DEF_B, community=C2)
        s = must(s, SaveDefinition(e), Created(at(5)))
        assert s.runtime[(C2, WF)] == record_of(e) and s.runtime[(C1, WF)] == record_of(E1)
        s = must(s, DeleteDefinition(C2, WF, ALICE, at(6)), Deleted(at(6)))
        assert dict(s.runtime) == {(C1, WF): record_of(E1)}
        assert dict(s.cutoffs) == {(C2, WF): at(6)}


class TestCutoff:
    def deleted_at_5(self) -> LifecycleSystem:
        return must(one_workflow(), DeleteDefinition(C1, WF, ALICE, at(5)), Deleted(at(5)))

    @pytest.mark.parametrize(
        "created_at", [at(2), at(5) - MICROSECOND, at(5)], ids=["before", "1us-before", "at-cutoff"]
    )
    def test_a_save_at_or_before_the_cutoff_cannot_revive(self, created_at: dt.datetime) -> None:
        unchanged(self.deleted_at_5(), SaveDefinition(event(created_at, DEF_B)), BeforeCutoff(cutoff=at(5)))

    def test_replaying_the_original_event_repairs_nothing(self) -> None:
        unchanged(self.deleted_at_5(), SaveDefinition(E1), BeforeCutoff(at(5)))

    def test_a_delayed_disable_or_enable_cannot_revive(self) -> None:
        s = self.deleted_at_5()
        unchanged(s, SaveDefinition(event(at(3), DEF_A_OFF)), BeforeCutoff(at(5)))
        unchanged(s, SaveDefinition(event(at(4), DEF_A_ON)), BeforeCutoff(at(5)))

    def test_a_strictly_newer_save_recreates_a_new_incarnation(self) -> None:
        e = event(at(5) + MICROSECOND, DEF_B)
        s = must(self.deleted_at_5(), SaveDefinition(e), Created(incarnation=at(5) + MICROSECOND))
        assert s.heads[(C1, WF)] == head_of(e)
        assert s.runtime[(C1, WF)] == record_of(e)
        assert s.cutoffs[(C1, WF)] == at(5)  # the cutoff persists

    def test_an_identical_recreation_has_the_same_hash_but_a_new_incarnation(self) -> None:
        e = event(at(6), DEF_A)
        s = must(self.deleted_at_5(), SaveDefinition(e), Created(at(6)))
        new, old = s.runtime[(C1, WF)], record_of(E1)
        assert new.hash == old.hash and new.actions == old.actions and new.enabled == old.enabled
        assert (new.owner, new.channel_id) == (old.owner, old.channel_id)
        assert (new.incarnation, old.incarnation) == (at(6), at(1))
        assert new != old

    def test_after_recreation_the_old_deletion_replayed_is_superseded(self) -> None:
        s = created(self.deleted_at_5(), event(at(6)))
        unchanged(s, DeleteDefinition(C1, WF, ALICE, at(5)), Superseded(at(6)))

    def test_after_recreation_saves_before_the_new_head_are_superseded(self) -> None:
        s = created(self.deleted_at_5(), event(at(6)))
        unchanged(s, SaveDefinition(event(at(4), DEF_B)), Superseded(at(6)))

    def test_a_second_deletion_moves_the_cutoff(self) -> None:
        s = created(self.deleted_at_5(), event(at(6)))
        s = must(s, DeleteDefinition(C1, WF, ALICE, at(8)), Deleted(at(8)))
        assert dict(s.cutoffs) == {(C1, WF): at(8)}
        unchanged(s, SaveDefinition(event(at(7))), BeforeCutoff(at(8)))

    def test_other_authors_still_cannot_recreate_before_the_cutoff(self) -> None:
        # After deletion the coordinate has no head, so no author binding remains:
        # BOB (who has authority) is refused only by the cutoff ...
        unchanged(self.deleted_at_5(), SaveDefinition(event(at(5), author=BOB)), BeforeCutoff(at(5)))
        # ... and may recreate it strictly after.
        s = must(self.deleted_at_5(), SaveDefinition(event(at(6), author=BOB)), Created(at(6)))
        assert s.runtime[(C1, WF)].owner == BOB


# ==========================================================================
# 4. Delete


class TestDelete:
    def test_delete_removes_head_and_runtime_together_and_records_the_cutoff(self) -> None:
        s = created(one_workflow(), event(at(1), DEF_B, workflow=WF2))
        s = must(s, DeleteDefinition(C1, WF, ALICE, at(3)), Deleted(cutoff=at(3)))
        assert (C1, WF) not in s.heads and (C1, WF) not in s.runtime
        assert dict(s.cutoffs) == {(C1, WF): at(3)}
        assert list(s.heads) == list(s.runtime) == [(C1, WF2)]  # the other coordinate stays

    def test_a_deletion_at_the_heads_own_time_deletes(self) -> None:
        s = must(one_workflow(), DeleteDefinition(C1, WF, ALICE, at(1)), Deleted(at(1)))
        assert (s.heads, s.runtime, dict(s.cutoffs)) == (FrozenMap(), FrozenMap(), {(C1, WF): at(1)})

    def test_a_disabled_definition_can_be_deleted(self) -> None:
        s = must(one_workflow(), SaveDefinition(event(at(2), DEF_A_OFF)), Updated(False))
        s = must(s, DeleteDefinition(C1, WF, ALICE, at(3)), Deleted(at(3)))
        assert s.heads == s.runtime == FrozenMap()

    def test_not_found(self) -> None:
        unchanged(world(), DeleteDefinition(C1, WF, ALICE, at(3)), NotFound("workflow", C1, WF))

    def test_deleting_twice_is_not_found(self) -> None:
        s = must(one_workflow(), DeleteDefinition(C1, WF, ALICE, at(3)), Deleted(at(3)))
        unchanged(s, DeleteDefinition(C1, WF, ALICE, at(4)), NotFound("workflow", C1, WF))

    def test_another_author(self) -> None:
        unchanged(one_workflow(), DeleteDefinition(C1, WF, BOB, at(3)), NotAuthor(WF, BOB))

    def test_the_authors_authority_revoked(self) -> None:
        s = must(one_workflow(), SetAuthority(C1, CH, ALICE, False), Ok())
        assert (C1, CH2, ALICE) in s.authority  # authority elsewhere does not count
        unchanged(s, DeleteDefinition(C1, WF, ALICE, at(3)), NoAuthority(CH, ALICE))

    @pytest.mark.parametrize("created_at", [at(0), at(1) - MICROSECOND], ids=["older", "1us-older"])
    def test_a_deletion_older_than_the_head_is_superseded(self, created_at: dt.datetime) -> None:
        unchanged(one_workflow(), DeleteDefinition(C1, WF, ALICE, created_at), Superseded(head_created_at=at(1)))

    def test_a_deletion_older_than_an_update_is_superseded(self) -> None:
        s = must(one_workflow(), SaveDefinition(event(at(4), DEF_B)), Updated(True))
        unchanged(s, DeleteDefinition(C1, WF, ALICE, at(3)), Superseded(at(4)))

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    def test_a_community_that_is_not_active_refuses_deletion(self, state: CommunityState) -> None:
        s = must(one_workflow(), SetCommunityState(C1, state), Ok())
        unchanged(s, DeleteDefinition(C1, WF, ALICE, at(3)), CommunityNotWritable(C1, state))

    def test_a_deleted_or_unknown_community(self) -> None:
        s = with_community_state(world(), C2, CommunityState.DELETED)
        unchanged(s, DeleteDefinition(C2, WF, ALICE, at(3)), CommunityNotWritable(C2, CommunityState.DELETED))
        unchanged(world(), DeleteDefinition(C_UNKNOWN, WF, ALICE, at(3)), UnknownCommunity(C_UNKNOWN))


class TestAlternateDeletion:
    """Carl's P1: a report-enforcement (or any non-canonical) deletion must not split head from runtime."""

    @pytest.mark.parametrize("path", ALTERNATE_DELETIONS)
    def test_every_alternate_path_is_rejected_and_changes_nothing(self, path: str) -> None:
        s = refresh(one_workflow(), "r1")
        unchanged(s, AlternateDelete(C1, WF, path), AlternateDeletionRejected(path))
        assert s.heads[(C1, WF)] == head_of(E1) and s.runtime[(C1, WF)] == record_of(E1)
        assert s.cutoffs == FrozenMap()

    @pytest.mark.parametrize("path", ALTERNATE_DELETIONS)
    def test_after_a_rejected_alternate_deletion_the_author_can_still_delete(self, path: str) -> None:
        s = unchanged(one_workflow(), AlternateDelete(C1, WF, path), AlternateDeletionRejected(path))
        s = must(s, DeleteDefinition(C1, WF, ALICE, at(2)), Deleted(at(2)))
        assert s.heads == s.runtime == FrozenMap()

    @pytest.mark.parametrize("path", ALTERNATE_DELETIONS)
    def test_the_runtime_stays_live_and_executable(self, path: str) -> None:
        s = refresh(one_workflow(), "r1")
        s = unchanged(s, AlternateDelete(C1, WF, path), AlternateDeletionRejected(path))
        s = must(s, fire("r1"), Admitted(1, record_of(E1)))
        assert s.executed == FrozenMap({1: ("notify", "label")})

    @pytest.mark.parametrize("path", ["report-enforcement", "report-enforcement-retry", "admin"])
    def test_rejected_even_for_a_missing_coordinate_or_unknown_community(self, path: str) -> None:
        unchanged(world(), AlternateDelete(C1, WF_NEW, path), AlternateDeletionRejected(path))
        unchanged(world(), AlternateDelete(C_UNKNOWN, WF, path), AlternateDeletionRejected(path))


# ==========================================================================
# 5. Caches and admission: the stale replica findings


def _update(s: LifecycleSystem) -> LifecycleSystem:
    return must(s, SaveDefinition(event(at(2), DEF_B)), Updated(True))


def _disable(s: LifecycleSystem) -> LifecycleSystem:
    return must(s, SaveDefinition(event(at(2), DEF_A_OFF)), Updated(False))


def _delete(s: LifecycleSystem) -> LifecycleSystem:
    return must(s, DeleteDefinition(C1, WF, ALICE, at(2)), Deleted(at(2)))


def _recreate_changed(s: LifecycleSystem) -> LifecycleSystem:
    return must(_delete(s), SaveDefinition(event(at(3), DEF_B)), Created(at(3)))


def _recreate_identical(s: LifecycleSystem) -> LifecycleSystem:
    return must(_delete(s), SaveDefinition(event(at(3), DEF_A)), Created(at(3)))


# change -> (how, the current record afterwards or None when nothing is enabled)
CHANGES: dict[str, tuple[Callable[[LifecycleSystem], LifecycleSystem], Record | None]] = {
    "update": (_update, record_of(event(at(2), DEF_B), incarnation=at(1))),
    "disable": (_disable, None),
    "delete": (_delete, None),
    "delete-recreate-changed": (_recreate_changed, record_of(event(at(3), DEF_B))),
    "delete-recreate-identical": (_recreate_identical, record_of(event(at(3), DEF_A))),
}


class TestStaleReplica:
    @pytest.mark.parametrize("door", DOORS)
    @pytest.mark.parametrize("change", CHANGES)
    def test_a_stale_replica_admits_nothing(self, change: str, door: str) -> None:
        how, _ = CHANGES[change]
        s = warmed()
        # Control: before the change, the same replica and door admit.
        s = must(s, fire("r1", door), Admitted(1, record_of(E1)))
        before_change = s
        s = how(s)
        # Neither replica's cache was invalidated.
        assert s.caches == before_change.caches
        assert s.caches["r1"].records[(C1, WF)] == record_of(E1) != s.runtime.get((C1, WF))
        for replica in ("r1", "r2"):
            unchanged(s, fire(replica, door), AdmissionRefused())
        assert list(s.runs) == [1]
        assert s.executed == FrozenMap({1: ("notify", "label")})  # nothing more executed

    @pytest.mark.parametrize("change", CHANGES)
    def test_a_fresh_replica_serves_only_the_current_record(self, change: str) -> None:
        how, current = CHANGES[change]
        s = refresh(how(warmed()), "r2")
        unchanged(s, fire("r1"), AdmissionRefused())  # r1 is still stale
        if current is None:
            assert s.caches["r2"] == Cache(T0, FrozenMap())
            unchanged(s, fire("r2"), NotSelected())
            assert s.runs == FrozenMap() and s.executed == FrozenMap()
        else:
            assert s.caches["r2"] == Cache(T0, FrozenMap({(C1, WF): current}))
            s = must(s, fire("r2", "manual"), Admitted(1, current))
            assert s.runs == FrozenMap({1: Run(1, "manual", current, T0)})
            assert s.executed == FrozenMap({1: current.actions})

    def test_identical_recreation_is_stale_only_by_its_incarnation(self) -> None:
        s = _recreate_identical(warmed())
        stale, current = s.caches["r1"].records[(C1, WF)], s.runtime[(C1, WF)]
        assert attrs.evolve(stale, incarnation=current.incarnation, revision=current.revision) == current
        unchanged(s, fire("r1", "webhook"), AdmissionRefused())

    def test_disabling_does_not_cancel_admitted_work(self) -> None:
        s = must(warmed(), fire("r1"), Admitted(1, record_of(E1)))
        s = _disable(s)
        assert s.runs == FrozenMap({1: Run(1, "event", record_of(E1), T0)})
        assert s.executed == FrozenMap({1: ("notify", "label")})


class TestAdmission:
    @pytest.mark.parametrize("door", DOORS)
    def test_a_current_cached_record_is_admitted(self, door: str) -> None:
        s = must(warmed(), fire("r2", door), Admitted(run_id=1, record=record_of(E1)))
        assert s == attrs.evolve(
            warmed(),
            runs=FrozenMap({1: Run(1, door, record_of(E1), T0)}),
            executed=FrozenMap({1: ("notify", "label")}),
        )

    def test_created_after_the_refresh_is_not_selected(self) -> None:
        s = created(refresh(world(), "r1"), E1)
        unchanged(s, fire("r1"), NotSelected())
        assert s.runs == FrozenMap() and s.executed == FrozenMap()

    def test_disabled_at_refresh_is_not_selected_even_after_enabling(self) -> None:
        s = refresh(created(world(), event(at(1), DEF_A_OFF)), "r1")
        assert s.caches["r1"].records == FrozenMap()
        unchanged(s, fire("r1"), NotSelected())
        s = must(s, SaveDefinition(event(at(2), DEF_A_ON)), Updated(True))
        unchanged(s, fire("r1"), NotSelected())
        s = refresh(s, "r1")
        s = must(s, fire("r1"), Admitted(1, record_of(event(at(2), DEF_A_ON), incarnation=at(1))))

    def test_an_unknown_coordinate_is_not_selected(self) -> None:
        unchanged(warmed(), fire("r1", workflow=WF_NEW), NotSelected())
        unchanged(warmed(), fire("r1", community=C2), NotSelected())

    def test_unknown_replica(self) -> None:
        unchanged(warmed(), fire("r3"), UnknownReplica("r3"))
        unchanged(warmed(), RefreshCache("r3"), UnknownReplica("r3"))
        unchanged(tick(warmed(), CACHE_TTL), fire("r3"), UnknownReplica("r3"))

    def test_refresh_loads_only_enabled_records_at_now(self) -> None:
        s = created(one_workflow(), event(at(1), DEF_A_OFF, workflow=WF2))
        s = refresh(tick(s, 3 * SECOND), "r1")
        assert s.caches["r1"] == Cache(T0 + 3 * SECOND, FrozenMap({(C1, WF): record_of(E1)}))
        assert s.caches["r2"] == Cache(T0)

    @pytest.mark.parametrize("state", [CommunityState.FENCED, CommunityState.QUIESCING])
    def test_a_community_not_writable_at_fire_time(self, state: CommunityState) -> None:
        s = must(warmed(), SetCommunityState(C1, state), Ok())
        for door in DOORS:
            unchanged(s, fire("r1", door), CommunityNotWritable(C1, state))
        s = must(s, SetCommunityState(C1, CommunityState.ACTIVE), Ok())
        must(s, fire("r1"), Admitted(1, record_of(E1)))

    @pytest.mark.parametrize("state", [CommunityState.FENCED, CommunityState.QUIESCING])
    def test_the_community_check_precedes_selection(self, state: CommunityState) -> None:
        s = must(refresh(world(), "r1"), SetCommunityState(C1, state), Ok())
        unchanged(s, fire("r1"), CommunityNotWritable(C1, state))  # not cached, still refused
        unchanged(s, fire("r1", workflow=WF_NEW), CommunityNotWritable(C1, state))

    def test_a_refused_fire_does_not_reload_an_expired_cache(self) -> None:
        s = _update(warmed())  # r1's cache is stale, so a reload would show
        s = must(s, SetCommunityState(C1, CommunityState.FENCED), Ok())
        s = tick(s, CACHE_TTL)
        unchanged(s, fire("r1"), CommunityNotWritable(C1, CommunityState.FENCED))
        assert s.caches["r1"] == Cache(T0, FrozenMap({(C1, WF): record_of(E1)}))
        unchanged(tick(s, CACHE_TTL), fire("r1", community=C_UNKNOWN), UnknownCommunity(C_UNKNOWN))

    def test_after_the_fence_lifts_the_stale_cache_still_admits_nothing(self) -> None:
        s = _update(warmed())
        s = must(s, SetCommunityState(C1, CommunityState.FENCED), Ok())
        s = must(s, SetCommunityState(C1, CommunityState.ACTIVE), Ok())
        unchanged(s, fire("r1"), AdmissionRefused())

    def test_a_deleted_community_at_fire_time(self) -> None:
        s = warmed()
        purged = handmade(
            attrs.evolve(
                s,
                communities=s.communities.set(C1, CommunityState.DELETED),
                heads=FrozenMap(),
                runtime=FrozenMap(),
            )
        )
        unchanged(purged, fire("r1"), CommunityNotWritable(C1, CommunityState.DELETED))

    def test_an_unknown_community(self) -> None:
        unchanged(warmed(), fire("r1", community=C_UNKNOWN), UnknownCommunity(C_UNKNOWN))
        unchanged(tick(warmed(), CACHE_TTL), fire("r1", community=C_UNKNOWN), UnknownCommunity(C_UNKNOWN))

    def test_the_replica_is_checked_before_the_community(self) -> None:
        unchanged(world(), fire("r3", community=C_UNKNOWN), UnknownReplica("r3"))

    def test_the_owners_revoked_authority_refuses_admission(self) -> None:
        s = must(warmed(), SetAuthority(C1, CH, ALICE, False), Ok())
        for door in DOORS:
            unchanged(s, fire("r1", door), AdmissionRefused())
        unchanged(refresh(s, "r2"), fire("r2"), AdmissionRefused())  # a fresh cache too: the owner is unauthorised
        s = must(s, SetAuthority(C1, CH, ALICE, True), Ok())
        must(s, fire("r1"), Admitted(1, record_of(E1)))

    def test_another_members_revoked_authority_does_not_matter(self) -> None:
        s = must(warmed(), SetAuthority(C1, CH, BOB, False), Ok())
        s = must(s, SetAuthority(C1, CH2, ALICE, False), Ok())
        must(s, fire("r1"), Admitted(1, record_of(E1)))

    def test_run_ids_are_1_to_n_in_admission_order(self) -> None:
        s = must(warmed(), fire("r1", "event"), Admitted(1, record_of(E1)))
        s = tick(s, SECOND)
        s = _update(s)
        current = CHANGES["update"][1]
        assert current is not None
        unchanged(s, fire("r1", "schedule"), AdmissionRefused())  # a refusal takes no id
        s = refresh(s, "r2")
        s = must(s, fire("r2", "manual"), Admitted(2, current))
        s = tick(s, SECOND)
        s = must(s, fire("r2", "webhook"), Admitted(3, current))
        assert s.runs == FrozenMap(
            {
                1: Run(1, "event", record_of(E1), T0),
                2: Run(2, "manual", current, T0 + SECOND),
                3: Run(3, "webhook", current, T0 + 2 * SECOND),
            }
        )
        assert s.executed == FrozenMap({1: ("notify", "label"), 2: ("escalate",), 3: ("escalate",)})

    def test_executed_is_exactly_the_admitted_records_actions(self) -> None:
        actions = ("a", "b", "a", "c")
        e = event(at(1), Definition(actions), workflow=WF2)
        s = refresh(created(one_workflow(), e), "r1")
        s = must(s, fire("r1", workflow=WF2), Admitted(1, record_of(e)))
        s = must(s, fire("r1"), Admitted(2, record_of(E1)))
        assert s.executed == FrozenMap({1: ("a", "b", "a", "c"), 2: ("notify", "label")})


class TestCacheExpiry:
    @pytest.mark.parametrize("change", CHANGES)
    def test_exactly_at_the_ttl_the_cache_reloads_before_serving(self, change: str) -> None:
        how, current = CHANGES[change]
        s = tick(how(warmed()), CACHE_TTL)
        after, outcome = apply(s, fire("r1", "schedule"))
        reloaded = Cache(T0 + CACHE_TTL, FrozenMap() if current is None else FrozenMap({(C1, WF): current}))
        assert after.caches == s.caches.set("r1", reloaded)  # r2 untouched
        if current is None:
            assert outcome == NotSelected()
            assert after == attrs.evolve(s, caches=after.caches)
        else:
            assert outcome == Admitted(1, current)
            assert after.runs == FrozenMap({1: Run(1, "schedule", current, T0 + CACHE_TTL)})
            assert after.executed == FrozenMap({1: current.actions})

    @pytest.mark.parametrize("change", CHANGES)
    def test_one_microsecond_before_the_ttl_the_stale_cache_serves(self, change: str) -> None:
        how, _ = CHANGES[change]
        s = tick(how(warmed()), CACHE_TTL - MICROSECOND)
        unchanged(s, fire("r1", "schedule"), AdmissionRefused())
        assert s.caches["r1"].loaded_at == T0

    def test_a_new_coordinate_appears_at_the_ttl(self) -> None:
        s = created(refresh(world(), "r1"), E1)
        unchanged(tick(s, CACHE_TTL - MICROSECOND), fire("r1"), NotSelected())
        s = must(tick(s, CACHE_TTL), fire("r1"), Admitted(1, record_of(E1)))
        assert s.caches["r1"] == Cache(T0 + CACHE_TTL, FrozenMap({(C1, WF): record_of(E1)}))

    def test_an_expired_empty_cache_reloads_even_when_nothing_is_selected(self) -> None:
        s = tick(world(), CACHE_TTL)
        after, outcome = apply(s, fire("r2"))
        assert outcome == NotSelected()
        assert after == attrs.evolve(s, caches=s.caches.set("r2", Cache(T0 + CACHE_TTL)))

    def test_a_reload_restarts_the_ttl(self) -> None:
        s = must(tick(warmed(), CACHE_TTL), fire("r1"), Admitted(1, record_of(E1)))
        s = _update(s)
        unchanged(tick(s, CACHE_TTL - MICROSECOND), fire("r1"), AdmissionRefused())
        updated = CHANGES["update"][1]
        assert updated is not None
        s = must(tick(s, CACHE_TTL), fire("r1"), Admitted(2, updated))


# ==========================================================================
# 6. Resume


def admitted_once() -> LifecycleSystem:
    """Run 1 admitted on r1 for E1's record, executed once."""
    s = must(warmed(), fire("r1", "manual"), Admitted(1, record_of(E1)))
    assert s.executed == FrozenMap({1: ("notify", "label")})
    return s


class TestResume:
    def test_resume_while_current_executes_the_pinned_actions_again(self) -> None:
        s = must(admitted_once(), ResumeRun(1), Resumed(actions=ACTIONS))
        assert s.executed == FrozenMap({1: ("notify", "label") * 2})
        s = must(s, ResumeRun(1), Resumed(ACTIONS))
        assert s.executed == FrozenMap({1: ("notify", "label") * 3})
        assert s.runs == admitted_once().runs

    @pytest.mark.parametrize("change", CHANGES)
    def test_resume_fails_closed_once_the_pinned_revision_is_gone(self, change: str) -> None:
        how, _ = CHANGES[change]
        s = how(admitted_once())
        unchanged(s, ResumeRun(1), ResumeRefused())
        assert s.executed == FrozenMap({1: ("notify", "label")})

    def test_a_resume_of_run_1_after_run_2_was_admitted_appends_to_run_1_only(self) -> None:
        e = event(at(1), DEF_B, workflow=WF2)
        s = refresh(created(admitted_once(), e), "r2")
        s = must(s, fire("r2", workflow=WF2), Admitted(2, record_of(e)))
        assert s.executed == FrozenMap({1: ("notify", "label"), 2: ("escalate",)})
        s = must(s, ResumeRun(1), Resumed(ACTIONS))
        assert s.executed == FrozenMap({1: ("notify", "label", "notify", "label"), 2: ("escalate",)})

    def test_only_the_run_pinned_to_the_current_revision_resumes(self) -> None:
        s = refresh(_update(admitted_once()), "r2")
        current = CHANGES["update"][1]
        assert current is not None
        s = must(s, fire("r2"), Admitted(2, current))
        unchanged(s, ResumeRun(1), ResumeRefused())
        s = must(s, ResumeRun(2), Resumed(ACTIONS_B))
        assert s.executed == FrozenMap({1: ("notify", "label"), 2: ("escalate", "escalate")})

    def test_unknown_run(self) -> None:
        unchanged(world(), ResumeRun(1), UnknownRun(1))
        unchanged(admitted_once(), ResumeRun(2), UnknownRun(2))

    def test_resume_fails_closed_once_the_owner_lost_authority(self) -> None:
        s = must(admitted_once(), SetAuthority(C1, CH, ALICE, False), Ok())
        unchanged(s, ResumeRun(1), ResumeRefused())
        s = must(s, SetAuthority(C1, CH, ALICE, True), Ok())
        s = must(s, ResumeRun(1), Resumed(ACTIONS))
        assert s.executed == FrozenMap({1: ("notify", "label") * 2})

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    def test_resume_in_a_community_that_is_not_active(self, state: CommunityState) -> None:
        s = must(admitted_once(), SetCommunityState(C1, state), Ok())
        unchanged(s, ResumeRun(1), CommunityNotWritable(C1, state))
        s = _update(must(s, SetCommunityState(C1, CommunityState.ACTIVE), Ok()))
        s = must(s, SetCommunityState(C1, state), Ok())
        unchanged(s, ResumeRun(1), CommunityNotWritable(C1, state))  # the community check comes first
        unchanged(s, ResumeRun(2), UnknownRun(2))  # after the run lookup

    @pytest.mark.parametrize(
        "meanwhile",
        [
            pytest.param(
                (SaveDefinition(event(at(2), DEF_A_OFF)), SaveDefinition(event(at(3), DEF_A))), id="disable-re-enable"
            ),
            pytest.param(
                (SaveDefinition(event(at(2), DEF_B)), SaveDefinition(event(at(3), DEF_A))), id="update-revert"
            ),
        ],
    )
    def test_resume_fails_closed_if_the_coordinate_changed_meanwhile_and_changed_back(
        self, meanwhile: tuple[SaveDefinition, SaveDefinition]
    ) -> None:
        s = admitted_once()
        for save in meanwhile:
            s, outcome = apply(s, save)
            assert isinstance(outcome, Updated)
        # Content identical to the pinned revision, but a later revision of it.
        assert attrs.evolve(s.runtime[(C1, WF)], revision=E1.event_id) == record_of(E1)
        unchanged(s, ResumeRun(1), ResumeRefused())


# ==========================================================================
# 7. Random sequences keep the invariants


P_COMMUNITY = st.sampled_from((C1, C1, C1, C2))
P_WORKFLOW = st.sampled_from((WF, WF2))
P_AUTHOR = st.sampled_from((ALICE, ALICE, BOB))
P_CHANNEL = st.sampled_from((CH, CH, CH2))
P_DEFINITION = st.sampled_from((DEF_A, DEF_A_ON, DEF_A_OFF, DEF_B))
P_REPLICA = st.sampled_from(("r1", "r2", "r1", "r2", "r3"))
# A signed time relative to the coordinate's newest time (head, else cutoff, else T0):
# mostly newer, sometimes equal or older, so Superseded and BeforeCutoff happen too.
P_DELTA = st.sampled_from((1, 1, 1, 2, 5, 0, -1))


def often(times: int, strategy: st.SearchStrategy[Any]) -> list[st.SearchStrategy[Any]]:
    """`st.one_of` takes no weights: repeat a branch to make it likelier."""
    return [strategy] * times


def _latest(state: LifecycleSystem, coordinate: tuple[uuid.UUID, uuid.UUID]) -> dt.datetime:
    head = state.heads.get(coordinate)
    return head.created_at if head is not None else state.cutoffs.get(coordinate, T0)


@attrs.frozen
class SaveRecipe:
    community: uuid.UUID
    workflow: uuid.UUID
    author: bytes
    channel: uuid.UUID
    delta: int
    definition: Definition

    def build(self, state: LifecycleSystem) -> SaveDefinition:
        created_at = _latest(state, (self.community, self.workflow)) + self.delta * SECOND
        return SaveDefinition(
            event(
                created_at,
                self.definition,
                author=self.author,
                channel=self.channel,
                workflow=self.workflow,
                community=self.community,
            )
        )


@attrs.frozen
class DeleteRecipe:
    community: uuid.UUID
    workflow: uuid.UUID
    author: bytes
    delta: int

    def build(self, state: LifecycleSystem) -> DeleteDefinition:
        created_at = _latest(state, (self.community, self.workflow)) + self.delta * SECOND
        return DeleteDefinition(self.community, self.workflow, self.author, created_at)


@attrs.frozen
class ResumeRecipe:
    back: int  # 0 resumes the newest run; len(runs) is an unknown run

    def build(self, state: LifecycleSystem) -> ResumeRun:
        run_id = len(state.runs) - self.back
        return ResumeRun(run_id if run_id >= 1 else len(state.runs) + 1)


RECIPES = st.one_of(
    *often(8, st.builds(SaveRecipe, P_COMMUNITY, P_WORKFLOW, P_AUTHOR, P_CHANNEL, P_DELTA, P_DEFINITION)),
    *often(2, st.builds(DeleteRecipe, P_COMMUNITY, P_WORKFLOW, P_AUTHOR, st.sampled_from((1, 0, -1)))),
    st.builds(AlternateDelete, P_COMMUNITY, P_WORKFLOW, st.sampled_from(ALTERNATE_DELETIONS)),
    *often(3, st.builds(RefreshCache, P_REPLICA)),
    *often(10, st.builds(Fire, P_REPLICA, st.sampled_from(DOORS), P_COMMUNITY, P_WORKFLOW)),
    *often(3, st.builds(ResumeRecipe, st.sampled_from((0, 0, 0, 1, 2, 99)))),
    *often(4, st.builds(AdvanceClock, st.sampled_from((SECOND, 5 * SECOND, 10 * SECOND)))),
    *often(2, st.builds(SetAuthority, P_COMMUNITY, P_CHANNEL, P_AUTHOR, st.sampled_from((True, True, False)))),
    st.builds(
        SetCommunityState,
        st.sampled_from((C1, C2, C_UNKNOWN)),
        st.sampled_from(
            (CommunityState.ACTIVE, CommunityState.ACTIVE, CommunityState.QUIESCING, CommunityState.FENCED)
        ),
    ),
    st.builds(CreateCommunity, P_COMMUNITY),
)


def property_start() -> LifecycleSystem:
    """C1 (C2 may be created later); ALICE holds C1/CH, BOB C1/CH and C1/CH2; ALICE's WF live, both caches warm."""
    s = initial_state(T0)
    for command in (
        CreateCommunity(C1),
        SetAuthority(C1, CH, ALICE, True),
        SetAuthority(C1, CH, BOB, True),
        SetAuthority(C1, CH2, BOB, True),
        SaveDefinition(E1),
        RefreshCache("r1"),
        RefreshCache("r2"),
    ):
        s, _ = step(s, command)
    assert list(s.runtime) == [(C1, WF)]
    return s


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RECIPES, min_size=10, max_size=60))
def test_random_sequences_keep_invariants_and_rejections_change_nothing(recipes: list[Any]) -> None:
    state = property_start()
    for recipe in recipes:
        # What a step reads of the command depends on its outcome (Admitted: a Fire, ...).
        command: Any = recipe.build(state) if isinstance(recipe, SaveRecipe | DeleteRecipe | ResumeRecipe) else recipe
        after, outcome = step(state, command)
        assert variant(outcome) in OUTCOME_VARIANTS[type(command)]
        assert step_violations(state, after, outcome) == []
        if isinstance(outcome, Rejection):
            assert after == state, f"{outcome!r} changed the state"
        assert state_violations(after) == []
        assert step(state, command) == (after, outcome)  # deterministic
        # Independent of the checkers: admission and execution.
        if isinstance(outcome, Admitted):
            assert outcome.record == state.runtime[outcome.record.coordinate] and outcome.record.enabled
            assert (command.community_id, outcome.record.channel_id, outcome.record.owner) in state.authority
            assert state.communities[command.community_id] is CommunityState.ACTIVE
            assert outcome.run_id == len(state.runs) + 1
            assert after.runs[outcome.run_id] == Run(outcome.run_id, command.door, outcome.record, state.now)
            assert outcome.run_id not in state.executed
            assert after.executed == state.executed.set(outcome.run_id, outcome.record.actions)
        elif isinstance(outcome, Resumed):
            run = state.runs[command.run_id]
            assert run.record == state.runtime[run.record.coordinate]
            assert (run.record.community_id, run.record.channel_id, run.record.owner) in state.authority
            assert state.communities[run.record.community_id] is CommunityState.ACTIVE
            assert after.executed == state.executed.set(run.run_id, state.executed[run.run_id] + run.record.actions)
        else:
            assert (after.runs, after.executed) == (state.runs, state.executed)
        if isinstance(outcome, (AdmissionRefused, NotSelected)):  # at most the replica's cache reloads
            assert after == attrs.evolve(state, caches=after.caches)
            reloaded = state.caches.set(command.replica, Cache(state.now, after.caches[command.replica].records))
            assert after.caches in (state.caches, reloaded)
        for coordinate, cutoff in state.cutoffs.items():
            assert after.cutoffs[coordinate] >= cutoff  # cutoffs persist and never move back
        state = after


# ==========================================================================
# 8. The invariant checkers detect corruption


def rich() -> LifecycleSystem:
    """WF live (E1), WF2 deleted at at(5), run 1 admitted for WF via r1; now T0 + 1s."""
    s = created(one_workflow(), event(at(1), DEF_B, workflow=WF2))
    s = refresh(s, "r1")
    s = must(s, fire("r1"), Admitted(1, record_of(E1)))
    s = must(s, DeleteDefinition(C1, WF2, ALICE, at(5)), Deleted(at(5)))
    s = tick(s, SECOND)
    assert state_violations(s) == []
    return s


def only(violations: list[str], fragment: str) -> None:
    assert len(violations) == 1, violations
    assert fragment in violations[0], violations


class TestStateViolations:
    def test_a_consistent_world_has_none(self) -> None:
        assert state_violations(rich()) == []

    def test_head_without_runtime(self) -> None:
        s = rich()
        only(state_violations(attrs.evolve(s, runtime=FrozenMap())), "head and runtime split")

    def test_runtime_without_head(self) -> None:
        s = rich()
        only(state_violations(attrs.evolve(s, heads=FrozenMap())), "head and runtime split")

    @pytest.mark.parametrize(
        "fields",
        [
            {"hash": DEF_B.hash},
            {"enabled": False},
            {"owner": BOB},
            {"channel_id": CH2},
            {"actions": ACTIONS_B},
        ],
        ids=lambda f: next(iter(f)),
    )
    def test_a_disagreeing_runtime(self, fields: dict[str, Any]) -> None:
        s = rich()
        bad = attrs.evolve(s.runtime[(C1, WF)], **fields)
        only(state_violations(attrs.evolve(s, runtime=s.runtime.set((C1, WF), bad))), "disagrees with the head")

    def test_an_incarnation_newer_than_its_head(self) -> None:
        s = rich()
        bad = attrs.evolve(s.runtime[(C1, WF)], incarnation=at(1) + MICROSECOND)
        only(state_violations(attrs.evolve(s, runtime=s.runtime.set((C1, WF), bad))), "is newer than its head")

    @pytest.mark.parametrize("cutoff", [at(1), at(2)], ids=["at", "after"])
    def test_a_head_at_or_before_its_cutoff(self, cutoff: dt.datetime) -> None:
        s = rich()
        only(state_violations(attrs.evolve(s, cutoffs=s.cutoffs.set((C1, WF), cutoff))), "at or before its cutoff")

    def test_a_head_just_after_its_cutoff_is_fine(self) -> None:
        s = rich()
        assert state_violations(attrs.evolve(s, cutoffs=s.cutoffs.set((C1, WF), at(1) - MICROSECOND))) == []

    def test_a_definition_in_a_deleted_community(self) -> None:
        s = rich()
        s = attrs.evolve(s, communities=s.communities.set(C1, CommunityState.DELETED))
        only(state_violations(s), "its community is gone")

    def test_a_run_under_another_id(self) -> None:
        s = rich()
        only(state_violations(attrs.evolve(s, runs=s.runs.set(2, s.runs[1]))), "ids must be 1..n")

    def test_a_gap_in_run_ids(self) -> None:
        s = rich()
        run3 = attrs.evolve(s.runs[1], run_id=3)
        only(state_violations(attrs.evolve(s, runs=s.runs.set(3, run3))), "ids must be 1..n")

    def test_actions_executed_for_a_run_never_admitted(self) -> None:
        s = rich()
        only(state_violations(attrs.evolve(s, executed=s.executed.set(2, ("notify",)))), "never admitted")


class TestStepViolations:
    def test_a_legal_step_has_none(self) -> None:
        s = rich()
        after, outcome = step(s, fire("r1"))
        assert outcome == Admitted(2, record_of(E1))
        assert step_violations(s, after, outcome) == []

    def test_an_admission_of_a_record_that_is_not_current(self) -> None:
        s = _update(rich())
        stale = record_of(E1)
        after = attrs.evolve(
            s,
            runs=s.runs.set(2, Run(2, "event", stale, s.now)),
            executed=s.executed.set(2, stale.actions),
        )
        only(step_violations(s, after, Admitted(2, stale)), "was not current, enabled and authorised")

    def test_an_admission_for_an_owner_without_authority(self) -> None:
        s = must(rich(), SetAuthority(C1, CH, ALICE, False), Ok())
        record = record_of(E1)
        after = attrs.evolve(
            s,
            runs=s.runs.set(2, Run(2, "event", record, s.now)),
            executed=s.executed.set(2, record.actions),
        )
        only(step_violations(s, after, Admitted(2, record)), "was not current, enabled and authorised")

    def test_an_admission_that_executes_other_actions(self) -> None:
        s = rich()
        record = record_of(E1)
        after = attrs.evolve(s, runs=s.runs.set(2, Run(2, "event", record, s.now)), executed=s.executed.set(2, ("x",)))
        only(step_violations(s, after, Admitted(2, record)), "did not execute exactly its admitted record")

    @pytest.mark.parametrize("outcome", [Ok(), NotSelected(), AdmissionRefused(), ResumeRefused()], ids=repr)
    def test_actions_executed_without_admission(self, outcome: Any) -> None:
        s = rich()
        after = attrs.evolve(s, executed=s.executed.set(1, s.executed[1] + ("notify",)))
        only(step_violations(s, after, outcome), "actions executed without an admission or a resume")

    @pytest.mark.parametrize(
        ("executed", "fragment"),
        [
            (FrozenMap({1: ("label", "notify")}), "the executed actions of run 1 were rewritten"),
            (FrozenMap({1: ("notify",)}), "the executed actions of run 1 were rewritten"),
            (FrozenMap({1: ()}), "the executed actions of run 1 were rewritten"),
            (FrozenMap(), "the executed actions of a run disappeared"),
            (FrozenMap({1: ("notify", "labels")}), "the executed actions of run 1 were rewritten"),
        ],
        ids=["reordered", "truncated", "emptied", "erased", "edited"],
    )
    def test_the_executed_log_rewritten(self, executed: FrozenMap[int, tuple[str, ...]], fragment: str) -> None:
        s = rich()
        assert s.executed == FrozenMap({1: ("notify", "label")})
        only(step_violations(s, attrs.evolve(s, executed=executed), Ok()), fragment)

    def test_another_runs_actions_rewritten_during_a_legal_resume(self) -> None:
        s = must(rich(), fire("r1"), Admitted(2, record_of(E1)))
        after, outcome = step(s, ResumeRun(2))
        assert outcome == Resumed(ACTIONS) and step_violations(s, after, outcome) == []
        rewritten = attrs.evolve(after, executed=after.executed.set(1, ("label", "notify")))
        only(step_violations(s, rewritten, outcome), "the executed actions of run 1 were rewritten")

    def test_a_resume_of_a_revision_that_is_no_longer_current(self) -> None:
        s = _update(rich())
        after = attrs.evolve(s, executed=s.executed.set(1, s.executed[1] + ("notify", "label")))
        only(step_violations(s, after, Resumed(ACTIONS)), "resumed a revision that is no longer current")

    def test_a_resume_that_executes_other_actions(self) -> None:
        s = rich()
        after = attrs.evolve(s, executed=s.executed.set(1, s.executed[1] + ("label",)))
        only(step_violations(s, after, Resumed(ACTIONS)), "did not execute exactly its pinned record")

    def test_a_resume_that_executes_two_runs(self) -> None:
        s = must(rich(), fire("r1"), Admitted(2, record_of(E1)))
        after = attrs.evolve(s, executed=FrozenMap({r: s.executed[r] + ACTIONS for r in (1, 2)}))
        violations = step_violations(s, after, Resumed(ACTIONS))
        assert "a resume executed the actions of 2 runs" in violations

    def test_a_legal_resume_has_none(self) -> None:
        s = rich()
        after, outcome = step(s, ResumeRun(1))
        assert outcome == Resumed(ACTIONS)
        assert step_violations(s, after, outcome) == []

    def test_a_rejection_that_changed_the_state(self) -> None:
        s = rich()
        after = attrs.evolve(s, now=s.now + SECOND)
        only(step_violations(s, after, UnknownRun(9)), "changed the state")

    def test_the_clock_going_back(self) -> None:
        s = rich()
        only(step_violations(s, attrs.evolve(s, now=s.now - MICROSECOND), Ok()), "the clock went back")

    def test_an_admitted_run_disappearing(self) -> None:
        s = rich()
        only(step_violations(s, attrs.evolve(s, runs=FrozenMap()), Ok()), "an admitted run disappeared")

    @pytest.mark.parametrize("created_at", [at(5), at(4)], ids=["at", "before"])
    def test_a_revival_at_or_before_the_cutoff(self, created_at: dt.datetime) -> None:
        s = rich()
        e = event(created_at, DEF_B, workflow=WF2)
        after = attrs.evolve(
            s, heads=s.heads.set((C1, WF2), head_of(e)), runtime=s.runtime.set((C1, WF2), record_of(e))
        )
        only(step_violations(s, after, Created(created_at)), "revived by an event at or before its cutoff")


# ==========================================================================
# 9. The outcome catalogue


def _parameter_sets(fn: Callable[..., Any]) -> Iterator[dict[str, Any]] | None:
    """Every argument combination of `fn`'s parametrize marks; None if it must not be re-run."""
    marks = getattr(fn, "pytestmark", [])
    if any(m.name in ("xfail", "skip", "skipif") for m in marks) or hasattr(fn, "hypothesis"):
        return None
    axes: list[list[dict[str, Any]]] = []
    for mark in (m for m in marks if m.name == "parametrize"):
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        axis = []
        for value in mark.args[1]:
            if hasattr(value, "values") and hasattr(value, "marks"):  # pytest.param
                if any(m.name == "xfail" for m in value.marks):
                    continue
                value = value.values if len(names) > 1 else value.values[0]
            axis.append(dict(zip(names, value, strict=False)) if len(names) > 1 else {names[0]: value})
        axes.append(axis)
    return ({k: v for part in combo for k, v in part.items()} for combo in itertools.product(*axes))


def run_every_scenario() -> int:
    """Call every (non-xfail, non-property) test of this module; return how many calls ran."""
    calls = 0
    module = sys.modules[__name__]
    for name, obj in list(vars(module).items()):
        if inspect.isclass(obj) and name.startswith("Test") and obj is not TestCatalogue:
            tests = [(getattr(obj(), m), f) for m, f in vars(obj).items() if m.startswith("test_")]
        elif inspect.isfunction(obj) and name.startswith("test_"):
            tests = [(obj, obj)]
        else:
            continue
        for bound, fn in tests:
            combos = _parameter_sets(fn)
            for kwargs in combos or ():
                bound(**kwargs)
                calls += 1
    return calls


class TestCatalogue:
    def test_every_command_type_has_its_outcome_variants(self) -> None:
        assert set(OUTCOME_VARIANTS) == ALL_COMMANDS
        assert all(OUTCOME_VARIANTS[c] for c in ALL_COMMANDS)
        assert all(len(set(v)) == len(v) for v in OUTCOME_VARIANTS.values())

    def test_every_listed_variant_names_an_outcome_class(self) -> None:
        for variants in OUTCOME_VARIANTS.values():
            for name in variants:
                cls = getattr(lc, name, None) or getattr(d, name)
                assert isinstance(cls, type), name

    def test_rejections_are_the_refusal_outcomes(self) -> None:
        for rejection in (
            NoAuthority(CH, ALICE),
            NotAuthor(WF, ALICE),
            UnknownReplica("r3"),
            AlternateDeletionRejected("admin"),
            UnknownRun(1),
            NotFound("workflow", C1, WF),
            UnknownCommunity(C1),
            CommunityNotWritable(C1, CommunityState.FENCED),
            AlreadyExists("community", C1, C1),
        ):
            assert isinstance(rejection, Rejection)
        for result in (
            Created(T0),
            Updated(True),
            Superseded(T0),
            BeforeCutoff(T0),
            Deleted(T0),
            Admitted(1, record_of(E1)),
            NotSelected(),
            AdmissionRefused(),
            Resumed(ACTIONS),
            ResumeRefused(),
            Ok(),
        ):
            assert not isinstance(result, Rejection)

    def test_variant_names(self) -> None:
        assert variant(Admitted(1, record_of(E1))) == "Admitted"
        assert variant(CommunityNotWritable(C1, CommunityState.FENCED)) == "CommunityNotWritable"
        assert variant(NotSelected()) == "NotSelected"

    @pytest.mark.parametrize("not_a_command", [object(), "Fire", None, Fire, Ok(), d.Reap()], ids=_stable_id)
    def test_step_on_a_non_command_raises_type_error(self, not_a_command: Any) -> None:
        with pytest.raises(TypeError):
            step(world(), not_a_command)

    def test_the_scenarios_reach_every_listed_variant(self) -> None:
        global RECORDER
        saved, RECORDER = RECORDER, Recorder()
        try:
            calls = run_every_scenario()
            observed, reachable = RECORDER.reachable | RECORDER.handmade, set(RECORDER.reachable)
        finally:
            RECORDER = saved
        listed = {(command, name) for command, names in OUTCOME_VARIANTS.items() for name in names}
        assert calls > 250
        # Everything observed is listed, and every listed variant was observed ...
        assert observed == listed, (sorted(map(str, listed - observed)), sorted(map(str, observed - listed)))
        # ... from a state reached through `step` alone, not only from a hand-made one
        # (the `deleted` community states built by `with_community_state`).
        assert reachable == listed, sorted(map(str, listed - reachable))
