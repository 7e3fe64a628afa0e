"""Lockstep conformance for the definition lifecycle and run admission.

The model and an implementation (replica engines with their own caches)
receive the same saves, deletions, cache refreshes, clock moves and fires;
after every step the outcomes, the full persisted state, every replica's
cache and each run's executed actions must agree. Event times are drawn
relative to the coordinate's head and cutoff ("newer", "older", "at the
cutoff"), so delayed saves, replays and recreations are common.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from leaseproof.conformance import world as w
from leaseproof.conformance.lockstep import Coverage, LockstepMachine, MachineSpec, bind
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as m
from leaseproof.model.lifecycle_invariants import state_violations, step_violations

CONTENTS = {
    "a": m.Definition(("post-summary",)),
    "a-on": m.Definition(("post-summary",), enabled=True),
    "a-off": m.Definition(("post-summary",), enabled=False),
    "b": m.Definition(("post-summary", "page-oncall")),
}
WHENS = ("newer", "same", "older", "at-cutoff", "after-cutoff")
SECOND = dt.timedelta(seconds=1)


def describe_difference(model: m.LifecycleSystem, implementation: m.LifecycleSystem) -> str:
    lines = []
    for field in attrs.fields(m.LifecycleSystem):
        a, b = getattr(model, field.name), getattr(implementation, field.name)
        if a != b:
            lines.append(f"{field.name}: implementation {w.describe(b)}\n    but the model says {w.describe(a)}")
    return "\n".join(lines) or "(no difference)"


LIFECYCLE = MachineSpec(
    name="lifecycle",
    decide=m.decide,
    rules=m.RULES,
    initial_state=lambda start: m.initial_state(start, w.REPLICAS),
    violations=lambda before, after, outcome: state_violations(after) + step_violations(before, after, outcome),
    variants=m.OUTCOME_VARIANTS,
    variant=m.variant,
    describe=w.describe,
    difference=describe_difference,
    transitions=m.COORDINATE_TRANSITIONS,
    subject="coordinate",
    transitions_of=lambda before, after: coordinate_transitions(before, after),
)


def coordinate_transitions(
    before: m.LifecycleSystem, after: m.LifecycleSystem
) -> list[tuple[m.Coordinate, tuple[str, str]]]:
    """Each coordinate whose head the step changed, with its (from, to) life transition."""
    changed = {c for c in before.heads.keys() | after.heads.keys() if before.heads.get(c) != after.heads.get(c)}
    return [(c, (m.coordinate_status(before, c), m.coordinate_status(after, c))) for c in sorted(changed, key=str)]


def _mostly(common: list[Any], rare: list[Any], weight: int = 3) -> st.SearchStrategy[Any]:
    return st.sampled_from(common * weight + rare)


communities = _mostly(["A", "B"], ["Z"], weight=5)
workflows = _mostly(["W1"], ["W2"])
authors = _mostly(["alice"], ["bob"])
channels = _mostly(["general"], ["ops"])
replicas = _mostly(list(w.REPLICAS), ["r9"], weight=6)


class LifecycleConformance(LockstepMachine):
    """The lifecycle model and an implementation in lockstep; bound by `lifecycle_machine_for`."""

    spec = LIFECYCLE
    start = w.START

    @initialize()
    def setup(self) -> None:
        """Communities A and B, alice and bob with authority in #general of each and alice
        in #ops of A, and a live definition "a" of (A, W1) by alice that both replicas
        serve. One step of the lockstep: every outcome compared, the whole state once."""
        self.begin()
        self.run_together(SETUP, "the set-up")

    def _at(self, community: str, workflow: str, when: str) -> dt.datetime:
        return event_time(self.model, community, workflow, when)

    @rule(
        community=communities,
        workflow=workflows,
        author=authors,
        channel=channels,
        content=_mostly(["a"], ["a-on", "a-off", "b"], weight=2),
        when=_mostly(["newer"], list(WHENS[1:]), weight=4),
    )
    def save(self, community: str, workflow: str, author: str, channel: str, content: str, when: str) -> None:
        self.run(save_command(community, workflow, author, channel, content, self._at(community, workflow, when)))

    @rule(community=communities, workflow=workflows, author=authors, when=_mostly(["newer"], ["same", "older"]))
    def delete(self, community: str, workflow: str, author: str, when: str) -> None:
        at = self._at(community, workflow, when)
        self.run(m.DeleteDefinition(w.COMMUNITIES[community], w.WORKFLOWS[workflow], w.AUTHORS[author], at))

    @rule(community=communities, workflow=workflows, identical=st.booleans())
    def recreate(self, community: str, workflow: str, identical: bool) -> None:
        """The seed's delete→recreate, in one breath: the owner deletes, then saves the
        same content again (identical) or other content, just after the cutoff."""
        head = self.model.heads.get((w.COMMUNITIES[community], w.WORKFLOWS[workflow]))
        if head is None:
            return
        author, channel = w.name_of(head.author), w.name_of(head.channel_id)
        same = next(name for name, definition in CONTENTS.items() if definition == head.definition)
        content = same if identical else ("b" if same != "b" else "a")
        self.delete(community, workflow, author, "newer")
        self.save(community, workflow, author, channel, content, "after-cutoff")

    @rule(community=communities, workflow=workflows, path=st.sampled_from(m.ALTERNATE_DELETIONS))
    def alternate_delete(self, community: str, workflow: str, path: str) -> None:
        self.run(m.AlternateDelete(w.COMMUNITIES[community], w.WORKFLOWS[workflow], path))

    @rule(
        community=communities,
        action=st.sampled_from(
            ["grant alice ops", "grant bob ops", "revoke alice general", "revoke bob general", "grant alice general"]
            + ["activate"] * 2
            + ["quiesce", "fence", "create"]
        ),
    )
    def tenant(self, community: str, action: str) -> None:
        """Channel authority ("revoke alice general") and tenant state ("fence")."""
        cid = w.COMMUNITIES[community]
        verb, _, rest = action.partition(" ")
        if rest:
            member, channel = rest.split()
            self.run(m.SetAuthority(cid, w.CHANNELS[channel], w.AUTHORS[member], verb == "grant"))
        elif verb == "create":
            self.run(d.CreateCommunity(cid))
        else:
            state = {"activate": "active", "quiesce": "quiescing", "fence": "fenced"}[verb]
            self.run(d.SetCommunityState(cid, d.CommunityState(state)))

    @rule(replica=replicas)
    def refresh(self, replica: str) -> None:
        self.run(m.RefreshCache(replica))

    @rule(replica=replicas, door=st.sampled_from(m.DOORS), community=communities, workflow=workflows)
    def fire(self, replica: str, door: str, community: str, workflow: str) -> None:
        self.run(m.Fire(replica, door, w.COMMUNITIES[community], w.WORKFLOWS[workflow]))

    @rule(run_id=st.integers(1, 4))
    def resume(self, run_id: int) -> None:
        self.run(m.ResumeRun(run_id))

    # Mostly short moves, so caches stay warm (and stale) long enough to matter.
    @rule(seconds=_mostly([1], [5, 10], weight=2))
    def advance_clock(self, seconds: int) -> None:
        self.run(d.AdvanceClock(seconds * SECOND))


def event_time(state: m.LifecycleSystem, community: str, workflow: str, when: str) -> dt.datetime:
    """An event time relative to the coordinate's head and cutoff."""
    coordinate = (w.COMMUNITIES[community], w.WORKFLOWS[workflow])
    head = state.heads.get(coordinate)
    cutoff = state.cutoffs.get(coordinate)
    base = head.created_at if head is not None else (cutoff or w.START)
    if when in ("at-cutoff", "after-cutoff") and cutoff is not None:
        base = cutoff
    offset = {"newer": SECOND, "same": 0 * SECOND, "older": -SECOND, "at-cutoff": 0 * SECOND}
    return base + offset.get(when, SECOND)


def save_command(
    community: str, workflow: str, author: str, channel: str, content: str, at: dt.datetime
) -> m.SaveDefinition:
    """A signed save in world names; its event id is derived from everything it says."""
    identity = f"{community}/{workflow}/{author}/{channel}/{content}/{at.isoformat()}"
    return m.SaveDefinition(
        m.DefinitionEvent(
            event_id=hashlib.sha256(identity.encode()).digest(),
            community_id=w.COMMUNITIES[community],
            workflow_id=w.WORKFLOWS[workflow],
            author=w.AUTHORS[author],
            channel_id=w.CHANNELS[channel],
            created_at=at,
            definition=CONTENTS[content],
        )
    )


def _setup() -> tuple[Any, ...]:
    commands: list[Any] = []
    for name in w.LIVE_COMMUNITIES:
        cid = w.COMMUNITIES[name]
        commands.append(d.CreateCommunity(cid))
        commands += [m.SetAuthority(cid, w.CHANNELS["general"], w.AUTHORS[a], True) for a in ("alice", "bob")]
    commands.append(m.SetAuthority(w.COMMUNITIES["A"], w.CHANNELS["ops"], w.AUTHORS["alice"], True))
    commands.append(save_command("A", "W1", "alice", "general", "a", w.START + SECOND))
    commands += [m.RefreshCache(replica) for replica in w.REPLICAS]
    return tuple(commands)


SETUP = _setup()


def lifecycle_machine_for(
    adapter: Any,
    coverage: Coverage | None = None,
    on_example: Callable[[Coverage], None] | None = None,
) -> type[LifecycleConformance]:
    """A machine class bound to one adapter (reused, and reset, across examples)."""
    return bind(LifecycleConformance, adapter, coverage, on_example, None)  # type: ignore[return-value]
