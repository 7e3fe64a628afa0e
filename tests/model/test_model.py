"""The delivery model alone: its values, every operation's outcomes, its invariants.

No database here. Every test drives `step(state, command)` (or constructs a
value) and asserts exact outcomes and exact state fields. The `apply` helper
also checks, on every step it takes, that the invariants hold and that a
rejection left the state unchanged, so each scenario doubles as an invariant
check.

The world: two live communities C1 and C2 with the same workflows, runs and
message events (ids are per community); C_UNKNOWN was never created. ALICE
and BOB are targets. The clock starts at T0.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any, cast

import attrs
import pytest
from helpers import Stepping, raises_invalid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, EventCause, ScheduleCause, WebhookCause
from leaseproof.model.delivery import (
    OUTCOME_VARIANTS,
    AdvanceClock,
    AlreadyExists,
    AlreadyTerminal,
    Claim,
    Claimed,
    ClaimMiss,
    CommitDeliveries,
    Committed,
    CommunityNotWritable,
    CommunityState,
    CreateCommunity,
    CreateRun,
    CreateWorkflow,
    DeleteCommunity,
    DeleteEvent,
    DeleteRun,
    DeleteWorkflow,
    Delivery,
    DeliveryIdTaken,
    DeliverySystem,
    Finish,
    Found,
    GetDelivery,
    Lease,
    LeaseLost,
    NewDelivery,
    NotFound,
    Ok,
    PublishEvent,
    Reap,
    Reaped,
    Rejection,
    Renew,
    Renewed,
    SetCommunityState,
    Settled,
    Status,
    UnknownCommunity,
    WorkflowMismatch,
    initial_state,
    step,
    variant,
)
from leaseproof.model.errors import InvalidValue
from leaseproof.model.frozenmap import FrozenMap
from leaseproof.model.invariants import state_violations, step_violations

# --------------------------------------------------------------------------
# The world

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SECOND = dt.timedelta(seconds=1)
MICROSECOND = dt.timedelta(microseconds=1)
LEASE = 30  # seconds, the default lease in these tests

C1, C2, C_UNKNOWN = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)
WF, WF2, WF_NEW = uuid.UUID(int=10), uuid.UUID(int=11), uuid.UUID(int=12)
RUN, RUN2, RUN_WF2, RUN_NEW = uuid.UUID(int=20), uuid.UUID(int=21), uuid.UUID(int=22), uuid.UUID(int=23)
RUN_WORKFLOW = {RUN: WF, RUN2: WF, RUN_WF2: WF2}

MSG, MSG2, MSG_NEW = b"\x01" * 32, b"\x02" * 32, b"\x09" * 32
DEFINITION, DEFINITION2 = b"\x03" * 32, b"\x04" * 32
ALICE, BOB = b"\xa1" * 32, b"\xb0" * 32
TRIGGER, TRIGGER2 = b"\x05" * 32, b"\x06" * 32
INVOCATION, INVOCATION2 = uuid.UUID(int=40), uuid.UUID(int=41)

D1, D2, D3, D4, D5 = (uuid.UUID(int=100 + n) for n in range(1, 6))

EVENT_CAUSE = EventCause(TRIGGER)


def _stable_id(value: object) -> str:
    """A test id that is the same in every process (a bare object's repr holds its address,
    which differs between pytest-xdist workers, and they must collect the same tests)."""
    return "object()" if type(value) is object else repr(value)


def binding(
    *,
    community: uuid.UUID = C1,
    workflow: uuid.UUID = WF,
    run: uuid.UUID = RUN,
    step_id: str = "s1",
    target: bytes = ALICE,
    definition: bytes = DEFINITION,
    message: bytes = MSG,
    cause: Any = EVENT_CAUSE,
) -> Binding:
    return Binding(
        community_id=community,
        workflow_id=workflow,
        run_id=run,
        step_id=step_id,
        target_pubkey=target,
        definition_event_id=definition,
        message_event_id=message,
        cause=cause,
    )


def new(delivery_id: uuid.UUID, **fields: Any) -> NewDelivery:
    return NewDelivery(delivery_id, binding(**fields))


def commit_of(*news: NewDelivery) -> CommitDeliveries:
    """A commit whose community, run and step are those of the first delivery."""
    b = news[0].binding
    return CommitDeliveries(b.community_id, b.run_id, b.step_id, news)


def pending_row(delivery_id: uuid.UUID, b: Binding, created_at: dt.datetime = T0) -> Delivery:
    return Delivery(
        id=delivery_id,
        binding=b,
        status=Status.PENDING,
        lease_generation=0,
        lease_until=None,
        claimed_at=None,
        finished_at=None,
        created_at=created_at,
    )


# Every step checked: the invariants, and a rejection leaving the state unchanged.
STEPS = Stepping(step, state_violations, step_violations)
apply, must, refused, tick = STEPS.apply, STEPS.must, STEPS.unchanged, STEPS.tick


def claim(
    state: DeliverySystem, target: bytes = ALICE, community: uuid.UUID = C1, seconds: int = LEASE, **kw: Any
) -> tuple[DeliverySystem, Lease]:
    after, outcome = apply(state, Claim(community, target, seconds, **kw))
    assert isinstance(outcome, Claimed), outcome
    assert after.deliveries[outcome.delivery.key] == outcome.delivery
    return after, outcome.lease


def row(state: DeliverySystem, delivery_id: uuid.UUID = D1, community: uuid.UUID = C1) -> Delivery:
    return state.deliveries[(community, delivery_id)]


def world() -> DeliverySystem:
    """Both communities active, each with WF (RUN, RUN2), WF2 (RUN_WF2), MSG and MSG2."""
    s = initial_state(T0)
    for c in (C1, C2):
        for command in (
            CreateCommunity(c),
            CreateWorkflow(c, WF),
            CreateWorkflow(c, WF2),
            CreateRun(c, WF, RUN),
            CreateRun(c, WF, RUN2),
            CreateRun(c, WF2, RUN_WF2),
            PublishEvent(c, MSG),
            PublishEvent(c, MSG2),
        ):
            s = must(s, command, Ok())
    return s


def one_pending() -> DeliverySystem:
    """World plus D1: pending for ALICE in C1 (RUN, step s1), created at T0."""
    return must(world(), commit_of(new(D1)), Committed((D1,), False))


def one_claimed() -> tuple[DeliverySystem, Lease]:
    """D1 claimed by ALICE at T0 for LEASE seconds (generation 1)."""
    return claim(one_pending())


def one_finished(outcome: Status = Status.FINISHED) -> tuple[DeliverySystem, Lease]:
    s, lease = one_claimed()
    return must(s, Finish(lease, outcome), Settled(outcome)), lease


def expire_and_reap(s: DeliverySystem, lease: Lease) -> DeliverySystem:
    """Move one microsecond past the lease's row expiry and reap it."""
    lease_until = row(s, lease.delivery_id, lease.community_id).lease_until
    assert lease_until is not None
    s = tick(s, lease_until - s.now + MICROSECOND)
    after, outcome = apply(s, Reap())
    assert isinstance(outcome, Reaped) and outcome.count >= 1
    return after


def set_state(s: DeliverySystem, community: uuid.UUID, state: CommunityState) -> DeliverySystem:
    return must(s, SetCommunityState(community, state), Ok())


# ==========================================================================
# 1. Value validation


class TestStepId:
    @pytest.mark.parametrize(
        "bad",
        [
            "",
            " ",
            "\t",
            "\n",
            " \t\n\r\f\v ",
            "a" * 65,
            "é" * 65,
            "a\x00b",
            "\x00",
            "\ud800",
            5,
            None,
            b"s1",
        ],
        ids=repr,
    )
    def test_binding_rejects_malformed_step_id(self, bad: Any) -> None:
        raises_invalid("step_id", lambda: binding(step_id=bad))

    @pytest.mark.parametrize("bad", ["", " \t\n", "a" * 65, "a\x00"], ids=repr)
    def test_commit_rejects_malformed_step_id(self, bad: Any) -> None:
        raises_invalid("step_id", lambda: CommitDeliveries(C1, RUN, bad, [new(D1)]))

    @pytest.mark.parametrize("good", ["a" * 64, "é" * 64, "x", " x ", "\tstep\n", "步"], ids=repr)
    def test_binding_accepts_step_id(self, good: str) -> None:
        assert binding(step_id=good).step_id == good

    def test_error_names_value_and_rule(self) -> None:
        error = raises_invalid("step_id", lambda: binding(step_id="a" * 65))
        assert error.value == "a" * 65
        assert error.rule == "must be at most 64 characters"


class TestKeys:
    @pytest.mark.parametrize("field", ["target", "definition", "message"])
    @pytest.mark.parametrize("bad", [b"\x01" * 31, b"\x01" * 33, b"", bytearray(32), "a" * 32, None], ids=repr)
    def test_binding_rejects_key_not_32_bytes(self, field: str, bad: Any) -> None:
        name = {"target": "target_pubkey", "definition": "definition_event_id", "message": "message_event_id"}
        raises_invalid(name[field], lambda: binding(**{field: bad}))

    @pytest.mark.parametrize("bad", [b"\x01" * 31, b"\x01" * 33], ids=len)
    def test_event_cause_rejects_key_not_32_bytes(self, bad: bytes) -> None:
        raises_invalid("event_id", lambda: EventCause(bad))

    @pytest.mark.parametrize("bad", [b"\x01" * 31, b"\x01" * 33], ids=len)
    def test_commands_and_lease_reject_key_not_32_bytes(self, bad: bytes) -> None:
        raises_invalid("target_pubkey", lambda: Claim(C1, bad, LEASE))
        raises_invalid("target_pubkey", lambda: Lease(C1, D1, bad, 1, T0))
        raises_invalid("event_id", lambda: PublishEvent(C1, bad))
        raises_invalid("event_id", lambda: DeleteEvent(C1, bad))

    def test_32_bytes_is_accepted(self) -> None:
        assert EventCause(b"\x00" * 32).event_id == b"\x00" * 32


class TestIds:
    @pytest.mark.parametrize("field", ["community", "workflow", "run"])
    @pytest.mark.parametrize("bad", [str(uuid.UUID(int=1)), 1, uuid.UUID(int=1).bytes, None], ids=repr)
    def test_binding_rejects_non_uuid(self, field: str, bad: Any) -> None:
        raises_invalid(f"{field}_id", lambda: binding(**{field: bad}))

    def test_commands_reject_non_uuid(self) -> None:
        text: Any = str(D1)  # deliberately not a UUID: the validators must refuse it
        raises_invalid("invocation_id", lambda: WebhookCause(text))
        raises_invalid("id", lambda: NewDelivery(text, binding()))
        raises_invalid("community_id", lambda: Claim(text, ALICE, LEASE))
        raises_invalid("delivery_id", lambda: Claim(C1, ALICE, LEASE, delivery_id=text))
        raises_invalid("delivery_id", lambda: Lease(C1, text, ALICE, 1, T0))
        raises_invalid("delivery_id", lambda: GetDelivery(C1, text))
        raises_invalid("community_id", lambda: CreateCommunity(text))
        raises_invalid("run_id", lambda: CreateRun(C1, WF, text))
        raises_invalid("run_id", lambda: CommitDeliveries(C1, text, "s1", [new(D1)]))

    def test_claim_delivery_id_is_optional(self) -> None:
        assert Claim(C1, ALICE, LEASE).delivery_id is None


class TestInstants:
    NAIVE = dt.datetime(2026, 1, 1)

    def test_naive_datetimes_are_rejected(self) -> None:
        raises_invalid("scheduled_for", lambda: ScheduleCause(self.NAIVE))
        raises_invalid("lease_until", lambda: Lease(C1, D1, ALICE, 1, self.NAIVE))
        raises_invalid("now", lambda: initial_state(self.NAIVE))

    def test_schedule_cause_rejects_microseconds(self) -> None:
        error = raises_invalid("scheduled_for", lambda: ScheduleCause(T0 + MICROSECOND))
        assert error.rule == "must be a whole-second instant"

    def test_schedule_cause_rejects_a_sub_second_utc_offset(self) -> None:
        odd_zone = dt.timezone(dt.timedelta(microseconds=500_000))
        raises_invalid("scheduled_for", lambda: ScheduleCause(dt.datetime(2026, 1, 1, tzinfo=odd_zone)))

    def test_schedule_cause_normalises_to_utc(self) -> None:
        plus_two = dt.timezone(dt.timedelta(hours=2))
        cause = ScheduleCause(dt.datetime(2026, 1, 1, 2, tzinfo=plus_two))
        assert cause.scheduled_for.tzinfo is dt.UTC
        assert cause == ScheduleCause(T0)

    def test_state_clock_is_stored_in_utc(self) -> None:
        plus_two = dt.timezone(dt.timedelta(hours=2))
        assert initial_state(dt.datetime(2026, 1, 1, 2, tzinfo=plus_two)) == initial_state(T0)


class TestCause:
    @pytest.mark.parametrize("bad", [None, "event", TRIGGER, INVOCATION, T0, EventCause, (EVENT_CAUSE,)], ids=repr)
    def test_cause_must_be_one_of_the_three_kinds(self, bad: Any) -> None:
        error = raises_invalid("cause", lambda: binding(cause=bad))
        assert error.rule == "must be exactly one of event, schedule or webhook cause"

    @pytest.mark.parametrize("cause", [EVENT_CAUSE, ScheduleCause(T0), WebhookCause(INVOCATION)])
    def test_each_kind_is_accepted(self, cause: Any) -> None:
        assert binding(cause=cause).cause == cause

    def test_kinds_are_named(self) -> None:
        assert (EVENT_CAUSE.kind, ScheduleCause(T0).kind, WebhookCause(INVOCATION).kind) == (
            "event",
            "schedule",
            "webhook",
        )


class TestLeaseSeconds:
    BAD = (0, -1, True, False, 86401, 1.5, 30.0, "30", None)

    @pytest.mark.parametrize("bad", BAD, ids=repr)
    def test_claim_rejects(self, bad: Any) -> None:
        raises_invalid("lease_seconds", lambda: Claim(C1, ALICE, bad))

    @pytest.mark.parametrize("bad", BAD, ids=repr)
    def test_renew_rejects(self, bad: Any) -> None:
        lease = Lease(C1, D1, ALICE, 1, T0)
        raises_invalid("lease_seconds", lambda: Renew(lease, bad))

    @pytest.mark.parametrize("good", [1, 86400])
    def test_bounds_are_accepted(self, good: int) -> None:
        assert Claim(C1, ALICE, good).lease_seconds == good
        assert Renew(Lease(C1, D1, ALICE, 1, T0), good).lease_seconds == good


class TestOtherCommandValues:
    @pytest.mark.parametrize("bad", [Status.PENDING, Status.CLAIMED, "finished", None], ids=repr)
    def test_finish_outcome_must_be_terminal(self, bad: Any) -> None:
        raises_invalid("outcome", lambda: Finish(Lease(C1, D1, ALICE, 1, T0), bad))

    @pytest.mark.parametrize("good", [Status.FINISHED, Status.FAILED])
    def test_finish_accepts_terminal_outcomes(self, good: Status) -> None:
        assert Finish(Lease(C1, D1, ALICE, 1, T0), good).outcome is good

    @pytest.mark.parametrize("bad", [CommunityState.DELETED, "active", None], ids=repr)
    def test_set_community_state_refuses_deleted_and_non_states(self, bad: Any) -> None:
        raises_invalid("state", lambda: SetCommunityState(C1, bad))

    @pytest.mark.parametrize("bad", [dt.timedelta(0), -MICROSECOND, -SECOND, 5, None], ids=repr)
    def test_advance_clock_must_move_forward(self, bad: Any) -> None:
        raises_invalid("by", lambda: AdvanceClock(bad))

    @pytest.mark.parametrize("bad", [-1, True, 1.0, "1", None], ids=repr)
    def test_lease_generation_must_be_a_non_negative_integer(self, bad: Any) -> None:
        raises_invalid("lease_generation", lambda: Lease(C1, D1, ALICE, bad, T0))

    def test_lease_generation_zero_is_accepted(self) -> None:
        assert Lease(C1, D1, ALICE, 0, T0).lease_generation == 0

    def test_advance_clock_accepts_one_microsecond(self) -> None:
        assert AdvanceClock(MICROSECOND).by == MICROSECOND


class TestCommitShape:
    def test_commit_needs_at_least_one_delivery(self) -> None:
        raises_invalid("deliveries", lambda: CommitDeliveries(C1, RUN, "s1", []))

    @pytest.mark.parametrize(
        ("field", "change"),
        [("community_id", {"community": C2}), ("run_id", {"run": RUN2}), ("step_id", {"step_id": "s2"})],
    )
    def test_every_binding_must_name_the_commits_community_run_and_step(
        self, field: str, change: dict[str, Any]
    ) -> None:
        error = raises_invalid(
            f"deliveries[1].binding.{field}",
            lambda: CommitDeliveries(C1, RUN, "s1", [new(D1), new(D2, target=BOB, **change)]),
        )
        assert error.rule == f"must equal the commit's {field}"

    def test_step_id_must_match_exactly_not_after_trimming(self) -> None:
        raises_invalid(
            "deliveries[0].binding.step_id", lambda: CommitDeliveries(C1, RUN, "s1", [new(D1, step_id=" s1")])
        )

    def test_elements_must_be_new_deliveries(self) -> None:
        raises_invalid("deliveries[0]", lambda: CommitDeliveries(C1, RUN, "s1", [cast(Any, binding())]))

    def test_deliveries_are_stored_as_a_tuple(self) -> None:
        assert CommitDeliveries(C1, RUN, "s1", [new(D1)]).deliveries == (new(D1),)

    def test_new_delivery_needs_a_binding(self) -> None:
        raises_invalid("binding", lambda: NewDelivery(D1, cast(Any, "binding")))


# ==========================================================================
# 2. Operations


class TestCommunities:
    def test_create_makes_an_active_community(self) -> None:
        s = must(initial_state(T0), CreateCommunity(C1), Ok())
        assert s.communities == FrozenMap({C1: CommunityState.ACTIVE})

    def test_create_twice_is_already_exists(self) -> None:
        refused(world(), CreateCommunity(C1), AlreadyExists("community", C1, C1))

    def test_set_state_moves_between_live_states(self) -> None:
        s = world()
        for target in (CommunityState.QUIESCING, CommunityState.FENCED, CommunityState.ACTIVE):
            s = set_state(s, C1, target)
            assert s.communities[C1] is target
            assert s.communities[C2] is CommunityState.ACTIVE

    def test_set_state_of_unknown_community(self) -> None:
        refused(world(), SetCommunityState(C_UNKNOWN, CommunityState.FENCED), UnknownCommunity(C_UNKNOWN))

    def test_set_state_of_deleted_community_is_refused(self) -> None:
        s = must(world(), DeleteCommunity(C1), Ok())
        for target in (CommunityState.ACTIVE, CommunityState.FENCED):
            refused(s, SetCommunityState(C1, target), CommunityNotWritable(C1, CommunityState.DELETED))

    def test_delete_purges_every_row_and_leaves_a_tombstone(self) -> None:
        s, _ = one_claimed()
        s = must(s, commit_of(new(D1, community=C2)), Committed((D1,), False))
        s = must(s, DeleteCommunity(C1), Ok())
        assert s.communities == FrozenMap({C1: CommunityState.DELETED, C2: CommunityState.ACTIVE})
        assert {k[0] for k in s.workflows} == {C2}
        assert {k[0] for k in s.runs} == {C2}
        assert {k[0] for k in s.events} == {C2}
        assert list(s.deliveries) == [(C2, D1)]
        assert s.retired == frozenset()

    def test_delete_works_on_a_fenced_community(self) -> None:
        s, _ = one_claimed()
        s = set_state(s, C1, CommunityState.FENCED)
        s = must(s, DeleteCommunity(C1), Ok())
        assert s.communities[C1] is CommunityState.DELETED
        assert (C1, D1) not in s.deliveries

    def test_delete_unknown_community(self) -> None:
        refused(world(), DeleteCommunity(C_UNKNOWN), UnknownCommunity(C_UNKNOWN))

    def test_delete_of_a_tombstone_is_an_ok_no_op(self) -> None:
        s = must(world(), DeleteCommunity(C1), Ok())
        after, outcome = apply(s, DeleteCommunity(C1))
        assert (outcome, after) == (Ok(), s)

    def test_a_deleted_id_is_never_reused(self) -> None:
        s = must(world(), DeleteCommunity(C1), Ok())
        refused(s, CreateCommunity(C1), AlreadyExists("community", C1, C1))


def _writes(community: uuid.UUID, lease: Lease) -> dict[str, Any]:
    """One of every write to `community`; each would otherwise be accepted."""
    lease = attrs.evolve(lease, community_id=community)
    return {
        "CreateWorkflow": CreateWorkflow(community, WF_NEW),
        "DeleteWorkflow": DeleteWorkflow(community, WF),
        "CreateRun": CreateRun(community, WF, RUN_NEW),
        "DeleteRun": DeleteRun(community, RUN),
        "PublishEvent": PublishEvent(community, MSG_NEW),
        "DeleteEvent": DeleteEvent(community, MSG),
        "CommitDeliveries": commit_of(new(D5, community=community, step_id="s9")),
        "Claim": Claim(community, ALICE, LEASE),
        "Claim(expected)": Claim(community, ALICE, LEASE, expected=binding(community=community, step_id="s2")),
        "Renew": Renew(lease, LEASE),
        "Finish": Finish(lease, Status.FINISHED),
    }


WRITES = list(_writes(C1, Lease(C1, D1, ALICE, 1, T0)))


def _two_pending_one_claimed() -> tuple[DeliverySystem, Lease]:
    """D1 (ALICE) claimed, D2 (ALICE, step s2) pending: every write in `_writes` would succeed."""
    s = one_pending()
    s = must(s, commit_of(new(D2, step_id="s2")), Committed((D2,), False))
    return claim(s, delivery_id=D1)


class TestWriteFence:
    @pytest.mark.parametrize("name", WRITES)
    def test_every_write_succeeds_in_an_active_community(self, name: str) -> None:
        s, lease = _two_pending_one_claimed()
        _, outcome = apply(s, _writes(C1, lease)[name])
        assert not isinstance(outcome, Rejection | ClaimMiss | LeaseLost), outcome

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    @pytest.mark.parametrize("name", WRITES)
    def test_non_active_community_refuses_every_write(self, name: str, state: CommunityState) -> None:
        s, lease = _two_pending_one_claimed()
        s = set_state(s, C1, state)
        refused(s, _writes(C1, lease)[name], CommunityNotWritable(C1, state))

    @pytest.mark.parametrize("name", WRITES)
    def test_deleted_community_refuses_every_write(self, name: str) -> None:
        s, lease = _two_pending_one_claimed()
        s = must(s, DeleteCommunity(C1), Ok())
        refused(s, _writes(C1, lease)[name], CommunityNotWritable(C1, CommunityState.DELETED))

    @pytest.mark.parametrize("name", WRITES)
    def test_unknown_community_refuses_every_write(self, name: str) -> None:
        s, lease = _two_pending_one_claimed()
        refused(s, _writes(C_UNKNOWN, lease)[name], UnknownCommunity(C_UNKNOWN))

    def test_an_unexpired_lease_survives_a_fence(self) -> None:
        s, lease = one_claimed()
        s = set_state(s, C1, CommunityState.FENCED)
        s = tick(s, 10 * SECOND)
        s = set_state(s, C1, CommunityState.ACTIVE)
        must(s, Renew(lease, LEASE), Renewed(T0 + 40 * SECOND))

    def test_a_lease_expiring_while_fenced_is_reaped_after_reactivation(self) -> None:
        s, lease = one_claimed()
        s = set_state(s, C1, CommunityState.FENCED)
        s = tick(s, LEASE * SECOND + MICROSECOND)
        refused(s, Reap(), Reaped(0))
        s = set_state(s, C1, CommunityState.ACTIVE)
        refused(s, Renew(lease, LEASE), LeaseLost())
        s = must(s, Reap(), Reaped(1))
        assert (row(s).status, row(s).lease_generation) == (Status.PENDING, 2)

    def test_fencing_one_community_leaves_the_other_writable(self) -> None:
        s = set_state(world(), C1, CommunityState.FENCED)
        must(s, commit_of(new(D1, community=C2)), Committed((D1,), False))


class TestWorkflowsRunsEvents:
    def test_create_workflow_twice(self) -> None:
        refused(world(), CreateWorkflow(C1, WF), AlreadyExists("workflow", C1, WF))

    def test_delete_unknown_workflow(self) -> None:
        refused(world(), DeleteWorkflow(C1, WF_NEW), NotFound("workflow", C1, WF_NEW))

    def test_create_run_of_unknown_workflow(self) -> None:
        refused(world(), CreateRun(C1, WF_NEW, RUN_NEW), NotFound("workflow", C1, WF_NEW))

    def test_create_run_twice(self) -> None:
        refused(world(), CreateRun(C1, WF2, RUN), AlreadyExists("run", C1, RUN))

    def test_create_run_records_its_workflow(self) -> None:
        s = must(world(), CreateRun(C1, WF2, RUN_NEW), Ok())
        assert s.runs[(C1, RUN_NEW)] == WF2
        assert (C2, RUN_NEW) not in s.runs

    def test_delete_unknown_run(self) -> None:
        refused(world(), DeleteRun(C1, RUN_NEW), NotFound("run", C1, RUN_NEW))

    def test_publish_event_twice(self) -> None:
        refused(world(), PublishEvent(C1, MSG), AlreadyExists("event", C1, MSG))

    def test_delete_unknown_event(self) -> None:
        refused(world(), DeleteEvent(C1, MSG_NEW), NotFound("event", C1, MSG_NEW))

    def test_ids_are_scoped_per_community(self) -> None:
        s = must(world(), DeleteRun(C1, RUN), Ok())
        assert (C2, RUN) in s.runs
        refused(s, DeleteRun(C1, RUN), NotFound("run", C1, RUN))


def _cascade_world() -> DeliverySystem:
    """C1: D1 (RUN, MSG, claimed), D2 (RUN2, MSG2), D3 (RUN_WF2, MSG); C2: D1 (RUN, MSG)."""
    s = one_pending()
    s = must(s, commit_of(new(D2, run=RUN2, message=MSG2)), Committed((D2,), False))
    s = must(s, commit_of(new(D3, run=RUN_WF2, workflow=WF2, target=BOB)), Committed((D3,), False))
    s = must(s, commit_of(new(D1, community=C2)), Committed((D1,), False))
    s, _ = claim(s, delivery_id=D1)
    return s


class TestCascades:
    def test_deleting_a_run_removes_its_deliveries_only(self) -> None:
        before = _cascade_world()
        s = must(before, DeleteRun(C1, RUN), Ok())
        assert set(s.deliveries) == {(C1, D2), (C1, D3), (C2, D1)}
        assert s.deliveries[(C1, D2)] == before.deliveries[(C1, D2)]
        assert (C1, RUN) not in s.runs
        assert s.retired == frozenset({(C1, D1)})

    def test_deleting_a_workflow_removes_its_runs_and_their_deliveries(self) -> None:
        s = must(_cascade_world(), DeleteWorkflow(C1, WF), Ok())
        assert set(s.deliveries) == {(C1, D3), (C2, D1)}
        assert {k for k in s.runs if k[0] == C1} == {(C1, RUN_WF2)}
        assert (C1, WF) not in s.workflows and (C2, WF) in s.workflows
        assert s.retired == frozenset({(C1, D1), (C1, D2)})

    def test_deleting_the_message_event_removes_its_deliveries(self) -> None:
        s = must(_cascade_world(), DeleteEvent(C1, MSG), Ok())
        assert set(s.deliveries) == {(C1, D2), (C2, D1)}
        assert (C1, MSG) not in s.events and (C2, MSG) in s.events
        assert s.retired == frozenset({(C1, D1), (C1, D3)})

    def test_deleting_a_definition_or_trigger_named_event_leaves_deliveries(self) -> None:
        s = must(world(), PublishEvent(C1, DEFINITION), Ok())
        s = must(s, PublishEvent(C1, TRIGGER), Ok())
        s = must(s, commit_of(new(D1)), Committed((D1,), False))
        s = must(s, DeleteEvent(C1, DEFINITION), Ok())
        s = must(s, DeleteEvent(C1, TRIGGER), Ok())
        assert set(s.deliveries) == {(C1, D1)}
        assert s.retired == frozenset()


def _run_recreated_after_delete() -> tuple[DeliverySystem, Lease]:
    """D1 (ALICE, RUN, s1) claimed at generation 1, then RUN deleted and recreated; the old lease is returned."""
    s, lease = one_claimed()
    s = must(s, DeleteRun(C1, RUN), Ok())
    return must(s, CreateRun(C1, WF, RUN), Ok()), lease


class TestRetiredIds:
    def test_a_deleted_id_cannot_be_committed_again(self) -> None:
        s, _ = _run_recreated_after_delete()
        assert s.retired == frozenset({(C1, D1)})
        refused(s, commit_of(new(D1)), DeliveryIdTaken(C1, D1))

    def test_a_retired_id_rolls_back_the_whole_commit(self) -> None:
        s, _ = _run_recreated_after_delete()
        refused(s, commit_of(new(D2, target=BOB), new(D1)), DeliveryIdTaken(C1, D1))

    def test_the_identity_can_be_recommitted_under_a_new_id(self) -> None:
        s, _ = _run_recreated_after_delete()
        s = must(s, commit_of(new(D2)), Committed((D2,), False))
        assert row(s, D2) == pending_row(D2, binding())

    def test_a_lease_on_the_deleted_row_governs_nothing(self) -> None:
        s, old = _run_recreated_after_delete()
        s = must(s, commit_of(new(D2)), Committed((D2,), False))
        s, _ = claim(s)
        refused(s, Renew(old, LEASE), LeaseLost())
        refused(s, Finish(old, Status.FINISHED), LeaseLost())

    def test_a_retired_id_whose_identity_is_live_is_the_usual_no_op(self) -> None:
        s, _ = _run_recreated_after_delete()
        s = must(s, commit_of(new(D2)), Committed((D2,), False))
        refused(s, commit_of(new(D1)), Committed((), True))

    def test_retirement_is_per_community(self) -> None:
        s, _ = _run_recreated_after_delete()
        must(s, commit_of(new(D1, community=C2)), Committed((D1,), False))

    def test_deleting_the_community_forgets_its_retired_ids_only(self) -> None:
        s, _ = _run_recreated_after_delete()
        s = must(s, commit_of(new(D4, community=C2)), Committed((D4,), False))
        s = must(s, DeleteRun(C2, RUN), Ok())
        assert s.retired == frozenset({(C1, D1), (C2, D4)})
        s = must(s, DeleteCommunity(C1), Ok())
        assert s.retired == frozenset({(C2, D4)})


class TestCommit:
    def test_creates_pending_rows_with_every_field(self) -> None:
        s = tick(world(), SECOND)
        s = must(s, commit_of(new(D1), new(D2, target=BOB)), Committed((D1, D2), False))
        assert row(s, D1) == pending_row(D1, binding(), T0 + SECOND)
        assert row(s, D2) == pending_row(D2, binding(target=BOB), T0 + SECOND)
        assert set(s.deliveries) == {(C1, D1), (C1, D2)}

    def test_created_follows_the_commands_order(self) -> None:
        s = must(world(), commit_of(new(D2), new(D1, target=BOB)), Committed((D2, D1), False))
        assert len(s.deliveries) == 2

    def test_identical_retry_is_a_no_op(self) -> None:
        s = must(world(), commit_of(new(D1), new(D2, target=BOB)), Committed((D1, D2), False))
        s = tick(s, SECOND)
        refused(s, commit_of(new(D1), new(D2, target=BOB)), Committed((), True))

    def test_retry_does_not_touch_a_claimed_or_finished_row(self) -> None:
        s, _ = one_finished()
        refused(s, commit_of(new(D1)), Committed((), True))

    def test_retry_adding_a_target_creates_only_that_target(self) -> None:
        s = one_pending()
        s = tick(s, SECOND)
        before = row(s, D1)
        s = must(s, commit_of(new(D1), new(D2, target=BOB)), Committed((D2,), True))
        assert row(s, D1) == before
        assert row(s, D2).created_at == T0 + SECOND

    def test_existing_identity_under_another_id_is_a_no_op(self) -> None:
        s = one_pending()
        refused(s, commit_of(new(D2)), Committed((), True))

    def test_existing_identity_with_another_binding_is_a_no_op(self) -> None:
        s = one_pending()
        refused(s, commit_of(new(D2, message=MSG2, cause=WebhookCause(INVOCATION))), Committed((), True))

    def test_identity_existed_reports_another_target_of_the_same_step(self) -> None:
        s = one_pending()
        must(s, commit_of(new(D2, target=BOB)), Committed((D2,), True))

    def test_identity_existed_is_per_run_and_step(self) -> None:
        s = one_pending()
        s = must(s, commit_of(new(D2, step_id="s2")), Committed((D2,), False))
        s = must(s, commit_of(new(D3, run=RUN2)), Committed((D3,), False))
        must(s, commit_of(new(D4, community=C2)), Committed((D4,), False))

    def test_identity_existed_is_true_for_a_step_whose_rows_are_terminal(self) -> None:
        s, _ = one_finished()
        must(s, commit_of(new(D2, target=BOB)), Committed((D2,), True))

    def test_taken_id_on_a_later_target_rolls_back_every_target(self) -> None:
        s = one_pending()
        refused(
            s,
            commit_of(new(D2, step_id="s2"), new(D1, step_id="s2", target=BOB)),
            DeliveryIdTaken(C1, D1),
        )

    def test_same_id_twice_in_one_commit_rolls_back(self) -> None:
        refused(world(), commit_of(new(D1), new(D1, target=BOB)), DeliveryIdTaken(C1, D1))

    def test_same_identity_twice_in_one_commit_keeps_the_first(self) -> None:
        s = must(world(), commit_of(new(D1), new(D2)), Committed((D1,), False))
        assert set(s.deliveries) == {(C1, D1)}

    def test_same_id_in_two_communities_are_independent_rows(self) -> None:
        s = one_pending()
        s = must(s, commit_of(new(D1, community=C2, target=BOB)), Committed((D1,), False))
        assert row(s, D1, C2) == pending_row(D1, binding(community=C2, target=BOB))
        s, lease = claim(s, target=BOB, community=C2)
        assert lease == Lease(C2, D1, BOB, 1, T0 + LEASE * SECOND)
        assert row(s, D1, C1) == pending_row(D1, binding())
        s = must(s, Finish(lease, Status.FAILED), Settled(Status.FAILED))
        assert row(s, D1, C1).status is Status.PENDING

    def test_binding_workflow_must_be_the_runs_workflow(self) -> None:
        refused(
            world(),
            commit_of(new(D1), new(D2, target=BOB, workflow=WF2)),
            WorkflowMismatch(RUN, WF, WF2),
        )

    def test_unknown_run(self) -> None:
        refused(world(), commit_of(new(D1, run=RUN_NEW)), NotFound("run", C1, RUN_NEW))

    def test_run_of_the_other_community_is_not_found(self) -> None:
        s = must(world(), CreateRun(C2, WF, RUN_NEW), Ok())
        refused(s, commit_of(new(D1, run=RUN_NEW)), NotFound("run", C1, RUN_NEW))

    def test_unknown_message_event(self) -> None:
        refused(world(), commit_of(new(D1), new(D2, target=BOB, message=MSG_NEW)), NotFound("event", C1, MSG_NEW))

    def test_definition_and_trigger_events_need_not_exist(self) -> None:
        must(world(), commit_of(new(D1, definition=DEFINITION2, cause=EventCause(TRIGGER2))), Committed((D1,), False))

    def test_check_order_community_then_run_then_workflow_then_event(self) -> None:
        bad_everything = {"run": RUN_NEW, "workflow": WF2, "message": MSG_NEW}
        refused(world(), commit_of(new(D1, community=C_UNKNOWN, **bad_everything)), UnknownCommunity(C_UNKNOWN))
        refused(world(), commit_of(new(D1, **bad_everything)), NotFound("run", C1, RUN_NEW))
        refused(world(), commit_of(new(D1, workflow=WF2, message=MSG_NEW)), WorkflowMismatch(RUN, WF, WF2))


class TestClaim:
    def test_claim_sets_every_lease_field(self) -> None:
        s = tick(one_pending(), 5 * SECOND)
        now = T0 + 5 * SECOND
        after, outcome = apply(s, Claim(C1, ALICE, 45))
        expected_row = attrs.evolve(
            pending_row(D1, binding()),
            status=Status.CLAIMED,
            lease_generation=1,
            lease_until=now + 45 * SECOND,
            claimed_at=now,
        )
        assert outcome == Claimed(Lease(C1, D1, ALICE, 1, now + 45 * SECOND), expected_row)
        assert row(after) == expected_row

    @pytest.mark.parametrize("seconds", [1, 86400])
    def test_lease_until_is_now_plus_lease_seconds(self, seconds: int) -> None:
        s, lease = claim(one_pending(), seconds=seconds)
        assert lease.lease_until == row(s).lease_until == T0 + seconds * SECOND

    def test_oldest_created_at_wins_over_a_smaller_id(self) -> None:
        s = must(world(), commit_of(new(D5)), Committed((D5,), False))
        s = tick(s, MICROSECOND)
        s = must(s, commit_of(new(D1, step_id="s2")), Committed((D1,), False))
        s, lease = claim(s)
        assert lease.delivery_id == D5
        assert row(s, D1).status is Status.PENDING

    def test_equal_created_at_is_broken_by_smallest_id(self) -> None:
        s = must(world(), commit_of(new(D5)), Committed((D5,), False))
        s = must(s, commit_of(new(D2, step_id="s2")), Committed((D2,), False))
        s = must(s, commit_of(new(D3, step_id="s3")), Committed((D3,), False))
        s, first = claim(s)
        s, second = claim(s)
        s, third = claim(s)
        assert [first.delivery_id, second.delivery_id, third.delivery_id] == [D2, D3, D5]
        refused(s, Claim(C1, ALICE, LEASE), ClaimMiss())

    def test_only_the_targets_rows_are_candidates(self) -> None:
        refused(one_pending(), Claim(C1, BOB, LEASE), ClaimMiss())

    def test_only_the_communitys_rows_are_candidates(self) -> None:
        refused(one_pending(), Claim(C2, ALICE, LEASE), ClaimMiss())

    def test_claimed_and_terminal_rows_are_not_candidates(self) -> None:
        s, _ = one_claimed()
        refused(s, Claim(C1, ALICE, LEASE), ClaimMiss())
        s, _ = one_finished()
        refused(s, Claim(C1, ALICE, LEASE), ClaimMiss())

    def test_empty_community_is_a_miss(self) -> None:
        refused(world(), Claim(C1, ALICE, LEASE), ClaimMiss())

    def test_delivery_id_picks_that_row_even_if_younger(self) -> None:
        s = one_pending()
        s = tick(s, SECOND)
        s = must(s, commit_of(new(D2, step_id="s2")), Committed((D2,), False))
        s, lease = claim(s, delivery_id=D2)
        assert lease.delivery_id == D2
        assert row(s, D1).status is Status.PENDING

    def test_delivery_id_of_another_target_is_a_miss(self) -> None:
        s = must(world(), commit_of(new(D1), new(D2, target=BOB)), Committed((D1, D2), False))
        refused(s, Claim(C1, ALICE, LEASE, delivery_id=D2), ClaimMiss())

    def test_unknown_or_already_claimed_delivery_id_is_a_miss(self) -> None:
        s, _ = one_claimed()
        s = must(s, commit_of(new(D2, step_id="s2")), Committed((D2,), False))
        refused(s, Claim(C1, ALICE, LEASE, delivery_id=D1), ClaimMiss())
        refused(s, Claim(C1, ALICE, LEASE, delivery_id=D5), ClaimMiss())

    def test_expected_binding_that_matches_claims(self) -> None:
        _s, lease = claim(one_pending(), expected=binding(), delivery_id=D1)
        assert lease == Lease(C1, D1, ALICE, 1, T0 + LEASE * SECOND)

    def test_expected_binding_selects_a_younger_row(self) -> None:
        s = one_pending()
        s = tick(s, SECOND)
        s = must(s, commit_of(new(D2, step_id="s2")), Committed((D2,), False))
        _, lease = claim(s, expected=binding(step_id="s2"))
        assert lease.delivery_id == D2

    @pytest.mark.parametrize(
        "change",
        [
            {"workflow": WF2},
            {"run": RUN2},
            {"step_id": "s2"},
            {"step_id": "s1 "},
            {"definition": DEFINITION2},
            {"message": MSG2},
            {"cause": EventCause(TRIGGER2)},
            {"cause": ScheduleCause(T0)},
            {"cause": WebhookCause(INVOCATION)},
        ],
        ids=lambda change: "-".join(f"{k}={v!r}"[:40] for k, v in change.items()),
    )
    def test_expected_binding_differing_in_one_field_is_a_miss(self, change: dict[str, Any]) -> None:
        refused(one_pending(), Claim(C1, ALICE, LEASE, expected=binding(**change)), ClaimMiss())

    CAUSES = (
        EventCause(TRIGGER),
        EventCause(TRIGGER2),
        ScheduleCause(T0),
        ScheduleCause(T0 + SECOND),
        WebhookCause(INVOCATION),
        WebhookCause(INVOCATION2),
    )

    @pytest.mark.parametrize(
        ("stored", "expected"), list(itertools.product(CAUSES, CAUSES)), ids=lambda c: repr(c)[:40]
    )
    def test_expected_cause_must_match_kind_and_value(self, stored: Any, expected: Any) -> None:
        s = must(world(), commit_of(new(D1, cause=stored)), Committed((D1,), False))
        after, outcome = apply(s, Claim(C1, ALICE, LEASE, expected=binding(cause=expected)))
        if stored == expected:
            assert isinstance(outcome, Claimed) and outcome.lease.delivery_id == D1
        else:
            assert (outcome, after) == (ClaimMiss(), s)

    def test_expected_schedule_in_another_time_zone_is_the_same_instant(self) -> None:
        plus_two = dt.timezone(dt.timedelta(hours=2))
        s = must(world(), commit_of(new(D1, cause=ScheduleCause(T0))), Committed((D1,), False))
        cause = ScheduleCause(dt.datetime(2026, 1, 1, 2, tzinfo=plus_two))
        _, lease = claim(s, expected=binding(cause=cause))
        assert lease.delivery_id == D1

    def test_expected_binding_of_another_community_is_a_miss_before_lookup(self) -> None:
        s = one_pending()
        s = must(s, commit_of(new(D1, community=C2)), Committed((D1,), False))
        refused(s, Claim(C1, ALICE, LEASE, expected=binding(community=C2)), ClaimMiss())

    def test_expected_binding_of_another_target_is_a_miss(self) -> None:
        s = must(world(), commit_of(new(D1), new(D2, target=BOB)), Committed((D1, D2), False))
        refused(s, Claim(C1, ALICE, LEASE, expected=binding(target=BOB)), ClaimMiss())

    def test_scope_mismatch_is_a_miss_even_in_an_unknown_community(self) -> None:
        s = one_pending()
        refused(s, Claim(C_UNKNOWN, ALICE, LEASE, expected=binding(community=C1)), ClaimMiss())
        refused(s, Claim(C_UNKNOWN, ALICE, LEASE, expected=binding(community=C_UNKNOWN, target=BOB)), ClaimMiss())

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    def test_scope_mismatch_is_a_miss_even_in_a_fenced_community(self, state: CommunityState) -> None:
        s = set_state(one_pending(), C1, state)
        refused(s, Claim(C1, ALICE, LEASE, expected=binding(target=BOB)), ClaimMiss())
        refused(s, Claim(C1, ALICE, LEASE, expected=binding(community=C2)), ClaimMiss())

    def test_scope_mismatch_is_a_miss_even_in_a_deleted_community(self) -> None:
        s = must(one_pending(), DeleteCommunity(C1), Ok())
        refused(s, Claim(C1, ALICE, LEASE, expected=binding(target=BOB)), ClaimMiss())

    def test_in_scope_expected_binding_still_meets_the_community_checks(self) -> None:
        s = set_state(one_pending(), C1, CommunityState.FENCED)
        refused(s, Claim(C1, ALICE, LEASE, expected=binding()), CommunityNotWritable(C1, CommunityState.FENCED))
        refused(
            s,
            Claim(C_UNKNOWN, ALICE, LEASE, expected=binding(community=C_UNKNOWN)),
            UnknownCommunity(C_UNKNOWN),
        )

    def test_generation_increments_on_every_claim_and_reap(self) -> None:
        s, lease = one_claimed()
        assert lease.lease_generation == 1
        s = expire_and_reap(s, lease)
        assert (row(s).status, row(s).lease_generation) == (Status.PENDING, 2)
        s, lease = claim(s)
        assert lease.lease_generation == row(s).lease_generation == 3
        assert lease.lease_until == s.now + LEASE * SECOND


class TestRenew:
    def test_renew_extends_from_now(self) -> None:
        s, lease = one_claimed()
        s = tick(s, 10 * SECOND)
        after, outcome = apply(s, Renew(lease, 100))
        assert outcome == Renewed(T0 + 110 * SECOND)
        assert row(after) == attrs.evolve(row(s), lease_until=T0 + 110 * SECOND)

    def test_renew_may_shorten_the_lease(self) -> None:
        s, lease = one_claimed()
        s = must(s, Renew(lease, 1), Renewed(T0 + SECOND))
        assert row(s).lease_until == T0 + SECOND

    def test_renew_with_an_old_lease_until_still_works(self) -> None:
        s, lease = one_claimed()
        s = tick(s, 20 * SECOND)
        s = must(s, Renew(lease, LEASE), Renewed(T0 + 50 * SECOND))
        s = tick(s, 20 * SECOND)  # past the lease value's own lease_until, within the row's
        must(s, Renew(lease, LEASE), Renewed(T0 + 70 * SECOND))

    def test_renew_at_exactly_lease_until_is_held(self) -> None:
        s, lease = one_claimed()
        s = tick(s, LEASE * SECOND)
        must(s, Renew(lease, 5), Renewed(T0 + (LEASE + 5) * SECOND))

    def test_renew_one_microsecond_late_is_lost_even_before_reap(self) -> None:
        s, lease = one_claimed()
        s = tick(s, LEASE * SECOND + MICROSECOND)
        refused(s, Renew(lease, 5), LeaseLost())
        assert row(s).status is Status.CLAIMED

    @pytest.mark.parametrize("generation", [0, 2])
    def test_renew_at_another_generation_is_lost(self, generation: int) -> None:
        s, lease = one_claimed()
        refused(s, Renew(attrs.evolve(lease, lease_generation=generation), LEASE), LeaseLost())

    def test_renew_with_a_foreign_target_is_lost(self) -> None:
        s, lease = one_claimed()
        refused(s, Renew(attrs.evolve(lease, target_pubkey=BOB), LEASE), LeaseLost())

    def test_renew_of_an_unknown_delivery_is_lost(self) -> None:
        s, lease = one_claimed()
        refused(s, Renew(attrs.evolve(lease, delivery_id=D5), LEASE), LeaseLost())

    def test_renew_after_finish_is_lost(self) -> None:
        s, lease = one_finished()
        refused(s, Renew(lease, LEASE), LeaseLost())

    def test_renew_after_reap_is_lost(self) -> None:
        s, lease = one_claimed()
        s = expire_and_reap(s, lease)
        refused(s, Renew(lease, LEASE), LeaseLost())

    def test_renew_after_reap_and_reclaim_is_lost_for_the_old_holder(self) -> None:
        s, old = one_claimed()
        s = expire_and_reap(s, old)
        s, _ = claim(s)
        refused(s, Renew(old, LEASE), LeaseLost())

    def test_renew_in_another_community_is_lost(self) -> None:
        s, lease = one_claimed()
        refused(s, Renew(attrs.evolve(lease, community_id=C2), LEASE), LeaseLost())

    def test_renew_in_a_fenced_community(self) -> None:
        s, lease = one_claimed()
        s = set_state(s, C1, CommunityState.FENCED)
        refused(s, Renew(lease, LEASE), CommunityNotWritable(C1, CommunityState.FENCED))


class TestFinish:
    @pytest.mark.parametrize("outcome", [Status.FINISHED, Status.FAILED])
    def test_finish_settles_and_clears_the_lease(self, outcome: Status) -> None:
        s, lease = one_claimed()
        s = tick(s, 7 * SECOND)
        after, result = apply(s, Finish(lease, outcome))
        assert result == Settled(outcome)
        assert row(after) == attrs.evolve(
            pending_row(D1, binding()),
            status=outcome,
            lease_generation=1,
            finished_at=T0 + 7 * SECOND,
        )

    def test_finish_at_exactly_lease_until_settles(self) -> None:
        s, lease = one_claimed()
        s = tick(s, LEASE * SECOND)
        must(s, Finish(lease, Status.FINISHED), Settled(Status.FINISHED))

    def test_finish_one_microsecond_late_is_lost_even_before_reap(self) -> None:
        s, lease = one_claimed()
        s = tick(s, LEASE * SECOND + MICROSECOND)
        refused(s, Finish(lease, Status.FINISHED), LeaseLost())

    @pytest.mark.parametrize("retry", [Status.FINISHED, Status.FAILED])
    @pytest.mark.parametrize("recorded", [Status.FINISHED, Status.FAILED])
    def test_same_holder_retry_is_already_terminal_with_the_recorded_status(
        self, recorded: Status, retry: Status
    ) -> None:
        s, lease = one_finished(recorded)
        refused(s, Finish(lease, retry), AlreadyTerminal(recorded))

    def test_same_holder_retry_long_after_expiry_is_still_already_terminal(self) -> None:
        s, lease = one_finished(Status.FAILED)
        s = tick(s, dt.timedelta(days=3))
        refused(s, Finish(lease, Status.FINISHED), AlreadyTerminal(Status.FAILED))

    @pytest.mark.parametrize("stale_asks", [Status.FINISHED, Status.FAILED])
    def test_stale_holder_is_never_credited_the_newer_terminal(self, stale_asks: Status) -> None:
        """Review finding 1: expired, reaped, reclaimed, finished by the newer holder."""
        s, stale = one_claimed()
        s = expire_and_reap(s, stale)
        s, newer = claim(s)
        s = must(s, Finish(newer, Status.FINISHED), Settled(Status.FINISHED))
        refused(s, Finish(stale, stale_asks), LeaseLost())
        refused(s, Finish(newer, stale_asks), AlreadyTerminal(Status.FINISHED))

    def test_stale_holder_cannot_finish_while_the_newer_holder_holds(self) -> None:
        s, stale = one_claimed()
        s = expire_and_reap(s, stale)
        s, _ = claim(s)
        refused(s, Finish(stale, Status.FAILED), LeaseLost())

    def test_finish_after_reap_is_lost(self) -> None:
        s, lease = one_claimed()
        s = expire_and_reap(s, lease)
        refused(s, Finish(lease, Status.FINISHED), LeaseLost())

    def test_foreign_target_cannot_finish_a_claimed_row(self) -> None:
        """Review finding 4: right id and generation, rebuilt with another target."""
        s, lease = one_claimed()
        refused(s, Finish(attrs.evolve(lease, target_pubkey=BOB), Status.FINISHED), LeaseLost())

    def test_foreign_target_is_not_told_the_terminal(self) -> None:
        s, lease = one_finished()
        refused(s, Finish(attrs.evolve(lease, target_pubkey=BOB), Status.FINISHED), LeaseLost())

    @pytest.mark.parametrize("generation", [0, 2])
    def test_another_generation_is_lost_on_claimed_and_terminal_rows(self, generation: int) -> None:
        s, lease = one_claimed()
        other = attrs.evolve(lease, lease_generation=generation)
        refused(s, Finish(other, Status.FINISHED), LeaseLost())
        s = must(s, Finish(lease, Status.FINISHED), Settled(Status.FINISHED))
        refused(s, Finish(other, Status.FINISHED), LeaseLost())

    def test_finish_of_an_unknown_delivery_is_lost(self) -> None:
        s, lease = one_claimed()
        refused(s, Finish(attrs.evolve(lease, delivery_id=D5), Status.FINISHED), LeaseLost())

    def test_finish_of_a_deleted_row_is_lost(self) -> None:
        s, lease = one_claimed()
        s = must(s, DeleteRun(C1, RUN), Ok())
        refused(s, Finish(lease, Status.FINISHED), LeaseLost())

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    def test_fenced_community_refuses_even_a_retry(self, state: CommunityState) -> None:
        s, lease = one_finished()
        s = set_state(s, C1, state)
        refused(s, Finish(lease, Status.FINISHED), CommunityNotWritable(C1, state))


class TestReap:
    def test_nothing_expired_reaps_nothing(self) -> None:
        s, _ = one_claimed()
        s = tick(s, LEASE * SECOND)  # lease_until == now: still held
        refused(s, Reap(), Reaped(0))

    def test_expired_row_returns_to_pending_with_next_generation(self) -> None:
        s, _ = one_claimed()
        s = tick(s, LEASE * SECOND + MICROSECOND)
        after, outcome = apply(s, Reap())
        assert outcome == Reaped(1)
        assert row(after) == attrs.evolve(pending_row(D1, binding()), lease_generation=2)

    def test_reap_counts_every_community_and_leaves_the_rest(self) -> None:
        s = one_pending()
        s = must(s, commit_of(new(D2, target=BOB)), Committed((D2,), True))
        s = must(s, commit_of(new(D1, community=C2)), Committed((D1,), False))
        s = must(s, commit_of(new(D3, step_id="s3")), Committed((D3,), False))
        s = must(s, commit_of(new(D4, step_id="s4")), Committed((D4,), False))
        s, _ = claim(s, delivery_id=D1, seconds=10)
        s, _ = claim(s, target=BOB, seconds=10)
        s, _ = claim(s, community=C2, seconds=10)
        s, _long = claim(s, delivery_id=D3, seconds=100)
        s, done = claim(s, delivery_id=D4, seconds=1)
        s = must(s, Finish(done, Status.FAILED), Settled(Status.FAILED))
        s = tick(s, 11 * SECOND)
        after, outcome = apply(s, Reap())
        assert outcome == Reaped(3)
        for key in [(C1, D1), (C1, D2), (C2, D1)]:
            assert after.deliveries[key].status is Status.PENDING
            assert after.deliveries[key].lease_generation == 2
        assert row(after, D3) == row(s, D3)
        assert row(after, D4) == row(s, D4)

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    def test_reap_skips_non_active_communities(self, state: CommunityState) -> None:
        s, _ = one_claimed()
        s = must(s, commit_of(new(D1, community=C2)), Committed((D1,), False))
        s, _ = claim(s, community=C2)
        s = set_state(s, C1, state)
        s = tick(s, LEASE * SECOND + MICROSECOND)
        after, outcome = apply(s, Reap())
        assert outcome == Reaped(1)
        assert row(after, D1, C1) == row(s, D1, C1)
        assert row(after, D1, C2).status is Status.PENDING

    def test_reaped_row_can_be_claimed_again(self) -> None:
        s, lease = one_claimed()
        s = expire_and_reap(s, lease)
        s, again = claim(s)
        assert again.delivery_id == D1 and again.lease_generation == 3


class TestGetDelivery:
    def test_found_returns_the_exact_row(self) -> None:
        s, _ = one_claimed()
        refused(s, GetDelivery(C1, D1), Found(row(s)))

    def test_unknown_id(self) -> None:
        refused(one_pending(), GetDelivery(C1, D2), NotFound("delivery", C1, D2))

    def test_same_id_in_another_community_is_not_found(self) -> None:
        refused(one_pending(), GetDelivery(C2, D1), NotFound("delivery", C2, D1))

    def test_reads_are_allowed_in_a_fenced_community(self) -> None:
        s = set_state(one_pending(), C1, CommunityState.FENCED)
        refused(s, GetDelivery(C1, D1), Found(row(s)))

    def test_unknown_and_deleted_communities_are_not_found(self) -> None:
        s = must(one_pending(), DeleteCommunity(C1), Ok())
        refused(s, GetDelivery(C1, D1), NotFound("delivery", C1, D1))
        refused(s, GetDelivery(C_UNKNOWN, D1), NotFound("delivery", C_UNKNOWN, D1))


class TestClock:
    def test_advance_clock_moves_only_now(self) -> None:
        s, _ = one_claimed()
        after = tick(s, 3 * SECOND + MICROSECOND)
        assert after == attrs.evolve(s, now=T0 + 3 * SECOND + MICROSECOND)


# ==========================================================================
# 3. Random sequences: rejections never change the state; invariants hold

TARGETS = (ALICE, BOB)
POOL_IDS = (D1, D2, D3)
LIVE_STATES = (CommunityState.ACTIVE, CommunityState.QUIESCING, CommunityState.FENCED)
POOL_CAUSES = (EventCause(TRIGGER), ScheduleCause(T0), WebhookCause(INVOCATION))
# Outcomes that are not rejections but must not change the state either.
READ_ONLY = (ClaimMiss, LeaseLost, AlreadyTerminal, Found)


@st.composite
def pool_commits(draw: Any) -> CommitDeliveries:
    community = draw(st.sampled_from((C1, C1, C2, C_UNKNOWN)))
    run = draw(st.sampled_from((RUN, RUN, RUN2, RUN_WF2)))
    step_id = draw(st.sampled_from(("s1", "s2")))
    news = [
        NewDelivery(
            draw(st.sampled_from(POOL_IDS)),
            binding(
                community=community,
                run=run,
                step_id=step_id,
                target=draw(st.sampled_from(TARGETS)),
                workflow=draw(st.sampled_from((RUN_WORKFLOW[run],) * 4 + (WF, WF2))),
                message=draw(st.sampled_from((MSG, MSG, MSG2, MSG_NEW))),
                cause=draw(st.sampled_from(POOL_CAUSES)),
            ),
        )
        for _ in range(draw(st.integers(1, 3)))
    ]
    return CommitDeliveries(community, run, step_id, news)


@attrs.frozen
class WithLease:
    """Renew or finish with the `back`-th most recent lease obtained so far, maybe forged."""

    make: type
    back: int
    forge: str | None
    arg: Any

    def build(self, state: DeliverySystem, leases: list[Lease]) -> Any:
        lease = leases[-1 - self.back % len(leases)] if leases else Lease(C1, D1, ALICE, 1, T0)
        if self.forge == "target":
            lease = attrs.evolve(lease, target_pubkey=BOB if lease.target_pubkey == ALICE else ALICE)
        elif self.forge == "generation":
            lease = attrs.evolve(lease, lease_generation=lease.lease_generation + 1)
        elif self.forge == "community":
            lease = attrs.evolve(lease, community_id=C_UNKNOWN)
        return self.make(lease, self.arg)


@attrs.frozen
class ClaimExpecting:
    """Claim with an existing row's binding as the wake, maybe altered (a forged or stale wake)."""

    back: int
    change: tuple[tuple[str, Any], ...]
    seconds: int

    def build(self, state: DeliverySystem, leases: list[Lease]) -> Any:
        known = [d.binding for d in state.deliveries.values()] or [binding()]
        b = known[self.back % len(known)]
        return Claim(b.community_id, b.target_pubkey, self.seconds, expected=attrs.evolve(b, **dict(self.change)))


def often(times: int, strategy: st.SearchStrategy[Any]) -> list[st.SearchStrategy[Any]]:
    """`st.one_of` takes no weights: repeat a branch to make it likelier."""
    return [strategy] * times


SECONDS = st.sampled_from((1, 5, LEASE))
TERMINAL = st.sampled_from((Status.FINISHED, Status.FAILED))
COMMUNITY = st.sampled_from((C1, C1, C2, C_UNKNOWN))
TARGET = st.sampled_from(TARGETS)
BACK = st.integers(0, 3)
FORGE = st.sampled_from(("target", "generation", "community"))
CHANGES = st.sampled_from(
    [(), (), (("target_pubkey", BOB),), (("community_id", C2),), (("step_id", "s2"),), (("cause", POOL_CAUSES[2]),)]
)
RECIPES = st.one_of(
    *often(6, pool_commits()),
    *often(3, st.builds(Claim, COMMUNITY, TARGET, SECONDS)),
    *often(2, st.builds(Claim, COMMUNITY, TARGET, SECONDS, delivery_id=st.sampled_from(POOL_IDS))),
    *often(3, st.builds(ClaimExpecting, BACK, CHANGES, SECONDS)),
    *often(3, st.builds(WithLease, st.just(Renew), BACK, st.none(), SECONDS)),
    st.builds(WithLease, st.just(Renew), BACK, FORGE, SECONDS),
    *often(4, st.builds(WithLease, st.just(Finish), BACK, st.none(), TERMINAL)),
    st.builds(WithLease, st.just(Finish), BACK, FORGE, TERMINAL),
    *often(2, st.just(Reap())),
    *often(3, st.builds(AdvanceClock, st.sampled_from((MICROSECOND, SECOND, 10 * SECOND, 31 * SECOND)))),
    *often(2, st.builds(GetDelivery, COMMUNITY, st.sampled_from(POOL_IDS))),
    *often(2, st.builds(SetCommunityState, COMMUNITY, st.sampled_from(LIVE_STATES))),
    st.builds(DeleteCommunity, st.sampled_from((C2, C_UNKNOWN))),
    st.builds(CreateCommunity, COMMUNITY),
    st.builds(CreateWorkflow, COMMUNITY, st.sampled_from((WF, WF_NEW))),
    st.builds(DeleteWorkflow, COMMUNITY, st.sampled_from((WF2, WF_NEW))),
    st.builds(CreateRun, COMMUNITY, st.sampled_from((WF, WF2, WF_NEW)), st.sampled_from((RUN2, RUN_NEW))),
    st.builds(DeleteRun, COMMUNITY, st.sampled_from((RUN2, RUN_NEW))),
    st.builds(PublishEvent, COMMUNITY, st.sampled_from((MSG2, MSG_NEW))),
    st.builds(DeleteEvent, COMMUNITY, st.sampled_from((MSG2, MSG_NEW))),
)


def busy_world() -> DeliverySystem:
    """World plus pending rows for both targets in both communities, so claims can succeed."""
    s = world()
    for c in (C1, C2):
        s = must(s, commit_of(new(D1, community=c), new(D2, community=c, target=BOB)), Committed((D1, D2), False))
        s = must(s, commit_of(new(D3, community=c, run=RUN2, message=MSG2)), Committed((D3,), False))
    return s


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RECIPES, min_size=1, max_size=50))
def test_random_sequences_keep_invariants_and_rejections_change_nothing(recipes: list[Any]) -> None:
    state = busy_world()
    leases: list[Lease] = []
    for recipe in recipes:
        command = recipe.build(state, leases) if isinstance(recipe, WithLease | ClaimExpecting) else recipe
        after, outcome = step(state, command)
        assert variant(outcome) in OUTCOME_VARIANTS[type(command)]
        if isinstance(outcome, (Rejection, *READ_ONLY)) or outcome in (Reaped(0), Committed((), True)):
            assert after == state, f"{outcome!r} changed the state"
        assert state_violations(after) == []
        assert step_violations(state, after, outcome) == []
        assert step(state, command) == (after, outcome)  # deterministic
        if isinstance(outcome, Claimed):
            leases.append(outcome.lease)
        state = after


# ==========================================================================
# 4. The invariant checkers detect corruption


def _rich_world() -> tuple[DeliverySystem, Lease]:
    """Rows in every status: D1 claimed (ALICE), D2 finished, D3 pending at generation 2."""
    s = must(world(), commit_of(new(D1), new(D2, target=BOB)), Committed((D1, D2), False))
    s = must(s, commit_of(new(D3, step_id="s3")), Committed((D3,), False))
    s, reaped = claim(s, delivery_id=D3, seconds=1)
    s = expire_and_reap(s, reaped)
    s, bob = claim(s, target=BOB)
    s = must(s, Finish(bob, Status.FINISHED), Settled(Status.FINISHED))
    s, lease = claim(s, delivery_id=D1)
    s = tick(s, SECOND)
    assert [row(s, d).status for d in (D1, D2, D3)] == [Status.CLAIMED, Status.FINISHED, Status.PENDING]
    assert row(s, D3).lease_generation == 2
    return s, lease


def corrupt(s: DeliverySystem, delivery_id: uuid.UUID, **fields: Any) -> DeliverySystem:
    return s.with_delivery(attrs.evolve(row(s, delivery_id), **fields))


def only(violations: list[str], fragment: str) -> None:
    assert len(violations) == 1, violations
    assert fragment in violations[0], violations


class TestStateViolations:
    def test_a_consistent_world_has_none(self) -> None:
        s, _ = _rich_world()
        assert state_violations(s) == []

    @pytest.mark.parametrize(
        ("delivery_id", "fields", "fragment"),
        [
            (D3, {"lease_until": T0 + 99 * SECOND}, "lease fields must be set iff claimed (status pending)"),
            (D3, {"claimed_at": T0}, "lease fields must be set iff claimed (status pending)"),
            (D2, {"lease_until": T0 + 99 * SECOND}, "lease fields must be set iff claimed (status finished)"),
            (D1, {"finished_at": T0}, "finished_at must be set iff terminal (status claimed)"),
            (D2, {"finished_at": None}, "finished_at must be set iff terminal (status finished)"),
            (D3, {"lease_generation": -1}, "generation -1 impossible while pending"),
            (D1, {"lease_generation": 0}, "generation 0 impossible while claimed"),
            (D3, {"created_at": T0 + dt.timedelta(hours=1)}, "a timestamp lies in the future"),
            (D2, {"finished_at": T0 + dt.timedelta(hours=1)}, "a timestamp lies in the future"),
        ],
        ids=lambda v: v if isinstance(v, str) else None,
    )
    def test_row_field_corruption(self, delivery_id: uuid.UUID, fields: dict[str, Any], fragment: str) -> None:
        s, _ = _rich_world()
        only(state_violations(corrupt(s, delivery_id, **fields)), fragment)

    @pytest.mark.parametrize("missing", ["lease_until", "claimed_at"])
    def test_claimed_row_missing_a_lease_field(self, missing: str) -> None:
        s, _ = _rich_world()
        only(
            state_violations(corrupt(s, D1, **{missing: None})), "lease fields must be set iff claimed (status claimed)"
        )

    def test_claimed_at_after_now(self) -> None:
        s, _ = _rich_world()
        only(
            state_violations(corrupt(s, D1, claimed_at=s.now + SECOND)),
            "claimed_at must not lie after now or after lease_until",
        )

    def test_two_rows_with_the_same_identity(self) -> None:
        s, _ = _rich_world()
        s = s.with_delivery(pending_row(D5, row(s, D3).binding))
        only(state_violations(s), "shares (community, run, step, target) with delivery")

    def test_row_stored_under_another_key(self) -> None:
        s, _ = _rich_world()
        s = attrs.evolve(s, deliveries=s.deliveries.set((C1, D5), row(s, D3)))
        assert any("not its own key" in v for v in state_violations(s))

    def test_row_whose_run_is_missing(self) -> None:
        s, _ = _rich_world()
        s = attrs.evolve(s, runs=s.runs.remove_where(lambda k, _: k == (C1, RUN)))
        violations = state_violations(s)
        assert len(violations) == 3  # D1, D2 and D3 all belong to RUN
        assert all(f"its run {RUN} of workflow {WF} does not exist" in v for v in violations)

    def test_row_whose_run_belongs_to_another_workflow(self) -> None:
        s = one_pending()
        s = attrs.evolve(s, runs=s.runs.set((C1, RUN), WF2))
        only(state_violations(s), "does not exist")

    def test_row_whose_message_event_is_missing(self) -> None:
        s = one_pending()
        only(state_violations(attrs.evolve(s, events=s.events - {(C1, MSG)})), "its message event does not exist")

    def test_run_whose_workflow_is_missing(self) -> None:
        s = world()
        only(state_violations(attrs.evolve(s, workflows=s.workflows - {(C1, WF2)})), "its workflow does not exist")

    def test_an_id_both_live_and_retired(self) -> None:
        s, _ = _rich_world()
        s = attrs.evolve(s, retired=frozenset({(C1, D3)}))
        only(state_violations(s), f"delivery {D3} of community {C1} is both live and retired")

    def test_a_retired_id_of_a_deleted_community(self) -> None:
        s = attrs.evolve(initial_state(T0), communities=FrozenMap({C1: CommunityState.DELETED}))
        only(state_violations(attrs.evolve(s, retired=frozenset({(C1, D1)}))), "but still owns rows")
        only(
            state_violations(attrs.evolve(initial_state(T0), retired=frozenset({(C1, D1)}))), "None but still owns rows"
        )

    def test_deleted_community_still_owning_rows(self) -> None:
        s = attrs.evolve(world(), communities=world().communities.set(C2, CommunityState.DELETED))
        violations = state_violations(s)
        assert violations and all("but still owns rows" in v for v in violations)


class TestStepViolations:
    def test_an_accepted_step_has_none(self) -> None:
        before, lease = _rich_world()
        after, outcome = step(before, Finish(lease, Status.FAILED))
        assert step_violations(before, after, outcome) == []

    def test_a_rejection_that_changed_the_state(self) -> None:
        before, _ = _rich_world()
        after = corrupt(before, D3, created_at=T0 - SECOND)
        violations = step_violations(before, after, UnknownCommunity(C_UNKNOWN))
        assert any("the rejection UnknownCommunity(" in v and "changed the state" in v for v in violations)
        assert step_violations(before, before, UnknownCommunity(C_UNKNOWN)) == []

    def test_generation_decreasing(self) -> None:
        before, _ = _rich_world()
        only(step_violations(before, corrupt(before, D3, lease_generation=1), Ok()), "generation fell from 2 to 1")

    def test_generation_moving_without_claim_or_reap(self) -> None:
        before, _ = _rich_world()
        only(
            step_violations(before, corrupt(before, D3, lease_generation=3), Ok()),
            "generation went 2 -> 3 on pending -> pending",
        )

    def test_a_no_op_outcome_that_changed_the_state(self) -> None:
        before, _ = _rich_world()
        after = corrupt(before, D3, created_at=T0 - SECOND)
        for outcome in (ClaimMiss(), LeaseLost(), AlreadyTerminal(Status.FINISHED)):
            assert any(
                f"the no-op outcome {outcome!r} changed the state" in v for v in step_violations(before, after, outcome)
            )

    def test_a_terminal_row_changing(self) -> None:
        before, _ = _rich_world()
        after = corrupt(before, D2, finished_at=before.now)
        only(step_violations(before, after, Ok()), "a terminal row changed")

    def test_a_terminal_row_flipping(self) -> None:
        before, _ = _rich_world()
        violations = step_violations(before, corrupt(before, D2, status=Status.FAILED), Ok())
        assert any("illegal transition finished -> failed" in v for v in violations)
        assert any("a terminal row changed" in v for v in violations)

    def test_an_illegal_transition(self) -> None:
        before, _ = _rich_world()
        after = corrupt(before, D3, status=Status.FINISHED, finished_at=before.now)
        only(step_violations(before, after, Ok()), "illegal transition pending -> finished")

    def test_binding_or_created_at_changing(self) -> None:
        before, _ = _rich_world()
        after = corrupt(before, D3, binding=attrs.evolve(row(before, D3).binding, message_event_id=MSG2))
        only(step_violations(before, after, Ok()), "binding or created_at changed")

    @pytest.mark.parametrize("state", [CommunityState.QUIESCING, CommunityState.FENCED])
    def test_a_fenced_communitys_row_changing(self, state: CommunityState) -> None:
        before, _ = _rich_world()
        before = attrs.evolve(before, communities=before.communities.set(C1, state))
        after = corrupt(before, D1, lease_until=before.now + 99 * SECOND)
        only(step_violations(before, after, Ok()), f"changed while its community was {state}")

    def test_a_fenced_communitys_row_vanishing_without_deletion(self) -> None:
        before, _ = _rich_world()
        before = attrs.evolve(before, communities=before.communities.set(C1, CommunityState.FENCED))
        after = before.without_deliveries(lambda d: d.id == D3)
        only(step_violations(before, after, Ok()), "changed while its community was")
        purged = attrs.evolve(after, communities=after.communities.set(C1, CommunityState.DELETED))
        assert step_violations(before, purged, Ok()) == []

    def test_a_row_born_claimed(self) -> None:
        before = world()
        claimed = attrs.evolve(
            pending_row(D1, binding()), status=Status.CLAIMED, lease_generation=1, lease_until=T0, claimed_at=T0
        )
        only(step_violations(before, before.with_delivery(claimed), Ok()), "born claimed at generation 1")

    def test_a_row_created_in_a_non_active_community(self) -> None:
        before = attrs.evolve(world(), communities=world().communities.set(C1, CommunityState.FENCED))
        after = before.with_delivery(pending_row(D1, binding()))
        only(step_violations(before, after, Ok()), "created in a community that is not active")

    def test_an_id_un_retired(self) -> None:
        before, _ = _run_recreated_after_delete()
        after = attrs.evolve(before, retired=frozenset())
        only(step_violations(before, after, Ok()), f"delivery id {D1} of community {C1} was un-retired")

    def test_only_a_purge_may_forget_retired_ids(self) -> None:
        before, _ = _run_recreated_after_delete()
        after, outcome = step(before, DeleteCommunity(C1))
        assert after.retired == frozenset()
        assert step_violations(before, after, outcome) == []

    def test_the_clock_going_back(self) -> None:
        before = tick(world(), SECOND)
        only(step_violations(before, attrs.evolve(before, now=T0), Ok()), "the clock went back")


# ==========================================================================
# 5. Outcome catalogue, dispatch, FrozenMap

ALL_COMMANDS = {
    CreateCommunity,
    SetCommunityState,
    DeleteCommunity,
    CreateWorkflow,
    DeleteWorkflow,
    CreateRun,
    DeleteRun,
    PublishEvent,
    DeleteEvent,
    CommitDeliveries,
    Claim,
    Renew,
    Finish,
    Reap,
    AdvanceClock,
    GetDelivery,
}


class TestCatalogue:
    def test_every_command_type_has_its_outcome_variants(self) -> None:
        assert set(OUTCOME_VARIANTS) == ALL_COMMANDS
        assert all(OUTCOME_VARIANTS[c] for c in ALL_COMMANDS)

    def test_every_listed_variant_names_an_outcome_class(self) -> None:
        for variants in OUTCOME_VARIANTS.values():
            for name in variants:
                assert isinstance(getattr(m, name.split("(")[0]), type), name

    def test_finish_lists_each_status_of_settled_and_already_terminal(self) -> None:
        assert set(OUTCOME_VARIANTS[Finish]) >= {
            "Settled(finished)",
            "Settled(failed)",
            "AlreadyTerminal(finished)",
            "AlreadyTerminal(failed)",
            "LeaseLost",
        }

    def test_variant_names(self) -> None:
        assert variant(Settled(Status.FINISHED)) == "Settled(finished)"
        assert variant(Settled(Status.FAILED)) == "Settled(failed)"
        assert variant(AlreadyTerminal(Status.FINISHED)) == "AlreadyTerminal(finished)"
        assert variant(AlreadyTerminal(Status.FAILED)) == "AlreadyTerminal(failed)"
        assert variant(ClaimMiss()) == "ClaimMiss"
        assert variant(Reaped(3)) == "Reaped"
        assert variant(CommunityNotWritable(C1, CommunityState.FENCED)) == "CommunityNotWritable"

    @pytest.mark.parametrize("not_a_command", [object(), "Reap", None, Reap, Ok()], ids=_stable_id)
    def test_step_on_a_non_command_raises_type_error(self, not_a_command: Any) -> None:
        with pytest.raises(TypeError):
            step(world(), not_a_command)

    def test_rejections_are_the_refusal_outcomes(self) -> None:
        for rejection in (
            UnknownCommunity(C1),
            CommunityNotWritable(C1, CommunityState.FENCED),
            AlreadyExists("run", C1, RUN),
            NotFound("run", C1, RUN),
            WorkflowMismatch(RUN, WF, WF2),
            DeliveryIdTaken(C1, D1),
        ):
            assert isinstance(rejection, Rejection)
        for result in (ClaimMiss(), LeaseLost(), AlreadyTerminal(Status.FAILED), Reaped(0), Ok()):
            assert not isinstance(result, Rejection)

    def test_invalid_value_equality_is_by_field_and_rule(self) -> None:
        assert InvalidValue("by", 1, "rule") == InvalidValue("by", 2, "rule")
        assert InvalidValue("by", 1, "rule") != InvalidValue("at", 1, "rule")
        assert str(InvalidValue("by", 1, "rule")) == "by=1: rule"


class TestFrozenMap:
    def test_equal_maps_hash_equal_whatever_the_insertion_order(self) -> None:
        a = FrozenMap([(1, "a"), (2, "b")])
        b = FrozenMap({2: "b"}).set(1, "a")
        assert a == b and hash(a) == hash(b)

    def test_set_returns_a_new_map_and_does_not_mutate(self) -> None:
        a = FrozenMap({1: "a"})
        b = a.set(1, "z").set(2, "b")
        assert dict(a) == {1: "a"}
        assert dict(b) == {1: "z", 2: "b"}
        assert a != b

    def test_remove_where_does_not_mutate(self) -> None:
        a = FrozenMap({1: "a", 2: "b"})
        b = a.remove_where(lambda k, _: k == 1)
        assert dict(a) == {1: "a", 2: "b"} and dict(b) == {2: "b"}

    def test_hash_is_stable_after_set(self) -> None:
        a = FrozenMap({1: "a"})
        before = hash(a)
        a.set(2, "b")
        assert hash(a) == before

    def test_states_are_values(self) -> None:
        assert world() == world() and hash(world()) == hash(world())
        s, _ = one_claimed()
        assert {s: 1}[one_claimed()[0]] == 1
