"""The nemesis: the bundled delivery store used as a service uses it, under faults.

`leaseproof nemesis` runs worker processes that claim, renew and finish
deliveries of several tenants on the database's real clock with short leases,
and a reaper process that sweeps expired leases, while a seeded schedule
injects faults (FAULTS: kills, ended backends, pauses, a stalled tenant, server
restarts, network faults through a loopback proxy). Every worker logs what the
store answered it, and the database keeps a trail of the claims it handed out.
Afterwards an audit judges logs, trail and rows: nothing lost, settled twice,
accepted stale, claimed twice at one generation, left unprocessed or orphaned;
and liveness: the longest a healthy tenant's expired lease waited for the
reaper, against REAP_BOUND, whatever the stalled tenant's client did. The exit
status is 0 only if all hold. Each fault and clause, and why the run's database
commits synchronously, is in docs/nemesis.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import multiprocessing
import os
import random
import signal
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, TextIO

import attrs
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from leaseproof.conformance.concurrent.faults import NETWORK_FAULTS, arm
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.provision import postgres_server
from leaseproof.conformance.harness.proxy import FaultProxy
from leaseproof.impl.connection import Waits, connect
from leaseproof.impl.delivery.service import DeliveryService
from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.errors import ConnectionLost, Unavailable
from leaseproof.impl.hooks.functions import install, patches_of
from leaseproof.impl.migrate import migrate
from leaseproof.model import delivery as m
from leaseproof.model.binding import Binding, EventCause
from leaseproof.model.errors import Refused

FAULTS = ("kill", "terminate", "pause", "stall", "restart", *NETWORK_FAULTS)
RESTART_MODES = ("fast", "immediate")
TARGET = b"\x07" * 32
WORKFLOW, RUN = uuid.UUID(int=0x100), uuid.UUID(int=0x200)
MESSAGE, DEFINITION = b"\x03" * 32, b"\x04" * 32
LEASE_SECONDS = 1
REAP_EVERY = 0.1  # seconds between sweeps
WORK_SECONDS = 0.3  # the most a worker spends on one delivery (well inside its lease)
STALL_SECONDS = 2.5  # the abandoned lease (LEASE_SECONDS) ends with 1.5 s of the stall to go
PAUSE_SECONDS = LEASE_SECONDS + 0.5
# The reaper sweeps every REAP_EVERY; a healthy tenant's expired lease should
# wait no longer than a few sweeps, whatever another tenant's client does.
REAP_BOUND = 1.0
WAITS = Waits(lock=0.5, statement=5, idle_in_transaction=10)


CAUSE = b"\x05" * 32


def tenant(index: int) -> uuid.UUID:
    return uuid.UUID(int=0xC0 + index)


def set_up_community(store: PostgresDeliveryStore, community: uuid.UUID) -> None:
    """Create `community` with what its deliveries name: the workflow, its run and the published
    message (the answers unchecked); the throughput benchmark and the plans test set theirs up so too."""
    for command in (
        m.CreateCommunity(community),
        m.CreateWorkflow(community, WORKFLOW),
        m.CreateRun(community, WORKFLOW, RUN),
        m.PublishEvent(community, MESSAGE),
    ):
        store.execute(command)


def binding(community: uuid.UUID, step: str, target: bytes = TARGET) -> Binding:
    """What a delivery to `target` at `step` of the run `set_up_community` makes is bound to."""
    return Binding(community, WORKFLOW, RUN, step, target, DEFINITION, MESSAGE, EventCause(CAUSE))


@attrs.frozen
class Plan:
    seed: int
    duration: float
    workers: int = 4
    tenants: int = 3
    per_tenant: int = 400
    faults: tuple[str, ...] = FAULTS
    # Seconds between two faults of one kind: the decisions come `period / len(faults)` apart, so
    # that a kind added to the mix does not make the others rarer.
    period: float = 1.6

    @property
    def every(self) -> float:
        """Seconds between two fault decisions."""
        return self.period / max(1, len(self.faults))

    # The store the workers and the reaper use: the bundled one, or a variant of it (a mutant),
    # whose database functions `prepare` puts in the database; and the client they hold it
    # through (a service mutant's is a variant of DeliveryService).
    store: type[PostgresDeliveryStore] = PostgresDeliveryStore
    service: type[DeliveryService] = DeliveryService


@attrs.define
class Report:
    committed: int = 0
    cycles: int = 0  # finishes the store accepted
    faults: Counter[str] = attrs.field(factory=Counter)
    lost: list[str] = attrs.field(factory=list)
    double: list[str] = attrs.field(factory=list)
    stale: list[str] = attrs.field(factory=list)
    same_generation: list[str] = attrs.field(factory=list)
    unprocessed: list[str] = attrs.field(factory=list)
    orphaned: list[str] = attrs.field(factory=list)
    answers: Counter[str] = attrs.field(factory=Counter)
    worst_healthy_delay: float = 0.0
    worst_stalled_delay: float = 0.0
    restarts: Counter[str] = attrs.field(factory=Counter)  # by mode
    network: Counter[str] = attrs.field(factory=Counter)  # what the proxy did (FaultProxy.counts)
    left_by_sweeps: int = 0  # expired leases a sweep passed over (held locked by another client), summed
    abandoned: int = 0  # leases of healthy tenants the run left to expire during stalls

    @property
    def safe(self) -> bool:
        return not self.problems

    @property
    def problems(self) -> list[str]:
        """Every safety clause's findings, in the audit's order."""
        return [*self.lost, *self.double, *self.stale, *self.same_generation, *self.unprocessed, *self.orphaned]

    @property
    def live(self) -> bool:
        return self.worst_healthy_delay <= REAP_BOUND

    def lines(self) -> list[str]:
        modes = " (" + ", ".join(f"{mode} {self.restarts[mode]}" for mode in RESTART_MODES) + ")"
        faults = ", ".join(
            f"{kind} {self.faults[kind]}" + (modes if kind == "restart" and self.restarts else "") for kind in FAULTS
        )
        if self.network:
            faults += "; the proxy: " + ", ".join(f"{what} {n}" for what, n in sorted(self.network.items()))
        answers = ", ".join(f"{name} {count}" for name, count in sorted(self.answers.items()))
        return [
            f"committed deliveries: {self.committed}   cycles (finishes accepted): {self.cycles}",
            f"faults: {faults}",
            f"answers: {answers}",
            f"lost: {len(self.lost)}   settled twice: {len(self.double)}   stale accepted: {len(self.stale)}"
            f"   one generation claimed twice: {len(self.same_generation)}   unprocessed: {len(self.unprocessed)}"
            f"   orphaned leases: {len(self.orphaned)}",
            f"worst reap delay: healthy tenants {self.worst_healthy_delay:.2f}s (bound {REAP_BOUND:g}s)"
            f", the stalled tenant {self.worst_stalled_delay:.2f}s; leases abandoned during stalls {self.abandoned}"
            f"   (expired leases passed over by sweeps, held locked: {self.left_by_sweeps})",
            *(f"  {problem}" for problem in self.problems[:20]),
            "verdict: " + ("SAFE" if self.safe else "UNSAFE") + ", " + ("LIVE" if self.live else "NOT LIVE"),
        ]


def _named(dsn: str, name: str) -> str:
    return make_conninfo(dsn, application_name=name)


def prepare(dsn: str, plan: Plan) -> list[uuid.UUID]:
    """Make commits durable in the database, migrate, and commit `per_tenant` deliveries in
    each tenant, on the real clock.

    Durable: a server may run with `synchronous_commit = off` (leaseproof's own embedded
    server does, for speed), and then a crash loses commits it had already acknowledged
    (measured: with it off, an immediate restart handed one generation to two claims, 9
    times in 15 s). Faults are judged against a database that keeps its word, so every
    session of this one commits synchronously."""
    ids: list[uuid.UUID] = []
    with connect(dsn) as conn:
        name = conn.execute("SELECT current_database() AS name").fetchone()["name"]  # type: ignore[index]  # one row
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(sql.Identifier(name)))
    with connect(dsn) as conn:
        migrate(conn)
        install(conn, patches_of(plan.store))
        conn.execute(_CLAIM_TRAIL)
        store = plan.store(conn)
        for t in range(plan.tenants):
            community = tenant(t)
            set_up_community(store, community)
            for n in range(plan.per_tenant):  # one per step: a step has one delivery per target
                step, delivery = f"s{n}", uuid.UUID(int=(t << 64) | (n + 1))
                new = m.NewDelivery(delivery, binding(community, step))
                store.execute(m.CommitDeliveries(community, RUN, step, [new]))
                ids.append(delivery)
    return ids


# Every claim the database hands out, as the database saw it (the audit's, in the run's own
# database, beside the schema it judges): which delivery, at which generation, under which
# request key (a worker's keys begin with its name).
_CLAIM_TRAIL = """
    CREATE TABLE lp_nemesis_claims (
        id uuid NOT NULL, generation bigint NOT NULL, claim_key text, lease_until timestamptz,
        at timestamptz NOT NULL DEFAULT clock_timestamp());
    CREATE FUNCTION lp_nemesis_trail() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO lp_nemesis_claims (id, generation, claim_key, lease_until)
        VALUES (NEW.id, NEW.lease_generation, NEW.claim_key, NEW.lease_until);
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER lp_nemesis_trail AFTER UPDATE ON workflow_agent_deliveries FOR EACH ROW
        WHEN (OLD.status <> 'claimed' AND NEW.status = 'claimed') EXECUTE FUNCTION lp_nemesis_trail();
"""


def _log(out: Any, **entry: Any) -> None:
    out.write(json.dumps(entry, default=str) + "\n")
    out.flush()


def _quiet() -> None:
    """In a worker: SIGINT is the parent's to handle, and psycopg's warning that a
    rollback found the connection gone (what the faults do) is not news."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("psycopg").setLevel(logging.ERROR)


def worker(
    dsn: str, name: str, seed: int, until: float, log_path: str, tenants: int,
    store_class: type[PostgresDeliveryStore] = PostgresDeliveryStore,
    service_class: type[DeliveryService] = DeliveryService,
) -> None:  # fmt: skip
    """Claim, sometimes renew, finish, through the DeliveryService (it reconnects, and
    resends what is safe to resend). A finish answered by a resend is logged with when the
    resend was sent (`resent_at`); a call given up is logged with what it was doing."""
    _quiet()
    rng = random.Random(seed)
    store = service_class(_named(dsn, name), WAITS, store_class=store_class)
    claims = 0
    with open(log_path, "a", encoding="utf-8") as out:
        while time.time() < until:
            doing, key = "claim", ""
            try:
                community = tenant(rng.randrange(tenants))
                claims += 1  # each claim request its own key: a resend after a lost answer gets its lease
                key = f"{name}/{seed}/{claims}"
                _log(out, op="claiming", key=key)  # a worker killed before its answer leaves this line last
                got = store.execute(m.Claim(community, TARGET, LEASE_SECONDS, request_key=key))
                if not isinstance(got, m.Claimed):
                    _log(out, op="claim", answer=type(got).__name__)
                    time.sleep(0.005)  # nothing to do: poll again, as a worker does
                    continue
                lease = got.lease
                _log(out, op="claim", answer="Claimed", id=lease.delivery_id, gen=lease.lease_generation)
                time.sleep(rng.uniform(0, WORK_SECONDS))  # the work the delivery asks for
                if rng.random() < 0.3:
                    doing = "renew"
                    renewed = store.execute(m.Renew(lease, LEASE_SECONDS))
                    _log(out, op="renew", answer=type(renewed).__name__, id=lease.delivery_id,
                         gen=lease.lease_generation)  # fmt: skip
                    if isinstance(renewed, m.Renewed):
                        lease = attrs.evolve(lease, lease_until=renewed.lease_until)
                doing = "finish"
                done = store.execute(m.Finish(lease, m.Status.FINISHED))
                _log(out, op="finish", answer=type(done).__name__, id=lease.delivery_id, gen=lease.lease_generation,
                     resent_at=store.resent_at)  # fmt: skip
            except Refused as refused:
                _log(out, op="refused", answer=type(refused.rejection).__name__, doing=doing)
            except Unavailable as exc:
                _log(out, op="unavailable", answer="Unavailable", reason=exc.reason, doing=doing)
                time.sleep(0.05)  # a worker backs off before it tries again (the server may be restarting)
            except (ConnectionLost, psycopg.Error) as exc:
                _log(out, op="lost", answer=type(exc).__name__, doing=doing, key=key)
                store.close()


def reaper(
    dsn: str, until: float, log_path: str, store_class: type[PostgresDeliveryStore] = PostgresDeliveryStore
) -> None:
    _quiet()
    service = DeliveryService(_named(dsn, "lp-nemesis-reaper"), WAITS, store_class=store_class)
    with open(log_path, "a", encoding="utf-8") as out:
        while time.time() < until:
            try:
                sweep = service.sweep()
                _log(out, op="reap", answer="Reaped", count=sweep.reaped, left=len(sweep.left))
            except Unavailable as exc:
                _log(out, op="reap", answer="Unavailable", reason=exc.reason)
            except (ConnectionLost, psycopg.Error) as exc:
                _log(out, op="reap", answer=type(exc).__name__)
                service.close()
            time.sleep(REAP_EVERY)  # the sweep's period


# How long each tenant's most overdue expired lease has waited for the reaper, counted from
# when it expired or from when the server was last back from a restart, whichever is later:
# a lease cannot be reaped while there is no server.
_OVERDUE = """
    SELECT community_id, EXTRACT(EPOCH FROM max(now() - greatest(lease_until, %(up_since)s)))::float8 AS overdue
    FROM workflow_agent_deliveries
    WHERE status = 'claimed' AND lease_until < now()
    GROUP BY community_id
"""


def run(dsn: str, plan: Plan, folder: Path, say: Any = print, restart: Callable[[str], None] | None = None) -> Report:
    """The whole nemesis run on the migrated-or-empty database `dsn`; logs go to `folder`.
    `restart(mode)` restarts the server (the "restart" fault needs it)."""
    if "restart" in plan.faults and restart is None:
        raise ValueError("the restart fault needs a server leaseproof started itself (not one named by --dsn)")
    report = Report()
    ids = prepare(dsn, plan)
    report.committed = len(ids)
    nemesis = _Nemesis(dsn, plan, folder, report, restart)
    nemesis.start()
    try:
        nemesis.strike_until_the_end()
    except BaseException:  # interrupted (Ctrl-C, SIGTERM) or failed: the workers stop now, not at `until`
        nemesis.kill_everyone()
        raise
    finally:
        nemesis.stop()
    _drain(dsn, plan.store)
    report.abandoned = len(nemesis.abandoned)
    _audit(dsn, ids, [*nemesis.logs, folder / "reaper.jsonl"], report, nemesis.abandoned)
    for line in report.lines():
        say(line)
    return report


class _Nemesis:
    """One run's processes, connections and seeded schedule: the workers and the reaper, the
    proxy, the monitor that samples reap delays, the staller; one method a step or a fault."""

    def __init__(
        self, dsn: str, plan: Plan, folder: Path, report: Report, restart: Callable[[str], None] | None
    ) -> None:
        self.dsn, self.plan, self.folder, self.report, self.restart = dsn, plan, folder, report, restart
        self.rng = random.Random(plan.seed)
        self.ctx = multiprocessing.get_context("spawn")
        self.until = time.time() + plan.duration
        self.logs = [folder / f"worker-{i}.jsonl" for i in range(plan.workers)]
        self.procs: dict[int, Any] = {}
        self.sweeper: Any = None
        self.proxy: FaultProxy | None = None
        self.workers_dsn = dsn
        self.paused: dict[int, float] = {}  # worker -> when to continue it
        self.abandoned: set[str] = set()  # keys of the leases the run claimed and left to expire (at each stall)
        self.staller: psycopg.Connection[Any] | None = None
        self.stalled_until = 0.0
        self.monitor: psycopg.Connection[Any] | None = None
        self.up_since = dt.datetime.fromtimestamp(0, dt.UTC)  # when the server was last back from a restart
        self.kinds: list[str] = []

    def start(self) -> None:
        """The proxy (if the run has network faults), the workers through it, the reaper, the monitor."""
        if set(self.plan.faults) & set(NETWORK_FAULTS):
            self.proxy = FaultProxy(self.dsn).start()
            self.workers_dsn = self.proxy.dsn_through(self.dsn)
        for i in range(self.plan.workers):
            self.start_worker(i)
        args = (self.dsn, self.until, str(self.folder / "reaper.jsonl"), self.plan.store)
        self.sweeper = self.ctx.Process(target=reaper, args=args, daemon=True)
        self.sweeper.start()
        self.monitor = connect(self.dsn)

    def start_worker(self, i: int) -> None:
        seed = self.rng.randrange(2**32)
        name = f"lp-nemesis-worker-{i}"
        plan = self.plan
        args = (self.workers_dsn, name, seed, self.until, str(self.logs[i]), plan.tenants, plan.store, plan.service)
        self.procs[i] = self.ctx.Process(target=worker, args=args, daemon=True)
        self.procs[i].start()

    def strike_until_the_end(self) -> None:
        """Until the run's end: continue paused workers, end a stall that is over, sample the reap
        delays, and at each decision's time strike with the next kind of fault."""
        next_fault = time.time() + self.plan.every
        while time.time() < self.until:
            now = time.time()
            self.continue_paused(now)
            self.end_stall(now)
            self.sample_delays()
            if now >= next_fault and self.plan.faults:
                next_fault = now + self.plan.every
                if not self.kinds:  # every kind once per round, in a seeded order
                    self.kinds = self.rng.sample(self.plan.faults, len(self.plan.faults))
                kind = self.kinds.pop()
                if not self.strike(kind, self.rng.randrange(self.plan.workers), now):
                    continue
                self.report.faults[kind] += 1
            time.sleep(0.02)  # the monitor's sampling period

    def continue_paused(self, now: float) -> None:
        for i, resume in list(self.paused.items()):
            if now >= resume:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.procs[i].pid, signal.SIGCONT)
                del self.paused[i]

    def end_stall(self, now: float) -> None:
        if self.staller is not None and now >= self.stalled_until:
            with contextlib.suppress(psycopg.Error):
                self.staller.execute("ROLLBACK")
            self.staller.close()
            self.staller = None

    def watching(self) -> psycopg.Connection[Any]:
        """The monitor's connection, made again after a restart ended it."""
        if self.monitor is None:
            self.monitor = connect(self.dsn)
        return self.monitor

    def sample_delays(self) -> None:
        for row in self.watching().execute(_OVERDUE, {"up_since": self.up_since}).fetchall():
            overdue = max(0.0, row["overdue"])
            if row["community_id"] == tenant(0):
                self.report.worst_stalled_delay = max(self.report.worst_stalled_delay, overdue)
            else:
                self.report.worst_healthy_delay = max(self.report.worst_healthy_delay, overdue)

    def strike(self, kind: str, i: int, now: float) -> bool:
        """A fault of `kind` (at worker `i`, if it strikes a worker); False if it cannot strike
        now (the worker is paused, a stall holds, no restart or no proxy)."""
        if kind == "kill" and i not in self.paused:
            self.procs[i].kill()
            self.procs[i].join(10)
            self.start_worker(i)
        elif kind == "terminate":
            self.watching().execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                (f"lp-nemesis-worker-{i}",),
            )
        elif kind == "pause" and i not in self.paused:
            os.kill(self.procs[i].pid, signal.SIGSTOP)
            self.paused[i] = now + PAUSE_SECONDS
        elif kind == "restart" and self.restart is not None:
            self.restart_server(self.restart)
        elif kind in NETWORK_FAULTS and self.proxy is not None:
            arm(self.proxy, kind)
        elif kind == "stall" and self.staller is None:
            self.stall(now)
        else:
            return False
        return True

    def restart_server(self, restart: Callable[[str], None]) -> None:
        mode = self.rng.choice(RESTART_MODES)
        if self.monitor is not None:
            self.monitor.close()
        self.monitor = None
        restart(mode)  # every connection is gone; workers reconnect once it answers again
        self.up_since = dt.datetime.now(dt.UTC)
        if self.staller is not None:
            self.staller.close()
            self.staller = None
        self.report.restarts[mode] += 1

    def stall(self, now: float) -> None:
        """Abandon a healthy tenant's lease, and hold the first tenant's claimed rows locked."""
        self.abandoned |= _abandon(self.dsn, self.plan, self.rng)
        self.staller = connect(_named(self.dsn, "lp-nemesis-staller"), Waits(lock=1, idle_in_transaction=30))
        self.staller.execute("BEGIN")
        self.staller.execute(  # what it can lock now: a client holds what it took
            "SELECT 1 FROM workflow_agent_deliveries WHERE community_id = %s AND status = 'claimed'"
            " FOR UPDATE SKIP LOCKED",
            (tenant(0),),
        )
        self.stalled_until = now + STALL_SECONDS

    def kill_everyone(self) -> None:
        for proc in (*self.procs.values(), self.sweeper):
            proc.kill()

    def stop(self) -> None:
        """Continue the paused, end a stall, let every process end (killing what outlives its
        time), close the monitor and the proxy (its counts go to the report)."""
        for i in self.paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.procs[i].pid, signal.SIGCONT)
        if self.staller is not None:
            self.staller.close()
        for proc in (*self.procs.values(), self.sweeper):
            proc.join(10 + WAITS.statement)
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        if self.monitor is not None:
            self.monitor.close()
        if self.proxy is not None:
            self.proxy.close()
            self.report.network.update(self.proxy.counts)


ABANDONER = "lp-nemesis-abandoner"


def _abandon(dsn: str, plan: Plan, rng: random.Random) -> set[str]:
    """Claim a pending delivery of a healthy tenant, with a lease that ends halfway through a
    stall, and drop it: a holder that died. The claim's key, if it claimed one. Through the
    bundled client: the probe is the run's, not the client's under test."""
    if plan.tenants < 2:
        return set()
    key = f"{ABANDONER}/{rng.randrange(2**32)}"
    with (
        contextlib.suppress(Unavailable, ConnectionLost, psycopg.Error),
        DeliveryService(_named(dsn, ABANDONER), WAITS, store_class=plan.store) as service,
    ):
        got = service.execute(m.Claim(tenant(rng.randrange(1, plan.tenants)), TARGET, LEASE_SECONDS, request_key=key))
        return {key} if isinstance(got, m.Claimed) else set()
    return {key}  # it may have claimed: its answer was lost


# After the workers stop: how long past the lease the last sweep waits, and how many times it
# is tried (a sweep that finds a community's fence held, or the server busy, skips it).
DRAIN_MARGIN = 0.5
DRAIN_SWEEPS = 3


def _drain(dsn: str, store_class: type[PostgresDeliveryStore]) -> None:
    """Once no worker runs, every lease a worker took ends within LEASE_SECONDS: wait that
    long (the real clock, as the run's), then sweep with the store under test, so that
    every delivery not settled is claimable again. What is still claimed after this is a
    delivery nobody will process (`_audit`: unprocessed)."""
    time.sleep(LEASE_SECONDS + DRAIN_MARGIN)
    with DeliveryService(_named(dsn, "lp-nemesis-drain"), WAITS, store_class=store_class) as service:
        for _ in range(DRAIN_SWEEPS):
            with contextlib.suppress(Unavailable, ConnectionLost, psycopg.Error):
                if not service.sweep().skipped:
                    return


def _entries(paths: Sequence[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line cut by SIGKILL mid-write
                    yield json.loads(line)


def _audit(
    dsn: str, ids: list[uuid.UUID], logs: Sequence[Path], report: Report, excused: AbstractSet[str] = frozenset()
) -> None:
    """Judge the logs and the rows; `excused`: request keys of claims the run itself abandoned."""
    rows, trail = _rows(dsn)
    _judge_committed(ids, rows, report)
    logged = _Logged()
    for path in logs:
        logged.read(path, report)
    report.cycles = sum(map(len, logged.settled.values()))
    for (claimed, generation), count in logged.claims.items():
        if count > 1:
            report.same_generation.append(f"claimed twice: delivery {claimed} at generation {generation}")
    _judge_settled(logged, rows, report)
    _orphans(trail, logged.claims, logged.unanswered | logged.given_up | set(excused), report)


def _rows(dsn: str) -> tuple[dict[uuid.UUID, dict[str, Any]], list[dict[str, Any]]]:
    """The deliveries' rows by id, and the trail of claims (none if the run's database has no trail)."""
    with connect(dsn) as conn:
        rows = {
            row["id"]: row
            for row in conn.execute(
                "SELECT id, status, lease_generation, lease_until, claimed_at, finished_at"
                " FROM workflow_agent_deliveries"
            ).fetchall()
        }
        trail = []
        if conn.execute("SELECT to_regclass('lp_nemesis_claims') IS NOT NULL AS made").fetchone()["made"]:  # type: ignore[index]  # one row
            trail = conn.execute("SELECT id, generation, claim_key, lease_until, at FROM lp_nemesis_claims").fetchall()
    return rows, trail


def _judge_committed(ids: list[uuid.UUID], rows: dict[uuid.UUID, dict[str, Any]], report: Report) -> None:
    """Lost or unprocessed: each committed delivery's row is there, and not left claimed."""
    for delivery in ids:
        if delivery not in rows:
            report.lost.append(f"lost: delivery {delivery} was committed and is gone")
        elif rows[delivery]["status"] == "claimed":
            held = rows[delivery]
            report.unprocessed.append(
                f"unprocessed: delivery {delivery} is still claimed at generation {held['lease_generation']},"
                f" its lease until {held['lease_until']}, after every worker stopped and the last lease ran out"
            )


@attrs.define
class _Logged:
    """What the workers' logs say the store answered them."""

    settled: defaultdict[str, list[int]] = attrs.Factory(lambda: defaultdict(list))  # generations settled, by id
    resettled: list[dict[str, Any]] = attrs.Factory(list)  # Settled answers that came from a resend
    claims: Counter[tuple[str, int]] = attrs.Factory(Counter)  # (id, generation) -> times handed out
    given_up: set[str] = attrs.Factory(set)  # keys of claims a worker gave up on, their outcome unknown
    unanswered: set[str] = attrs.Factory(set)  # keys of the claims workers were sending when they were killed

    def read(self, path: Path, report: Report) -> None:
        """One worker's log (or the reaper's); its answers are counted in `report`."""
        asking = ""  # the key of the claim this worker sent last and has no answer logged for
        for entry in _entries((path,)):
            if entry["op"] == "claiming":
                if asking:  # the incarnation before was killed while it claimed
                    self.unanswered.add(asking)
                asking = entry["key"]
                continue
            if entry["op"] in ("claim", "lost", "unavailable", "refused"):
                asking = ""
            report.answers[f"{entry['op']}:{entry['answer']}"] += 1
            report.left_by_sweeps += entry.get("left", 0)
            if entry["op"] == "claim" and entry["answer"] == "Claimed":
                self.claims[(entry["id"], entry["gen"])] += 1
            if entry["op"] == "finish" and entry["answer"] == "Settled":
                self.settled[entry["id"]].append(entry["gen"])
                if entry.get("resent_at") is not None:
                    self.resettled.append(entry)
            if entry["op"] == "lost" and entry.get("doing") == "claim":
                self.given_up.add(entry.get("key", ""))
        if asking:  # killed at the end, while it claimed
            self.unanswered.add(asking)


def _judge_settled(logged: _Logged, rows: dict[uuid.UUID, dict[str, Any]], report: Report) -> None:
    """Settled twice or stale accepted: each accepted finish against the others and its row."""
    by_text = {str(k): v for k, v in rows.items()}
    for settled_id, generations in logged.settled.items():
        if len(generations) > 1:
            report.double.append(f"settled twice: delivery {settled_id} at generations {generations}")
        row = by_text.get(settled_id)
        if row is None:
            continue
        if row["status"] != "finished" or row["lease_generation"] != generations[-1]:
            report.stale.append(
                f"stale accepted: delivery {settled_id} settled at generation {generations[-1]}, the row is"
                f" {row['status']} at generation {row['lease_generation']}"
            )
    for entry in logged.resettled:  # told Settled by a resend, though the first attempt had settled it
        row = by_text.get(entry["id"])
        if row is not None and row["finished_at"] is not None and row["finished_at"].timestamp() < entry["resent_at"]:
            report.double.append(
                f"settled twice: delivery {entry['id']} was settled at {row['finished_at']:%H:%M:%S.%f} by a finish"
                f" whose answer was lost, and its resend, sent later, was told Settled again"
            )


def _orphans(
    trail: Sequence[dict[str, Any]], claims: dict[tuple[str, int], int], excused: AbstractSet[str], report: Report
) -> None:
    """Every lease the database handed out must reach the worker that claimed it, unless the
    claim's key is `excused` (its worker was killed while it claimed, the answer may have
    been on its way; or it gave the claim up, its connection lost and the resend too; or
    the run abandoned it), or the lease had run out when the claim's resend, under the same
    key, took another (the model's keyed claim: a key's lease is returned while it holds).
    What is left is a lease nobody holds, its delivery held up until the lease runs out."""
    taken_at: dict[str, list[Any]] = defaultdict(list)  # when each key's claims were made
    for row in trail:
        taken_at[row["claim_key"] or ""].append(row["at"])
    orphaned = []
    for row in trail:
        key, until = row["claim_key"] or "", row["lease_until"]
        if (str(row["id"]), row["generation"]) in claims or key in excused:
            continue
        if until is not None and any(at > until for at in taken_at[key]):
            continue  # ran out before its resend took another
        orphaned.append(f"delivery {row['id']} at generation {row['generation']} under key {key or '(none)'}")
    if orphaned:
        report.orphaned.append(
            f"orphaned leases: {len(orphaned)} claimed and handed to no worker (none killed while claiming it"
            f" or giving it up): {'; '.join(orphaned[:3])}"
        )


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the nemesis as `args` say; 2 (nothing started) for bad arguments."""
    faults = FAULTS if args.faults is None else tuple(f for f in args.faults.split(",") if f)
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or args.duration <= 0 or args.workers < 1 or args.deliveries < 1:
        problem = f"unknown faults {unknown}" if unknown else "--duration, --workers, --deliveries must be positive"
        err.write(f"leaseproof: {problem}\n")
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    store: type[PostgresDeliveryStore] = PostgresDeliveryStore
    service: type[DeliveryService] = DeliveryService
    if args.mutant is not None:
        from leaseproof.impl.mutants import by_name
        from leaseproof.impl.mutants.faults import FAULT_MUTANTS
        from leaseproof.impl.mutants.service import SERVICE_MUTANTS

        mutant = by_name((*SERVICE_MUTANTS, *FAULT_MUTANTS), args.mutant)
        store, service = mutant.store, mutant.service
        out.write(f"mutant: {mutant.name} — {mutant.stands_for}\n")
    with postgres_server(args.dsn, log=lambda line: err.write(line + "\n")) as server:
        if server.restart is None and "restart" in faults:
            if args.faults is not None:
                err.write(
                    "nemesis: the restart fault needs a server leaseproof starts itself, not " + server.source + "\n"
                )
                return 2
            faults = tuple(f for f in faults if f != "restart")
            err.write(f"leaseproof: no restart fault: the server is not one leaseproof started ({server.source})\n")
        out.write(
            f"nemesis seed {seed}: {args.workers} workers, {args.duration:g}s, faults {', '.join(faults) or 'none'}\n"
        )
        with scratch_database(server) as dsn, tempfile.TemporaryDirectory(prefix="lp-nemesis-") as folder:
            plan = Plan(
                seed,
                args.duration,
                args.workers,
                per_tenant=args.deliveries,
                faults=faults,
                store=store,
                service=service,
            )
            report = run(dsn, plan, Path(folder), say=lambda line: out.write(line + "\n"), restart=server.restart)
    return 0 if report.safe and report.live else 1
