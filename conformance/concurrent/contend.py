"""Contention at the database, for any implementation: the harness holds the locks the
implementation's statements take, and lets them go when the statements have piled up.

`leaseproof stress --contend P` drives an implementation it knows only through its
sessions and the database it announces. While rounds run, the `Contender` watches that
database's `pg_locks` and `pg_stat_activity` and learns what the implementation's backends
lock: tables (by the mode a statement takes on them) and advisory keys. In a seeded
fraction `P` of rounds, before the round starts, it takes one or two of those locks from
connections of its own, each in a mode that makes the implementation's statements wait:

- a row of a table they lock or write (`FOR KEY SHARE`, `FOR SHARE` or `FOR UPDATE`),
- a table they write (`LOCK TABLE ... IN SHARE MODE`, or `EXCLUSIVE`, which a `FOR
  UPDATE` waits for too),
- an advisory key they take (exclusive, or shared, which an exclusive taker waits for).

Then the round runs. Statements that need what is held wait; reads go on. When no
statement of the implementation is left running, only waiting (or the round is over, or
HOLD_SECONDS have passed), the holds go, one at a time in a seeded order, each once the
last release has settled. Each records the statements that waited when it went, by their
text; a replay lets it go once those wait again. So a claim that read a row and then writes it, a check and the
act that trusts it, two writers of one key: they meet at the release, where they
re-check, or fail to, all at once. Seen from the client, that is only a delay. While the
round still runs, a new wave of holds is drawn as soon as one has gone (at most WAVES a
round): the statements let go are running again, and their next ones, the act after a
check, meet it.

The injector never waits itself (`SKIP LOCKED`, `NOWAIT`, `pg_try_advisory_xact_lock`, and
a `lock_timeout` of moments for a table's own lock), so it is in no deadlock and takes
nothing a backend already holds. What it holds can
still be seen: a claim passes over a row it holds (`SKIP LOCKED`), a sweep over a tenant
whose fence key it holds. Its holds are recorded in the history as stalls of every tenant
(`Stall(by="contention")`), so the checker allows exactly that, while they last, and does
not call the waits a finding. docs/stress.md says more.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from leaseproof.conformance.concurrent.faults import INJECTOR, Cut, FaultError, RoundFault, connect_injector
from leaseproof.conformance.concurrent.history import Stall
from leaseproof.conformance.harness.interleave import signature
from leaseproof.conformance.lockstep import world as w

HOLD_SECONDS = 1.0  # the longest a hold waits for the round's statements to pile up behind it
SETTLE_POLL = 0.001  # seconds between looks at the implementation's backends
SETTLED_LOOKS = 3  # consecutive looks with nothing running: the statements have piled up
LEARN_POLL = 0.002  # seconds between looks at pg_locks in a round without holds
WAVES = 3  # holds taken in a round, at most: before it starts, then again as each wave is let go

# Locks held by the implementation's backends (every client of the database but the
# injectors'): relation locks on user tables, and advisory locks.
_SEEN = """
    SELECT l.locktype, l.mode, l.classid, l.objid, l.objsubid, n.nspname AS schema, c.relname AS table
    FROM pg_locks l
    JOIN pg_stat_activity a ON a.pid = l.pid
    LEFT JOIN pg_class c ON l.locktype = 'relation' AND c.oid = l.relation
    LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE a.datname = current_database() AND a.backend_type = 'client backend'
      AND a.pid <> pg_backend_pid() AND a.application_name IS DISTINCT FROM %(injector)s
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND (l.locktype = 'advisory'
           OR (l.locktype = 'relation' AND c.relkind IN ('r', 'p')
               AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'))
"""
# How many of the implementation's backends run a statement without waiting for a lock,
# how many wait for one, and the statements that wait.
_RUNNING = """
    SELECT count(*) FILTER (WHERE state = 'active' AND wait_event_type IS DISTINCT FROM 'Lock') AS running,
           count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock') AS waiting,
           coalesce(array_agg(query) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock'), '{}') AS parked
    FROM pg_stat_activity
    WHERE datname = current_database() AND backend_type = 'client backend'
      AND pid <> pg_backend_pid() AND application_name IS DISTINCT FROM %(injector)s
"""
_PRIMARY_KEY = """
    SELECT a.attname AS column
    FROM pg_index i
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
    WHERE i.indrelid = %(table)s::regclass AND i.indisprimary
    ORDER BY array_position(i.indkey::int2[], a.attnum)
"""
# The modes a statement that locks rows, or writes them, takes on its table.
_ROW_LOCKING = frozenset({"RowShareLock", "RowExclusiveLock"})
_WRITING = frozenset({"RowExclusiveLock"})
ROW_MODES = ("KEY SHARE", "SHARE", "UPDATE")
TABLE_MODES = ("SHARE", "EXCLUSIVE")
ADVISORY_MODES = ("exclusive", "shared")


@attrs.frozen
class Held:
    """One lock the injector held in a round: what (`kind`: row, table or advisory), which
    (`target`, for people), in which `mode`, released `order`-th, with `waiting` of the
    implementation's statements waiting for a lock when it was let go, `parked` the signatures
    of those statements (interleave.signature: their text, literals out). How to take it again
    (a replay): a row by `table` and `key` (its primary key's columns and values, or the whole
    row where the table has none, matched with jsonb `@>`), a table by `table`, an advisory
    key by the `arguments` of pg_advisory_xact_lock."""

    kind: str
    target: str
    mode: str
    order: int = 0
    waiting: int = 0
    wave: int = 0
    table: str = ""
    key: Any = None
    arguments: tuple[int, ...] = ()
    parked: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        taken = {"row": {"table": self.table, "key": self.key}, "table": {"table": self.table}}
        how = taken.get(self.kind, {"arguments": list(self.arguments)})
        fields = {"kind": self.kind, "target": self.target, "mode": self.mode, "order": self.order}
        return {**fields, "waiting": self.waiting, "parked": list(self.parked), "wave": self.wave, **how}

    @classmethod
    def from_json(cls, data: Any) -> Held:
        """The hold `to_json` wrote; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"a hold is an object, not {type(data).__name__}")
        kind, mode, order = data.get("kind"), data.get("mode"), data.get("order")
        modes = {"row": [f"FOR {m}" for m in ROW_MODES], "table": [f"{m} MODE" for m in TABLE_MODES],
                 "advisory": list(ADVISORY_MODES)}  # fmt: skip
        if kind not in modes or mode not in modes[kind]:
            raise ValueError(f"a hold's kind and mode: {kind!r} {mode!r} is none of {modes}")
        if not isinstance(order, int) or isinstance(order, bool) or order < 1:
            raise ValueError(f"a hold's order is a positive integer, not {order!r}")
        waiting = data.get("waiting", 0)
        if not isinstance(waiting, int) or isinstance(waiting, bool) or waiting < 0:
            raise ValueError(f"a hold's waiting is a count, not {waiting!r}")
        wave = data.get("wave", 0)
        if not isinstance(wave, int) or isinstance(wave, bool) or not 0 <= wave < WAVES:
            raise ValueError(f"a hold's wave is one of 0 to {WAVES - 1}, not {wave!r}")
        table, arguments = data.get("table", ""), data.get("arguments", [])
        if kind != "advisory" and (not isinstance(table, str) or table.count(".") < 1):
            raise ValueError(f"a {kind} hold names its table as schema.table, not {table!r}")
        if kind == "row" and not isinstance(data.get("key"), dict):
            raise ValueError("a row hold names its row by an object of column values (key)")
        if kind == "advisory" and (
            not isinstance(arguments, list) or len(arguments) not in (1, 2)
            or not all(isinstance(a, int) and not isinstance(a, bool) for a in arguments)
        ):  # fmt: skip
            raise ValueError(f"an advisory hold's arguments are one or two integers, not {arguments!r}")
        parked = data.get("parked", [])  # absent from files written before it was recorded
        if not isinstance(parked, list) or not all(isinstance(p, str) for p in parked):
            raise ValueError(f"a hold's parked statements are a list of strings, not {parked!r}")
        target = data.get("target", "")
        return cls(kind, str(target), mode, order, waiting, wave, table if kind != "advisory" else "",
                   data.get("key"), tuple(arguments), tuple(sorted(parked)))  # fmt: skip


Schedule = tuple[tuple[Held, ...], ...]
"""What the injector held in each round of one run of a program (an empty tuple: nothing)."""


Key = tuple[int, int, int]  # an advisory key as pg_locks names it: classid, objid, objsubid


@attrs.define
class LockMap:
    """What the implementation's backends were seen to lock, and how often: tables by the
    modes taken on them, and advisory keys. A hold is drawn in proportion to how often its
    lock was seen: what the implementation locks most is where its statements meet."""

    tables: dict[str, collections.Counter[str]] = attrs.Factory(dict)
    advisory: collections.Counter[Key] = attrs.Factory(collections.Counter)

    def learn(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if row["locktype"] == "advisory":
                self.advisory[(row["classid"], row["objid"], row["objsubid"])] += 1
            else:
                self.tables.setdefault(f"{row['schema']}.{row['table']}", collections.Counter())[row["mode"]] += 1

    def row_tables(self) -> dict[str, int]:
        """The tables whose rows statements lock or write, each with how often."""
        return self._tables(_ROW_LOCKING)

    def written_tables(self) -> dict[str, int]:
        return self._tables(_WRITING)

    def keys(self) -> dict[Key, int]:
        return dict(sorted(self.advisory.items()))

    def _tables(self, modes: frozenset[str]) -> dict[str, int]:
        seen = {table: sum(n for mode, n in taken.items() if mode in modes) for table, taken in self.tables.items()}
        return {table: n for table, n in sorted(seen.items()) if n}


def weighted(choices: random.Random, seen: dict[Any, int]) -> Any:
    """One of `seen`'s keys, drawn in proportion to its count (in the keys' order: seeded)."""
    return choices.choices(list(seen), weights=list(seen.values()))[0]


def advisory_arguments(key: Key) -> tuple[int, ...]:
    """The arguments of pg_advisory_xact_lock that take the key pg_locks shows as `key`: one
    bigint (objsubid 1: its high and low halves), or two integers (objsubid 2)."""
    classid, objid, objsubid = key
    if objsubid == 1:
        whole = (classid << 32) | objid
        return (whole - (1 << 64) if whole >= 1 << 63 else whole,)
    return tuple(half - (1 << 32) if half >= 1 << 31 else half for half in (classid, objid))


def _in_transaction(
    conn: psycopg.Connection[Any], take: Callable[[psycopg.Connection[Any]], Held | None], what: str
) -> Held | None:
    """`take`'s hold, in a transaction of `conn` that stays open while it is held: None (and the
    transaction rolled back) if it could not be taken without waiting."""
    try:
        conn.execute("BEGIN")
        held = take(conn)
    except psycopg.errors.LockNotAvailable:
        held = None
    except psycopg.Error as exc:
        raise FaultError(f"could not take {what}: {exc}") from exc
    if held is None:
        conn.execute("ROLLBACK")
    return held


def _lock_table(conn: psycopg.Connection[Any], table: str, mode: str) -> None:
    """`LOCK TABLE` in `mode` (as "SHARE MODE"), without waiting (LockNotAvailable if held)."""
    relation = sql.Identifier(*table.split(".", 1))
    conn.execute(sql.SQL("LOCK TABLE {} IN {} NOWAIT").format(relation, sql.SQL(mode)))


def _try_advisory(conn: psycopg.Connection[Any], held: Held) -> bool:
    """Whether the advisory key `held` names was taken, in its mode, without waiting."""
    function = "pg_try_advisory_xact_lock" + ("_shared" if held.mode == "shared" else "")
    placeholders = sql.SQL(", ").join(sql.Placeholder() for _ in held.arguments)
    query = sql.SQL("SELECT {}({}) AS got").format(sql.Identifier(function), placeholders)
    row = conn.execute(query, held.arguments).fetchone()
    return row is not None and bool(row["got"])


class Contender(RoundFault):
    """Holds locks the implementation takes, in a `rate` fraction of rounds (see the module);
    or, given a `script` (the schedule of a run, as `schedule()` gave it), exactly those holds
    in exactly those rounds, let go in their recorded order: a replay."""

    kind = "contend"

    def __init__(self, dsn: str, rate: float, seed: int, holders: int = 2, script: Schedule | None = None) -> None:
        super().__init__(rate, seed)
        self.script = script
        if script is not None:
            holders = max([holders, *(len(holds) for holds in script)])
        self.choices = random.Random(seed ^ 0xC0DE)
        self.watch = connect_injector(dsn)
        self.conns = [connect_injector(dsn) for _ in range(holders)]
        for conn in self.conns:
            # A table's own lock, which taking a row of it needs, may be held (by another
            # holder, or a statement of the implementation): then that hold is not taken.
            conn.execute("SET lock_timeout = '20ms'")
        self.map = LockMap()
        self.held: list[tuple[psycopg.Connection[Any], Held]] = []
        self.began: int | None = None
        self.rounds: list[tuple[Held, ...]] = []  # what each round of the last run held
        self.untaken: list[str] = []  # holds of the script that could not be taken again
        self.waiting = 0  # statements seen waiting at a release, over the run
        self._pk: dict[str, list[str]] = {}

    def schedule(self) -> Schedule:
        """What each round of the last run held, in the order they were let go: a replay's script."""
        return tuple(self.rounds)

    def due(self) -> Cut | None:
        self.rounds.append(())
        if self.script is not None:
            turn = len(self.rounds) - 1
            return Cut(0.0, 0.0, self.kind) if turn < len(self.script) and self.script[turn] else None
        # Every round is watched (a round without holds teaches the map); `kind` says which hold.
        cut = super().due()
        return cut if cut is not None else Cut(0.0, 0.0, "learn")

    def record_into(self, recorder: Any) -> None:
        super().record_into(recorder)
        self.rounds = []

    def before_round(self, cut: Cut) -> None:
        if cut.kind == "learn" or self.recorder is None:
            return
        self.began = self.recorder.tick()
        self._take_wave(0)

    def _take_wave(self, wave: int) -> None:
        """The holds of a round's `wave`-th wave: drawn from the map, or the script's."""
        if self.script is not None:
            again = [held for held in self.script[len(self.rounds) - 1] if held.wave == wave]
            for conn, one in zip(self.conns, again, strict=False):
                held = self._take_again(conn, one)
                if held is None:
                    self.untaken.append(f"round {len(self.rounds)}: {one.kind} {one.target} ({one.mode})")
                else:
                    self.held.append((conn, held))
            return
        wanted = 1 + self.choices.randrange(len(self.conns))
        for conn in self.conns[:wanted]:
            held = self._take(conn)
            if held is not None:
                self.held.append((conn, held))

    def during_round(self, done: threading.Event, cut: Cut) -> bool:
        if cut.kind != "learn":
            self.counts.rounds_faulted += 1
        if cut.kind == "learn" or not self.held:
            if cut.kind != "learn":
                self.counts.missed += 1  # nothing learned yet, or all of it held by others
            while not done.is_set():
                self._learn()
                done.wait(LEARN_POLL)
            return False
        released: list[Held] = []
        for wave in range(WAVES):
            if wave:  # the statements let go are running again: hold what their next ones need
                if done.is_set():
                    break
                self._take_wave(wave)
                if not self.held:
                    break
            order = list(range(len(self.held)))
            if self.script is None:
                self.choices.shuffle(order)
            else:
                order.sort(key=lambda index: self.held[index][1].order)
            for index in order:
                # A replay lets a hold go once the statements that waited for a lock when it went
                # in the run it replays wait again, and as many (or the round is over, or
                # HOLD_SECONDS have passed).
                conn, held = self.held[index]
                waiting, parked = (
                    self._settle(done, held.waiting, held.parked) if self.script is not None else self._settle(done)
                )
                self._release(conn)
                self.waiting += waiting
                released.append(attrs.evolve(held, order=len(released) + 1, waiting=waiting, parked=parked, wave=wave))
            self.held = []
        self._record(released)
        self.counts.ended += 1
        return True

    def close(self) -> None:
        for conn in (self.watch, *self.conns):
            conn.close()

    # -- the steps -------------------------------------------------------------------------

    def _learn(self) -> None:
        try:
            self.map.learn(self.watch.execute(_SEEN, {"injector": INJECTOR}).fetchall())
        except psycopg.Error as exc:
            raise FaultError(f"could not read the database's locks: {exc}") from exc

    def _take(self, conn: psycopg.Connection[Any]) -> Held | None:
        """One lock the map knows of, chosen by the seed, taken without waiting: None if there
        is none yet, or what was chosen is held by someone else."""
        kinds = [k for k, known in (("row", self.map.row_tables()), ("table", self.map.written_tables()),
                                    ("advisory", self.map.keys())) if known]  # fmt: skip
        if not kinds:
            return None
        take = {"row": self._take_row, "table": self._take_table, "advisory": self._take_advisory}
        return _in_transaction(conn, take[self.choices.choice(kinds)], "a lock the implementation takes")

    def _take_row(self, conn: psycopg.Connection[Any]) -> Held | None:
        table = weighted(self.choices, self.map.row_tables())
        mode = self.choices.choice(ROW_MODES)
        pick = self.choices.random()
        relation = sql.Identifier(*table.split(".", 1))
        count = conn.execute(sql.SQL("SELECT count(*) AS n FROM {}").format(relation)).fetchone()
        if count is None or not count["n"]:
            return None
        order = sql.SQL(", ").join(sql.Identifier(c) for c in self._primary_key(conn, table)) or sql.SQL("ctid")
        row = conn.execute(
            sql.SQL("SELECT to_jsonb(t) AS row FROM {} t ORDER BY {} OFFSET %s LIMIT 1 FOR {} SKIP LOCKED").format(
                relation, order, sql.SQL(mode)
            ),
            (int(pick * count["n"]),),
        ).fetchone()
        if row is None:
            return None
        primary = self._primary_key(conn, table)
        key = {column: row["row"][column] for column in primary} if primary else row["row"]
        return Held("row", f"{table} {row['row']}", f"FOR {mode}", table=table, key=key)

    def _take_table(self, conn: psycopg.Connection[Any]) -> Held:
        table = weighted(self.choices, self.map.written_tables())
        mode = f"{self.choices.choice(TABLE_MODES)} MODE"
        _lock_table(conn, table, mode)
        return Held("table", table, mode, table=table)

    def _take_advisory(self, conn: psycopg.Connection[Any]) -> Held | None:
        arguments = advisory_arguments(weighted(self.choices, self.map.keys()))  # drawn first, then the mode
        mode = self.choices.choice(ADVISORY_MODES)
        held = Held("advisory", "key " + ", ".join(map(str, arguments)), mode, arguments=arguments)
        return held if _try_advisory(conn, held) else None

    def _take_again(self, conn: psycopg.Connection[Any], held: Held) -> Held | None:
        """The hold a script names, taken without waiting: None if it is not there to take (no
        such row, or someone holds it)."""

        def take(conn: psycopg.Connection[Any]) -> Held | None:
            if held.kind == "advisory":
                return held if _try_advisory(conn, held) else None
            if held.kind == "table":
                _lock_table(conn, held.table, held.mode)
                return held
            relation = sql.Identifier(*held.table.split(".", 1))
            query = sql.SQL("SELECT 1 FROM {} t WHERE to_jsonb(t) @> %s LIMIT 1 {} NOWAIT").format(
                relation, sql.SQL(held.mode)
            )
            return held if conn.execute(query, (Jsonb(held.key),)).fetchone() is not None else None

        return _in_transaction(conn, take, f"the hold the schedule names ({held.target})")

    def _primary_key(self, conn: psycopg.Connection[Any], table: str) -> list[str]:
        if table not in self._pk:
            rows = conn.execute(_PRIMARY_KEY, {"table": table}).fetchall()
            self._pk[table] = [r["column"] for r in rows]
        return self._pk[table]

    def _settle(
        self, done: threading.Event, enough: int = 1, statements: tuple[str, ...] = ()
    ) -> tuple[int, tuple[str, ...]]:
        """Until the implementation's statements have piled up (at least `enough` waiting for a
        lock, `statements` among them, and none running, over SETTLED_LOOKS looks), the round is
        over, or HOLD_SECONDS have passed: how many wait, and the signatures of the statements
        that do. (Nothing running and nothing waiting is a round not started yet, or between
        statements: it goes on.)"""
        deadline = time.monotonic() + HOLD_SECONDS
        wanted = collections.Counter(statements)
        piled, waiting, parked = 0, 0, collections.Counter[str]()
        while piled < SETTLED_LOOKS and not done.is_set() and time.monotonic() < deadline:
            try:
                row = self.watch.execute(_RUNNING, {"injector": INJECTOR}).fetchone()
            except psycopg.Error as exc:
                raise FaultError(f"could not watch the implementation's backends: {exc}") from exc
            assert row is not None
            waiting, parked = row["waiting"], collections.Counter(map(signature, row["parked"]))
            there = waiting >= max(enough, 1) and not row["running"] and not wanted - parked
            piled = piled + 1 if there else 0
            self._learn()  # what the waiting statements hold and ask for
            done.wait(SETTLE_POLL)
        return waiting, tuple(sorted(parked.elements()))

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error as exc:
            raise FaultError(f"could not let a held lock go: {exc}") from exc

    def _record(self, released: list[Held]) -> None:
        """The round's holds, into the history: one stall of every tenant, from before the
        first was taken to after the last went (what a hold lets others see is anyone's)."""
        recorder, began = self.recorder, self.began
        assert recorder is not None and began is not None
        patient, letting_go = recorder.tick(), recorder.tick()
        ended = recorder.tick()
        for tenant in w.COMMUNITIES.values():
            recorder.stalled(Stall(tenant, began, patient, letting_go, ended, by="contention"))
        self.rounds[-1] = tuple(released)
