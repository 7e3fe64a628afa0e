"""Record the order in which several clients' statements reached PostgreSQL, and force it again.

Every client of a queue connects through a `FaultProxy` (proxy.py) whose observer this is. While
`recording()` is open, each request a connection sends (a simple Query, or an extended-protocol
batch up to its Sync) and each response that comes back whole is an `Event`, in the order the
proxy saw them: the interleaving of the clients at the wire, whatever language or driver they use.
A connection is known by its *role*, the order in which it first sent something while recording.

`forcing(events)` runs them again in that order: a connection's request is held until every event
recorded before it has happened (requests sent, responses back), so a statement that ran after
another client's statement returned runs after it again, and one that was sent while another
was still running (waiting on a lock, say) is sent while it runs again. A connection takes the
role whose recorded requests begin as its own do (`signature`: the statement's text with its
literals out), the first such role in the recorded order, so clients that send the same
statements may swap roles, which changes nothing; a pool's connections, which begin alike,
take theirs once a statement tells them apart. Every wait is bounded (`STEP_WAIT`); what did
not go as recorded (a request nobody recorded, a statement that differs, a wait that timed out)
is a divergence, and after the first one nothing more is held: the run goes on untouched and
says why it could not be forced.

What the wire cannot order is what happens inside one statement while another runs: a race
that lives there may not come back even when every statement ran in its recorded order.
"""

from __future__ import annotations

import contextlib
import re
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs

from leaseproof.conformance.harness.proxy import FaultProxy

STEP_WAIT = 2.0  # seconds a request is held, at most, for the events recorded before it
_SIGNATURE_LENGTH = 160
_LITERAL = re.compile(r"'(?:[^']|'')*'|(?<![$\w])\d+(?:\.\d+)?\b")
_SPACE = re.compile(r"\s+")


@attrs.frozen
class Event:
    """A request a connection sent (`what`: its signature) or a response that came back to it."""

    role: int
    kind: str  # "send" or "reply"
    what: str = ""

    def to_json(self) -> list[Any]:
        return [self.role, self.kind, self.what]

    @classmethod
    def from_json(cls, item: Any) -> Event:
        role, kind, what = item
        if not isinstance(role, int) or kind not in ("send", "reply") or not isinstance(what, str):
            raise ValueError(f"not an interleaving's event: {item!r}")
        return cls(role, kind, what)

    def __str__(self) -> str:
        return f"connection {self.role + 1} " + (f"sent {self.what!r}" if self.kind == "send" else "got its answer")


def signatures(messages: bytes) -> list[str]:
    """The signature of each request `messages` end: the text of its first statement (a Query's, a
    Parse's; a Bind's prepared statement by name), lower-case, with literals as `?` and spaces as
    one, cut to a length; "" for a request with no statement (a lone Sync)."""
    found: list[str] = []
    current = ""
    at = 0
    while at + 5 <= len(messages):
        kind = messages[at : at + 1]
        (length,) = struct.unpack_from("!i", messages, at + 1)
        body = messages[at + 5 : at + 1 + length]
        at += 1 + length
        if kind == b"Q":
            found.append(signature(body.split(b"\0", 1)[0].decode("utf-8", "replace")))
            current = ""
        elif kind == b"P" and not current:
            current = signature(body.split(b"\0", 2)[1].decode("utf-8", "replace"))
        elif kind == b"B" and not current:
            current = "prepared " + body.split(b"\0", 2)[1].decode("utf-8", "replace")
        elif kind in (b"S", b"F"):
            found.append(current)
            current = ""
    return found


def in_finishing_order(events: list[Event] | tuple[Event, ...]) -> list[Event]:
    """The same requests one at a time, in the order their answers came back: each request followed
    by its answer, the next sent only then (a request never answered comes last, in its order).
    A statement that ran beside another and finished after it then starts after it: what it read
    is what that one left, the effect order the overlap had, without the overlap."""
    sends: dict[int, list[Event]] = {}
    for event in events:
        if event.kind == "send":
            sends.setdefault(event.role, []).append(event)
    answered: dict[int, int] = {}
    serial: list[Event] = []
    for event in events:
        if event.kind == "reply":
            nth = answered.get(event.role, 0)
            answered[event.role] = nth + 1
            if nth < len(sends.get(event.role, [])):
                serial += [sends[event.role][nth], event]
    for role, sent in sends.items():
        serial += sent[answered.get(role, 0) :]
    return serial


def signature(text: str) -> str:
    """A statement's text as requests are told apart: lower-case, its literals `?`, its spaces one,
    cut to a length (the same statement with other values has the same signature)."""
    sql = _SPACE.sub(" ", _LITERAL.sub("?", text)).strip().lower()
    return sql[:_SIGNATURE_LENGTH]


@attrs.define
class _Unplaced:
    """A connection whose role is not known yet: what it sent, and how many answers it got."""

    sent: list[str] = attrs.Factory(list)
    replies: int = 0


@attrs.define
class Forced:
    """How a forced run went: what diverged from the recorded interleaving (empty: it all ran as recorded)."""

    divergences: list[str] = attrs.Factory(list)

    @property
    def followed(self) -> bool:
        return not self.divergences


class Interleaver:
    """The observer of `proxy` (every connection through it): records, or forces, the order of
    its connections' requests and responses."""

    def __init__(self, proxy: FaultProxy) -> None:
        self._changed = threading.Condition()
        self._mode = ""  # "", "record" or "force"
        self._roles: dict[int, int] = {}  # connection number -> role
        self._events: list[Event] = []  # recorded; or, forcing, the recorded ones
        self._happened: list[bool] = []  # forcing: which recorded events happened
        self._forced = Forced()
        self._order: list[int] = []  # forcing: the roles, by their first event
        self._unplaced: dict[int, _Unplaced] = {}  # forcing: connections whose role is not known yet
        proxy.observer = self

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[Event]]:
        """The events while open, in the list it yields (filled as they come)."""
        with self._changed:
            self._mode, self._roles, self._events = "record", {}, []
            events = self._events
        try:
            yield events
        finally:
            with self._changed:
                self._mode = ""

    @contextlib.contextmanager
    def forcing(self, events: list[Event]) -> Iterator[Forced]:
        """Hold each request, while open, until the events recorded before it have happened."""
        with self._changed:
            self._mode, self._roles, self._events = "force", {}, list(events)
            self._happened = [False] * len(events)
            self._order = list(dict.fromkeys(event.role for event in events))
            self._unplaced = {}
            self._forced = forced = Forced()
        try:
            yield forced
        finally:
            with self._changed:
                self._mode = ""
                if forced.followed and not all(self._happened):
                    missing = self._events[self._happened.index(False)]
                    forced.divergences.append(f"the run ended before {missing}")
                self._changed.notify_all()

    # -- the proxy's side --------------------------------------------------------------------------------------

    def before_requests(self, connection: int, messages: bytes, requests: int) -> None:
        sent = signatures(messages) or [""] * requests
        with self._changed:
            if self._mode == "record":
                role = self._roles.setdefault(connection, len(self._roles))
                self._events.extend(Event(role, "send", what) for what in sent)
            elif self._mode == "force":
                self._force_sends(connection, sent)

    def after_response(self, connection: int) -> None:
        with self._changed:
            if self._mode == "record" and connection in self._roles:
                self._events.append(Event(self._roles[connection], "reply"))
            elif self._mode == "force" and connection in self._unplaced:
                self._unplaced[connection].replies += 1
            elif self._mode == "force" and connection in self._roles:
                index = self._next(self._roles[connection], "reply")
                if index is not None:
                    self._happened[index] = True
                    self._changed.notify_all()

    # -- forcing (under the lock) ---------------------------------------------------------------------------

    def _force_sends(self, connection: int, sent: list[str]) -> None:
        role = self._roles.get(connection)
        if role is None:
            role = self._place(connection, sent)
            if role is None:
                return
        first = self._next(role, "send")
        if first is None:
            self._diverge(f"connection {role + 1} sent {sent[0]!r} after all it was recorded sending")
            return
        deadline = time.monotonic() + STEP_WAIT
        while self._mode == "force" and not all(self._done(index) for index in range(first)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = self._events[next(index for index in range(first) if not self._done(index))]
                self._diverge(f"connection {role + 1}'s {sent[0]!r} waited {STEP_WAIT:g}s for {waiting}")
                return
            self._changed.wait(remaining)
        if self._mode != "force":
            return
        for what in sent:
            index = self._next(role, "send")
            if index is None:
                self._diverge(f"connection {role + 1} sent {what!r} after all it was recorded sending")
                return
            if self._events[index].what != what:
                self._diverge(f"connection {role + 1} sent {what!r} where {self._events[index]} was recorded")
                return
            self._happened[index] = True
        self._changed.notify_all()

    def _place(self, connection: int, sent: list[str]) -> int | None:
        """The role of a connection that has none yet, once what it sent tells: the first role, in
        recorded order, not taken, whose recorded requests begin with all it sent, once every
        role that fits would send the same from then on. Until then (a pool's connections begin
        alike) its requests go through unheld, and count as its role's once it has one. None:
        not placed yet (or no role fits, a divergence)."""
        unplaced = self._unplaced.setdefault(connection, _Unplaced())
        unplaced.sent += sent
        taken = set(self._roles.values())
        fits = [role for role in self._order if role not in taken
                and self._sends(role)[: len(unplaced.sent)] == unplaced.sent]  # fmt: skip
        if not fits:
            self._diverge(f"a connection sent {unplaced.sent!r}, which no recorded connection began with")
            return None
        if len({tuple(self._sends(role)) for role in fits}) > 1:
            return None  # the roles that fit differ further on: what it sends next tells
        role = fits[0]
        self._roles[connection] = role
        del self._unplaced[connection]
        before = len(unplaced.sent) - len(sent)  # sent (and answered) before it was placed
        for kind, count in (("send", before), ("reply", unplaced.replies)):
            for _ in range(count):
                index = self._next(role, kind)
                if index is not None:
                    self._happened[index] = True
        self._changed.notify_all()
        return role

    def _done(self, index: int) -> bool:
        """Whether recorded event `index` happened: marked so, or, of a role no connection took yet,
        done by a connection not placed yet that may be taking it (its requests so far begin that
        role's, and it sent, or was answered, as often as the event needs)."""
        if self._happened[index]:
            return True
        event = self._events[index]
        if event.role in self._roles.values():
            return False
        nth = sum(e.role == event.role and e.kind == event.kind for e in self._events[: index + 1])
        recorded = self._sends(event.role)
        return any(
            (len(u.sent) if event.kind == "send" else u.replies) >= nth and recorded[: len(u.sent)] == u.sent
            for u in self._unplaced.values()
        )

    def _sends(self, role: int) -> list[str]:
        return [event.what for event in self._events if event.role == role and event.kind == "send"]

    def _next(self, role: int, kind: str) -> int | None:
        """The first recorded event of `role` of `kind` that has not happened."""
        for index, event in enumerate(self._events):
            if event.role == role and event.kind == kind and not self._happened[index]:
                return index
        return None

    def _diverge(self, why: str) -> None:
        """Stop forcing: the run goes on as it will, and says why."""
        self._forced.divergences.append(why)
        self._mode = ""
        self._changed.notify_all()
