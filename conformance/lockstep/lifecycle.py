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
from hypothesis.stateful import initialize, precondition, rule

from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.core import Coverage, LockstepMachine, Lockstepped, MachineSpec, bind, unchanged_or
from leaseproof.conformance.lockstep.swarm import Option, Swarm, values, weighted
from leaseproof.conformance.lockstep.swarm import swarm as swarm_of
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as m
from leaseproof.model.lifecycle_invariants import state_violations, step_violations

CONTENTS = {
    "a": m.Definition(("post-summary",)),
    "a-on": m.Definition(("post-summary",), enabled=True),
    "a-off": m.Definition(("post-summary",), enabled=False),
    "b": m.Definition(("post-summary", "page-oncall")),
}
# Beside the named contents, a save may carry one drawn from the model's whole domain
# (`m.Definition`): 1 to MAX_ACTIONS actions, each non-blank text of at most 64
# characters of any character a signed (UTF-8) event carries, the bounds themselves
# drawn as often as the sizes inside them. What the hash, the stored actions and
# their order must get right for every content, not only for ASCII words.
DRAWN = "drawn"
# Characters are drawn as code points (st.characters() made the number of programs a
# failing run shrinks through vary from run to run in one process; integers do not):
# printable ASCII half the time, else any code point but NUL and the surrogates.
_CHARACTERS = st.one_of(
    st.integers(0x20, 0x7E), st.integers(0x01, 0x10FFFF).filter(lambda c: not 0xD800 <= c <= 0xDFFF)
).map(chr)
_ACTION = st.one_of(st.text(_CHARACTERS, min_size=1, max_size=64), st.text(_CHARACTERS, min_size=64, max_size=64))
drawn_contents = st.builds(
    m.Definition,
    st.one_of(
        st.lists(_ACTION.filter(str.strip), min_size=1, max_size=m.MAX_ACTIONS),
        st.lists(_ACTION.filter(str.strip), min_size=m.MAX_ACTIONS, max_size=m.MAX_ACTIONS),
    ).map(tuple),
    enabled=st.booleans(),
)
WHENS = ("newer", "same", "older", "at-cutoff", "after-cutoff")
SECOND = dt.timedelta(seconds=1)


def describe_difference(model: m.LifecycleSystem, implementation: m.LifecycleSystem) -> str:
    lines = []
    for field in attrs.fields(m.LifecycleSystem):
        a, b = getattr(model, field.name), getattr(implementation, field.name)
        if a != b:
            lines.append(f"{field.name}: implementation {w.describe(b)}\n    but the model says {w.describe(a)}")
    return "\n".join(lines) or "(no difference)"


def explain_step(
    command: Any, before: m.LifecycleSystem, after: m.LifecycleSystem, implementation: m.LifecycleSystem
) -> str:
    """The clock at the step, and the coordinate it touched: its head, runtime row,
    cutoff, every replica's cached record and its runs, before, in the model
    after, and in the implementation after."""
    lines = [f"clock at the step: {w.describe(before.now)} ({before.now.isoformat()})"]
    coordinate = _coordinate_of(command, before)
    if coordinate is None:
        return lines[0]
    lines.append(f"the coordinate it touched, ({w.name_of(coordinate[0])}, {w.name_of(coordinate[1])}):")
    shown: dict[tuple[str, ...], str] = {}
    for label, state in (("before", before), ("model after", after), ("implementation", implementation)):
        summary = tuple(_coordinate_summary(state, coordinate))
        if summary in shown:
            lines.append(f"  {label}: as {shown[summary]}")
            continue
        shown[summary] = label
        lines.append(f"  {label}:")
        lines += [f"    {line}" for line in summary]
    return "\n".join(lines)


def _coordinate_of(command: Any, state: m.LifecycleSystem) -> tuple[Any, Any] | None:
    if isinstance(command, m.SaveDefinition):
        return (command.event.community_id, command.event.workflow_id)
    if isinstance(command, m.DeleteDefinition | m.AlternateDelete | m.Fire):
        return (command.community_id, command.workflow_id)
    if isinstance(command, m.ResumeRun) and command.run_id in state.runs:
        return state.runs[command.run_id].record.coordinate
    return None


def _coordinate_summary(state: m.LifecycleSystem, coordinate: tuple[Any, Any]) -> list[str]:
    head, runtime = state.heads.get(coordinate), state.runtime.get(coordinate)
    lines = [
        "head: " + ("none" if head is None else f"saved {w.describe(head.created_at)}, {w.describe(head.definition)}"),
        "runtime: " + ("none" if runtime is None else _record_summary(runtime)),
        f"cutoff: {w.describe(state.cutoffs[coordinate]) if coordinate in state.cutoffs else 'none'}",
    ]
    for replica, cache in sorted(state.caches.items()):
        record = cache.records.get(coordinate)
        cached = "not cached" if record is None else _record_summary(record)
        lines.append(f"replica {replica} (loaded {w.describe(cache.loaded_at)}): {cached}")
    for run in state.runs.values():
        if run.record.coordinate == coordinate:
            done = state.executed.get(run.run_id, ())
            lines.append(f"run {run.run_id} via {run.door}: {_record_summary(run.record)}; executed {list(done)}")
    return lines


def _record_summary(record: m.Record) -> str:
    return (
        f"actions {list(record.actions)}, {'enabled' if record.enabled else 'disabled'}, hash {record.hash.hex()[:8]}, "
        f"owner {w.name_of(record.owner)} in {w.name_of(record.channel_id)}, "
        f"incarnation {w.describe(record.incarnation)}, "
        f"revision {record.revision.hex()[:8]}"
    )


LIFECYCLE = MachineSpec(
    name="lifecycle",
    decide=m.decide,
    rules=m.RULES,
    initial_state=lambda start: m.initial_state(start, w.REPLICAS),
    violations=lambda before, after, outcome: unchanged_or(before, after, state_violations, step_violations, outcome),
    variants=m.OUTCOME_VARIANTS,
    variant=m.variant,
    describe=w.describe,
    difference=describe_difference,
    explain=explain_step,
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


# Every program draws a swarm first (`conformance/lockstep/swarm.py`): the rules and the
# families of values it leaves out.
FEATURES = (
    # rules (a program whose swarm leaves clock moves out still has the rule,
    # which then does nothing: see `advance_clock`)
    "save", "delete", "recreate", "tenant", "grants", "refresh", "fire", "resume", "advance_clock",
    # values
    "community-B", "community-Z", "workflow-W2", "author-bob", "channel-ops", "other-contents", "drawn-contents",
    "replays",
    "unknown-replica", "long-moves", "authority", "fences", "alternate-deletions",
)  # fmt: skip
SWARM = swarm_of(FEATURES, key="lifecycle swarm")


def _among(*options: Option) -> st.SearchStrategy[Any]:
    return values(SWARM, options)


communities = _among(*[("A", None)] * 4, *[("B", "community-B")] * 3, ("Z", "community-Z"))
workflows = _among(*weighted(["W1"], ["W2"], 3, "workflow-W2"))
authors = _among(*weighted(["alice"], ["bob"], 3, "author-bob"))
channels = _among(*weighted(["general"], ["ops"], 3, "channel-ops"))
replicas = _among(*weighted(list(w.REPLICAS), ["r9"], 6, "unknown-replica"))
# A drawn content is drawn only when the choice is DRAWN, so that a program whose
# failure needs none shrinks it away with the choice.
contents = _among(*weighted(["a"], ["a-on", "a-off", "b"], 2, "other-contents"), (DRAWN, "drawn-contents")).flatmap(
    lambda name: drawn_contents if name == DRAWN else st.just(name)
)
# Newer saves are common; replays, delayed saves and saves at the cutoff rarer.
save_times = _among(*weighted(["newer"], list(WHENS[1:]), 4, "replays"))
delete_times = _among(*weighted(["newer"], ["same", "older"], 3, "replays"))
# Authority is a rule of its own, as often as a save or a fire: a run's
# resume and every save are judged by it. Beside named grants and
# revocations, one lands on the run admitted last: its owner loses authority
# in its channel, while the other member of the channel (and the owner
# elsewhere) keeps it.
NEWEST_RUN_OWNER = "revoke the newest run's owner"
authority_actions = _among(
    *[(a, "authority") for a in ("grant alice ops", "grant bob ops", "revoke alice general", "revoke bob general")],
    ("grant alice general", "authority"),
    *[(NEWEST_RUN_OWNER, None)] * 3,
)
tenant_actions = _among(
    *[("activate", "fences")] * 2,
    ("quiesce", "fences"),
    ("fence", "fences"),
    ("create", "fences"),
    *[(f"delete W1 by {path}", "alternate-deletions") for path in m.ALTERNATE_DELETIONS],
    ("delete W2 by report-enforcement", "alternate-deletions"),
)
# Mostly short moves, so caches stay warm (and stale) long enough to matter.
clock_moves = _among(*weighted([1], [5, 10], 2, "long-moves"))


def _on(feature: str) -> Callable[[Any], bool]:
    return lambda machine: bool(machine.swarm.on(feature))


class LifecycleConformance(LockstepMachine):
    """The lifecycle model and an implementation in lockstep; bound by `lifecycle_machine_for`."""

    spec = LIFECYCLE
    start = w.START

    @initialize(swarm=SWARM)
    def setup(self, swarm: Swarm = Swarm()) -> None:
        """Communities A and B, alice and bob with authority in #general of each and alice
        in #ops of A, and a live definition "a" of (A, W1) by alice that both replicas
        serve. One step of the lockstep: every outcome compared, the whole state once.
        `swarm`: the features this program leaves out."""
        self.swarm = swarm
        self.begin()
        self.run_together(SETUP, "the set-up")

    def _at(self, community: str, workflow: str, when: str) -> dt.datetime:
        return event_time(self.model, community, workflow, when)

    @rule(
        community=communities,
        workflow=workflows,
        author=authors,
        channel=channels,
        content=contents,
        when=save_times,
    )
    @precondition(_on("save"))
    def save(
        self,
        community: str,
        workflow: str,
        author: str,
        channel: str,
        content: str | m.Definition,
        when: str,
    ) -> None:
        """A signed save of `content` (a name of CONTENTS, or a drawn definition)."""
        self.run(save_command(community, workflow, author, channel, content, self._at(community, workflow, when)))

    @rule(community=communities, workflow=workflows, author=authors, when=delete_times)
    @precondition(_on("delete"))
    def delete(self, community: str, workflow: str, author: str, when: str) -> None:
        at = self._at(community, workflow, when)
        self.run(m.DeleteDefinition(w.COMMUNITIES[community], w.WORKFLOWS[workflow], w.AUTHORS[author], at))

    @rule(community=communities, workflow=workflows, content=contents)
    @precondition(_on("save"))
    def revise(self, community: str, workflow: str, content: str | m.Definition) -> None:
        """The owner saves a new revision of a live coordinate (the same content
        again is a new revision too), in its channel, newer than the head."""
        head = self.model.heads.get((w.COMMUNITIES[community], w.WORKFLOWS[workflow]))
        if head is not None:
            author, channel = w.name_of(head.author), w.name_of(head.channel_id)
            self.save(community, workflow, author, channel, content, "newer")

    @rule(community=communities, workflow=workflows, identical=st.booleans())
    @precondition(_on("recreate"))
    def recreate(self, community: str, workflow: str, identical: bool) -> None:
        """The seed's delete→recreate, in one breath: the owner deletes, then saves the
        same content again (identical) or other content, just after the cutoff."""
        head = self.model.heads.get((w.COMMUNITIES[community], w.WORKFLOWS[workflow]))
        if head is None:
            return
        author, channel = w.name_of(head.author), w.name_of(head.channel_id)
        same: str | m.Definition = next(
            (name for name, definition in CONTENTS.items() if definition == head.definition), head.definition
        )
        content = same if identical else ("b" if same != "b" else "a")
        self.delete(community, workflow, author, "newer")
        self.save(community, workflow, author, channel, content, "after-cutoff")

    @rule(community=communities, action=authority_actions)
    @precondition(_on("grants"))
    def authority(self, community: str, action: str) -> None:
        """Channel authority: "revoke alice general", "grant bob ops", or the
        newest run's owner revoked in its channel (of its community)."""
        if action == NEWEST_RUN_OWNER:
            if self.model.runs:
                record = self.model.runs[max(self.model.runs)].record
                self.run(m.SetAuthority(record.community_id, record.channel_id, record.owner, False))
            return
        self.tenant(community, action)

    @rule(community=communities, action=tenant_actions)
    @precondition(_on("tenant"))
    def tenant(self, community: str, action: str) -> None:
        """Tenant state ("fence"), the alternate deletion paths, always refused
        ("delete W1 by admin"), and (from `authority`) channel authority."""
        cid = w.COMMUNITIES[community]
        verb, _, rest = action.partition(" ")
        if verb == "delete":
            workflow, _, path = rest.partition(" by ")
            self.run(m.AlternateDelete(cid, w.WORKFLOWS[workflow], path))
        elif rest:
            member, channel = rest.split()
            self.run(m.SetAuthority(cid, w.CHANNELS[channel], w.AUTHORS[member], verb == "grant"))
        elif verb == "create":
            self.run(d.CreateCommunity(cid))
        else:
            state = {"activate": "active", "quiesce": "quiescing", "fence": "fenced"}[verb]
            self.run(d.SetCommunityState(cid, d.CommunityState(state)))

    @rule(replica=replicas)
    @precondition(_on("refresh"))
    def refresh(self, replica: str) -> None:
        self.run(m.RefreshCache(replica))

    @rule(replica=replicas, door=st.sampled_from(m.DOORS), community=communities, workflow=workflows)
    @precondition(_on("fire"))
    def fire(self, replica: str, door: str, community: str, workflow: str) -> None:
        self.run(m.Fire(replica, door, w.COMMUNITIES[community], w.WORKFLOWS[workflow]))

    @rule(door=st.sampled_from(m.DOORS))
    @precondition(_on("fire"))
    def fire_cached(self, door: str) -> None:
        """A trigger for a record some replica serves from its cache: a stale one
        (the current row no longer matches it) if any replica has one, else any."""
        cached = [
            (replica, coordinate, self.model.runtime.get(coordinate) == record)
            for replica, cache in sorted(self.model.caches.items())
            if self.model.now - cache.loaded_at < m.CACHE_TTL
            for coordinate, record in sorted(cache.records.items(), key=str)
        ]
        if cached:
            replica, (community_id, workflow_id), _ = min(cached, key=lambda c: c[2])  # stale first
            self.run(m.Fire(replica, door, community_id, workflow_id))

    @rule(run_id=st.integers(1, 4))
    @precondition(_on("resume"))
    def resume(self, run_id: int) -> None:
        self.run(m.ResumeRun(run_id))

    # Always available, as Hypothesis orders it first: the shrinker lowers every
    # step's rule choice towards it, and a choice it could not take would be
    # padding it can neither lower nor delete. Off in the swarm, it sends nothing.
    @rule(seconds=clock_moves)
    def advance_clock(self, seconds: int) -> None:
        if self.swarm.on("advance_clock"):
            self.run(d.AdvanceClock(seconds * SECOND))


def event_time(state: m.LifecycleSystem, community: str, workflow: str, when: str) -> dt.datetime:
    """An event time relative to the coordinate's head and cutoff; a coordinate with
    neither is first saved around the current time, so coordinates created at
    different moments have different incarnations."""
    coordinate = (w.COMMUNITIES[community], w.WORKFLOWS[workflow])
    head = state.heads.get(coordinate)
    cutoff = state.cutoffs.get(coordinate)
    base = head.created_at if head is not None else (cutoff or state.now)
    if when in ("at-cutoff", "after-cutoff") and cutoff is not None:
        base = cutoff
    offset = {"newer": SECOND, "same": 0 * SECOND, "older": -SECOND, "at-cutoff": 0 * SECOND}
    return base + offset.get(when, SECOND)


def save_command(
    community: str, workflow: str, author: str, channel: str, content: str | m.Definition, at: dt.datetime
) -> m.SaveDefinition:
    """A signed save in world names (`content`: a name of CONTENTS, or the definition
    itself); its event id is derived from everything it says."""
    named = content if isinstance(content, str) else repr(content)
    identity = f"{community}/{workflow}/{author}/{channel}/{named}/{at.isoformat()}"
    return m.SaveDefinition(
        m.DefinitionEvent(
            event_id=hashlib.sha256(identity.encode()).digest(),
            community_id=w.COMMUNITIES[community],
            workflow_id=w.WORKFLOWS[workflow],
            author=w.AUTHORS[author],
            channel_id=w.CHANNELS[channel],
            created_at=at,
            definition=CONTENTS[content] if isinstance(content, str) else content,
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
    adapter: Lockstepped,
    coverage: Coverage | None = None,
    on_example: Callable[[Coverage], None] | None = None,
) -> type[LifecycleConformance]:
    """A machine class bound to one adapter (reused, and reset, across examples)."""
    return bind(LifecycleConformance, adapter, coverage, on_example, None)
