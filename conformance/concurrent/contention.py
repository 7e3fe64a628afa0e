"""Contention schedules derived from a locking statement of either machine.

A lock matters only while another transaction wants the same thing. Each statement
that locks (a row lock, SKIP LOCKED, an advisory lock, the write fence) is a point a
schedule parks at: every operation of a small catalogue that runs it is parked right
after it, inside its function (an `instrumented` variant, impl/hooks/gate.py), then
before its COMMIT, on a fixed scene, while each operation of the catalogue runs
beside it on another connection. Judged: some serial order of the model explains the
outcomes and the final state (`Race.judgement`), and no operation waits where the
spec says it does not. Every pair of the catalogue is run.
Nothing here names a mutant: the statements are found in the shipped functions
(`locking_statements`), and a variant is parked at the same statement of its own.
docs/search-power.md ("Contention schedules") says what waits for what, and who runs them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from leaseproof.conformance.concurrent import schedules as s
from leaseproof.conformance.concurrent.schedules import CLAIM, LEASE, ONE_ROW, SECOND, Bundled, C, Forced, Race, new
from leaseproof.conformance.lockstep import world as w
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.hooks.gate import (
    At,
    Client,
    NotReached,
    Schedule,
    Statement,
    called,
    instrumented,
    points_of,
    statements,
)
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.impl.migrate import functions
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc

PARKED, BESIDE, OBSERVER = "parked", "beside", "observer"  # a schedule's clients; a catalogue may differ by role


@attrs.frozen
class Machine:
    """What the schedules of one machine are made of."""

    name: str
    scene: tuple[Any, ...]  # set up in lockstep with the model before each schedule
    # The operations by name, from the scene's outcomes, for the client `role` (PARKED or BESIDE).
    catalogue: Callable[[list[Any] | None, str], dict[str, Any]]
    names: tuple[str, ...]
    may_wait: Callable[[str, str], bool]  # whether the second may wait for the first, parked
    adapter: Callable[..., Bundled]  # (dsn, **role classes) -> the bundled adapter running them
    race: Callable[[Any, Schedule], Race[Any]]  # a race on the adapter, reset and its world set up
    client: Callable[[Race[Any], str, Any], Client]  # the client that runs a command, by its name
    observers: tuple[str, ...] = ()  # the catalogue's reads, run third where `beside` finished
    # Whether (parked, beside, observer) is run: a connection for each.
    may_observe: Callable[[str, str, str], bool] = lambda parked, beside, observer: True


# -- the delivery machine --------------------------------------------------------------------

D3 = w.delivery_id(w.FRESH, "R1", "long", "T1")
D4 = w.delivery_id(w.FRESH, "R1", "wide", "T1")

# The scene: d1 claimed and expired (its holder's lease L1), d2 claimed and live
# (L2), d3 pending; community A active, its workflow W1, run R1 and message M1.
DELIVERY_SCENE = (
    ONE_ROW,
    CLAIM,
    d.AdvanceClock((LEASE + 1) * SECOND),
    d.CommitDeliveries(C, s.R1, "s2", [new(s.D2, "T1", "s2")]),
    CLAIM,
    d.CommitDeliveries(C, s.R1, w.STEPS["long"], [new(D3, "T1", "long")]),
)

_ANY_LEASE = d.Lease(C, s.D1, w.TARGETS["T1"], 1, w.START)
_COMMUNITY_CHANGES = frozenset({"fence", "quiesce", "delete community"})


def delivery_catalogue(outcomes: list[Any] | None, role: str = PARKED) -> dict[str, Any]:
    """The delivery operations a schedule parks and runs beside, by name (`outcomes`: the
    scene's, whose claims give the leases; None for the names alone)."""
    expired, live = (outcomes[1].lease, outcomes[4].lease) if outcomes else (_ANY_LEASE, _ANY_LEASE)
    return {
        "claim": CLAIM,
        "keyed claim": d.Claim(C, w.TARGETS["T1"], LEASE, request_key=w.REQUEST_KEY),
        "reap": d.Reap(),
        "finish": d.Finish(live, d.Status.FINISHED),
        "renew": d.Renew(live, LEASE),
        "finish expired": d.Finish(expired, d.Status.FAILED),
        "retry": ONE_ROW,
        "commit": d.CommitDeliveries(C, s.R1, w.STEPS["wide"], [new(D4, "T1", "wide")]),
        "fence": d.SetCommunityState(C, d.CommunityState.FENCED),
        "quiesce": d.SetCommunityState(C, d.CommunityState.QUIESCING),
        "delete community": d.DeleteCommunity(C),
        "delete run": d.DeleteRun(C, s.R1),
        "delete workflow": d.DeleteWorkflow(C, s.W1),
        "delete message": d.DeleteEvent(C, s.M1),
        "create run": d.CreateRun(C, s.W1, w.RUNS["R2"]),
        "read": d.GetDelivery(C, s.D1),
    }


def may_wait(parked: str, beside: str) -> bool:
    """Whether delivery's `beside` may wait for `parked`: always, unless it is a claim or a
    sweep. A claim waits for a change of its community's state (a keyed claim for another
    claim under its key, too); a sweep for another sweep only (it skips a community whose
    fence a change holds, and leaves the rows others hold)."""
    if beside == "claim":
        return parked in _COMMUNITY_CHANGES
    if beside == "keyed claim":
        return parked in _COMMUNITY_CHANGES | {"keyed claim"}
    if beside == "reap":
        return parked == "reap"
    return True


DELIVERY = Machine(
    "delivery",
    DELIVERY_SCENE,
    delivery_catalogue,
    tuple(delivery_catalogue(None)),
    may_wait,
    PostgresDeliveryAdapter,
    s.delivery_race,
    lambda race, name, command: race.client(name),
    ("read",),
)

# -- the lifecycle machine -------------------------------------------------------------------

W2 = w.WORKFLOWS["W2"]

# The scene: community A active, alice with authority in #general, a live
# definition of (A, W1) by her that both replicas have cached, and run 1
# admitted for it (on r1).
LIFECYCLE_SCENE = (lc.RefreshCache("r2"), s.fire("r1"))


def lifecycle_catalogue(outcomes: list[Any] | None, role: str = PARKED) -> dict[str, Any]:
    """The lifecycle operations a schedule parks and runs beside, by name. A fire and a
    refresh run on replica r1 when parked, on r2 beside or observing (each replica is one
    connection)."""
    replica = "r1" if role == PARKED else "r2"  # beside, or the observer
    return {
        "fire": lc.Fire(replica, "event", C, s.W1),
        "refresh": lc.RefreshCache(replica),
        "resume": lc.ResumeRun(1),
        "update": s.save(2, s.NEW),
        "disable": s.save(2, s.OFF),
        "delete": s.delete(2),
        "create W2": s.save(2, s.OLD, workflow=W2),
        "revoke": lc.SetAuthority(C, s.GENERAL, s.ALICE, False),
        "grant": lc.SetAuthority(C, w.CHANNELS["ops"], s.ALICE, True),
        "fence": d.SetCommunityState(C, d.CommunityState.FENCED),
        "quiesce": d.SetCommunityState(C, d.CommunityState.QUIESCING),
    }


def _lifecycle_client(race: Race[Any], name: str, command: Any) -> Client:
    """A fire or a refresh runs on its replica engine's own connection, gated."""
    if isinstance(command, lc.Fire | lc.RefreshCache):
        assert isinstance(race, s.LifecycleRace)
        return race.replica(name, command.replica)
    return race.client(name)


LIFECYCLE = Machine(
    "lifecycle",
    LIFECYCLE_SCENE,
    lifecycle_catalogue,
    tuple(lifecycle_catalogue(None)),
    lambda parked, beside: beside != "refresh",  # a refresh reads, and waits for nothing
    PostgresLifecycleAdapter,
    s.lifecycle_race,
    _lifecycle_client,
    ("refresh",),
    # The observer's refresh runs on r2, so beside must not be on it (there is no third replica).
    lambda parked, beside, observer: beside not in {"fire", "refresh"},
)

MACHINES: Mapping[str, Machine] = {m.name: m for m in (DELIVERY, LIFECYCLE)}

# -- the locking statements ------------------------------------------------------------------

# The adapters' role classes, by keyword, in the order an adapter installs their functions.
ROLES: Mapping[str, tuple[tuple[str, type], ...]] = {
    "delivery": (("store_class", PostgresDeliveryStore),),
    "lifecycle": (
        ("store_class", LifecycleStore),
        ("engine_class", ReplicaEngine),
        ("resumer_class", RunResumer),
        ("communities_class", PostgresDeliveryStore),
    ),
}
# The statements of each role class the machine runs (None: all of them). The lifecycle
# adapter creates communities and changes their state through the delivery store, and
# runs nothing else of it.
_RUNS: Mapping[tuple[str, str], frozenset[str]] = {
    ("lifecycle", "communities_class"): frozenset({"SQL_CREATE_COMMUNITY", "SQL_SET_COMMUNITY_STATE"}),
}
# The calls that write nothing: an operation is parked before the COMMIT of its first call
# that is not one of these (a fire's admission, not its check of the community).
READS = frozenset({"lp_now", "lp_get_delivery", "lp_fire_check", "lp_enabled_records"})

_LOCKING = re.compile(
    r"\bFOR\s+(?:NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)\b|\bpg_(?:try_)?advisory_(?:xact_)?lock(?:_shared)?\s*\(",
    re.IGNORECASE,
)
_COMMENT = re.compile(r"--[^\n]*")


def bundled(machine: str) -> dict[str, type]:
    """The bundled implementation's role classes of `machine`, by the adapter's keyword."""
    return dict(ROLES[machine])


def functions_of(machine: str) -> tuple[str, ...]:
    """The database functions `machine` runs: those its role classes' statements call, and
    every function with points (`gate.statements`) they reach, in the migrations' order."""
    shipped = functions()
    called_names = {
        name
        for keyword, cls in ROLES[machine]
        for attribute in dir(cls)
        if attribute.startswith("SQL_") and attribute in _RUNS.get((machine, keyword), {attribute})
        for name in re.findall(r"\b(lp_\w+)\s*\(", str(getattr(cls, attribute)))
    }
    reached, frontier = set(), [n for n in called_names if n in shipped]
    while frontier:
        name = frontier.pop()
        if name in reached:
            continue
        reached.add(name)
        frontier += [n for n in re.findall(r"\b(lp_\w+)\s*\(", shipped[name].body) if n in shipped]
    return tuple(name for name in shipped if name in reached and statements(shipped[name]))


def locking_statements(machine: str) -> dict[str, tuple[Statement, ...]]:
    """The statements of `machine`'s functions (as shipped) that lock something: a
    row-locking clause or an advisory lock, blocking or not; by function, each function
    that has one."""
    shipped = functions()
    found = {}
    for name in functions_of(machine):
        locking = tuple(
            s for s in statements(shipped[name]) if not s.compound and _LOCKING.search(_COMMENT.sub("", s.text))
        )
        if locking:
            found[name] = locking
    return found


def _named(machine: str, where: str) -> tuple[str, ...]:
    """The locking statements `where` names: one (`lp_claim:7`), or every one a function
    runs: its own, then those of the functions it calls (lp_enter's fence: a change of a
    lock there shows where the function holds what the helper took)."""
    locking = locking_statements(machine)
    if any(s.name == where for each in locking.values() for s in each):
        return (where,)
    if where not in functions_of(machine):
        raise ValueError(f"{where!r} is neither a function of {machine} nor one of its statements that lock something")
    shipped = functions()
    calls = re.findall(r"\b(lp_\w+)\s*\(", shipped[where].body)
    reached = [where, *dict.fromkeys(name for name in calls if name != where and name in locking)]
    return tuple(s.name for name in reached for s in locking.get(name, ()))


@attrs.frozen
class Verdict:
    parked: str  # the catalogue's name of the parked operation
    beside: str
    statement: str  # the locking statement the schedule is derived from (`lp_claim:7`)
    where: str  # where the parked one waits: "after" the statement, "before commit" of its call
    ok: bool
    why: str
    fault: bool = False  # the implementation raised (a deadlock, a foreign key), rather than answered
    observer: str | None = None  # the read run after `beside` returned, while `parked` still waited
    waited: str = ""  # what `beside` did: "blocked" on the parked one's locks, or "finished"
    ran: bool = True  # whether the parked one's call had run the statement (else: its first write)


WHERE = ("after", "before commit")


@attrs.frozen
class _Placement:
    """Where one schedule parks: `parked` waits `where` (at the point `point`, right after
    the statement, or before the COMMIT of its call that passed it, or, if None, of its
    first call that writes) while `beside` runs, and then `observer`, if given.
    `statement` names the locking statement it is derived from."""

    statement: str
    parked: str
    beside: str
    where: str
    point: str | None
    observer: str | None = None


def schedules(
    dsn: str,
    machine: str,
    classes: Mapping[str, type],
    where: str,
    *,
    stop_at_first: bool = False,
    every: int = 1,
) -> Iterator[Verdict]:
    """Every schedule of the locking statements `where` names (a function of `machine`:
    each of its locking statements; or one, `lp_claim:7`), run against the adapter's role
    `classes` (by keyword: the bundled ones, or a variant's), judged.

    For each statement, first each operation that runs it is parked right after it and
    then before its call commits, while each operation runs beside it (one that does not
    run the statement is skipped). Then each operation is parked before its first call
    that writes commits, holding everything it took, while each operation that runs the
    statement runs beside it: where the statement waits shows there.

    `every`: a fixed sample, one placement in `every` in that order (the first of each
    parked operation always runs, since whether it gets there decides what follows)."""
    if every < 1:
        raise ValueError(f"every: one schedule in {every}? give 1 or more")
    roles = _instrumented(machine, classes)
    sample = _Sample(every, itertools.count())
    points = points_of(*roles.values())
    with _adapter(dsn, machine, roles) as (spec, adapter):  # one for all the schedules: each resets it
        for name in _named(machine, where):
            statement = points.named(name)
            failed = False
            for verdict in _schedules(dsn, spec, adapter, name, statement.after, stop_at_first, sample):
                failed = failed or not verdict.ok
                yield verdict
            if stop_at_first and failed:
                return


def again(dsn: str, machine: str, classes: Mapping[str, type], verdict: Verdict) -> Verdict | None:
    """The schedule `verdict` judged, run once more against the implementation of `classes`
    (None if its parked operation did not get there this time)."""
    roles = _instrumented(machine, classes)
    point = points_of(*roles.values()).named(verdict.statement).after if verdict.ran else None
    placement = _Placement(verdict.statement, verdict.parked, verdict.beside, verdict.where, point, verdict.observer)
    with _adapter(dsn, machine, roles) as (spec, adapter):
        return _one(dsn, spec, adapter, placement)


def _instrumented(machine: str, classes: Mapping[str, type]) -> dict[str, type]:
    """`classes` (by keyword), in the order the adapter installs them, with every point."""
    keywords = [keyword for keyword, _ in ROLES[machine]]
    if set(classes) != set(keywords):
        raise ValueError(f"the {machine} adapter takes {', '.join(keywords)}, not {', '.join(classes)}")
    return dict(zip(keywords, instrumented(*(classes[k] for k in keywords)), strict=True))


@contextlib.contextmanager
def _adapter(dsn: str, machine: str, classes: Mapping[str, type]) -> Iterator[tuple[Machine, Bundled]]:
    """The machine's adapter running `classes` on `dsn`, closed on exit."""
    spec = MACHINES[machine]
    adapter = spec.adapter(dsn, **classes)
    try:
        yield spec, adapter
    finally:
        adapter.close()


@attrs.define
class _Sample:
    """Which placements a sampled run of the schedules runs: one in `every`, counted over
    the run (`count`), besides the first of each parked operation at each stage."""

    every: int
    count: Iterator[int]

    def runs(self, first: bool) -> bool:
        return first or next(self.count) % self.every == 0


def _schedules(
    dsn: str,
    spec: Machine,
    adapter: Bundled,
    name: str,
    point: str | None,
    stop_at_first: bool,
    sample: _Sample,
) -> Iterator[Verdict]:
    reachers: list[str] = []
    if point is not None:
        for parked in spec.names:
            for where in WHERE:
                for beside in spec.names:
                    if not sample.runs(first=parked not in reachers):
                        continue
                    placement = _Placement(name, parked, beside, where, point)
                    verdicts = list(_observed(dsn, spec, adapter, placement, stop_at_first))
                    if not verdicts:
                        break
                    if parked not in reachers:
                        reachers.append(parked)
                    yield from verdicts
                    if stop_at_first and not verdicts[-1].ok:
                        return
                if parked not in reachers:
                    break
    for parked in spec.names:
        for i, beside in enumerate(reachers):
            if not sample.runs(first=i == 0):
                continue
            placement = _Placement(name, parked, beside, "before commit", None)
            verdicts = list(_observed(dsn, spec, adapter, placement, stop_at_first))
            if not verdicts:
                break  # the parked one commits no write
            yield from verdicts
            if stop_at_first and not verdicts[-1].ok:
                return


def _observed(
    dsn: str, spec: Machine, adapter: Bundled, placement: _Placement, stop_at_first: bool
) -> Iterator[Verdict]:
    """The schedule of `placement` (which has no observer); then, if its `beside` finished
    while `parked` waited, the same with each of the machine's reads run after it, still
    while `parked` waits (judged in real time: the read began after `beside` returned).
    Nothing if the parked one never got there."""
    verdict = _one(dsn, spec, adapter, placement)
    if verdict is None:
        return
    yield verdict
    if verdict.waited != "finished" or not verdict.ok:
        return  # an observer shows more only where the two alone were explained
    for observer in spec.observers:
        if not spec.may_observe(placement.parked, placement.beside, observer):
            continue
        seen = _one(dsn, spec, adapter, attrs.evolve(placement, observer=observer))
        if seen is None:
            continue  # not reached this time (it was the first time): nothing to judge
        yield seen
        if stop_at_first and not seen.ok:
            return


def _one(dsn: str, spec: Machine, adapter: Bundled, placement: _Placement) -> Verdict | None:
    """The one schedule `placement` says; None if its parked operation never got there."""
    engines = adapter.engines if isinstance(adapter, PostgresLifecycleAdapter) else {}
    connections = {name: engine.conn for name, engine in engines.items()}  # a replica client swaps its own
    try:
        with Schedule(dsn) as schedule:
            return _judged(spec, spec.race(adapter, schedule), placement)
    finally:
        for name, conn in connections.items():
            engines[name].conn = conn


def _writes(sql: str) -> bool:
    """Whether the call `sql` may write (it calls a function that is not a read)."""
    return called(sql) not in READS


def _judged(spec: Machine, race: Race[Any], placement: _Placement) -> Verdict | None:
    name, parked, beside, point, observer = (
        placement.statement,
        placement.parked,
        placement.beside,
        placement.point,
        placement.observer,
    )
    outcomes = race.setup(*spec.scene)
    first, second = spec.catalogue(outcomes, PARKED)[parked], spec.catalogue(outcomes, BESIDE)[beside]
    one, two = spec.client(race, PARKED, first), spec.client(race, BESIDE, second)
    if point is None:
        pause = one.gate.pause_before_commit(ran=_writes, label="its first write")
    elif placement.where == "after":
        pause = one.gate.pause_at(point, label=f"after {name}")
    else:
        pause = one.gate.pause_before_commit(ran=At(point), label=f"the call that ran {name}")
    race.start(one, first)
    try:
        pause.wait_parked()
    except NotReached:
        race.result(one)  # it ended without getting there: no schedule here
        return None
    race.start(two, second)
    reads: list[str] = []  # what the observer did
    faults: list[Exception] = []  # a deadlock, a foreign key: the schedule failed
    observing = False  # beside finished and its result is collected here; the observer ran unless it faulted
    try:
        waited = two.wait_blocked_or_finished()
        if observer is not None and waited == "finished":
            observing = True
            try:
                race.result(two)
            except Exception as fault:  # noqa: BLE001 - judged below
                faults.append(fault)
            else:
                third = spec.catalogue(outcomes, OBSERVER)[observer]
                three = spec.client(race, OBSERVER, third)
                race.start(three, third)
                reads.append(three.wait_blocked_or_finished())
    finally:
        pause.release()
    verdict = functools.partial(
        Verdict, parked, beside, name, placement.where, observer=observer, waited=waited, ran=point is not None
    )
    for collect in (one, None if observing else two, three if reads else None):
        if collect is not None:
            try:
                race.result(collect)
            except Exception as fault:  # noqa: BLE001 - judged below
                faults.append(fault)
    if faults:
        return verdict(False, f"{type(faults[0]).__name__}: {faults[0]}", fault=True)
    if waited == "blocked" and not spec.may_wait(parked, beside):
        return verdict(False, f"{beside} waited for {parked}, which it must not")
    if reads and reads[0] == "blocked" and observer is not None and not spec.may_wait(parked, observer):
        return verdict(False, f"{observer} waited for {parked}, which it must not")
    if reads:
        # Ticks: the parked one invoked (1) and returns last (9); beside runs 2 to 3; the
        # observer is invoked at 4 and returns at 5, or, if it waited for the parked one,
        # with it (8). A wider interval than the real one only admits more orders.
        ends = 5 if reads[0] == "finished" else 8
        forced = Forced(intervals={PARKED: (1, 9), BESIDE: (2, 3), OBSERVER: (4, ends)})
    else:
        forced = Forced()
    judgement = race.judgement(forced)
    return verdict(judgement.linearizable, judgement.why)
