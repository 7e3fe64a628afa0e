"""How fast is the linearizability checker on long delivery histories?

    python -m leaseproof.conformance.concurrent.bench [--sizes 1000,10000,100000] [--seed 1] [--clients 8]

Each history comes from simulating concurrent clients against the model (`simulate`):
every operation takes effect at one instant between its invocation and its response,
so every history is linearizable and the checker must say so. Clients spread over
many communities; short epochs end at a barrier that records the state; the clock
moves at some barriers, so leases expire and reaps find them; a few operations lose
their response, some after taking effect, some before (which may still take effect
later, or never). The table gives, per size, the checker's work and time, its peak
memory (a second, traced run), and its time as a multiple of the smallest size's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import random
import sys
import time
import tracemalloc
import uuid
from typing import Any

import attrs

from leaseproof.conformance.concurrent.history import History, Recorder
from leaseproof.conformance.concurrent.linearizability import check
from leaseproof.conformance.concurrent.models import DELIVERY
from leaseproof.conformance.lockstep import world as w
from leaseproof.model import delivery as d
from leaseproof.model.binding import Binding

STEP_WORKFLOW, STEP_RUN, STEP_MESSAGE = w.WORKFLOWS["W1"], w.RUNS["R1"], w.MESSAGES["M1"]
TARGETS = tuple(w.TARGETS.values())


@attrs.frozen
class Workload:
    operations: int
    clients: int = 8
    communities: int = 16
    epoch: int = 0  # invocations per epoch; 0: four per client
    indeterminate: float = 0.02  # chance an operation loses its response
    stateless: float = 0.0  # chance a barrier records no state
    clock: float = 0.3  # chance the clock moves at a barrier
    rows: int = 24  # a community with more deliveries than this is deleted and replaced
    expired: bool = False  # start with an expired claim in every community, for reaps to find
    lease_seconds: tuple[int, ...] = (20, 30, 60)
    clock_moves: tuple[int, ...] = (5, 10, 20, 40)  # seconds
    # How often clients choose each kind of operation (renew and finish need a lease in hand).
    mix: tuple[tuple[str, int], ...] = (
        ("commit", 22),
        ("claim", 28),
        ("renew", 14),
        ("finish", 22),
        ("get", 6),
        ("reap", 5),
        ("state", 3),
    )


def _uuid(rng: random.Random) -> uuid.UUID:
    return uuid.UUID(int=rng.getrandbits(128), version=4)


def _binding(community: uuid.UUID, step: str, target: bytes) -> Binding:
    return Binding(
        community_id=community,
        workflow_id=STEP_WORKFLOW,
        run_id=STEP_RUN,
        step_id=step,
        target_pubkey=target,
        definition_event_id=w.DEFINITIONS["D1"],
        message_event_id=STEP_MESSAGE,
        cause=w.CAUSES["event:E1"],
    )


def _founding(community: uuid.UUID) -> list[Any]:
    """What a new community needs before deliveries can be committed in it."""
    return [
        d.CreateCommunity(community),
        d.CreateWorkflow(community, STEP_WORKFLOW),
        d.CreateRun(community, STEP_WORKFLOW, STEP_RUN),
        d.PublishEvent(community, STEP_MESSAGE),
    ]


@attrs.define
class _Flight:
    client: str
    command: Any
    outcome: Any = None  # set once it has taken effect


class _Simulation:
    """Clients with possibly stale knowledge, and the model as the one true system."""

    def __init__(self, rng: random.Random, load: Workload) -> None:
        self.rng, self.load = rng, load
        names = list(w.COMMUNITIES.values())
        self.live = [names[i] if i < len(names) else _uuid(rng) for i in range(load.communities)]
        state = d.initial_state(w.START)
        self.steps: dict[uuid.UUID, int] = {}
        self.known: dict[uuid.UUID, list[uuid.UUID]] = {}
        for community in self.live:
            first = self.commit(community)
            for command in [*_founding(community), first]:
                state, _ = d.step(state, command)
            if load.expired:
                target = first.deliveries[0].binding.target_pubkey
                state, _ = d.step(state, d.Claim(community, target, 1))
        if load.expired:
            state, _ = d.step(state, d.AdvanceClock(dt.timedelta(seconds=2)))
        self.truth = state
        self.recorder = Recorder("delivery", state)
        self.leases: dict[str, list[d.Lease]] = {}
        self.queued: dict[str, list[Any]] = {}

    def commit(self, community: uuid.UUID) -> d.CommitDeliveries:
        self.steps[community] = step = self.steps.get(community, 0) + 1
        targets = self.rng.sample(TARGETS, self.rng.choice((1, 1, 2)))
        news = tuple(d.NewDelivery(_uuid(self.rng), _binding(community, f"s{step}", t)) for t in targets)
        self.known.setdefault(community, []).extend(n.id for n in news)
        return d.CommitDeliveries(community, STEP_RUN, f"s{step}", news)

    def choose(self, client: str) -> Any:
        if self.queued.get(client):
            return self.queued[client].pop(0)
        rng = self.rng
        community = rng.choice(self.live)
        if len(self.known.get(community, ())) > self.load.rows:
            # Retire the crowded community so the state stays small.
            newcomer = _uuid(rng)
            self.live[self.live.index(community)] = newcomer
            self.queued[client] = _founding(newcomer)
            return d.DeleteCommunity(community)
        leases = self.leases.get(client, [])
        kinds, weights = zip(*self.load.mix, strict=False)
        kind = rng.choices(kinds, weights)[0]
        if (kind in ("renew", "finish") and not leases) or (kind == "get" and not self.known.get(community)):
            kind = "claim"
        if kind == "commit":
            return self.commit(community)
        if kind == "claim":
            known = self.known.get(community)
            chosen = rng.choice(known) if known and rng.random() < 0.1 else None
            return d.Claim(community, rng.choice(TARGETS), rng.choice(self.load.lease_seconds), delivery_id=chosen)
        if kind == "renew":
            return d.Renew(rng.choice(leases), rng.choice(self.load.lease_seconds))
        if kind == "finish":
            return d.Finish(rng.choice(leases), rng.choice((d.Status.FINISHED, d.Status.FINISHED, d.Status.FAILED)))
        if kind == "get":
            return d.GetDelivery(community, rng.choice(self.known[community]))
        if kind == "reap":
            return d.Reap()
        states = (d.CommunityState.QUIESCING, d.CommunityState.FENCED, *[d.CommunityState.ACTIVE] * 3)
        return d.SetCommunityState(community, rng.choice(states))

    def apply(self, command: Any) -> Any:
        self.truth, outcome = d.step(self.truth, command)
        return outcome

    def learn(self, client: str, outcome: Any) -> None:
        if isinstance(outcome, d.Claimed):
            self.leases[client] = [*self.leases.get(client, [])[-2:], outcome.lease]

    def run(self) -> History:
        rng, load = self.rng, self.load
        clients = [f"w{i + 1}" for i in range(load.clients)]
        per_epoch = load.epoch or 4 * load.clients
        flights: dict[int, _Flight] = {}
        busy: dict[str, int] = {}
        lingering: list[int] = []  # abandoned before taking effect: may still take effect, or never
        made = 0
        while made < load.operations:
            left = min(per_epoch, load.operations - made)
            while left or busy:
                idle = [c for c in clients if c not in busy] if left else []
                client = rng.choice(idle + list(busy))
                if client not in busy:
                    command = self.choose(client)
                    busy[client] = self.recorder.invoke(client, command)
                    flights[busy[client]] = _Flight(client, command)
                    left, made = left - 1, made + 1
                    continue
                op = busy[client]
                flight = flights[op]
                if lingering and rng.random() < 0.05:
                    late = flights[lingering.pop(rng.randrange(len(lingering)))]
                    self.apply(late.command)
                if flight.outcome is None:
                    if rng.random() < load.indeterminate / 2:
                        self.recorder.abandon(op, "timed out before it ran")
                        lingering.append(op)
                        del busy[client]
                    else:
                        flight.outcome = self.apply(flight.command)
                    continue
                if rng.random() < load.indeterminate / 2:
                    self.recorder.abandon(op, "connection lost after it ran")
                else:
                    self.recorder.respond(op, flight.outcome)
                    self.learn(client, flight.outcome)
                del busy[client]
            for op in lingering:
                if rng.random() < 0.5:
                    self.apply(flights[op].command)
            lingering.clear()
            self.recorder.barrier(None if rng.random() < load.stateless else self.truth)
            if made < load.operations and rng.random() < load.clock:
                tick = d.AdvanceClock(dt.timedelta(seconds=rng.choice(load.clock_moves)))
                op = self.recorder.invoke("coordinator", tick)
                self.recorder.respond(op, self.apply(tick))
                self.recorder.barrier(None if rng.random() < load.stateless else self.truth)
                made += 1
        return self.recorder.history()


def simulate(rng: random.Random, load: Workload) -> History:
    """A linearizable delivery history of about `load.operations` operations."""
    return _Simulation(rng, load).run()


# -- the benchmark -------------------------------------------------------------------


def _seeded(seed: int, size: int) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(f"{seed}/{size}".encode()).digest()[:8], "big"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leaseproof.conformance.concurrent.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated history sizes (operations)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    ratio = f"× {min(sizes):,}"
    header = ("operations", "epochs", "partitions", "configurations", "seconds", "peak MiB", ratio, "verdict")
    print(f"delivery histories, {args.clients} clients, seed {args.seed}")
    print("  ".join(f"{h:>14}" for h in header))
    base = None
    judged = []
    for size in sorted(sizes):
        history = simulate(_seeded(args.seed, size), Workload(size, clients=args.clients))
        began = time.perf_counter()
        result = check(history, DELIVERY)
        seconds = time.perf_counter() - began
        tracemalloc.start()  # a second run, traced: tracing slows it down, so it is not the one timed
        check(history, DELIVERY)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        base = base or seconds
        row = (
            f"{len(history):,}",
            f"{result.epochs:,}",
            f"{result.partitions:,}",
            f"{result.configurations:,}",
            f"{seconds:.2f}",
            f"{peak:.2f}",
            f"{seconds / base:.1f}",
            result.verdict,
        )
        print("  ".join(f"{cell:>14}" for cell in row), flush=True)
        judged.append(result.linearizable)
    return 0 if all(judged) else 1


if __name__ == "__main__":
    sys.exit(main())
