"""Bounded exhaustive exploration of a model: an explicit-state, TLC-style search.

Breadth-first from the machine's initial state, over a finite alphabet of commands that
depends on the bounds and on the state (renew and finish present leases derived from the
rows that exist). Every state reached is checked against the machine's state invariants;
every step against its step invariants, against its rule (a step may change only the fields
its rule declares) and against the declared transitions (a row or a coordinate moves only
along one, by a rule that declares it makes it). A state outside the bounds (the clock too
far, too many rows or runs, a generation too high) is reached, checked and counted, but not
expanded: TLC's state constraint. Breadth-first, so the path reported for each kind of
violation is a shortest one; `write_counterexample` writes it as a trace `leaseproof replay`
runs. The search knows a machine only through an `ExplorationSpec`, so a test can explore a
deliberately broken model the same way.
"""

from __future__ import annotations

import collections
import datetime as dt
import functools
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.delivery import DELIVERY
from leaseproof.conformance.lockstep.lifecycle import LIFECYCLE
from leaseproof.conformance.spec.bounds import (
    DeliveryBounds,
    LifecycleBounds,
)
from leaseproof.conformance.traces import trace
from leaseproof.model import delivery as dm
from leaseproof.model import invariants as delivery_invariants
from leaseproof.model import lifecycle as lm
from leaseproof.model import lifecycle_invariants
from leaseproof.model.rules import Decision, Rule, behaviours, changed_fields

# -- the search --------------------------------------------------------------


@attrs.frozen
class ExplorationSpec:
    """What the search knows about one machine, and nothing else."""

    machine: str  # the machine its paths replay on, as traces name it: "delivery" or "lifecycle"
    initial_state: Callable[[dt.datetime], Any]
    decide: Callable[[Any, Any], Decision[Any]]
    state_violations: Callable[[Any], list[str]]
    step_violations: Callable[[Any, Any, Any], list[str]]  # (before, after, outcome)
    commands: Callable[[Any, Any], Iterable[Any]]  # (state, bounds): the alphabet, in a fixed order
    within: Callable[[Any, Any], bool]  # (state, bounds): the state constraint
    variant: Callable[[Any], str]
    rules: Mapping[type, tuple[Rule, ...]]
    bounds: type  # the machine's bounds class; `bounds()` is the default
    describe: Callable[[Any], str] = w.describe
    start: dt.datetime = w.START
    # What moves along the machine's declared transitions (rows, coordinates): each
    # (subject, (from, to)) a step made; and per declared (from, to) the rules,
    # "Operation/guard", that may make it.
    transitions_of: Callable[[Any, Any], Iterable[tuple[Any, tuple[str, str]]]] = lambda before, after: ()
    transitions: Mapping[tuple[str, str], tuple[str, ...]] = attrs.field(factory=dict)
    subject: str = "row"  # what moves along them, by name
    # (after, command, outcome): how sending the command again right after it took effect
    # breaks the machine's resend rule (a safe resend changes nothing more, and says so).
    resend_violations: Callable[[Any, Any, Any], list[str]] = lambda after, command, outcome: []


@attrs.frozen
class Progress:
    states: int  # distinct states so far
    frontier: int  # states still to expand, at this depth and the next
    depth: int  # the level being expanded
    rate: float  # distinct states per second
    seconds: float


@attrs.frozen
class Violation:
    """One kind of violation, and the shortest path that shows it."""

    kind: str  # the message with its ids and numbers blanked: what groups violations
    message: str  # the first instance (the one at the end of `path`), verbatim
    path: tuple[Any, ...]  # the commands from the initial state
    count: int  # how many states or steps showed this kind


@attrs.frozen
class Exploration:
    machine: str
    bounds: Any
    states: int  # distinct states reached, the unexpanded ones included
    transitions: int  # steps taken: every command of the alphabet from every expanded state
    depth: int  # BFS levels: the longest shortest path to a reached state
    unexpanded: int  # distinct states outside the bounds: reached and checked, not expanded
    seconds: float
    coverage: Mapping[tuple[str, str, str], int]  # (operation, guard, outcome variant) -> steps
    never_reached: tuple[tuple[str, str, str], ...]  # declared (operation, guard, outcome) never taken
    moves: Mapping[tuple[str, str], int]  # declared transitions (from, to) taken -> how often
    never_moved: tuple[tuple[str, str], ...]  # declared transitions never taken
    violations: tuple[Violation, ...]  # shortest paths first

    @property
    def holds(self) -> bool:
        return not self.violations


_BLANKS = (
    (re.compile(r"UUID\('[^']*'\)|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r"b'(?:[^'\\]|\\.)*'|b\"(?:[^\"\\]|\\.)*\""), "<key>"),
    (re.compile(r"datetime\.datetime\([^)]*\)\)?|\d{4}-\d\d-\d\d[ T][\d:.+]+"), "<instant>"),
    (re.compile(r"\d+"), "N"),
)


def violation_kind(message: str) -> str:
    """What groups violations: the message with ids, keys, instants and numbers blanked."""
    for pattern, blank in _BLANKS:
        message = pattern.sub(blank, message)
    return message


def explore(
    spec: ExplorationSpec,
    bounds: Any = None,
    on_progress: Callable[[Progress], None] | None = None,
    progress_every: int = 2_000,
    every_step: bool = False,
) -> Exploration:
    """Every state reachable within `bounds` (default: the spec's), breadth-first.

    Step invariants are checked on every step that changes the state or whose
    rule may change it. The stutter of a refusal or a read (its rule declares
    no change, and `decide` holds it to that) satisfies them, as a stuttering
    step satisfies [][A]_vars in TLA+; `every_step` checks those too.
    """
    bounds = spec.bounds() if bounds is None else bounds
    began = time.perf_counter()
    initial = spec.initial_state(spec.start)
    # Each state's parent and the command that first reached it: BFS makes these the shortest paths.
    parents: dict[Any, tuple[Any, Any] | None] = {initial: None}
    coverage: collections.Counter[tuple[str, str, str]] = collections.Counter()
    moved: collections.Counter[tuple[str, str]] = collections.Counter()
    found: dict[str, list[Any]] = {}  # kind -> [message, state, command or None, count]

    def note(messages: Iterable[str], state: Any, command: Any, prefix: str = "") -> None:
        for message in messages:
            kind = violation_kind(prefix + message)
            if kind in found:
                found[kind][3] += 1
            else:
                found[kind] = [prefix + message, state, command, 1]

    note(spec.state_violations(initial), initial, None)
    frontier = [initial] if spec.within(initial, bounds) else []
    transitions, unexpanded, depth, level, expanded = 0, int(not frontier), 0, 0, 0
    while frontier:
        following: list[Any] = []
        for index, state in enumerate(frontier):
            for command in spec.commands(state, bounds):
                transitions += 1
                operation = type(command).__name__
                try:
                    decision = spec.decide(state, command)
                except Exception as fault:  # noqa: BLE001 - a model that raises is a finding, not a crash
                    note([f"{operation}: the model raised {type(fault).__name__}: {fault}"], state, command)
                    continue
                after, outcome, rule = decision.state, decision.outcome, decision.rule
                coverage[(operation, rule.guard, spec.variant(outcome))] += 1
                if after is not state:
                    problems = spec.step_violations(state, after, outcome)
                    undeclared = [f for f in changed_fields(state, after) if f not in rule.changes]
                    if undeclared:
                        problems.append(f"changed {', '.join(undeclared)}, which its rule does not declare")
                    problems += spec.resend_violations(after, command, outcome)
                    for subject, pair in spec.transitions_of(state, after):
                        moved[pair] += 1
                        makers = spec.transitions.get(pair, ())
                        if f"{operation}/{rule.guard}" not in makers:
                            why = "a transition this rule makes" if makers else "a declared transition"
                            where = f"{spec.subject} {spec.describe(subject)}"
                            problems.append(f"{where} moved {pair[0]} -> {pair[1]}, not {why}")
                elif rule.changes or every_step:
                    problems = spec.step_violations(state, after, outcome)
                else:
                    continue  # a stutter of a refusal or a read: nothing to check, no new state
                if problems:
                    note(problems, state, command, f"{operation}/{rule.guard}: ")
                if after not in parents:
                    parents[after] = (state, command)
                    depth = level + 1
                    note(spec.state_violations(after), after, None)
                    if spec.within(after, bounds):
                        following.append(after)
                    else:
                        unexpanded += 1
            expanded += 1
            if on_progress is not None and expanded % progress_every == 0:
                on_progress(_progress(len(parents), len(frontier) - index - 1 + len(following), level, began))
        frontier, level = following, level + 1
        if on_progress is not None:
            on_progress(_progress(len(parents), len(frontier), level, began))
    violations = [
        Violation(kind, message, _path(parents, state) + (() if command is None else (command,)), count)
        for kind, (message, state, command, count) in found.items()
    ]
    return Exploration(
        machine=spec.machine,
        bounds=bounds,
        states=len(parents),
        transitions=transitions,
        depth=depth,
        unexpanded=unexpanded,
        seconds=time.perf_counter() - began,
        coverage=dict(coverage),
        never_reached=tuple(triple for triple in behaviours(spec.rules) if triple not in coverage),
        moves=dict(moved),
        never_moved=tuple(pair for pair in spec.transitions if pair not in moved),
        violations=tuple(sorted(violations, key=lambda v: len(v.path))),  # stable: found order within a length
    )


def _path(parents: Mapping[Any, tuple[Any, Any] | None], state: Any) -> tuple[Any, ...]:
    path = []
    link = parents[state]
    while link is not None:
        state, command = link
        path.append(command)
        link = parents[state]
    return tuple(reversed(path))


def _progress(states: int, frontier: int, depth: int, began: float) -> Progress:
    seconds = time.perf_counter() - began
    return Progress(states, frontier, depth, states / seconds if seconds > 0 else 0.0, seconds)


def counterexample(spec: ExplorationSpec, violation: Violation, name: str | None = None) -> trace.Trace:
    """The violation's path as a trace: the commands with what the machine's model
    (the real one, whatever `spec.decide` is) answers, for `leaseproof replay`."""
    return trace.record(name or f"explore-{spec.machine}", spec.start, violation.path, machine=spec.machine)


def write_counterexample(spec: ExplorationSpec, violation: Violation, path: Path) -> trace.Trace:
    recorded = counterexample(spec, violation, path.stem)
    trace.write(recorded, path)
    return recorded


# -- bounds ------------------------------------------------------------------


# -- the delivery machine ----------------------------------------------------


def _delivery_binding(community: str, step: str, target: str, workflow: str = "W1", message: str = "M1") -> Any:
    return w.binding(community, workflow, "R1", step, target, "D1", message, "event:E1")


def _commit(community: str, step: str, targets: Iterable[tuple[str, str]], **forged: str) -> dm.CommitDeliveries:
    """Commit one step of R1 to `targets`, each (delivery name, or FRESH, and target)."""
    return dm.CommitDeliveries(
        w.COMMUNITIES[community],
        w.RUNS["R1"],
        w.STEPS[step],
        [
            dm.NewDelivery(
                w.delivery_id(w.FRESH, "R1", step, target) if name == w.FRESH else w.delivery_named(name),
                _delivery_binding(community, step, target, **forged),
            )
            for name, target in targets
        ],
    )


@functools.lru_cache(maxsize=16)
def _delivery_alphabet(bounds: DeliveryBounds) -> tuple[Any, ...]:
    """The commands that do not depend on the state, in a fixed order."""
    lease = bounds.lease_seconds
    commands: list[Any] = []
    for name in ("A", "B")[: bounds.communities]:
        cid, wid = w.COMMUNITIES[name], w.WORKFLOWS["W1"]
        targets = ("T1", "T2")[: bounds.targets] if name == "A" else ("T1",)
        commands += [
            dm.CreateCommunity(cid),
            dm.CreateWorkflow(cid, wid),
            dm.CreateRun(cid, wid, w.RUNS["R1"]),
            dm.PublishEvent(cid, w.MESSAGES["M1"]),
            _commit(name, "s1", [(w.FRESH, t) for t in targets]),  # again: a producer retry
            *(dm.Claim(cid, w.TARGETS[t], lease) for t in targets),
            dm.GetDelivery(cid, w.delivery_named("R1/s1/T1")),
        ]
        if name == "A":
            commands += [
                # Another step under the id of s1's T1 row: whichever commits second finds it taken.
                _commit(name, "s2", [("R1/s1/T1", "T1")]),
                _commit(name, "s1", [(w.FRESH, "T1")], workflow="W2"),  # R1 is W1's
                _commit(name, "s1", [(w.FRESH, "T1")], message="M3"),  # never published
                dm.DeleteEvent(cid, w.MESSAGES["M1"]),
                dm.DeleteRun(cid, w.RUNS["R1"]),
                dm.DeleteWorkflow(cid, wid),
                dm.SetCommunityState(cid, dm.CommunityState.QUIESCING),
                dm.Claim(cid, w.TARGETS["T1"], lease, request_key=w.REQUEST_KEY),  # sent again, it is retried
            ]
        commands += [
            dm.SetCommunityState(cid, dm.CommunityState.FENCED),
            dm.SetCommunityState(cid, dm.CommunityState.ACTIVE),
            dm.DeleteCommunity(cid),
        ]
    # A wake whose expected binding names another community; a lease in Z, never created.
    commands.append(dm.Claim(w.COMMUNITIES["A"], w.TARGETS["T1"], lease, expected=_delivery_binding("B", "s1", "T1")))
    nowhere = dm.Lease(w.COMMUNITIES["Z"], w.DELIVERIES["d1"], w.TARGETS["T1"], 1, w.START)
    commands += [dm.Renew(nowhere, lease), dm.Finish(nowhere, dm.Status.FINISHED)]
    return tuple(commands)


@functools.lru_cache(maxsize=100_000)
def _row_commands(row: dm.Delivery, lease_seconds: int) -> tuple[Any, ...]:
    """What is sent about one row: claims naming it (by id, by binding), and renew
    and finish with leases at its generation and the one before, held by its
    target or by the other one."""
    cid, target = row.key[0], row.binding.target_pubkey
    other = next(t for t in w.TARGETS.values() if t != target)
    commands: list[Any] = [
        dm.Claim(cid, target, lease_seconds, delivery_id=row.id),
        dm.Claim(cid, target, lease_seconds, expected=row.binding),
    ]
    generations = (row.lease_generation, row.lease_generation - 1) if row.lease_generation else (0,)
    for generation in generations:
        for holder in (target, other):
            lease = dm.Lease(cid, row.id, holder, generation, row.lease_until or row.created_at)
            commands += [
                dm.Renew(lease, lease_seconds),
                dm.Finish(lease, dm.Status.FINISHED),
                dm.Finish(lease, dm.Status.FAILED),
            ]
    return tuple(commands)


@functools.lru_cache(maxsize=16)
def _clock_commands(lease_seconds: int) -> tuple[Any, ...]:
    return (dm.Reap(), dm.AdvanceClock(dt.timedelta(seconds=lease_seconds)))


def delivery_commands(state: dm.DeliverySystem, bounds: DeliveryBounds) -> list[Any]:
    commands = list(_delivery_alphabet(bounds))
    leased = False
    for row in state.deliveries.values():
        commands += _row_commands(row, bounds.lease_seconds)
        leased = leased or row.status is dm.Status.CLAIMED
    # Time matters only to leases: the clock moves, and a sweep runs, only while one is out.
    if leased:
        commands += _clock_commands(bounds.lease_seconds)
    return commands


def delivery_within(state: dm.DeliverySystem, bounds: DeliveryBounds) -> bool:
    return (
        state.now - w.START <= dt.timedelta(seconds=bounds.clock_steps * bounds.lease_seconds)
        and len(state.deliveries) <= bounds.deliveries
        and all(d.lease_generation <= bounds.generation for d in state.deliveries.values())
    )


DELIVERY_EXPLORATION = ExplorationSpec(
    machine="delivery",
    initial_state=dm.initial_state,
    decide=dm.decide,
    state_violations=delivery_invariants.state_violations,
    step_violations=delivery_invariants.step_violations,
    commands=delivery_commands,
    within=delivery_within,
    variant=dm.variant,
    rules=dm.RULES,
    bounds=DeliveryBounds,
    transitions_of=DELIVERY.transitions_of,
    transitions=DELIVERY.transitions,
    subject="delivery",
    resend_violations=dm.resend_violations,
)


# -- the lifecycle machine ---------------------------------------------------


SECOND = dt.timedelta(seconds=1)
# Each coordinate's saves: (name, author, channel, content, created_at in seconds after START).
SAVES = (
    ("e1", "alice", "general", lm.Definition(("post-summary",)), 1),
    ("e2", "alice", "general", lm.Definition(("post-summary",)), 2),  # e1's content again: a new revision
    ("e3", "alice", "general", lm.Definition(("post-summary",), enabled=False), 3),
    ("e4", "bob", "general", lm.Definition(("post-summary", "page-oncall")), 2),  # not alice's to replace
)
OTHER_CHANNEL_SAVE = ("e5", "alice", "ops", lm.Definition(("page-oncall",)), 4)
# Each coordinate's deletions: (author, created_at in seconds after START). Alice's at 1
# deletes e1 (a later e2 recreates it identically), is older than e2 and e3, and leaves
# a cutoff that e1 cannot pass; bob's is not the author's, unless bob saved e4 first.
DELETIONS = (("alice", 1), ("bob", 3))


def definition_event(community: str, workflow: str, save: tuple[Any, ...]) -> lm.DefinitionEvent:
    name, author, channel, content, seconds = save
    return lm.DefinitionEvent(
        event_id=_event_id(community, workflow, name),
        community_id=w.COMMUNITIES[community],
        workflow_id=w.WORKFLOWS[workflow],
        author=w.AUTHORS[author],
        channel_id=w.CHANNELS[channel],
        created_at=w.START + seconds * SECOND,
        definition=content,
    )


def _event_id(community: str, workflow: str, name: str) -> bytes:
    return hashlib.sha256(f"definition {community}/{workflow}/{name}".encode()).digest()


@functools.lru_cache(maxsize=16)
def _lifecycle_alphabet(bounds: LifecycleBounds) -> tuple[Any, ...]:
    saves = SAVES + ((OTHER_CHANNEL_SAVE,) if bounds.channels > 1 else ())
    commands: list[Any] = []
    for community in ("A", "B")[: bounds.communities]:
        cid = w.COMMUNITIES[community]
        commands.append(dm.CreateCommunity(cid))
        for channel in ("general", "ops")[: bounds.channels]:
            for author in ("alice", "bob"):
                commands += [lm.SetAuthority(cid, w.CHANNELS[channel], w.AUTHORS[author], a) for a in (True, False)]
        for workflow in ("W1", "W2")[: bounds.workflows]:
            wid = w.WORKFLOWS[workflow]
            commands += [lm.SaveDefinition(definition_event(community, workflow, save)) for save in saves]
            commands += [lm.DeleteDefinition(cid, wid, w.AUTHORS[a], w.START + s * SECOND) for a, s in DELETIONS]
            commands.append(lm.AlternateDelete(cid, wid, lm.ALTERNATE_DELETIONS[0]))
            commands += [lm.Fire(r, door, cid, wid) for r in w.REPLICAS for door in lm.DOORS[: bounds.doors]]
        commands += [dm.SetCommunityState(cid, s) for s in (dm.CommunityState.QUIESCING, dm.CommunityState.ACTIVE)]
    commands += [lm.RefreshCache(replica) for replica in (*w.REPLICAS, "r9")]
    commands.append(lm.Fire("r9", lm.DOORS[0], w.COMMUNITIES["A"], w.WORKFLOWS["W1"]))
    commands += [lm.ResumeRun(run_id) for run_id in range(1, bounds.runs + 1)]
    commands.append(dm.AdvanceClock(bounds.clock_seconds * SECOND))
    return tuple(commands)


def lifecycle_commands(state: lm.LifecycleSystem, bounds: LifecycleBounds) -> tuple[Any, ...]:
    return _lifecycle_alphabet(bounds)


def lifecycle_within(state: lm.LifecycleSystem, bounds: LifecycleBounds) -> bool:
    return (
        state.now - w.START <= bounds.clock_steps * bounds.clock_seconds * SECOND
        and len(state.runs) <= bounds.runs
        and all(
            len(state.executed.get(run_id, ())) <= (1 + bounds.resumes) * len(run.record.actions)
            for run_id, run in state.runs.items()
        )
    )


_EVENT_NAMES = {
    f"{_event_id(c, wf, save[0]).hex()[:8]}…": save[0]
    for c in ("A", "B")
    for wf in ("W1", "W2")
    for save in (*SAVES, OTHER_CHANNEL_SAVE)
}
_EVENT_PREFIX = re.compile(r"\b[0-9a-f]{8}…")


def describe_lifecycle(value: Any) -> str:
    """`world.describe`, with the explorer's definition events by name (e1 ... e5)."""
    return _EVENT_PREFIX.sub(lambda m: _EVENT_NAMES.get(m.group(0), m.group(0)), w.describe(value))


LIFECYCLE_EXPLORATION = ExplorationSpec(
    machine="lifecycle",
    initial_state=lambda start: lm.initial_state(start, w.REPLICAS),
    decide=lm.decide,
    state_violations=lifecycle_invariants.state_violations,
    step_violations=lifecycle_invariants.step_violations,
    commands=lifecycle_commands,
    within=lifecycle_within,
    variant=lm.variant,
    rules=lm.RULES,
    bounds=LifecycleBounds,
    describe=describe_lifecycle,
    transitions_of=LIFECYCLE.transitions_of,
    transitions=LIFECYCLE.transitions,
    subject="coordinate",
)

SPECS: dict[str, ExplorationSpec] = {spec.machine: spec for spec in (DELIVERY_EXPLORATION, LIFECYCLE_EXPLORATION)}


# -- for the command line (conformance/frontends/commands/explore.py) ------------


def bounds_for(machine: str, overrides: Mapping[str, int]) -> Any:
    """The machine's bounds: its defaults, with the overrides that are its own."""
    spec = SPECS[machine]
    names = {f.name for f in attrs.fields(spec.bounds)}
    return spec.bounds(**{name: value for name, value in overrides.items() if name in names})
