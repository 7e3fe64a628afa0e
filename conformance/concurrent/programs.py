"""Small concurrent programs for the stress runner.

A program is a sequential prefix that sets a scene, then a few rounds; in
each round every client runs a short branch of operations at the same
time as the others, and between rounds the coordinator may move the clock.
Programs are drawn from a seeded `random.Random` over a deliberately tiny
world (two communities, two targets, a handful of steps and definitions),
so that concurrent operations collide on the same rows.

Operations that need a lease name it by reference (`LeaseRef`): the lease
the client itself got from its latest claim in this program, else one of
the leases the prefix hands out (computed by running the model over the
prefix, so the program is fixed before anything runs, and every repetition
sends the same commands).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import random
from collections.abc import Callable
from typing import Any

import attrs

from leaseproof.conformance.lockstep import world as w
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc

SECOND = dt.timedelta(seconds=1)


@attrs.frozen
class LeaseRef:
    """A lease, resolved by the client when it sends the command."""

    fallback: d.Lease  # a lease the prefix handed out
    own: bool  # prefer this client's latest lease in the program


@attrs.frozen
class Renewal:
    lease: LeaseRef
    lease_seconds: int

    def resolve(self, own: d.Lease | None) -> d.Renew:
        return d.Renew(_pick(self.lease, own), self.lease_seconds)


@attrs.frozen
class Finishing:
    lease: LeaseRef
    outcome: d.Status

    def resolve(self, own: d.Lease | None) -> d.Finish:
        return d.Finish(_pick(self.lease, own), self.outcome)


def _pick(ref: LeaseRef, own: d.Lease | None) -> d.Lease:
    return own if ref.own and own is not None else ref.fallback


def resolve(step: Any, own: d.Lease | None) -> Any:
    """The concrete command a program step stands for, given the client's latest lease."""
    return step.resolve(own) if isinstance(step, Renewal | Finishing) else step


@attrs.frozen
class Round:
    branches: tuple[tuple[Any, ...], ...]  # one branch per client
    advance: dt.timedelta | None  # the coordinator's clock move after the round


@attrs.frozen
class Program:
    machine: str
    prefix: tuple[Any, ...]
    rounds: tuple[Round, ...]

    @property
    def size(self) -> int:
        return len(self.prefix) + sum(len(b) for r in self.rounds for b in r.branches) + len(self.rounds)


def _replay(step: Callable[[Any, Any], tuple[Any, Any]], state: Any, commands: tuple[Any, ...]) -> list[Any]:
    outcomes = []
    for command in commands:
        state, outcome = step(state, command)
        outcomes.append(outcome)
    return outcomes


def _program(
    machine: str,
    r: random.Random,
    setup: list[Any],
    operation: Callable[[], Any],
    clients: int,
    rounds: int,
    branch: int,
    advances: tuple[dt.timedelta | None, ...],
) -> Program:
    """The prefix, then `rounds` rounds of one branch of 1..`branch` operations per
    client, each round followed by one of `advances` (None: the clock stays)."""
    return Program(
        machine,
        tuple(setup),
        tuple(
            Round(
                tuple(tuple(operation() for _ in range(r.randint(1, branch))) for _ in range(clients)),
                r.choice(advances),
            )
            for _ in range(rounds)
        ),
    )


# -- the delivery machine -----------------------------------------------------

_TARGETS = ("T1", "T2")
_RUNS = ("R1", "R2")


def _commit(r: random.Random, community: str, run: str, step: str, targets: tuple[str, ...]) -> d.CommitDeliveries:
    news = [
        d.NewDelivery(
            w.delivery_id(w.FRESH, run, step, target),
            w.binding(community, "W1", run, step, target, "D1", "M1", "event:E1"),
        )
        for target in targets
    ]
    return d.CommitDeliveries(w.COMMUNITIES[community], w.RUNS[run], w.STEPS[step], news)


def delivery_program(
    r: random.Random, clients: int, rounds: int = 2, branch: int = 3, request_keys: bool = True
) -> Program:
    """Claims, renews, finishes, commits, fences, sweeps, reads and deletions of a
    delivery's parents (each deleted and created again while commits name them) race
    in every round; the checker explains what skip locked lets a claim or a sweep pass
    over (specs/delivery.md, "Concurrency"). One program in three has no claimer in its
    rounds (its prefix still hands out leases), where the parents come and go more
    often. With `request_keys`, some claims carry one of two keys every client shares,
    as a retry racing the claim it repeats would: claims under one key take turns."""
    setup: list[Any] = []
    for name in w.LIVE_COMMUNITIES:
        cid = w.COMMUNITIES[name]
        setup += [d.CreateCommunity(cid), d.CreateWorkflow(cid, w.WORKFLOWS["W1"])]
        setup += [d.CreateRun(cid, w.WORKFLOWS["W1"], w.RUNS[run]) for run in _RUNS]
        setup.append(d.PublishEvent(cid, w.MESSAGES["M1"]))
    # A few steps already committed, some already claimed: leases to race over.
    for _ in range(r.randint(1, 3)):
        setup.append(_commit(r, r.choice(("A", "A", "B")), r.choice(_RUNS), r.choice(("s1", "s2")), _TARGETS))
    for _ in range(r.randint(1, 3)):
        setup.append(d.Claim(w.COMMUNITIES["A"], w.TARGETS[r.choice(_TARGETS)], 30))
    if r.random() < 0.5:  # some leases go stale: expired, reaped, reclaimed
        setup += [d.AdvanceClock(31 * SECOND), d.Reap(), d.Claim(w.COMMUNITIES["A"], w.TARGETS["T1"], 30)]
    outcomes = _replay(d.step, d.initial_state(w.START), tuple(setup))
    leases = [o.lease for o in outcomes if isinstance(o, d.Claimed)]
    leases = leases or [d.Lease(w.COMMUNITIES["A"], w.DELIVERIES["d1"], w.TARGETS["T1"], 1, w.START)]

    claimers = r.random() < 2 / 3
    ids = [each for o in outcomes if isinstance(o, d.Committed) for each in o.created]

    def operation() -> Any:
        ref = LeaseRef(r.choice(leases), own=r.random() < 0.7)
        community = "A" if r.random() < 0.85 else "B"
        cid = w.COMMUNITIES[community]
        makers: list[Callable[[], Any]] = [
            lambda: Finishing(ref, r.choice((d.Status.FINISHED, d.Status.FAILED))),
            lambda: Renewal(ref, 30),
            lambda: d.Reap(),
            lambda: _commit(r, community, r.choice(_RUNS), r.choice(("s1", "s2", "long")), _some(r, _TARGETS)),
            lambda: d.SetCommunityState(cid, r.choice((d.CommunityState.QUIESCING, d.CommunityState.ACTIVE))),
            lambda: _read(r, cid, ids),
        ]
        weights = [20, 10, 10, 15, 3, 8]
        if claimers:
            makers.append(lambda: d.Claim(cid, w.TARGETS[r.choice(_TARGETS)], 30))
            weights.append(30)
            if request_keys:
                key = r.choice((w.REQUEST_KEY, w.REQUEST_KEY + "b"))
                makers.append(lambda: d.Claim(cid, w.TARGETS[r.choice(_TARGETS)], 30, request_key=key))
                weights.append(10)
        makers += [functools.partial(act, r, cid, ids) for act in _PARENT_ACTS]
        weights += [2 if claimers else 6] * len(_PARENT_ACTS)
        return r.choices(makers, weights=weights)[0]()

    return _program("delivery", r, setup, operation, clients, rounds, branch, (None, None, 10 * SECOND, 31 * SECOND))


# Each parent of a delivery (its run, its run's workflow, its message) deleted and
# created again. `ids`: the deliveries the prefix committed.
_PARENT_ACTS: tuple[Callable[[random.Random, Any, list[Any]], Any], ...] = (
    lambda r, cid, ids: d.DeleteRun(cid, w.RUNS[r.choice(_RUNS)]),
    lambda r, cid, ids: d.CreateRun(cid, w.WORKFLOWS["W1"], w.RUNS[r.choice(_RUNS)]),
    lambda r, cid, ids: d.DeleteWorkflow(cid, w.WORKFLOWS["W1"]),
    lambda r, cid, ids: d.CreateWorkflow(cid, w.WORKFLOWS["W1"]),
    lambda r, cid, ids: d.DeleteEvent(cid, w.MESSAGES["M1"]),
    lambda r, cid, ids: d.PublishEvent(cid, w.MESSAGES["M1"]),
)


def _read(r: random.Random, cid: Any, ids: list[Any]) -> d.GetDelivery:
    """A read of a delivery the prefix committed (a deleted one reads NotFound)."""
    return d.GetDelivery(cid, r.choice(ids or [w.DELIVERIES["d1"]]))


def _some(r: random.Random, names: tuple[str, ...]) -> tuple[str, ...]:
    chosen = tuple(n for n in names if r.random() < 0.6)
    return chosen or (r.choice(names),)


# -- the lifecycle machine ----------------------------------------------------

_CONTENTS = {
    "a": lc.Definition(("post-summary",)),
    "a-off": lc.Definition(("post-summary",), enabled=False),
    "b": lc.Definition(("post-summary", "page-oncall")),
}


def _event(community: str, workflow: str, content: str, at: dt.datetime, author: str = "alice") -> lc.DefinitionEvent:
    identity = f"{community}/{workflow}/{author}/{content}/{at.isoformat()}"
    return lc.DefinitionEvent(
        event_id=hashlib.sha256(identity.encode()).digest(),
        community_id=w.COMMUNITIES[community],
        workflow_id=w.WORKFLOWS[workflow],
        author=w.AUTHORS[author],
        channel_id=w.CHANNELS["general"],
        created_at=at,
        definition=_CONTENTS[content],
    )


def lifecycle_program(r: random.Random, clients: int, rounds: int = 2, branch: int = 3) -> Program:
    a = w.COMMUNITIES["A"]
    general = w.CHANNELS["general"]
    setup: list[Any] = []
    for name in w.LIVE_COMMUNITIES:
        setup += [
            d.CreateCommunity(w.COMMUNITIES[name]),
            lc.SetAuthority(w.COMMUNITIES[name], general, w.AUTHORS["alice"], True),
        ]
    # Event times only grow through the program, so whichever of two
    # concurrent saves is later in time supersedes the other in any order.
    clock = iter(w.START + n * SECOND for n in range(1, 10_000))
    # W1 runs two actions, so two resumes of one of its runs could interleave them.
    for workflow, content in (("W1", "b"), ("W2", "a")):
        setup.append(lc.SaveDefinition(_event("A", workflow, content, next(clock))))
    setup += [lc.RefreshCache(replica) for replica in w.REPLICAS]
    setup += [lc.Fire(r.choice(w.REPLICAS), "event", a, w.WORKFLOWS["W1"]) for _ in range(r.randint(1, 2))]
    runs = sum(
        isinstance(o, lc.Admitted) for o in _replay(lc.step, lc.initial_state(w.START, w.REPLICAS), tuple(setup))
    )

    def operation() -> Any:
        workflow = w.WORKFLOWS[r.choice(("W1", "W1", "W2"))]
        makers: list[Callable[[], Any]] = [
            lambda: lc.Fire(r.choice(w.REPLICAS), r.choice(lc.DOORS), a, workflow),
            lambda: lc.SaveDefinition(_event("A", w.name_of(workflow), r.choice(tuple(_CONTENTS)), next(clock))),
            lambda: lc.DeleteDefinition(a, workflow, w.AUTHORS["alice"], next(clock)),
            # Ids up to three past the known runs: concurrent admissions take them.
            lambda: lc.ResumeRun(r.choice((1, 1, r.randint(1, runs + 3)))),
            lambda: lc.RefreshCache(r.choice(w.REPLICAS)),
            lambda: lc.SetAuthority(a, general, w.AUTHORS["alice"], r.random() < 0.5),
            lambda: d.SetCommunityState(a, r.choice((d.CommunityState.QUIESCING, d.CommunityState.ACTIVE))),
        ]
        return r.choices(makers, weights=[30, 20, 8, 18, 6, 12, 3])[0]()

    return _program("lifecycle", r, setup, operation, clients, rounds, branch, (None, 2 * SECOND, 10 * SECOND))


GENERATORS: dict[str, Callable[..., Program]] = {"delivery": delivery_program, "lifecycle": lifecycle_program}
