"""Forced interleavings of the delivery store, judged against the model.

A `Race` sets a world up in lockstep with the model, then runs gated clients
(`impl/hooks/gate.py`), each on its own connection to the same database. A schedule
parks one client at a named point (around a call, or inside a function of the
`instrumented` store class it is given: `race.points`), runs the others, lets it go
on, and returns what it fixed (`Forced`): the serial order it implies, or the
real-time intervals of its operations. The history is judged by every serial order
of the model (each client's operations in program order), or by the
linearizability checker on those intervals. The race mutants that random
scheduling does not meet reliably have their schedules here (`INTERLEAVINGS`,
`LIFECYCLE_INTERLEAVINGS`), where the kill matrix runs them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import attrs
import psycopg

from leaseproof.conformance.concurrent.history import GUARD_SQLSTATE, Barrier, History, Operation, RefusedByTheDatabase
from leaseproof.conformance.concurrent.linearizability import CheckResult, Spec, check
from leaseproof.conformance.concurrent.models import SPECS
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.delivery import describe_state_difference
from leaseproof.conformance.lockstep.lifecycle import describe_difference
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.impl.hooks.gate import Aborted, Client, Points, Schedule, instrumented, instrumented_class, points_of
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter, PostgresLifecycleSession
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc
from leaseproof.model.errors import Refused

# The bundled implementation's adapters: the races run inside their stores (impl/hooks/gate.py).
Bundled = PostgresDeliveryAdapter | PostgresLifecycleAdapter
A = TypeVar("A", PostgresDeliveryAdapter, PostgresLifecycleAdapter)

SECOND = dt.timedelta(seconds=1)
LEASE = 10  # seconds


class ScheduleError(Exception):
    """The schedule did not run as written (e.g. an operation meant to roll back returned)."""


def serial_orders(programs: Mapping[str, list[Any]]) -> Iterator[tuple[str, ...]]:
    """Every merge of the clients' programs that keeps each client's own order, as client names."""
    left = {name: len(ops) for name, ops in programs.items() if ops}
    if not left:
        yield ()
        return
    for name in sorted(left):
        rest = {n: ops[1:] if n == name else ops for n, ops in programs.items()}
        for order in serial_orders(rest):
            yield (name, *order)


def describe_history(outcomes: Mapping[str, list[Any]]) -> str:
    return "; ".join(f"{name}: {w.describe(each)}" for name, each in outcomes.items())


@attrs.frozen
class Forced:
    """What a schedule fixed, to judge its history by: the serial order it implies
    (client names, "retry operator"), or, where some serial order explains the
    outcomes and only real time rules it out, each client's one operation as
    (invoked, returned) ticks. `waited` is what the client that ran into the
    parked one did ("blocked" on its lock, or "finished"), when the schedule asks."""

    implied: str = ""
    intervals: Mapping[str, tuple[int, int]] | None = None
    waited: str = ""


@attrs.frozen
class Judgement:
    """Whether some linearization of the model explains a forced history, and why."""

    linearizable: bool
    operations: int  # the concurrent operations of the schedule
    why: str


@attrs.define
class Race(Generic[A]):
    """One race's world: the adapter and the model in lockstep for the set-up, then gated
    clients whose operations are recorded, each with its outcome, for judging."""

    adapter: A
    schedule: Schedule
    step: Callable[[Any, Any], tuple[Any, Any]]
    state: Any  # the model's state when the concurrent part begins
    difference: Callable[[Any, Any], str]
    executor: Callable[[Client], Callable[[Any], Any]]
    programs: dict[str, list[Any]] = attrs.field(factory=dict)
    outcomes: dict[str, list[Any]] = attrs.field(factory=dict)
    _execute: dict[str, Callable[[Any], Any]] = attrs.field(factory=dict)

    def setup(self, *commands: Any) -> list[Any]:
        """Sequential, on the adapter and the model; each outcome must agree."""
        outcomes = []
        for command in commands:
            self.state, expected = self.step(self.state, command)
            actual = self.adapter.execute(command)
            if actual != expected:
                raise AssertionError(f"set-up {w.describe(command)}: {w.describe(actual)} != {w.describe(expected)}")
            outcomes.append(actual)
        return outcomes

    def client(self, name: str, conn: Any = None) -> Client:
        client = self.schedule.client(name, conn)
        self._execute[name] = self.executor(client)
        self.programs[name], self.outcomes[name] = [], []
        return client

    def start(self, client: Client, command: Any) -> Client:
        self.programs[client.name].append(command)
        execute = self._execute[client.name]
        return client.start(lambda: execute(command))

    def result(self, client: Client) -> Any:
        outcome = client.result()
        self.outcomes[client.name].append(outcome)
        return outcome

    def run(self, client: Client, command: Any) -> Any:
        self.start(client, command)
        return self.result(client)

    def rolled_back(self, client: Client) -> None:
        """The client's operation was rolled back at a pause: it never happened."""
        try:
            outcome = client.result()
        except Aborted:
            self.programs[client.name].pop()
            return
        raise ScheduleError(
            f"client {client.name!r} was to roll back, but its operation returned {w.describe(outcome)}"
        )

    def serial(self, order: tuple[str, ...]) -> tuple[dict[str, list[Any]], Any]:
        """The outcomes and the final state of the model, for one serial order."""
        state = self.state
        outcomes: dict[str, list[Any]] = {name: [] for name in self.programs}
        taken = dict.fromkeys(self.programs, 0)
        for name in order:
            state, outcome = self.step(state, self.programs[name][taken[name]])
            outcomes[name].append(outcome)
            taken[name] += 1
        return outcomes, state

    @property
    def points(self) -> Points:
        """The points of the functions the adapter runs (`Points.before(function, text)`, ...)."""
        adapter: Bundled = self.adapter
        if isinstance(adapter, PostgresLifecycleAdapter):
            return points_of(adapter.store_class, adapter.communities_class, adapter.resumer_class)
        return points_of(adapter.store_class)

    @property
    def operations(self) -> int:
        return sum(len(ops) for ops in self.programs.values())

    def explanations(self) -> list[str]:
        """The serial orders of the model that give exactly these outcomes and this snapshot."""
        seen = (self.outcomes, self.adapter.snapshot())
        return [" ".join(order) for order in serial_orders(self.programs) if self.serial(order) == seen]

    def real_time(self, intervals: Mapping[str, tuple[int, int]], spec: Spec | None = None) -> CheckResult:
        """The linearizability checker's verdict (under the machine's spec, or `spec`), each
        client's one operation placed at the (invoked, returned) ticks the schedule fixes."""
        operations = tuple(
            Operation(i, name, self.programs[name][0], self.outcomes[name][0], *intervals[name])
            for i, name in enumerate(intervals, 1)
        )
        end = max(t for pair in intervals.values() for t in pair) + 1
        history = History(self.machine, self.state, operations, (Barrier(end, self.adapter.snapshot()),))
        return check(history, spec or SPECS[self.machine])

    def judgement(self, forced: Forced) -> Judgement:
        """Whether the history is explained: by the checker on the schedule's intervals,
        if it fixed them, else by some serial order."""
        if forced.intervals is not None:
            result = self.real_time(forced.intervals)
            return Judgement(result.linearizable, self.operations, result.summary())
        orders = self.explanations()
        if orders:
            return Judgement(True, self.operations, f"the serial order {orders[0]!r} gives this history")
        return Judgement(
            False,
            self.operations,
            f"no serial order of the model gives this history: {describe_history(self.outcomes)}",
        )

    def assert_linearizable(self) -> None:
        """Some serial order of the model gives exactly these outcomes and this snapshot."""
        if not self.explanations():
            raise AssertionError(f"no serial order of the model gives this history: {describe_history(self.outcomes)}")

    @property
    def machine(self) -> str:
        return "lifecycle" if self.step is lc.step else "delivery"

    def judge_in_real_time(self, intervals: Mapping[str, tuple[int, int]], conforms: bool) -> None:
        """Judge by the linearizability checker on the schedule's intervals: for races
        where some serial order explains the outcomes and only real time rules it out."""
        result = self.real_time(intervals)
        if result.linearizable != conforms:
            raise AssertionError(result.summary() + " :: " + describe_history(self.outcomes))

    def judge(self, implied: str, conforms: bool) -> None:
        """`implied`: the serial order the schedule implies, as client names ("test stale newer").

        A conforming implementation gives exactly that order's outcomes and
        final state; a mutant gives a history no serial order gives."""
        snapshot = self.adapter.snapshot()
        histories = {order: self.serial(order) for order in serial_orders(self.programs)}
        if not histories:
            raise AssertionError("no serial order to compare with")
        if conforms:
            implied_order = tuple(implied.split())
            if implied_order not in histories:
                raise AssertionError(f"{implied!r} is not a serial order of {sorted(self.programs)}")
            expected_outcomes, expected_state = histories[implied_order]
            for name in self.programs:
                if self.outcomes[name] != expected_outcomes[name]:
                    raise AssertionError(
                        f"client {name!r}: {w.describe(self.outcomes[name])}\n"
                        f"  but in the serial order {implied!r} the model says {w.describe(expected_outcomes[name])}"
                    )
            if snapshot != expected_state:
                raise AssertionError(
                    f"after the serial order {implied!r}:\n" + self.difference(expected_state, snapshot)
                )
        else:
            same = [" ".join(o) for o, history in histories.items() if history == (self.outcomes, snapshot)]
            if same:
                raise AssertionError(
                    f"the mutant's history ({describe_history(self.outcomes)}) is that of the serial order"
                    f" {same[0]!r}: the race does not catch it"
                )


# -- the delivery world ---------------------------------------------------------------------------

C, W1, R1, M1 = w.COMMUNITIES["A"], w.WORKFLOWS["W1"], w.RUNS["R1"], w.MESSAGES["M1"]
T1 = w.TARGETS["T1"]
D1, D2 = w.DELIVERIES["d1"], w.DELIVERIES["d2"]


def new(delivery: Any, target: str, step: str = "s1") -> d.NewDelivery:
    return d.NewDelivery(delivery, w.binding("A", "W1", "R1", step, target, "D1", "M1", "event:E1"))


WORLD = (d.CreateCommunity(C), d.CreateWorkflow(C, W1), d.CreateRun(C, W1, R1), d.PublishEvent(C, M1))
ONE_ROW = d.CommitDeliveries(C, R1, "s1", [new(D1, "T1")])
CLAIM = d.Claim(C, T1, LEASE)


def delivery_executor(store_class: type[PostgresDeliveryStore]) -> Callable[[Client], Callable[[Any], Any]]:
    def bind(client: Client) -> Callable[[Any], Any]:
        connection = client.gate.as_connection()
        store, clock = store_class(connection), PinnedClock(connection)

        def execute(command: Any) -> Any:
            if isinstance(command, d.AdvanceClock):
                clock.advance(command.by)
                return d.Ok()
            try:
                return store.execute(command)
            except Refused as refused:
                return refused.rejection
            except psycopg.DatabaseError as exc:
                if exc.sqlstate != GUARD_SQLSTATE:
                    raise
                return RefusedByTheDatabase(exc.diag.constraint_name or "?")

        return execute

    return bind


DeliveryRace = Race[PostgresDeliveryAdapter]


def delivery_race(adapter: PostgresDeliveryAdapter, schedule: Schedule) -> DeliveryRace:
    """A delivery race on `adapter`'s database, reset and its world set up."""
    adapter.reset(w.START)
    race = Race(
        adapter,
        schedule,
        d.step,
        d.initial_state(w.START),
        describe_state_difference,
        delivery_executor(adapter.store_class),
    )
    race.setup(*WORLD)
    return race


@contextlib.contextmanager
def delivery_races(dsn: str, schedule: Schedule) -> Iterator[Callable[[type[PostgresDeliveryStore]], DeliveryRace]]:
    """A maker of delivery races on the (migrated or empty) database `dsn`, each one's
    world set up, on the `instrumented` variant of the store class it is given; on exit
    the schedule's clients are unstuck, then the adapters closed."""
    adapters: list[PostgresDeliveryAdapter] = []

    def make(store_class: type[PostgresDeliveryStore]) -> DeliveryRace:
        adapter = PostgresDeliveryAdapter(dsn, store_class=instrumented_class(store_class))
        adapters.append(adapter)
        return delivery_race(adapter, schedule)

    try:
        yield make
    finally:
        schedule.close()  # unstick the clients before their database goes
        for adapter in adapters:
            adapter.close()


# -- the lifecycle world: admission against definition writers -----------------------------------

ALICE, GENERAL = w.AUTHORS["alice"], w.CHANNELS["general"]
OLD = lc.Definition(("post-summary",))
NEW = lc.Definition(("post-summary", "page-oncall"))
OFF = lc.Definition(("post-summary",), enabled=False)
ON = lc.Definition(("post-summary",), enabled=True)


def save(at: int, definition: lc.Definition, workflow: Any = W1) -> lc.SaveDefinition:
    event_id = hashlib.sha256(f"{at}/{definition}/{workflow}".encode()).digest()
    return lc.SaveDefinition(
        lc.DefinitionEvent(event_id, C, workflow, ALICE, GENERAL, w.START + at * SECOND, definition)
    )


def delete(at: int) -> lc.DeleteDefinition:
    return lc.DeleteDefinition(C, W1, ALICE, w.START + at * SECOND)


def fire(replica: str) -> lc.Fire:
    return lc.Fire(replica, "event", C, W1)


# Replica r1 is warm with the first revision when each race begins.
LIFECYCLE_WORLD = (d.CreateCommunity(C), lc.SetAuthority(C, GENERAL, ALICE, True), save(1, OLD), lc.RefreshCache("r1"))


def lifecycle_executor(adapter: PostgresLifecycleAdapter) -> Callable[[Client], Callable[[Any], Any]]:
    """A session of the adapter on the client's gated connection: writers, resumers and
    community changes run on it; fires and refreshes on the adapter's replica engines
    (one of them may be gated too: `LifecycleRace.replica`)."""

    def bind(client: Client) -> Callable[[Any], Any]:
        return PostgresLifecycleSession(adapter, client.gate.as_connection()).execute

    return bind


class LifecycleRace(Race[PostgresLifecycleAdapter]):
    """A race of the lifecycle machine: its clients may be replica engines too."""

    def replica(self, name: str, replica: str) -> Client:
        """A client that is the replica engine itself: its own connection, gated."""
        engine = self.adapter.engines[replica]
        client = self.client(name, engine.conn)
        engine.conn = client.gate.as_connection()
        return client


def lifecycle_race(adapter: PostgresLifecycleAdapter, schedule: Schedule) -> LifecycleRace:
    """A lifecycle race on `adapter`'s database, reset and its world (LIFECYCLE_WORLD) set up."""
    adapter.reset(w.START)
    race = LifecycleRace(
        adapter,
        schedule,
        lc.step,
        lc.initial_state(w.START, w.REPLICAS),
        describe_difference,
        lifecycle_executor(adapter),
    )
    race.setup(*LIFECYCLE_WORLD)
    return race


@contextlib.contextmanager
def lifecycle_races(dsn: str, schedule: Schedule) -> Iterator[Callable[..., LifecycleRace]]:
    """A maker of lifecycle races on the (migrated or empty) database `dsn`, each one's
    world (LIFECYCLE_WORLD) set up; the maker takes the adapter's role classes by keyword,
    and runs their `instrumented` variant. On exit the schedule's clients are unstuck,
    then the adapters closed."""
    adapters: list[PostgresLifecycleAdapter] = []

    def make(
        engine_class: type[ReplicaEngine] = ReplicaEngine,
        store_class: type[LifecycleStore] = LifecycleStore,
        resumer_class: type[RunResumer] = RunResumer,
    ) -> LifecycleRace:
        store, engine, resumer, communities = instrumented(
            store_class, engine_class, resumer_class, PostgresDeliveryStore
        )
        adapter = PostgresLifecycleAdapter(
            dsn, store_class=store, engine_class=engine, resumer_class=resumer, communities_class=communities
        )
        adapters.append(adapter)
        return lifecycle_race(adapter, schedule)

    try:
        yield make
    finally:
        schedule.close()
        for adapter in adapters:
            adapter.close()


# -- the schedules the kill matrix runs -----------------------------------------------------------

COMMUNITY_CHANGES = {
    "fence": d.SetCommunityState(C, d.CommunityState.FENCED),
    "delete": d.DeleteCommunity(C),
}


def reconciliation_races_a_community_change(race: DeliveryRace, change: str) -> Forced:
    """The holder settled, and retries after an uncertain completion; its retry, whose
    finish settled nothing, is parked before its reconciliation read (a statement of
    lp_finish of its own) while the community is fenced or deleted. The bundled finish
    holds the community's write fence (shared) until its call ends, so the change waits
    for the retry, which is told the recorded terminal: "retry operator". A finish that
    lets the fence go before the read lets a deletion in, which purges the row, and the
    read then finds nothing: `LeaseLost`, in no serial order (after the deletion the
    retry is refused, before it it is told `AlreadyTerminal`)."""
    race.setup(ONE_ROW)
    (claimed,) = race.setup(CLAIM)
    race.setup(d.Finish(claimed.lease, d.Status.FAILED))
    retry, operator = race.client("retry"), race.client("operator")
    at_read = retry.gate.pause_at(race.points.before("lp_finish", "SELECT d.status INTO status"))
    race.start(retry, d.Finish(claimed.lease, d.Status.FINISHED))
    at_read.wait_parked()
    race.start(operator, COMMUNITY_CHANGES[change])
    waited = operator.wait_blocked_or_finished()
    at_read.release()
    race.result(retry)
    race.result(operator)
    return Forced(implied="retry operator" if waited == "blocked" else "operator retry", waited=waited)


def a_read_while_a_claim_holds_the_row(race: DeliveryRace) -> Forced:
    """d1 pending. A keyed claim (a transaction) takes it and is parked before its COMMIT,
    holding the row; a read of d1 runs. The bundled read takes no lock and finds d1
    pending, before the claim in the order; a read that skips locked rows answers
    NotFound, which no order explains (d1 exists before the claim and after it)."""
    race.setup(ONE_ROW)
    claimer, reader = race.client("claimer"), race.client("reader")
    at_commit = claimer.gate.pause_before_commit(ran=race.adapter.store_class.SQL_CLAIM)
    race.start(claimer, attrs.evolve(CLAIM, request_key="held"))
    at_commit.wait_parked()
    race.run(reader, d.GetDelivery(C, D1))
    at_commit.release()
    race.result(claimer)
    return Forced(intervals={"claimer": (1, 4), "reader": (2, 3)})


def a_second_sweep_then_a_claim(race: DeliveryRace) -> Forced:
    """Community A (fenced) has an expired claim, x; community B an expired claim, d1
    (claimed after x, for longer: a sweep meets x first), and a younger pending row, d2.
    A change of A back to active is parked before its COMMIT, holding A's write fence, so
    sweep one skips A, reaps B's d1 and is parked before its COMMIT. The change commits.
    Sweep two starts: the bundled one waits for its turn; one that does not take turns
    takes its snapshot (d1 still claimed), reaps x, and is parked in the trigger its write
    of x fires, before it meets d1. Sweep one commits; sweep two goes on and is parked
    before its COMMIT; then a claim in B must take d1, the oldest pending row. A sweep that
    overlapped met d1 after sweep one committed it: it locks the row's newest version,
    re-checks it, leaves it and keeps the lock, so the claim skips to d2. A serial order
    with the claim before sweep one explains that too; only real time (the claim began
    after sweep one returned) rules it out, so the checker judges it, in the order fixed here."""
    store = race.adapter.store_class
    b, w1, r1, m1 = w.COMMUNITIES["B"], w.WORKFLOWS["W1"], w.RUNS["R1"], w.MESSAGES["M1"]

    def in_b(delivery: Any, step: str) -> d.NewDelivery:
        return d.NewDelivery(delivery, w.binding("B", "W1", "R1", step, "T1", "D1", "M1", "event:E1"))

    race.setup(ONE_ROW, CLAIM, d.SetCommunityState(C, d.CommunityState.FENCED))  # x: A's, until LEASE
    race.setup(d.CreateCommunity(b), d.CreateWorkflow(b, w1), d.CreateRun(b, w1, r1), d.PublishEvent(b, m1))
    race.setup(d.CommitDeliveries(b, r1, "s1", [in_b(D1, "s1")]), d.Claim(b, T1, 2 * LEASE))  # d1: until 2 LEASE
    race.setup(d.AdvanceClock(SECOND), d.CommitDeliveries(b, r1, "s2", [in_b(D2, "s2")]))
    race.setup(d.AdvanceClock(2 * LEASE * SECOND))  # both have expired
    change, one, two, claimer = (race.client(n) for n in ("change", "one", "two", "claimer"))
    change_done = change.gate.pause_before_commit(ran=store.SQL_SET_COMMUNITY_STATE)
    race.start(change, d.SetCommunityState(C, d.CommunityState.ACTIVE))
    change_done.wait_parked()
    one_done = one.gate.pause_before_commit(ran=store.SQL_SWEEP)
    race.start(one, d.Reap())
    one_done.wait_parked()
    change_done.release()
    race.result(change)
    at_write = two.gate.pause_at(race.points.first("lp_delivery_transition"))
    two_done = two.gate.pause_before_commit(ran=store.SQL_SWEEP)
    race.start(two, d.Reap())
    two.wait_blocked_or_parked(at_write)  # blocked for its turn, or parked in its statement
    one_done.release()
    race.result(one)
    at_write.wait_parked()
    at_write.release()
    two_done.wait_parked()
    race.run(claimer, d.Claim(b, T1, LEASE))
    two_done.release()
    race.result(two)
    return Forced(intervals={"change": (1, 3), "one": (2, 5), "two": (4, 8), "claimer": (6, 7)})


# -- the lifecycle schedules the kill matrix runs ------------------------------------------------


def a_later_admission_exposes_a_stale_one(race: LifecycleRace, change: tuple[Any, ...] = (save(2, NEW),)) -> Forced:
    """Replica r1 selects the first revision R1 and its admission is parked before the
    statement of lp_admit that inserts the run (the bundled one: its one locking INSERT ...
    SELECT; an admission that matched the row by a read of its own: after that read). The
    writer makes `change` to the coordinate; a fresh replica r2 then admits the current
    revision and gets run id 1. Then r1 goes on.

    Run ids are 1..n in admission order, and a run pins the revision it was admitted
    for. A run pinned to R1 can only be admitted while R1 is current, before the writer's
    first change (R1 never becomes current again: a re-enable, a recreation, even an
    identical one, is a new revision or incarnation). The observer's admission needs the
    changed coordinate, so it comes after the writer, hence after any R1 admission, which
    would therefore have id 1: "Admitted(2, R1)" is in no serial order. The bundled
    admission, matching at its statement, is refused."""
    admission, writer, observer = race.replica("admission", "r1"), race.client("writer"), race.client("observer")
    at_insert = admission.gate.pause_at(race.points.before("lp_admit", "INSERT INTO admitted_runs"))
    race.start(admission, fire("r1"))
    at_insert.wait_parked()
    for command in change:
        race.run(writer, command)
    race.run(observer, lc.RefreshCache("r2"))
    admitted = race.run(observer, fire("r2"))
    if not isinstance(admitted, lc.Admitted):
        raise ScheduleError(f"the fresh replica was to admit the changed coordinate: {w.describe(admitted)}")
    at_insert.release()
    race.result(admission)
    writes = " ".join("writer" for _ in change)
    return Forced(implied=f"{writes} observer observer admission")


REVOKE = lc.SetAuthority(C, GENERAL, ALICE, False)


def a_save_racing_the_revocation_of_its_authority(race: LifecycleRace) -> Forced:
    """A save has checked its author's channel authority and is parked right after that
    statement of lp_save_definition, before it writes; the authority is revoked, and then
    replica r2 reloads its cache. The bundled check share-locks the authority row, so the
    revocation waits for the save. A check without the lock lets the revocation and the
    reload both finish first, and the save then lands after the revocation that forbids
    it: its `Updated` puts it before the revocation, so the reload, which came after the
    revocation, would have seen it.

    Every serial order of the three commands explains those outcomes; only real time
    rules them out (the reload began after the revocation returned), so the history is
    judged by the checker, with the order of events the schedule fixes: ticks 1 and 2
    the save's and the revocation's invocations."""
    writer, revoker, reader = race.client("writer"), race.client("revoker"), race.client("reader")
    at_check = writer.gate.pause_at(race.points.after("lp_save_definition", "FROM channel_authority a"))
    race.start(writer, save(2, NEW))
    at_check.wait_parked()
    race.start(revoker, REVOKE)
    if (waited := revoker.wait_blocked_or_finished()) == "blocked":
        at_check.release()
        race.result(writer)
        race.result(revoker)
        race.run(reader, lc.RefreshCache("r2"))
        return Forced(intervals={"writer": (1, 3), "revoker": (2, 4), "reader": (5, 6)}, waited=waited)
    race.result(revoker)
    race.run(reader, lc.RefreshCache("r2"))
    at_check.release()
    race.result(writer)
    return Forced(intervals={"writer": (1, 6), "revoker": (2, 3), "reader": (4, 5)}, waited=waited)


@attrs.frozen
class Interleaving:
    """A forced schedule that catches one race mutant, of the delivery machine (its
    schedule takes a delivery `Race`) or the lifecycle one (a `LifecycleRace`)."""

    name: str
    run: Callable[[Any], Forced]
    machine: str = "delivery"


# Race mutants that random scheduling does not catch reliably, each with the
# schedule that does (keyed by the race mutant's name, impl/mutants/race.py): of
# the delivery machine (the kill matrix runs them), and of the lifecycle machine,
# whose races inside one function stress no longer meets (a window of a few
# statements, where it was a round trip between the client's statements).
INTERLEAVINGS: dict[str, Interleaving] = {
    "reconcile-outside-transaction": Interleaving(
        "reconciliation races a community deletion",
        functools.partial(reconciliation_races_a_community_change, change="delete"),
    ),
    "sweeps-overlap": Interleaving("a second sweep, then a claim", a_second_sweep_then_a_claim),
    "read-skips-locked": Interleaving("a read while a claim holds the row", a_read_while_a_claim_holds_the_row),
}
LIFECYCLE_INTERLEAVINGS: dict[str, Interleaving] = {
    "admission-without-row-lock": Interleaving(
        "a later admission exposes a stale one", a_later_admission_exposes_a_stale_one, "lifecycle"
    ),
    "authority-check-unlocked": Interleaving(
        "a save races the revocation of its author's authority",
        a_save_racing_the_revocation_of_its_authority,
        "lifecycle",
    ),
}


def run_interleaving(interleaving: Interleaving, dsn: str, variant: Any) -> Judgement:
    """Run `interleaving` against `variant` on the database `dsn` and judge its history.
    `variant`: a delivery store class; for a lifecycle schedule, the mutant's record
    (`LifecycleMutant`: its store, engine and resumer) or the adapter's role classes by
    keyword (`store_class`, `engine_class`, `resumer_class`)."""
    with Schedule(dsn) as schedule:
        if interleaving.machine == "lifecycle":
            with lifecycle_races(dsn, schedule) as make:
                lifecycle = make(**_lifecycle_roles(variant))
                return lifecycle.judgement(interleaving.run(lifecycle))
        with delivery_races(dsn, schedule) as make_delivery:
            race = make_delivery(variant)
            return race.judgement(interleaving.run(race))


def _lifecycle_roles(variant: Any) -> dict[str, type]:
    if isinstance(variant, Mapping):
        return dict(variant)
    if all(hasattr(variant, role) for role in ("store", "engine", "resumer")):
        return {"store_class": variant.store, "engine_class": variant.engine, "resumer_class": variant.resumer}
    raise TypeError(f"a lifecycle schedule runs a LifecycleMutant or role classes by keyword, not {variant!r}")
