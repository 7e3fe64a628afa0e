"""Lockstep conformance for the delivery machine.

A Hypothesis rule-based state machine drives the model and an
implementation (any `DeliveryAdapter`) with the same commands. After every
step it checks that both returned the same outcome, that the model's
invariants hold, and that the implementation's full persisted state (every
field of every row, and its clock) equals the model's.

Programs are written in the names of `world`, so a shrunk counterexample
reads as a scenario: claim, advance past expiry, reap, reclaim, finish twice.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, multiple, precondition, rule

from leaseproof.conformance.boundary.protocols import offered_operations, takes_request_keys
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.core import Coverage as Coverage  # re-exported for callers of this module
from leaseproof.conformance.lockstep.core import LockstepMachine, Lockstepped, MachineSpec, bind, unchanged_or
from leaseproof.conformance.lockstep.core import NonConformance as NonConformance  # re-exported
from leaseproof.conformance.lockstep.core import RunAborted as RunAborted  # re-exported
from leaseproof.conformance.lockstep.swarm import Option, Swarm, values, weighted
from leaseproof.conformance.lockstep.swarm import swarm as swarm_of
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding
from leaseproof.model.invariants import state_violations, step_violations


def _status_name(d: m.Delivery | None) -> str:
    return m.status_name(None if d is None else d.status)


def describe_state_difference(expected: m.DeliverySystem, actual: m.DeliverySystem) -> str:
    """Which rows and fields differ, in world names."""
    lines: list[str] = []
    if expected.now != actual.now:
        lines.append(f"clock: model {expected.now.isoformat()}, implementation {actual.now.isoformat()}")
    for table in ("communities", "runs"):
        exp, act = dict(getattr(expected, table)), dict(getattr(actual, table))
        if exp != act:
            lines.append(f"{table}: model {_named(exp)}, implementation {_named(act)}")
    for table in ("workflows", "events", "retired"):
        exp_set, act_set = getattr(expected, table), getattr(actual, table)
        lines.extend(f"{table}: {_named(key)} only in the model" for key in sorted(exp_set - act_set, key=repr))
        lines.extend(
            f"{table}: {_named(key)} only in the implementation" for key in sorted(act_set - exp_set, key=repr)
        )
    for key in sorted(expected.deliveries.keys() | actual.deliveries.keys(), key=repr):
        exp_row, act_row = expected.deliveries.get(key), actual.deliveries.get(key)
        where = f"delivery {w.name_of(key[1])} of community {w.name_of(key[0])}"
        if exp_row is None:
            lines.append(f"{where}: only in the implementation")
        elif act_row is None:
            lines.append(f"{where}: only in the model")
        elif exp_row != act_row:
            for field in attrs.fields(m.Delivery):
                a, b = getattr(exp_row, field.name), getattr(act_row, field.name)
                if a != b:
                    lines.append(f"{where}: {field.name} is {w.describe(b)} but the model says {w.describe(a)}")
    return "\n".join(lines) or "(no difference)"


def _named(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_named(k)}: {_named(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_named(v) for v in value) + ")"
    if isinstance(value, m.CommunityState):
        return value.value
    return w.name_of(value)


def explain_step(
    command: m.Command, before: m.DeliverySystem, after: m.DeliverySystem, implementation: m.DeliverySystem
) -> str:
    """The clock at the step, and every row it touched (named by the command, changed
    by the model, or different in the implementation): before, in the model after,
    and in the implementation after. Rows are listed in claim order, (created_at,
    id), with their real ids, which decide between rows created at one instant."""
    keys = set(_named_keys(command, before))
    for state in (after, implementation):
        keys |= {
            k
            for k in before.deliveries.keys() | state.deliveries.keys()
            if before.deliveries.get(k) != state.deliveries.get(k)
        }
    keys |= {
        k
        for k in after.deliveries.keys() | implementation.deliveries.keys()
        if after.deliveries.get(k) != implementation.deliveries.get(k)
    }
    lines = [f"clock at the step: {w.describe(before.now)} ({before.now.isoformat()})"]
    if not keys:
        return lines[0]

    def order(key: m.CommunityKey) -> tuple[Any, ...]:
        row = before.deliveries.get(key) or after.deliveries.get(key) or implementation.deliveries.get(key)
        return (row.created_at, key[1]) if row is not None else (dt.datetime.max.replace(tzinfo=dt.UTC), key[1])

    lines.append("rows the step touched, oldest first by (created_at, id):")
    for key in sorted(keys, key=order):
        lines.append(f"  delivery {w.name_of(key[1])} of community {w.name_of(key[0])} (id {key[1]})")
        for label, state in (("before", before), ("model after", after), ("implementation", implementation)):
            lines.append(f"    {label + ':':<16}{_row_summary(state.deliveries.get(key))}")
    return "\n".join(lines)


def _named_keys(command: m.Command, state: m.DeliverySystem) -> list[m.CommunityKey]:
    """The rows a command names, or, for a claim of the oldest pending row, its candidates."""
    if isinstance(command, m.Renew | m.Finish):
        return [(command.lease.community_id, command.lease.delivery_id)]
    if isinstance(command, m.GetDelivery):
        return [(command.community_id, command.delivery_id)]
    if isinstance(command, m.Claim):
        if command.delivery_id is not None:
            return [(command.community_id, command.delivery_id)]
        return [
            key for key, d in state.deliveries.items()
            if key[0] == command.community_id and d.binding.target_pubkey == command.target_pubkey
            and d.status is m.Status.PENDING
        ]  # fmt: skip
    return []


def _row_summary(row: m.Delivery | None) -> str:
    if row is None:
        return "absent"
    text = f"{row.status.value}, generation {row.lease_generation}, target {w.name_of(row.binding.target_pubkey)}"
    if row.lease_until is not None:
        text += f", lease until {w.describe(row.lease_until)} (claimed {w.describe(row.claimed_at)})"
    if row.finished_at is not None:
        text += f", finished {w.describe(row.finished_at)}"
    return text + f", created {w.describe(row.created_at)}"


DELIVERY = MachineSpec(
    name="delivery",
    decide=m.decide,
    rules=m.RULES,
    initial_state=m.initial_state,
    violations=lambda before, after, outcome: unchanged_or(before, after, state_violations, step_violations, outcome),
    variants=m.OUTCOME_VARIANTS,
    variant=m.variant,
    describe=w.describe,
    difference=lambda model, implementation: describe_state_difference(model, implementation),
    explain=explain_step,
    transitions={(m.status_name(a), m.status_name(b)): by for (a, b), by in m.TRANSITION_RULES.items()},
    transitions_of=lambda before, after: _row_transitions(before, after),
)


# -- strategies, in world names ----------------------------------------------
#
# Every program draws a swarm first (`conformance/lockstep/swarm.py`): the rules and the
# families of values it leaves out. The families are the features below; a
# value without one is always on.

FEATURES = (
    # rules: claim is always on (every lease bug needs a claim); a program
    # without sweeps keeps expired leases in the hands of their holders, one
    # without clock moves creates every row at one instant, where the id
    # decides the claim order
    "commit", "renew", "finish", "reap", "advance_clock", "tenant", "records",
    # values
    "community-B", "community-Z", "absent-run", "odd-steps", "named-ids", "unpublished-message",
    "wrong-workflow", "other-agents", "expected-bindings", "binding-forgeries", "lease-forgeries",
    "short-leases", "longest-lease", "deadline-moves", "short-moves", "long-moves",
    "fences", "lineage", "reads", "tenant-lifecycle", "beside-live", "request-keys",
)  # fmt: skip
SWARM = swarm_of(FEATURES, key="delivery swarm")
HOLDING = "holding"  # a tenant action's community: that of the first standing claim to expire (else A)


def _among(*options: Option) -> st.SearchStrategy[Any]:
    return values(SWARM, options)


communities = _among(*[("A", None)] * 4, *[("B", "community-B")] * 3, ("Z", "community-Z"))
# A tenant action lands on the community of a standing claim (the one whose
# deadline comes first) as often as on a named one: fences, deletions and
# lineage changes while a lease is held.
tenant_communities = st.one_of(communities, st.just(HOLDING))
targets = st.sampled_from(sorted(w.TARGETS))
runs = _among(*weighted(list(w.INITIAL_RUNS), ["R4"], 3, "absent-run"))
# Beside plain ids, step ids that probe the value rules: 64 characters (the
# most), ASCII whitespace around (kept as given; only the emptiness check
# trims), a no-break space (not whitespace the rule trims), and 64 characters
# of 2 and of 4 bytes in UTF-8 (the limit counts characters, not bytes or
# UTF-16 units).
steps = _among(*weighted(["s1", "s2"], ["long", "padded", "tabbed", "nbsp", "wide", "astral"], 6, "odd-steps"))
lease_seconds = _among(
    (30, None), (30, None), (5, "short-leases"), (1, "short-leases"), (m.MAX_LEASE_SECONDS, "longest-lease")
)
# "deadline" moves the clock exactly onto the earliest live lease deadline
# (still renewable, not yet reapable); "past-deadline" one microsecond on.
advances = _among(
    ("deadline", "deadline-moves"), ("past-deadline", "deadline-moves"),
    ("1s", "short-moves"), ("5s", "short-moves"), ("30s", "long-moves"), ("60s", "long-moves"),
)  # fmt: skip
ADVANCE_SECONDS = {"1s": 1, "5s": 5, "30s": 30, "60s": 60}
# A recipient's id: derived from its identity (as producers do), a named one
# (the same in both communities), or one that collides with the state: an id
# retired in the community, a live row's of another identity, or an id retired
# or live only in another community (which does not collide: tenants are apart).
COLLISIONS = ("retired", "taken", "retired-elsewhere", "live-elsewhere")
target_specs = st.tuples(
    _among(*weighted([w.FRESH], [*sorted(w.DELIVERIES), *COLLISIONS, *COLLISIONS], 6, "named-ids")),
    targets,
    _among(*weighted(list(w.INITIAL_MESSAGES), ["M3"], 4, "unpublished-message")),
    st.sampled_from(sorted(w.DEFINITIONS)),
    st.sampled_from(sorted(w.CAUSES)),
)
# A commit may take its identity one field away from the community's newest
# live delivery: its run, step or target drawn, the other two that row's (so
# ids retired or taken meet an identity that nearly matches a live one).
BESIDE = ("run", "step", "target")
beside_live = _among(*[(None, None)] * 6, *[(field, "beside-live") for field in BESIDE])
# How a claim's expected binding relates to the row it names: the real
# binding, or the real one with a single field forged ("cause": another cause
# of the same kind, so only its identity column differs; "cause-kind": a cause
# of another kind).
BINDING_FORGERIES = (
    "exact", "community", "target", "workflow", "run", "step", "definition", "message", "cause", "cause-kind",
)  # fmt: skip
expected_bindings = _among(
    *[(None, None)] * 12,
    *[("exact", "expected-bindings")] * 4,
    *[(how, "binding-forgeries") for how in BINDING_FORGERIES[1:]],
)
WOKEN = BINDING_FORGERIES  # the exact binding, and each single-field forgery
woken_bindings = _among(*[("exact", None)] * 3, *[(how, "binding-forgeries") for how in WOKEN[1:]])
# How a lease presented to renew/finish relates to the one claim returned.
LEASE_FORGERIES = ("held", "foreign-target", "older-generation", "newer-generation", "foreign-community")
lease_forgeries = _among(*weighted(["held"], list(LEASE_FORGERIES[1:]), 4, "lease-forgeries"))
# A claim names no delivery (the oldest pending), or one by id: a named id
# (maybe in both communities, maybe another target's), or a producer-derived
# one that the set-up commits in A and B; or it names none but presents the
# newest pending row's binding ("newest").
claimed_ids = _among(
    *weighted([None], [*sorted(w.DELIVERIES), "R1/s1/T1", "R1/s1/T2", "R2/s1/T1"], 8, "named-ids"),
    *[("newest", None)] * 4,
)
agents = _among(*weighted(["recipient"], sorted(w.TARGETS), 3, "other-agents"))
LINEAGE = ("R1", "R2", "R3", "R4", "W1", "W2", "M1", "M2", "M3")
# A tenant's state and its records are two rules, so that fences (the state
# every write and every sweep must respect) come as often as any other act,
# not drowned among the eighteen lineage changes. Creating or deleting a
# tenant is rarer than a state change: a deleted tenant refuses everything
# after it.
tenant_states = _among(
    *[("fence", "fences"), ("quiesce", "fences"), ("activate", "fences")] * 2,
    ("create", "tenant-lifecycle"), ("delete", "tenant-lifecycle"),
)  # fmt: skip
# Lineage changes are common, reads rarer.
record_actions = _among(
    *[(f"{verb} {what}", "lineage") for what in LINEAGE for verb in ("delete", "create")],
    *[("delete the newest's run", "lineage")] * 8,
    # the run deleted and created again, and its producer committing the
    # newest delivery again, as it was: an id the deletion retired, for an
    # identity the other community (or another run) may still hold
    *[("recommit the newest", "lineage")] * 4,
    *[(f"get {name}", "reads") for name in ("R1/s1/T1", "R1/s1/T2", "R2/s1/T1", "d1")] * 2,
)


def _by_age(d: m.Delivery) -> tuple[Any, ...]:
    """The order deliveries were committed in: created_at, then id (the tie-break)."""
    return (d.created_at, d.id)


def _name(names: dict[str, Any], value: Any) -> str:
    """The world name of `value`."""
    return next(name for name, known in names.items() if known == value)


def _colliding_id(name: str, community: str, run: str, step: str, target: str, state: m.DeliverySystem | None) -> Any:
    """The id a commit's recipient names: a world name, or a collision with `state`."""
    if name in COLLISIONS and state is not None:
        cid, identity = w.COMMUNITIES[community], (w.RUNS[run], w.STEPS[step], w.TARGETS[target])
        here = {key[1] for key in (*state.retired, *state.deliveries) if key[0] == cid}
        if name == "retired":
            ids = [key[1] for key in state.retired if key[0] == cid]
        elif name == "taken":
            ids = [
                d.id for key, d in state.deliveries.items()
                if key[0] == cid and (d.binding.run_id, d.binding.step_id, d.binding.target_pubkey) != identity
            ]  # fmt: skip
        else:
            elsewhere = state.retired if name == "retired-elsewhere" else state.deliveries.keys()
            ids = [key[1] for key in elsewhere if key[0] != cid and key[1] not in here]
        if ids:
            return min(ids)
    return w.delivery_id(w.FRESH if name in COLLISIONS else name, run, step, target)


def _forge_binding(binding: Binding, how: str) -> Binding:
    replacements: dict[str, tuple[str, dict[str, Any]]] = {
        "community": ("community_id", w.COMMUNITIES),
        "target": ("target_pubkey", w.TARGETS),
        "workflow": ("workflow_id", w.WORKFLOWS),
        "run": ("run_id", w.RUNS),
        "step": ("step_id", w.STEPS),
        "definition": ("definition_event_id", w.DEFINITIONS),
        "message": ("message_event_id", w.MESSAGES),
    }
    if how == "exact":
        return binding
    if how in ("cause", "cause-kind"):
        same_kind = how == "cause"
        cause = next(
            c for _, c in sorted(w.CAUSES.items())
            if c != binding.cause and (c.kind == binding.cause.kind) == same_kind
        )  # fmt: skip
        return attrs.evolve(binding, cause=cause)
    field, table = replacements[how]
    current = getattr(binding, field)
    replacement = next(v for _, v in sorted(table.items()) if v != current)
    return attrs.evolve(binding, **{field: replacement})


def _forge_lease(lease: m.Lease, how: str) -> m.Lease:
    if how == "held":
        return lease
    if how == "foreign-target":
        other = next(v for v in w.TARGETS.values() if v != lease.target_pubkey)
        return attrs.evolve(lease, target_pubkey=other)
    if how == "older-generation":
        return attrs.evolve(lease, lease_generation=lease.lease_generation - 1)
    if how == "newer-generation":
        return attrs.evolve(lease, lease_generation=lease.lease_generation + 1)
    # A -> B (the same delivery id may exist there), B -> Z (maybe unknown).
    return attrs.evolve(lease, community_id=w.COMMUNITIES[w.other(w.name_of(lease.community_id), w.COMMUNITIES)])


class DeliveryConformance(LockstepMachine):
    """The delivery model and an implementation in lockstep; bound to an adapter by `machine_for`."""

    spec = DELIVERY
    start = w.START
    leases = Bundle("leases")

    @initialize(swarm=SWARM)
    def setup(self, swarm: Swarm = Swarm()) -> None:
        """The world every program starts from: communities A and B, each with both
        workflows, runs R1-R3, messages M1-M2, and (work to claim, even in a program
        that never commits) R1/s1 committed for T1 and T2. One step of the lockstep:
        every outcome compared, the whole state once, at the end. `swarm`: the
        features this program leaves out."""
        self.swarm = swarm
        self.issued: list[m.Lease] = []  # every lease a claim of this program returned, oldest first
        self.begin()
        self.run_together(SETUP, "the set-up")

    def _claimed(self, outcome: m.Outcome) -> m.Lease | None:
        """The lease a claim's outcome carries (noted as issued), if it took one."""
        if not isinstance(outcome, m.Claimed):
            return None
        self.issued.append(outcome.lease)
        return outcome.lease

    @staticmethod
    def commit_command(
        community: str,
        run: str,
        step: str,
        recipients: Sequence[tuple[str, ...]],
        wrong_workflow: bool | str,
        state: m.DeliverySystem | None = None,
    ) -> m.CommitDeliveries:
        """The commit in world names; a recipient's id may be named by its relation
        to `state`: "retired" (an id retired in the community) or "taken" (the id of
        a live row of the community with another identity). `wrong_workflow`: every
        target names the run's workflow (False), the other workflow (True), or
        ("mixed") the targets in turn name the other workflow, one no community has,
        and the run's own, so that a refusal must name the first mismatch."""
        own = w.RUN_WORKFLOW[run]
        other = w.WORKFLOWS[w.other(own, w.WORKFLOWS)]
        turns = (other, w.FOREIGN_WORKFLOW, w.WORKFLOWS[own])
        deliveries = []
        for i, (delivery, target, message, definition, cause) in enumerate(recipients):
            binding = w.binding(community, own, run, step, target, definition, message, cause)
            if wrong_workflow:
                binding = attrs.evolve(binding, workflow_id=turns[i % 3] if wrong_workflow == "mixed" else other)
            deliveries.append(m.NewDelivery(_colliding_id(delivery, community, run, step, target, state), binding))
        return m.CommitDeliveries(w.COMMUNITIES[community], w.RUNS[run], w.STEPS[step], deliveries)

    # -- deliveries -------------------------------------------------------------

    @rule(
        community=communities,
        run=runs,
        step=steps,
        recipients=st.lists(target_specs, min_size=1, max_size=3),
        wrong_workflow=_among(*weighted([False], [True, "mixed"], 7, "wrong-workflow")),
        beside=beside_live,
    )
    @precondition(lambda self: self.swarm.on("commit"))
    def commit(
        self,
        community: str,
        run: str,
        step: str,
        recipients: list[tuple[str, ...]],
        wrong_workflow: bool | str,
        beside: str | None = None,
    ) -> None:
        cid = w.COMMUNITIES[community]
        if any(r[0] in COLLISIONS for r in recipients):
            # A collision probes the id check: name a run that exists (its own
            # deletion is what retired most ids), its workflow, and published
            # messages, so that the id is what decides. (Measured with the model
            # as the adapter, seeds 1 to 5: of the commits naming a retired id, a
            # missing run or message had refused over half before the id check.)
            if (cid, w.RUNS[run]) not in self.model.runs:
                run = next((name for name in sorted(w.RUNS) if (cid, w.RUNS[name]) in self.model.runs), run)
            wrong_workflow = False
            published = [name for name in sorted(w.MESSAGES) if (cid, w.MESSAGES[name]) in self.model.events]
            if published:
                recipients = [
                    (r[0], r[1], r[2] if (cid, w.MESSAGES[r[2]]) in self.model.events else published[0], *r[3:])
                    for r in recipients
                ]
        newest = max(self._rows(cid), key=_by_age, default=None)
        if beside is not None and newest is not None:
            live = newest.binding
            names = (_name(w.RUNS, live.run_id), _name(w.STEPS, live.step_id), _name(w.TARGETS, live.target_pubkey))
            run = run if beside == "run" else names[0]
            step = step if beside == "step" else names[1]
            if beside != "target":
                recipients = [(r[0], names[2], *r[2:]) for r in recipients]
        self.run(self.commit_command(community, run, step, recipients, wrong_workflow, self.model))

    @rule(
        target=leases,
        community=communities,
        agent=agents,
        delivery=claimed_ids,
        expected=expected_bindings,
        seconds=lease_seconds,
    )
    def claim(
        self,
        community: str,
        agent: str,
        delivery: str | None,
        expected: str | None,
        seconds: int,
    ) -> Any:
        """Claim as `agent` ("recipient": the target of the row in question),
        for the named delivery or the oldest pending one, optionally
        presenting that row's binding, exact or with one field forged;
        "newest": for no id, presenting the newest pending row's binding."""
        cid = w.COMMUNITIES[community]
        if delivery in (None, "newest"):
            # The row a plain claim takes, or ("newest") the newest pending row:
            # claimed by no id, so only its binding can pick it out from older ones.
            pick = max if delivery == "newest" else min
            row = pick(self._rows(cid, m.Status.PENDING), key=_by_age, default=None)
        else:
            row = self.model.deliveries.get((cid, w.delivery_named(delivery)))
        target = w.TARGETS.get(agent) or (row.binding.target_pubkey if row is not None else w.TARGETS["T1"])
        binding = None
        if expected is not None:
            base = (
                row.binding if row is not None else w.binding(community, "W1", "R1", "s1", "T1", "D1", "M1", "event:E1")
            )
            binding = _forge_binding(base, expected)
        outcome = self.run(
            m.Claim(
                community_id=cid,
                target_pubkey=target,
                lease_seconds=seconds,
                delivery_id=None if delivery in (None, "newest") else w.delivery_named(delivery),
                expected=binding,
            )
        )
        lease = self._claimed(outcome)
        return multiple() if lease is None else lease

    # A woken agent's claim: it presents the binding its wake named, the
    # row's own or one forged in a single field. The forged-wake findings of
    # the seeds live here, so it is a rule of its own (as likely as a plain
    # claim) rather than a rarer value of `claim`.
    @rule(
        target=leases,
        community=communities,
        agent=agents,
        delivery=claimed_ids,
        expected=woken_bindings,
        seconds=lease_seconds,
    )
    def claim_woken(self, community: str, agent: str, delivery: str | None, expected: str, seconds: int) -> Any:
        """`claim`, presenting a binding: the row's exact one or one forged in one field."""
        return self.claim(community, agent, delivery, expected, seconds)

    # The fleet at work, as every worker runs: take the next pending delivery
    # of a tenant that can be written, as its target, with the usual lease
    # (its holder then acts through the holder rules below). With no argument
    # and no bundle it is the rule Hypothesis orders first (its generation
    # favours that rule, and the shrinker lowers every step towards it), so it
    # has no precondition (were it unavailable, the lowered choices would be
    # rejection-sampled into padding the shrinker can neither lower nor
    # delete); with no pending work it sends nothing. Measured with the model
    # as the adapter, this rule and the preconditions below (a sweep, or a
    # holder's act, waits for a claim) raised the share of programs that
    # reach each lease corner (an expired holder acting, a sweep at the
    # deadline or of a fenced tenant, a fence while a lease is held) about
    # 1.5 to 8 times: before, the first rule was the sweep, which found
    # nothing claimed in 85 % of the steps it took.
    @rule()
    def claim_next(self) -> None:
        """Claim the oldest pending delivery of an active community, as its target."""
        pending = [
            d for (cid, _), d in self.model.deliveries.items()
            if d.status is m.Status.PENDING and self.model.communities.get(cid) is m.CommunityState.ACTIVE
        ]  # fmt: skip
        if pending:
            row = min(pending, key=_by_age)
            self._claimed(self.run(m.Claim(row.key[0], row.binding.target_pubkey, 30)))

    # A worker's claim that carries a request key, and the same request sent
    # again (its answer was lost): at once, or when the clock has reached the
    # lease's deadline exactly (still held: the same lease again) or passed it
    # by a microsecond (expired: a new claim). Drawn again later with the same
    # key, it finds the lease settled, reaped or expired, and claims anew.
    @rule(
        target=leases,
        community=communities,
        key=st.sampled_from([w.REQUEST_KEY, w.REQUEST_KEY + "b"]),
        again=st.sampled_from(["no", "at once", "at the deadline", "past the deadline"]),
        seconds=lease_seconds,
    )
    @precondition(lambda self: self.swarm.on("request-keys") and takes_request_keys(self.adapter))
    def claim_keyed(self, community: str, key: str, again: str, seconds: int) -> Any:
        """Claim with a request key, as the target of the oldest pending row (else T1); maybe again."""
        cid = w.COMMUNITIES[community]
        row = min(self._rows(cid, m.Status.PENDING), key=_by_age, default=None)
        target = row.binding.target_pubkey if row is not None else w.TARGETS["T1"]
        command = m.Claim(cid, target, seconds, request_key=key)
        lease = self._claimed(self.run(command))
        if again != "no":
            if lease is not None and again != "at once":
                late = dt.timedelta(microseconds=1 if again == "past the deadline" else 0)
                by = lease.lease_until - self.model.now + late
                if by > dt.timedelta(0):
                    self.run(m.AdvanceClock(by))
            self._claimed(self.run(command))
        return multiple() if lease is None else lease

    @rule(lease=leases, forgery=lease_forgeries, seconds=lease_seconds)
    @precondition(lambda self: self.swarm.on("renew"))
    def renew(self, lease: m.Lease, forgery: str, seconds: int) -> None:
        self.run(m.Renew(_forge_lease(lease, forgery), seconds))

    @rule(lease=leases, forgery=lease_forgeries, outcome=st.sampled_from(["finished", "failed"]))
    @precondition(lambda self: self.swarm.on("finish"))
    def finish(self, lease: m.Lease, forgery: str, outcome: str) -> None:
        self.run(m.Finish(_forge_lease(lease, forgery), m.Status(outcome)))

    # The same acts by whoever holds a claim now, rather than by a lease the
    # program was handed earlier (most of which a reap, a finish or a newer
    # claim has since made stale): the holder of the oldest or the newest claim
    # still standing; or by the "former" holder: the one last issued a lease
    # that no longer holds (it settled, was swept, or its row was claimed
    # again: a retry after an uncertain finish, or the stale holder the fence
    # exists for). With none of them they wait.

    @rule(which=st.sampled_from(["oldest", "newest", "former"]), forgery=lease_forgeries, seconds=lease_seconds)
    @precondition(lambda self: self.swarm.on("renew") and self._holders())
    def holder_renews(self, which: str, forgery: str, seconds: int) -> None:
        lease = self._holder(which)
        if lease is not None:
            self.run(m.Renew(_forge_lease(lease, forgery), seconds))

    @rule(
        which=st.sampled_from(["oldest", "newest", "former"]),
        forgery=lease_forgeries,
        outcome=st.sampled_from(["finished", "failed"]),
    )
    @precondition(lambda self: self.swarm.on("finish") and self._holders())
    def holder_finishes(self, which: str, forgery: str, outcome: str) -> None:
        lease = self._holder(which)
        if lease is not None:
            self.run(m.Finish(_forge_lease(lease, forgery), m.Status(outcome)))

    def _holders(self) -> bool:
        """Whether a claim stands or a former holder exists."""
        return bool(self._claimed_rows()) or self._former_holder() is not None

    def _holder(self, which: str) -> m.Lease | None:
        """The lease of the oldest or the newest claim (by claimed_at, id) still
        standing, or the former holder's; falling back to any of them."""
        former = self._former_holder()
        if which == "former" and former is not None:
            return former
        rows = sorted(self._claimed_rows(), key=lambda d: (d.claimed_at, d.id))
        if not rows:
            return former
        row = rows[0] if which == "oldest" else rows[-1]
        return m.lease_of(row)

    def _former_holder(self) -> m.Lease | None:
        """The lease last issued that no longer holds its row (which still exists)."""
        for lease in reversed(self.issued):
            row = self.model.deliveries.get((lease.community_id, lease.delivery_id))
            if row is not None and (row.status, row.lease_generation) != (m.Status.CLAIMED, lease.lease_generation):
                return lease
        return None

    def _claimed_rows(self) -> list[m.Delivery]:
        return [d for d in self.model.deliveries.values() if d.status is m.Status.CLAIMED]

    def _rows(self, cid: Any, status: m.Status | None = None) -> list[m.Delivery]:
        """The model's deliveries in community `cid` (with `status`, if given)."""
        return [d for (c, _), d in self.model.deliveries.items() if c == cid and status in (None, d.status)]

    # With nothing claimed a sweep is a no-op: the rule waits for a claim.
    # (Called directly, by a scenario, it sweeps whatever the state.)
    @rule()
    @precondition(lambda self: self.swarm.on("reap") and bool(self._claimed_rows()))
    def reap(self) -> None:
        self.run(m.Reap())

    @rule(to=advances)
    @precondition(lambda self: self.swarm.on("advance_clock"))
    def advance_clock(self, to: str) -> None:
        by = dt.timedelta(seconds=ADVANCE_SECONDS.get(to, 1))
        deadlines = [d.lease_until for d in self._claimed_rows() if d.lease_until >= self.model.now]
        if to in ("deadline", "past-deadline") and deadlines:
            by = min(deadlines) - self.model.now  # type: ignore[type-var]  # claimed rows have a lease_until
            if to == "past-deadline":
                by += dt.timedelta(microseconds=1)
        if by > dt.timedelta(0):
            self.run(m.AdvanceClock(by))

    # -- tenants, lineage and reads -------------------------------------------

    @rule(community=tenant_communities, action=tenant_states)
    @precondition(lambda self: self.swarm.on("tenant"))
    def tenant_state(self, community: str, action: str) -> None:
        """A tenant's state: "fence", "quiesce", "activate", "create", "delete"."""
        self.tenant(community, action)

    @rule(community=tenant_communities, action=record_actions)
    @precondition(lambda self: self.swarm.on("records"))
    def records(self, community: str, action: str) -> None:
        """A tenant's records: lineage ("delete R1", "create M3", ...; "delete
        the newest's run": the run of the community's newest delivery, which
        retires its ids; "recommit the newest": that deletion, the run created
        again, and the newest delivery committed again as it was) and reads
        ("get d2")."""
        self.tenant(community, action)

    def tenant(self, community: str, action: str) -> None:
        """Everything around the deliveries: tenant state ("fence", "activate",
        "delete", ...), lineage ("delete R1", "create M3", ...) and reads ("get
        d2"), on a named community or (HOLDING) on that of the standing claim
        that expires first."""
        if community == HOLDING:
            held = sorted(self._claimed_rows(), key=lambda d: (d.lease_until, d.created_at, d.id))
            cid = held[0].key[0] if held else w.COMMUNITIES["A"]
        else:
            cid = w.COMMUNITIES[community]
        verb, _, what = action.partition(" ")
        if what in ("the newest's run", "the newest"):
            newest = max(self._rows(cid), key=_by_age, default=None)
            if newest is None:
                return
            b = newest.binding
            self.run(m.DeleteRun(cid, b.run_id))
            if verb == "recommit":
                self.run(m.CreateRun(cid, b.workflow_id, b.run_id))
                self.run(m.CommitDeliveries(cid, b.run_id, b.step_id, (m.NewDelivery(newest.id, b),)))
            return
        if not what:
            states = {"activate": "active", "quiesce": "quiescing", "fence": "fenced"}
            if verb in states:
                self.run(m.SetCommunityState(cid, m.CommunityState(states[verb])))
            else:
                self.run(m.CreateCommunity(cid) if verb == "create" else m.DeleteCommunity(cid))
        elif verb == "get":
            self.run(m.GetDelivery(cid, w.delivery_named(what)))
        elif what in w.RUNS:
            workflow = w.WORKFLOWS[w.RUN_WORKFLOW[what]]
            self.run(m.CreateRun(cid, workflow, w.RUNS[what]) if verb == "create" else m.DeleteRun(cid, w.RUNS[what]))
        elif what in w.WORKFLOWS:
            wid = w.WORKFLOWS[what]
            self.run(m.CreateWorkflow(cid, wid) if verb == "create" else m.DeleteWorkflow(cid, wid))
        else:
            eid = w.MESSAGES[what]
            self.run(m.PublishEvent(cid, eid) if verb == "create" else m.DeleteEvent(cid, eid))


def _setup() -> tuple[m.Command, ...]:
    commands: list[m.Command] = []
    for name in w.LIVE_COMMUNITIES:
        cid = w.COMMUNITIES[name]
        commands.append(m.CreateCommunity(cid))
        commands += [m.CreateWorkflow(cid, w.WORKFLOWS[workflow]) for workflow in sorted(w.WORKFLOWS)]
        commands += [m.CreateRun(cid, w.WORKFLOWS[w.RUN_WORKFLOW[run]], w.RUNS[run]) for run in w.INITIAL_RUNS]
        commands += [m.PublishEvent(cid, w.MESSAGES[message]) for message in w.INITIAL_MESSAGES]
    recipients = [(w.FRESH, "T1", "M1", "D1", "event:E1"), (w.FRESH, "T2", "M1", "D1", "event:E1")]
    commands += [DeliveryConformance.commit_command(name, "R1", "s1", recipients, False) for name in w.LIVE_COMMUNITIES]
    return tuple(commands)


SETUP = _setup()


def _row_transitions(before: m.DeliverySystem, after: m.DeliverySystem) -> list[tuple[Any, tuple[str, str]]]:
    """Each row the step changed, by key, with its (from, to) statuses."""
    if before.deliveries is after.deliveries:
        return []  # a refusal, a read or a clock move: the same rows, not merely equal ones
    changed = []
    for key in before.deliveries.keys() | after.deliveries.keys():
        old, new = before.deliveries.get(key), after.deliveries.get(key)
        if old != new:
            changed.append((key, (_status_name(old), _status_name(new))))
    return changed


def machine_for(
    adapter: Lockstepped,
    coverage: Coverage | None = None,
    on_example: Callable[[Coverage], None] | None = None,
) -> type[DeliveryConformance]:
    """A machine class bound to one adapter (reused, and reset, across examples)."""
    bound = bind(DeliveryConformance, adapter, coverage, on_example, offered_operations(adapter))
    if not takes_request_keys(adapter):
        bound.coverage.inapplicable = frozenset({("Claim", "retried")})
    return bound
