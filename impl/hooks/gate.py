"""The statement gate: deterministic interleavings of store operations, without sleeping.

A race is forced by holding one client at a named point while others run, then letting
it go on. A point is around a call, in the client (before or after a statement matched
by its SQL text, or before its COMMIT: a call is sent as `BEGIN; call; COMMIT`, so it
parks holding every lock it took), or inside a function (`pause_at`): the test hook
`lp_test_pause(point)` waits for an advisory lock the schedule's monitor connection
holds while the point is armed. `instrumented(cls)` gives a store class's volatile
PL/pgSQL functions a point at every statement boundary, and the clock's read one
(`CLOCK_READ`: after an operation's snapshot, before it locks or writes anything).
`Pause` is one armed point, fired once, then `release()`d or `rollback()`ed; `Client`
runs one operation at a time on a thread; `Schedule` owns a test's clients and the
monitor. Every wait is for a condition, with a timeout naming it, so a broken schedule
fails instead of hanging. docs/stress.md ("Forced interleavings") says how points work.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import attrs
import psycopg
from psycopg import pq

from leaseproof.impl.connection import connect
from leaseproof.impl.hooks.functions import patches_of
from leaseproof.impl.migrate import Addition, Function, Patch, patched

TIMEOUT = 30.0  # seconds, for every wait of a test
_POLL = 0.005  # seconds between two checks of a polled condition
_PARKED_LIMIT = 300.0  # a client parked in the gate that nobody releases gives up (and rolls back) after this

# -- the points inside functions ------------------------------------------------------------------

# The test hook a variant's functions call at a point. It records the point in a setting
# of the transaction (so that a pause before the COMMIT can ask whether the call passed
# it), then waits for the point's advisory lock, held by the schedule's monitor while the
# point is armed for this backend, and lets it go at once. Its own lock wait is bounded
# generously (a parked client); it returns false, so `IF lp_test_pause(..) THEN END IF`
# does nothing else.
PAUSE_HOOK = Addition("""CREATE FUNCTION lp_test_pause(p_point text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp SET lock_timeout = '300s' AS $$
DECLARE
    k bigint := hashtextextended('leaseproof pause ' || p_point || ' ' || pg_backend_pid()::text, 0);
BEGIN
    PERFORM set_config('leaseproof.passed',
        coalesce(current_setting('leaseproof.passed', true), '') || p_point || ' ', true);
    PERFORM pg_advisory_lock_shared(k);
    PERFORM pg_advisory_unlock_shared(k);
    RETURN false;
END
$$""")

# The key of a point for a backend, as the hook computes it.
_KEY = "hashtextextended('leaseproof pause ' || %(point)s || ' ' || %(pid)s::text, 0)"
_WAITING = f"""
    SELECT EXISTS (
        SELECT 1 FROM pg_locks, (SELECT {_KEY} AS k) AS key
        WHERE locktype = 'advisory' AND pid = %(pid)s AND NOT granted AND objsubid = 1
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND classid::bigint = (key.k >> 32) & 4294967295 AND objid::bigint = key.k & 4294967295
    ) AS waiting
"""
_PASSED = "SELECT coalesce(current_setting('leaseproof.passed', true), '') AS passed"


@attrs.frozen
class Statement:
    """One statement of a function's body, as `instrument` finds them."""

    function: str
    ordinal: int  # 1-based, in the order the statements start in the body
    start: int  # offsets in the (uninstrumented) body
    end: int
    text: str
    before: str  # the point right before it
    after: str | None  # the point right after it (None: it returns or raises, nothing runs after it)
    compound: bool = False  # an IF, CASE, loop or block: it holds statements of its own

    @property
    def name(self) -> str:
        """How a schedule names it: `lp_claim:3`."""
        return f"{self.function}:{self.ordinal}"

    def describe(self) -> str:
        first = " ".join(self.text.split())
        return f"{self.name} ({first if len(first) <= 60 else first[:57] + '...'})"


_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>--[^\n]*|/\*.*?\*/)
      | (?P<string>[Ee]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*')
      | (?P<dollar>\$(?P<tag>[A-Za-z_]\w*)?\$.*?\$(?P=tag)?\$)
      | (?P<quoted>"(?:[^"]|"")*")
      | (?P<word>[A-Za-z_][\w$]*)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


@attrs.frozen
class _Token:
    word: str  # upper-cased if a word, else the character (or "" for a string, comment or space)
    start: int
    end: int


def _tokens(body: str) -> list[_Token]:
    found = []
    for match in _TOKEN.finditer(body):
        kind = match.lastgroup
        if kind in ("space", "comment"):
            continue
        if kind == "word":
            word = match.group().upper()
        elif kind == "other":
            word = match.group()
        else:
            word = ""  # a literal or a quoted name: opaque
        found.append(_Token(word, match.start(), match.end()))
    return found


class _Parser:
    """The statement lists of a PL/pgSQL body: where each statement starts and ends, and
    where each list ends. Enough of the grammar for the shipped functions and their
    variants: blocks (DECLARE, BEGIN, EXCEPTION), IF/ELSIF/ELSE, CASE, LOOP, WHILE, FOR,
    FOREACH, and simple statements up to their semicolon; SQL CASE expressions inside a
    condition are skipped over."""

    def __init__(self, body: str) -> None:
        self.body, self.tokens, self.i = body, _tokens(body), 0
        self.statements: list[tuple[int, int, bool]] = []  # (start, end, falls through)
        self.compound: set[int] = set()  # the starts of statements that hold statements
        self.list_ends: list[tuple[int, bool]] = []  # (offset, reachable)

    def peek(self, ahead: int = 0) -> str:
        j = self.i + ahead
        return self.tokens[j].word if j < len(self.tokens) else ""

    def take(self, *expected: str) -> _Token:
        token = self.tokens[self.i]
        if expected and token.word not in expected:
            raise ValueError(f"expected {' or '.join(expected)} at offset {token.start}, found {token.word!r}")
        self.i += 1
        return token

    def parse(self) -> None:
        while self.peek() == "#":  # a compiler option: #variable_conflict use_column
            line_end = self.body.index("\n", self.tokens[self.i].start)
            while self.i < len(self.tokens) and self.tokens[self.i].start < line_end:
                self.i += 1
        self.block(instrumented=True)

    def block(self, instrumented: bool) -> None:
        if self.peek() == "DECLARE":
            while self.peek() != "BEGIN":
                self.take()
        begin = self.take("BEGIN")
        self.statement_list(begin.end, ("END", "EXCEPTION"), instrumented)
        if self.peek() == "EXCEPTION":
            self.take()
            while self.peek() == "WHEN":
                then = self.until("THEN")
                self.statement_list(then.end, ("WHEN", "END"), instrumented=False)
        self.take("END")

    def until(self, word: str) -> _Token:
        """Skip to `word` outside parentheses and SQL CASE expressions; take it."""
        depth = cases = 0
        while True:
            token = self.take()
            if token.word == "(":
                depth += 1
            elif token.word == ")":
                depth -= 1
            elif depth == 0 and token.word == "CASE":
                cases += 1
            elif depth == 0 and token.word == "END" and cases:
                cases -= 1
            elif depth == 0 and cases == 0 and token.word == word:
                return token

    def statement_list(self, start: int, ends: tuple[str, ...], instrumented: bool) -> None:
        last_end, falls = start, True
        while self.peek() not in ends:
            if not self.peek():
                raise ValueError("the body ended inside a statement list")
            first = self.tokens[self.i]
            if self.peek() in ("IF", "CASE", "LOOP", "WHILE", "FOR", "FOREACH", "BEGIN", "DECLARE"):
                self.compound.add(first.start)
            falls = self.statement()
            end = self.tokens[self.i - 1].end
            if instrumented:
                self.statements.append((first.start, end, falls))
            last_end = end
        if instrumented:
            self.list_ends.append((last_end, falls))

    def statement(self) -> bool:
        """Parse one statement; whether control can go on after it."""
        word = self.peek()
        if word == "IF":
            then = self.until("THEN")
            self.statement_list(then.end, ("ELSIF", "ELSE", "END"), instrumented=True)
            while self.peek() == "ELSIF":
                then = self.until("THEN")
                self.statement_list(then.end, ("ELSIF", "ELSE", "END"), instrumented=True)
            if self.peek() == "ELSE":
                other = self.take()
                self.statement_list(other.end, ("END",), instrumented=True)
            self.take("END")
            self.take("IF")
            self.take(";")
            return True
        if word == "CASE":
            self.take()
            while self.peek() != "WHEN":
                self.take()
            while self.peek() == "WHEN":
                then = self.until("THEN")
                self.statement_list(then.end, ("WHEN", "ELSE", "END"), instrumented=True)
            if self.peek() == "ELSE":
                other = self.take()
                self.statement_list(other.end, ("END",), instrumented=True)
            self.take("END")
            self.take("CASE")
            self.take(";")
            return True
        if word in ("LOOP", "WHILE", "FOR", "FOREACH"):
            loop = self.take() if word == "LOOP" else self.until("LOOP")
            self.statement_list(loop.end, ("END",), instrumented=True)
            self.take("END")
            self.take("LOOP")
            self.take(";")
            return True
        if word in ("BEGIN", "DECLARE"):
            self.block(instrumented=True)
            self.take(";")
            return True
        ends_control = word == "RETURN" and self.peek(1) not in ("QUERY", "NEXT")
        ends_control |= word == "RAISE" and self.peek(1) not in ("DEBUG", "LOG", "INFO", "NOTICE", "WARNING")
        self.until(";")
        return not ends_control


def _instrumentable(function: Function) -> bool:
    """A volatile PL/pgSQL function: the operations, lp_enter, the triggers."""
    head = function.definition[: function.definition.index("$$")]
    return bool(re.search(r"\bLANGUAGE\s+plpgsql\b", head, re.IGNORECASE)) and not re.search(
        r"\b(IMMUTABLE|STABLE)\b", head, re.IGNORECASE
    )


@attrs.frozen
class _Layout:
    statements: tuple[Statement, ...]
    sites: tuple[tuple[int, str], ...]  # (offset in the body, point name), in body order


@functools.cache
def _layout(name: str, body: str) -> _Layout:
    parser = _Parser(body)
    parser.parse()
    offsets = sorted(
        {start for start, _, _ in parser.statements} | {end for end, reachable in parser.list_ends if reachable}
    )
    point = {offset: f"{name}@{n}" for n, offset in enumerate(offsets, 1)}
    ordered = sorted(parser.statements)
    statements = tuple(
        Statement(
            name,
            k,
            start,
            end,
            body[start:end],
            point[start],
            _after(ordered, k - 1, point) if falls else None,
            start in parser.compound,
        )
        for k, (start, end, falls) in enumerate(ordered, 1)
    )
    return _Layout(statements, tuple((offset, point[offset]) for offset in offsets))


def _after(ordered: list[tuple[int, int, bool]], index: int, point: Mapping[int, str]) -> str | None:
    """The point right after statement `index`: the next site at or after its end (the
    next statement of its list, or its list's end)."""
    end = ordered[index][1]
    following = [offset for offset in point if offset >= end]
    return point[min(following)] if following else None


def statements(function: Function) -> tuple[Statement, ...]:
    """The statements of `function`'s body, in order (none for a function `instrument`
    leaves alone)."""
    return _layout(function.name, function.body).statements if _instrumentable(function) else ()


def instrument(function: Function) -> Function:
    """`function` with a point at each statement boundary (itself if it is not a volatile
    PL/pgSQL function)."""
    if not _instrumentable(function):
        return function
    body = function.body
    pieces, last = [], 0
    for offset, name in _layout(function.name, body).sites:
        pieces += [body[last:offset], f"IF lp_test_pause('{name}') THEN END IF; "]
        last = offset
    return function.replaced("".join(pieces) + body[last:])


# The point inside the clock's read (see the module's docstring).
CLOCK_READ = "lp_now@read"
_CLOCK = "lp_now"


def instrumented_patches(patches: Sequence[Patch | Addition]) -> tuple[Patch | Addition, ...]:
    """`patches`, then the hook, then a patch of every instrumentable function that gives it
    its points (its whole body, as `patches` leave it, becomes the instrumented body), and
    the clock's read its point (`CLOCK_READ`)."""
    functions = patched(patches)
    instrumentation = tuple(
        Patch(name, function.body, instrument(function).body)
        for name, function in functions.items()
        if _instrumentable(function) and name != "lp_test_pause"
    )
    clock = functions[_CLOCK].body
    pause = f"BEGIN\n    IF lp_test_pause('{CLOCK_READ}') THEN END IF;\n"
    read = Patch(_CLOCK, clock, clock.replace("BEGIN\n", pause, 1))
    return (*patches, PAUSE_HOOK, *instrumentation, read)


@attrs.frozen
class Points:
    """The points of a variant's functions, named by the statements they surround."""

    functions: Mapping[str, Function]  # the variant's functions before instrumentation, by name

    def statements(self, function: str) -> tuple[Statement, ...]:
        return statements(self.functions[function])

    def statement(self, function: str, containing: str) -> Statement:
        """The one statement of `function` whose text contains `containing`."""
        found = [s for s in self.statements(function) if containing in s.text]
        if len(found) != 1:
            raise ValueError(f"{function}: {len(found)} statements contain {containing!r}, not one")
        return found[0]

    def named(self, name: str) -> Statement:
        """The statement `lp_claim:3` (see `Statement.name`)."""
        function, _, ordinal = name.rpartition(":")
        found = self.statements(function)
        if not ordinal.isdigit() or not 1 <= int(ordinal) <= len(found):
            raise ValueError(f"{function} has no statement {ordinal!r} (it has {len(found)})")
        return found[int(ordinal) - 1]

    def before(self, function: str, containing: str) -> str:
        """The point right before the statement of `function` that contains `containing`."""
        return self.statement(function, containing).before

    def after(self, function: str, containing: str) -> str:
        """The point right after the statement of `function` that contains `containing`."""
        statement = self.statement(function, containing)
        if statement.after is None:
            raise ValueError(f"{statement.describe()}: nothing runs after it")
        return statement.after

    def first(self, function: str) -> str:
        """The point before the first statement of `function`."""
        return self.statements(function)[0].before


def statement_containing(function: Function, offset: int) -> Statement | None:
    """The innermost statement of `function` whose text spans `offset` of its body (None:
    outside every statement, or a function without points)."""
    spanning = [s for s in statements(function) if s.start <= offset < s.end]
    return max(spanning, key=lambda s: s.start) if spanning else None


_INSTRUMENTED: dict[tuple[type, ...], tuple[type, ...]] = {}
_INSTRUMENTING = threading.Lock()


def instrumented(*classes: type) -> tuple[type, ...]:
    """The role classes of one adapter (`classes`, in the order the adapter installs their
    `FUNCTIONS`) with every point: the first lists every class's patches, then the hook
    and the instrumentation; the others are the classes themselves (their patches are
    the first's already). Each call with the same classes returns the same classes; the
    instrumented one carries `POINTS`."""
    with _INSTRUMENTING:
        if classes not in _INSTRUMENTED:
            patches = patches_of(*classes)
            first = classes[0]
            body = {
                "FUNCTIONS": instrumented_patches(patches),
                "POINTS": Points(patched(patches)),
                "__doc__": first.__doc__,
                "__module__": first.__module__,
            }
            _INSTRUMENTED[classes] = (type(first.__name__, (first,), body), *classes[1:])
        return _INSTRUMENTED[classes]


def instrumented_class(cls: type) -> type:
    """The variant of one store class with every point (`instrumented(cls)`)."""
    return instrumented(cls)[0]


def points_of(*classes: type) -> Points:
    """The points of the role classes of one adapter (instrumented or not)."""
    for cls in classes:
        points = getattr(cls, "POINTS", None)
        if isinstance(points, Points):
            return points
    return Points(patched(patches_of(*classes)))


# -- pauses ------------------------------------------------------------------------------------------


@attrs.frozen
class At:
    """A match of a pause before the COMMIT: a transaction in which the client passed the
    point `point` inside a function."""

    point: str


Match = str | Callable[[str], bool] | None


class Aborted(Exception):
    """Raised in a client at a pause point by `Pause.rollback()`: its transaction rolls back."""


class NotReached(Exception):
    """A client finished without reaching the point a schedule waited for: the schedule
    did not happen. Not an AssertionError, so that a test expected to fail on an
    assertion (a strict xfail) cannot pass because its schedule never took place."""


class ScheduleTimeout(Exception):
    """A wait of the schedule did not see its condition in time (not an AssertionError,
    for the reason `NotReached` gives)."""


_CALLED = re.compile(r"\b(lp_\w+)\s*\(")


def called(sql: str) -> str | None:
    """The database function a store's call statement calls (None: none)."""
    found = _CALLED.search(sql)
    return found.group(1) if found else None


def _label(match: Match | At) -> str:
    if match is None:
        return "any statement"
    if isinstance(match, At):
        return f"point {match.point}"
    if isinstance(match, str):
        text = " ".join(match.split())
        return repr(text if len(text) <= 72 else text[:69] + "...")
    return getattr(match, "__name__", repr(match))


def _matches(match: Match | At, sql: str) -> bool:
    """Whether `sql` is a statement `match` names: the same text, or a call of the same
    database function (`SQL_CLAIM` and `SQL_CLAIM_ANY` both call lp_claim), or one the
    predicate accepts. A point (`At`) names no statement."""
    if match is None:
        return True
    if isinstance(match, At):
        return False
    if isinstance(match, str):
        return sql == match or (called(match) is not None and called(match) == called(sql))
    return bool(match(sql))


class Pause:
    """One armed point of a gate; fires at most once."""

    def __init__(self, gate: Gate, kind: str, match: Match | At, label: str | None, parks: bool) -> None:
        self.gate, self.kind, self.match, self.parks = gate, kind, match, parks
        self.label = label or _label(match)
        self.fired = False
        self._parked = threading.Event()
        self._go = threading.Event()
        self._abort = False

    def __repr__(self) -> str:
        where = {"before": "before", "after": "after", "commit": "before the COMMIT of a transaction that ran"}
        return f"client {self.gate.name!r} {where[self.kind]} {self.label}"

    @property
    def parked(self) -> bool:
        """Parked now: reached and not yet released."""
        return self._parked.is_set() and not self._go.is_set()

    def wait_parked(self, timeout: float = TIMEOUT) -> Pause:
        """Block until the client is parked here; fail at once if it finished without getting here."""
        deadline = time.monotonic() + timeout
        while not self._check_parked():
            client = self.gate.client
            if client is not None and client.done and not self._check_parked():
                raise NotReached(f"{self}: the client finished without reaching this point ({client.describe()})")
            if time.monotonic() > deadline:
                raise ScheduleTimeout(f"timed out after {timeout:g}s waiting for {self} to park")
        return self

    def _check_parked(self) -> bool:
        return self._parked.wait(_POLL)

    def release(self) -> None:
        """Let the parked client go on."""
        self._go.set()

    def rollback(self) -> None:
        """Let the client go on by raising `Aborted` where it is parked: its transaction rolls back."""
        self._abort = True
        self._go.set()

    def _reach(self) -> None:
        """Called on the client's thread when this point fires."""
        if self.parks:
            self._parked.set()
            if not self._go.wait(_PARKED_LIMIT):
                raise Aborted(f"{self}: never released")
        if self._abort or not self.parks:
            raise Aborted(f"{self}: rolled back by the schedule")

    def _disarm(self) -> None:
        """Fire no more; roll back the client if it is parked here."""
        self.fired = True
        if not self._go.is_set():
            self.rollback()


class PointPause(Pause):
    """A point inside a database function (`Gate.pause_at`): its advisory lock is held by
    the schedule's monitor from arming to release."""

    def __init__(self, gate: Gate, point: str, label: str | None) -> None:
        super().__init__(gate, "point", At(point), label or f"point {point}", parks=True)
        self.point = point
        self._key = {"point": point, "pid": gate.pid}
        self._held = True
        self._cancelled = False
        monitor = gate.monitor()
        monitor.execute(f"SELECT pg_advisory_lock({_KEY})", self._key)

    def __repr__(self) -> str:
        return f"client {self.gate.name!r} at {self.label}"

    @property
    def parked(self) -> bool:
        return self._held and not self._cancelled and self._waiting()

    def _waiting(self) -> bool:
        row = self.gate.monitor().execute(_WAITING, self._key).fetchone()
        return bool(row and row["waiting"])

    def _check_parked(self) -> bool:
        if self._held and self._waiting():
            self.fired = True
            return True
        time.sleep(_POLL)  # the poll interval of a condition, not a wait for time to pass
        return False

    def release(self) -> None:
        if self._held:
            self._held = False
            self.fired = True
            self.gate.monitor().execute(f"SELECT pg_advisory_unlock({_KEY})", self._key)

    def rollback(self) -> None:
        """Cancel the client's statement where it waits here: its call fails (the gate
        raises `Aborted` in the client) and its transaction rolls back."""
        if not self._held:
            return
        if self._waiting():
            self._cancelled = True
            monitor = self.gate.monitor()
            monitor.execute("SELECT pg_cancel_backend(%(pid)s)", self._key)
            deadline = time.monotonic() + TIMEOUT
            while self._waiting():  # until the cancel has taken it out of the lock's queue
                if time.monotonic() > deadline:
                    raise ScheduleTimeout(f"{self}: the cancelled client still waits after {TIMEOUT:g}s")
                time.sleep(_POLL)  # the poll interval of a condition
        self.release()

    def _disarm(self) -> None:
        self.rollback()

    def _take_cancel(self) -> bool:
        """Whether this pause cancelled the client's statement (once)."""
        cancelled, self._cancelled = self._cancelled, False
        return cancelled


class Gate:
    """A connection whose client can be parked at named points; otherwise the connection itself."""

    def __init__(self, conn: psycopg.Connection[Any], name: str = "client") -> None:
        self.conn, self.name = conn, name
        self.pid = conn.info.backend_pid
        self.client: Client | None = None  # set by `Client`, so a wait can tell "finished" from "slow"
        self.pauses: list[Pause] = []  # every point ever armed, fired or not
        self._lock = threading.Lock()
        self._depth = 0
        self._ran: list[str] = []  # the statements of the current outermost transaction

    # -- arming (from the test's thread) ------------------------------------------

    def pause_before(self, match: Match, label: str | None = None) -> Pause:
        """Park before the next statement that `match`es (see `_matches`)."""
        return self._arm("before", match, label, parks=True)

    def pause_after(self, match: Match, label: str | None = None) -> Pause:
        """Park after the next statement that `match`es has returned (a call of its own has committed)."""
        return self._arm("after", match, label, parks=True)

    def pause_before_commit(self, ran: Match | At = None, label: str | None = None) -> Pause:
        """Park before the COMMIT of the next transaction that ran a statement matching `ran`,
        or passed the point `At(...)`: an explicit one, or a call of its own, which the gate
        then sends as BEGIN; call; COMMIT."""
        return self._arm("commit", ran, label, parks=True)

    def rollback_before_commit(self, ran: Match | At = None, label: str | None = None) -> Pause:
        """Without parking: abort the next such transaction where it would commit."""
        return self._arm("commit", ran, label, parks=False)

    def pause_at(self, point: str, label: str | None = None) -> Pause:
        """Park at `point` inside a database function (`Points`: the client's store must be
        an `instrumented` variant, or call `lp_test_pause(point)` itself). Needs the
        client of a `Schedule`, whose monitor holds the point."""
        pause = PointPause(self, point, label)
        with self._lock:
            self.pauses.append(pause)
        return pause

    def _arm(self, kind: str, match: Match | At, label: str | None, parks: bool) -> Pause:
        pause = Pause(self, kind, match, label, parks)
        with self._lock:
            self.pauses.append(pause)
        return pause

    def monitor(self) -> psycopg.Connection[Any]:
        if self.client is None:
            raise RuntimeError(f"client {self.name!r}: a point inside a function needs a Schedule's client")
        return self.client.schedule.monitor

    def parked_at(self) -> Pause | None:
        return next((p for p in self.pauses if p.parked), None)

    def unstick(self) -> None:
        """Disarm every point that has not fired, and roll back a parked client."""
        with self._lock:
            pauses = list(self.pauses)
            for pause in pauses:
                if not isinstance(pause, PointPause):
                    pause.fired = True
        for pause in pauses:
            pause._disarm()

    # -- the connection's surface (on the client's thread) ---------------------------

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> psycopg.Cursor[Any]:
        self._fire("before", lambda m: _matches(m, query))
        if self._depth == 0 and self._may_commit_here(query):
            cursor = self._alone(query, params, **kwargs)
        else:
            cursor = self._send(query, params, **kwargs)
            if self._depth:
                self._ran.append(query)
        self._fire("after", lambda m: _matches(m, query))
        return cursor

    def _send(self, query: Any, params: Any, **kwargs: Any) -> psycopg.Cursor[Any]:
        try:
            return self.conn.execute(query, params, **kwargs)
        except psycopg.errors.QueryCanceled as exc:
            cancelled = [p for p in self.pauses if isinstance(p, PointPause) and p._take_cancel()]
            if cancelled:
                raise Aborted(f"{cancelled[0]}: rolled back by the schedule") from exc
            raise

    def _may_commit_here(self, query: Any) -> bool:
        """Whether a commit point armed now may fire at the end of `query`, sent on its own."""
        if self.conn.info.transaction_status != pq.TransactionStatus.IDLE:
            return False
        with self._lock:
            return any(
                not p.fired and p.kind == "commit" and (isinstance(p.match, At) or _matches(p.match, query))
                for p in self.pauses
            )

    def _alone(self, query: Any, params: Any, **kwargs: Any) -> psycopg.Cursor[Any]:
        """`query`, its own transaction, sent as BEGIN; query; COMMIT, with the commit point between."""
        with self.conn.transaction():
            cursor = self._send(query, params, **kwargs)
            passed = self._passed()
            self._fire("commit", lambda m: _commits(m, [query], passed))
        return cursor

    def _passed(self) -> frozenset[str]:
        """The points the current transaction passed (if a commit point asks for one)."""
        with self._lock:
            asks = any(not p.fired and p.kind == "commit" and isinstance(p.match, At) for p in self.pauses)
        if not asks:
            return frozenset()
        row = self.conn.execute(_PASSED).fetchone()
        text = row["passed"] if isinstance(row, dict) else row[0] if row else ""
        return frozenset(text.split())

    def transaction(self, *args: Any, **kwargs: Any) -> _GatedTransaction:
        return _GatedTransaction(self, self.conn.transaction(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def as_connection(self) -> psycopg.Connection[dict[str, Any]]:
        """This gate, typed as the connection it stands in for (what a store is given)."""
        return cast("psycopg.Connection[dict[str, Any]]", self)

    def _fire(self, kind: str, matches: Callable[[Match | At], bool]) -> None:
        with self._lock:
            pause = next((p for p in self.pauses if not p.fired and p.kind == kind and matches(p.match)), None)
            if pause is not None:
                pause.fired = True
        if pause is not None:
            pause._reach()


def _commits(match: Match | At, ran: list[str], passed: frozenset[str]) -> bool:
    """Whether a commit point armed with `match` fires for a transaction that ran `ran` and
    passed the points `passed`."""
    if isinstance(match, At):
        return match.point in passed
    return match is None or any(_matches(match, sql) for sql in ran)


class _GatedTransaction:
    """`conn.transaction()`, with the gate's commit point at the outermost exit."""

    def __init__(self, gate: Gate, inner: contextlib.AbstractContextManager[psycopg.Transaction]) -> None:
        self.gate, self.inner = gate, inner

    def __enter__(self) -> psycopg.Transaction:
        entered = self.inner.__enter__()
        self.gate._depth += 1
        if self.gate._depth == 1:
            self.gate._ran = []
        return entered

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        try:
            if exc_type is None and self.gate._depth == 1:
                ran = list(self.gate._ran)
                try:
                    passed = self.gate._passed()
                    self.gate._fire("commit", lambda m: _commits(m, ran, passed))
                except Aborted as aborted:
                    self.inner.__exit__(Aborted, aborted, aborted.__traceback__)
                    raise
            return bool(self.inner.__exit__(exc_type, exc, tb))
        finally:
            self.gate._depth -= 1


class Client:
    """One gated connection and the thread that runs its operations, one at a time."""

    def __init__(self, gate: Gate, schedule: Schedule) -> None:
        self.gate, self.schedule, self.name = gate, schedule, gate.name
        gate.client = self
        self.pid = gate.pid
        self._thread: threading.Thread | None = None
        self._value: Any = None
        self._error: BaseException | None = None

    def start(self, operation: Callable[[], Any]) -> Client:
        """Run `operation` on this client's thread; it must use this client's gate only."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"client {self.name!r} is still running its previous operation")
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(operation,), name=f"client {self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self, operation: Callable[[], Any]) -> None:
        try:
            self._value = operation()
        except BaseException as error:  # noqa: BLE001 - handed to the test by result()
            self._error = error

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def describe(self) -> str:
        if not self.done:
            return "still running"
        return f"raised {self._error!r}" if self._error is not None else f"returned {self._value!r}"

    def wait_finished(self, timeout: float = TIMEOUT) -> Client:
        if self._thread is None:
            raise RuntimeError(f"client {self.name!r} was never started")
        self._thread.join(timeout)
        if self._thread.is_alive():
            parked = self.gate.parked_at()
            where = f" (it is parked: {parked})" if parked else ""
            raise ScheduleTimeout(f"timed out after {timeout:g}s waiting for client {self.name!r} to finish{where}")
        return self

    def result(self, timeout: float = TIMEOUT) -> Any:
        """The operation's return value; its exception is re-raised here."""
        self.wait_finished(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def run(self, operation: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
        """`start` and `result`: one operation, to its end."""
        return self.start(operation).result(timeout)

    def blocked_by(self) -> list[int]:
        """The backends this client's backend now waits for, inside PostgreSQL (the
        monitor's, which holds the points a parked client waits at, left out)."""
        row = self.schedule.monitor.execute("SELECT pg_blocking_pids(%s) AS pids", (self.pid,)).fetchone()
        monitor = self.schedule.monitor.info.backend_pid
        return [pid for pid in row["pids"] if pid != monitor]  # type: ignore[index]  # always one row

    def wait_blocked(self, timeout: float = TIMEOUT) -> Client:
        """Until this client's backend waits for a lock; fail if it finishes instead."""
        if self.wait_blocked_or_finished(timeout) == "finished":
            raise AssertionError(f"client {self.name!r} finished instead of blocking on a lock ({self.describe()})")
        return self

    def wait_blocked_or_finished(self, timeout: float = TIMEOUT) -> str:
        """Until this client's backend waits for a lock ("blocked") or its operation ended ("finished")."""
        return self._wait_for(timeout, "to block on a lock or finish")

    def wait_blocked_or_parked(self, pause: Pause, timeout: float = TIMEOUT) -> str:
        """Until this client's backend waits for a lock another holds ("blocked"), or it is
        parked at `pause` ("parked"); fail if it finishes instead."""
        if (seen := self._wait_for(timeout, f"to block on a lock or park at {pause.label}", pause)) == "finished":
            raise AssertionError(f"client {self.name!r} finished instead of blocking or parking ({self.describe()})")
        return seen

    def _wait_for(self, timeout: float, what: str, expected: Pause | None = None) -> str:
        deadline = time.monotonic() + timeout
        while True:
            if self.done:
                return "finished"
            if self.blocked_by():
                return "blocked"
            if (parked := self.gate.parked_at()) is not None:
                if parked is expected:
                    return "parked"
                raise AssertionError(f"{parked}: parked there instead of blocking on a lock or finishing")
            if time.monotonic() > deadline:
                raise ScheduleTimeout(f"timed out after {timeout:g}s waiting for client {self.name!r} {what}")
            time.sleep(_POLL)  # the poll interval of a condition, not a wait for time to pass


class Schedule:
    """The clients of one test on one database, and the monitor connection that watches
    them (and holds the points inside functions that are armed)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.monitor = connect(dsn)
        self.clients: list[Client] = []
        self._owned: list[psycopg.Connection[Any]] = []

    def client(self, name: str, conn: psycopg.Connection[Any] | None = None) -> Client:
        """A client behind a gate: on a new connection (autocommit, UTC, dict rows), or on
        `conn`, which its owner keeps (and closes); hand `client.gate` to a store in its place."""
        gate = Gate(conn if conn is not None else connect(self.dsn), name)
        client = Client(gate, self)
        self.clients.append(client)
        if conn is None:
            self._owned.append(gate.conn)
        return client

    def close(self) -> None:
        """Unstick every client (parked ones roll back), wait for them, close every connection."""
        for client in self.clients:
            client.gate.unstick()
        for client in self.clients:
            if client._thread is not None:
                client._thread.join(TIMEOUT)
        for conn in self._owned:
            conn.close()
        self.monitor.close()

    def __enter__(self) -> Schedule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "CLOCK_READ",
    "PAUSE_HOOK",
    "TIMEOUT",
    "Aborted",
    "At",
    "Client",
    "Gate",
    "NotReached",
    "Pause",
    "Points",
    "Schedule",
    "ScheduleTimeout",
    "Statement",
    "instrument",
    "instrumented",
    "instrumented_class",
    "points_of",
    "statement_containing",
    "statements",
]
