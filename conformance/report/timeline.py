"""A concurrent history drawn as an SVG timeline.

One lane per session (client): each operation is a bar from its invocation to
its response, an indeterminate one hatched and open to the next barrier. For
the delivery machine, one lane per delivery row below them: each lease a
claim handed out, from the claim to its lease_until (solid while it was live,
dashed once the clock passed it), the renewals that moved it, the finish that
settled it, the reap that took it back, and the row's generation and status
as each barrier read them. Clock moves and barriers cross every lane; the
epochs between barriers are numbered as the checker numbers them.

The horizontal axis is the history's logical clock by rank: every invocation,
response and barrier gets a column of its own, in order, so two events are
drawn in the order they happened and nothing else is implied by distance.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from leaseproof.conformance.concurrent.history import History, Operation, RefusedByTheDatabase
from leaseproof.conformance.concurrent.linearizability import Spec
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.report.page import escape
from leaseproof.model import delivery as d

LEFT, RIGHT = 118, 190  # the lanes' labels; room for the last labels past the end
HEAD = 40  # epochs and the clock, above the lanes
SESSION_LANE, ROW_LANE = 24, 44
CHAR = 6.2  # an average glyph's width at the labels' size, to decide whether a label fits

_KINDS: dict[type, str] = {
    d.Claim: "claim", d.Renew: "renew", d.Finish: "finish", d.Reap: "reap", d.AdvanceClock: "clock",
}  # fmt: skip
_COLOURS = {
    "claim": "var(--claim)", "renew": "var(--renew)", "finish": "var(--finish)", "reap": "var(--reap)",
    "clock": "var(--clock)", "other": "var(--other)",
}  # fmt: skip
_REFUSALS = (d.Rejection, d.LeaseLost, d.ClaimMiss, RefusedByTheDatabase)


@attrs.frozen
class Marks:
    """What a page wants emphasised on a timeline."""

    order: Mapping[int, str] = attrs.field(factory=dict)  # op id -> its place in the order found ("3", "e2·3")
    needed: frozenset[int] = frozenset()  # ops whose outcomes a violation rests on
    failing: frozenset[int] = frozenset()  # the ops at which the longest partial order stopped
    faded: frozenset[int] = frozenset()  # ops drawn for context only
    failed_epoch: int | None = None
    detail: Mapping[int, str] = attrs.field(factory=dict)  # op id -> more text for its hover box


def _client_order(name: str) -> tuple[int, int, str]:
    if name == "prefix":
        return (0, 0, name)
    if name == "coordinator":
        return (2, 0, name)
    number = re.fullmatch(r"w(\d+)", name)
    return (1, int(number.group(1)) if number else 10**6, name)


class _Axis:
    """Ticks by rank."""

    def __init__(self, history: History) -> None:
        ticks = {b.at for b in history.barriers}
        for op in history.operations:
            ticks.add(op.invoked)
            if op.returned is not None:
                ticks.add(op.returned)
        self.ticks = sorted(ticks)
        self.rank = {t: i for i, t in enumerate(self.ticks)}
        self.unit = max(11.0, min(36.0, 1150.0 / max(1, len(self.ticks))))
        self.barriers = sorted(b.at for b in history.barriers)

    def x(self, tick: int) -> float:
        return LEFT + (self.rank[tick] + 0.5) * self.unit

    @property
    def end(self) -> float:
        return LEFT + (len(self.ticks) + 0.5) * self.unit

    @property
    def epoch_edges(self) -> list[float]:
        """Where each epoch starts and ends: the left edge, every barrier, the end."""
        return [LEFT] + [self.x(b) for b in self.barriers] + [self.end]

    def closing(self, tick: int) -> float:
        """Where something open since `tick` is drawn to: the next barrier, else the end."""
        later = [b for b in self.barriers if b > tick]
        return self.x(later[0]) if later else self.end


LONG_NAME = 16  # a generated name (a step id of up to 64 characters) is cut to this in what the lanes show


def shortened(text: str) -> str:
    """`text` with each name longer than LONG_NAME cut to its start and an ellipsis: the lanes'
    labels stay short; the hover box and the tooltip say the whole name."""
    return re.sub(rf"[^\s,()/=]{{{LONG_NAME + 1},}}", lambda m: m.group(0)[: LONG_NAME - 1] + "…", text)


def _fits(text: str, width: float) -> bool:
    return len(text) * CHAR + 6 <= width


def _kind(command: Any) -> str:
    return _KINDS.get(type(command), "other")


@attrs.frozen
class _Lease:
    lease: d.Lease
    client: str
    start: int  # the claim's response
    expired: int | None  # the clock move that passed its lease_until, if one did while it was held
    end: int | None  # where it stopped being held: settled, or reaped after it expired
    how: str  # "finished", "failed", "reaped", "" (held to the end of the history)
    renewals: tuple[tuple[int, Any], ...]
    settled_late: bool  # a finish accepted after its lease had run out or been reaped
    stale_finish: tuple[int, str] | None = None  # (tick, status) of a finish accepted after it was no longer held


def _clock_moves(history: History) -> list[tuple[int, Any, Any]]:
    """(tick, by, the clock after) of every clock move, in order."""
    now = getattr(history.initial, "now", None)
    moves = []
    for op in sorted(history.operations, key=lambda o: o.invoked):
        if isinstance(op.command, d.AdvanceClock) and now is not None:
            now = now + op.command.by
            moves.append((op.returned if op.returned is not None else op.invoked, op.command.by, now))
    return moves


def _same_lease(a: d.Lease, b: d.Lease) -> bool:
    return (a.community_id, a.delivery_id, a.lease_generation) == (b.community_id, b.delivery_id, b.lease_generation)


def _leases(history: History) -> list[_Lease]:
    """Every lease a claim's answer handed out, followed through the clock moves, renewals,
    finishes and reaps of the history."""
    ops = sorted(history.operations, key=lambda o: o.invoked)
    moves = _clock_moves(history)
    leases = []
    for claim in ops:
        if not isinstance(claim.outcome, d.Claimed) or claim.returned is None:
            continue
        lease = claim.outcome.lease
        until = lease.lease_until
        events: list[tuple[int, str, Any]] = [(tick, "clock", now) for tick, _, now in moves if tick > claim.returned]
        for op in ops:
            tick = op.returned if op.returned is not None else None
            if tick is None or tick <= claim.returned:
                continue
            if (
                isinstance(op.command, d.Renew)
                and isinstance(op.outcome, d.Renewed)
                and _same_lease(op.command.lease, lease)
            ):
                events.append((tick, "renew", op.outcome.lease_until))
            elif (
                isinstance(op.command, d.Finish)
                and isinstance(op.outcome, d.Settled)
                and _same_lease(op.command.lease, lease)
            ):
                events.append((tick, "settle", op.outcome.status))
            elif isinstance(op.command, d.Reap) and isinstance(op.outcome, d.Reaped) and op.outcome.count:
                events.append((tick, "reap", None))
        expired: int | None = None
        end: int | None = None
        how, late = "", False
        renewals = []
        stale: tuple[int, str] | None = None  # an accepted finish after the lease was reaped
        ordered = sorted(events, key=lambda e: e[0])
        for index, (tick, what, value) in enumerate(ordered):
            if what == "clock" and expired is None and value > until:
                expired = tick
            elif what == "renew" and expired is None:
                until = value
                renewals.append((tick, value))
            elif what == "settle":
                end, how, late = tick, value.value, expired is not None
                break
            elif what == "reap" and expired is not None:
                end, how = tick, "reaped"
                settle = next(((t, v) for t, kind, v in ordered[index + 1 :] if kind == "settle"), None)
                stale = None if settle is None else (settle[0], settle[1].value)
                break
        if end is None:
            gone = _no_longer_held(history, lease, claim.returned)
            if gone is not None:
                end = gone
                how = how or "superseded"
        if stale is None and how == "superseded" and end is not None:
            later = [(t, v) for t, kind, v in events if kind == "settle" and t > end]
            stale = None if not later else (min(later)[0], min(later)[1].value)
        leases.append(
            _Lease(
                lease,
                claim.client,
                claim.returned,
                expired,
                end,
                how,
                tuple(renewals),
                late or stale is not None,
                stale,
            )
        )
    return leases


def _no_longer_held(history: History, lease: d.Lease, since: int) -> int | None:
    """The first barrier after `since` that read the lease's row as not claimed at its generation."""
    key = (lease.community_id, lease.delivery_id)
    for barrier in sorted(history.barriers, key=lambda b: b.at):
        if barrier.at <= since or not isinstance(barrier.state, d.DeliverySystem):
            continue
        row = barrier.state.deliveries.get(key)
        if row is None or row.status is not d.Status.CLAIMED or row.lease_generation != lease.lease_generation:
            return barrier.at
    return None


def _tracks(leases: Sequence[_Lease], end: int) -> dict[int, int]:
    """Two tracks per row lane, so that overlapping leases of one row (the bug a race mutant makes) both show."""
    tracks: dict[int, int] = {}
    last: dict[tuple[Any, Any, int], int] = {}
    for index, lease in sorted(enumerate(leases), key=lambda pair: pair[1].start):
        key = (lease.lease.community_id, lease.lease.delivery_id)
        stop = lease.end if lease.end is not None else end
        track = 0 if last.get((*key, 0), -1) < lease.start else 1
        tracks[index] = track
        last[(*key, track)] = stop
    return tracks


def _row_keys(history: History, leases: Sequence[_Lease]) -> list[d.CommunityKey]:
    keys: set[d.CommunityKey] = {(lease.lease.community_id, lease.lease.delivery_id) for lease in leases}
    for barrier in history.barriers:
        if isinstance(barrier.state, d.DeliverySystem):
            keys |= set(barrier.state.deliveries.keys())
    if isinstance(history.initial, d.DeliverySystem):
        keys |= set(history.initial.deliveries.keys())
    return sorted(keys, key=lambda k: (w.name_of(k[0]), w.name_of(k[1])))


def _generations(history: History, key: d.CommunityKey) -> list[tuple[int | None, str]]:
    """(barrier tick, "g3 claimed") where the row's recorded generation or status changed; None: the start."""
    marks: list[tuple[int | None, str]] = []
    last = None
    states: list[tuple[int | None, Any]] = [(None, history.initial)]
    states += [(b.at, b.state) for b in sorted(history.barriers, key=lambda b: b.at) if b.state is not None]
    for at, state in states:
        if not isinstance(state, d.DeliverySystem):
            continue
        row = state.deliveries.get(key)
        text = "absent" if row is None else f"g{row.lease_generation} {row.status.value}"
        if text != last and not (at is None and row is None):
            marks.append((at, text))
        last = text
    return marks


def _reaped_rows(history: History, reap: Operation) -> list[d.CommunityKey]:
    """The rows a sweep took back: claimed at the barrier before it, pending one generation on at the one after."""
    before = [b for b in history.barriers if b.at < reap.invoked and b.state is not None]
    after = [b for b in history.barriers if b.at > reap.invoked and b.state is not None]
    if not before or not after:
        return []
    start, end = max(before, key=lambda b: b.at).state, min(after, key=lambda b: b.at).state
    if not isinstance(start, d.DeliverySystem) or not isinstance(end, d.DeliverySystem):
        return []
    taken = []
    for key, row in start.deliveries.items():
        later = end.deliveries.get(key)
        if (
            row.status is d.Status.CLAIMED
            and later is not None
            and later.status is d.Status.PENDING
            and later.lease_generation == row.lease_generation + 1
        ):
            taken.append(key)
    return taken


def _hhmmss(value: Any) -> str:
    return str(value.strftime("%H:%M:%S"))


def timeline_svg(history: History, spec: Spec, marks: Marks | None = None, *, element_id: str = "timeline") -> str:
    """The SVG markup of `history`'s timeline (inline, styled by the page's sheet)."""
    marks = marks or Marks()
    axis = _Axis(history)
    clients = sorted({op.client for op in history.operations}, key=_client_order)
    leases = _leases(history) if history.machine == "delivery" else []
    rows = _row_keys(history, leases) if history.machine == "delivery" else []
    lane_y = {c: HEAD + i * SESSION_LANE for i, c in enumerate(clients)}
    rows_top = HEAD + len(clients) * SESSION_LANE + (18 if rows else 0)
    row_y = {k: rows_top + i * ROW_LANE for i, k in enumerate(rows)}
    height = rows_top + len(rows) * ROW_LANE + 14
    width = axis.end + RIGHT
    focus = _focus_x(history, axis, marks)
    at = f' data-focus-x="{focus:.0f}"' if focus is not None else ""
    out: list[str] = [
        f'<svg class="timeline" id="{escape(element_id)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'data-operations="{len(history.operations)}" data-leases="{len(leases)}"{at}>',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="6" height="6" fill="#e4e7ec"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#98a2b3" stroke-width="3"/>'
        "</pattern></defs>",
    ]
    out += _epochs_markup(history, axis, marks, height)
    for client in clients:
        y = lane_y[client]
        out.append(
            f'<line class="lane-rule" x1="0" x2="{width:.0f}" y1="{y + SESSION_LANE:.1f}" y2="{y + SESSION_LANE:.1f}"/>'
        )
        out.append(f'<text class="lane-label" x="8" y="{y + 16:.1f}">{escape(client)}</text>')
    if rows:
        out.append(f'<text class="lane-kind" x="8" y="{rows_top - 5:.1f}">leases, by delivery row</text>')
    for key in rows:
        y = row_y[key]
        out.append(f'<line class="lane-rule" x1="0" x2="{width:.0f}" y1="{y + ROW_LANE:.1f}" y2="{y + ROW_LANE:.1f}"/>')
        name = w.name_of(key[1])
        out.append(
            f'<g class="row-lane" data-row="{escape(name)}" data-detail="{escape(f"delivery {name}")}">'
            f'<text class="lane-label" x="8" y="{y + 13:.1f}">'
            f"{escape(shortened(name))}<title>{escape(name)}</title></text>"
            f'<text class="lane-kind" x="8" y="{y + 27:.1f}">community {escape(w.name_of(key[0]))}</text></g>'
        )
    out += _clock_markup(history, axis, height)
    for op in sorted(history.operations, key=lambda o: o.invoked):
        out.append(_op_markup(op, spec, axis, lane_y[op.client], marks))
    tracks = _tracks(leases, axis.ticks[-1] + 1 if axis.ticks else 0)
    for index, lease in enumerate(leases):
        key = (lease.lease.community_id, lease.lease.delivery_id)
        if key in row_y:
            out.append(_lease_markup(lease, axis, row_y[key] + 13 * tracks[index]))
    for key in rows:
        out += _generation_markup(history, key, axis, row_y[key])
    for op in history.operations:
        if isinstance(op.command, d.Reap) and isinstance(op.outcome, d.Reaped) and op.outcome.count:
            for key in _reaped_rows(history, op):
                if key in row_y:
                    out.append(_reap_markup(op, history, key, axis, row_y[key]))
    out.append("</svg>")
    return "".join(out)


def _focus_x(history: History, axis: _Axis, marks: Marks) -> float | None:
    """Where the page scrolls a wide timeline to when it opens: the first operation no order
    gets past, else the middle of the failed epoch; None when nothing failed."""
    failing = [op for op in history.operations if op.id in marks.failing]
    if failing:
        return axis.x(min(op.invoked for op in failing))
    if marks.failed_epoch is not None:
        edges = axis.epoch_edges
        if 1 <= marks.failed_epoch < len(edges):
            return (edges[marks.failed_epoch - 1] + edges[marks.failed_epoch]) / 2
    return None


def _epochs_markup(history: History, axis: _Axis, marks: Marks, height: float) -> list[str]:
    out = []
    edges = axis.epoch_edges
    for number, (left, right) in enumerate(itertools.pairwise(edges), 1):
        if marks.failed_epoch == number:
            out.append(
                f'<rect class="epoch-failed" data-epoch="{number}" x="{left:.1f}" y="0" width="{right - left:.1f}" '
                f'height="{height:.0f}"/>'
            )
        label = f"epoch {number}" if _fits(f"epoch {number}", right - left) else str(number)
        out.append(f'<text class="epoch-label" x="{(left + right) / 2:.1f}" y="11" text-anchor="middle">{label}</text>')
    for at in axis.barriers:
        x = axis.x(at)
        out.append(
            f'<line class="barrier" x1="{x:.1f}" x2="{x:.1f}" y1="14" y2="{height:.0f}">'
            f"<title>barrier at tick {at}: the state was read</title></line>"
        )
    return out


def _clock_markup(history: History, axis: _Axis, height: float) -> list[str]:
    now = getattr(history.initial, "now", None)
    out = []
    if now is not None:
        out.append(f'<text class="clock-label" x="{LEFT - 4:.1f}" y="30" text-anchor="end">clock {_hhmmss(now)}</text>')
    for tick, by, after in _clock_moves(history):
        x = axis.x(tick)
        seconds = f"+{by.total_seconds():g}s"
        out.append(
            f'<g class="clock"><line class="clock-move" x1="{x:.1f}" x2="{x:.1f}" y1="20" y2="{height:.0f}"/>'
            f'<text class="clock-label" x="{x + 3:.1f}" y="30">{escape(seconds)} → {escape(_hhmmss(after))}</text>'
            f"<title>the clock moved {escape(seconds)} to {escape(_hhmmss(after))}</title></g>"
        )
    return out


def _op_markup(op: Operation, spec: Spec, axis: _Axis, y: float, marks: Marks) -> str:
    x0 = axis.x(op.invoked)
    x1 = axis.x(op.returned) if op.returned is not None else axis.closing(op.invoked)
    x1 = max(x1, x0 + 4)
    kind = _kind(op.command)
    css = ["op", f"kind-{kind}"]
    if op.indeterminate:
        css.append("indeterminate")
    elif isinstance(op.outcome, _REFUSALS):
        css.append("refused")
    for flag, ids in (("needed", marks.needed), ("failing", marks.failing), ("faded", marks.faded)):
        if op.id in ids:
            css.append(flag)
    command = spec.describe_command(op.command)
    said = f"? {op.outcome.reason}" if op.indeterminate else spec.describe_outcome(op.outcome)
    lines = [f"{op.client} · {command}", f"answered: {said}"]
    lines.append(
        f"invoked at tick {op.invoked}, "
        + ("never returned" if op.returned is None else f"returned at tick {op.returned}")
    )
    if op.id in marks.order:
        lines.append(f"place in the order found: {marks.order[op.id]}")
    if op.id in marks.detail:
        lines.append(marks.detail[op.id])
    detail = "\n".join(lines)
    fill = "" if op.indeterminate else f' fill="{_COLOURS[kind]}" stroke="{_COLOURS[kind]}"'
    parts = [
        f'<g class="operation" data-op="{op.id}" data-client="{escape(op.client)}" data-detail="{escape(detail)}">',
        f'<rect class="{" ".join(css)}" x="{x0:.1f}" y="{y + 4:.1f}" width="{x1 - x0:.1f}" '
        f'height="{SESSION_LANE - 8}"{fill}>'
        f"<title>{escape(detail)}</title></rect>",
    ]
    short = shortened(command)
    label = short if _fits(short, x1 - x0) else ""
    if label:
        tone = "" if not op.indeterminate else ' style="fill: var(--ink)"'
        parts.append(f'<text class="op-label" x="{x0 + 3:.1f}" y="{y + 16:.1f}"{tone}>{escape(label)}</text>')
    if op.indeterminate:
        parts.append(f'<text class="order" x="{x1 + 2:.1f}" y="{y + 16:.1f}">?</text>')
    if op.id in marks.order and _fits(f"#{marks.order[op.id]}", x1 - x0 + 8):
        parts.append(f'<text class="order" x="{x0:.1f}" y="{y + 3:.1f}">#{escape(marks.order[op.id])}</text>')
    parts.append("</g>")
    return "".join(parts)


def _lease_markup(lease: _Lease, axis: _Axis, y: float) -> str:
    x0 = axis.x(lease.start)
    held_to = lease.expired if lease.expired is not None else lease.end
    x1 = axis.x(held_to) if held_to is not None else axis.end
    until = lease.lease.lease_until
    last_until = lease.renewals[-1][1] if lease.renewals else until
    name = f"gen {lease.lease.lease_generation} · {lease.client} · until {_hhmmss(last_until)}"
    detail = [
        f"lease of {w.name_of(lease.lease.delivery_id)} in community {w.name_of(lease.lease.community_id)}",
        f"generation {lease.lease.lease_generation}, claimed by {lease.client} at tick {lease.start}, "
        f"lease until {_hhmmss(until)}",
    ]
    detail += [f"renewed at tick {tick} until {_hhmmss(value)}" for tick, value in lease.renewals]
    if lease.expired is not None:
        detail.append(f"the clock passed its lease_until at tick {lease.expired}")
    if lease.how == "superseded":
        detail.append(f"the barrier at tick {lease.end} read the row as no longer held at this generation")
    elif lease.how:
        late = " (after the lease had run out)" if lease.settled_late else ""
        detail.append(f"{lease.how} at tick {lease.end}{late}")
    text = "\n".join(detail)
    css = "lease-interval" + (" settled-late" if lease.settled_late else "")
    out = [
        f'<g class="{css}" data-generation="{lease.lease.lease_generation}" data-detail="{escape(text)}">',
        f'<rect class="lease" x="{x0:.1f}" y="{y + 4:.1f}" width="{max(x1 - x0, 3):.1f}" height="12">'
        f"<title>{escape(text)}</title></rect>",
    ]
    if lease.expired is not None:
        x2 = axis.x(lease.end) if lease.end is not None else axis.end
        out.append(
            f'<rect class="lease expired" x="{x1:.1f}" y="{y + 4:.1f}" width="{max(x2 - x1, 2):.1f}" height="12">'
            f"<title>expired: the clock passed {escape(_hhmmss(last_until))}</title></rect>"
        )
    if _fits(name, x1 - x0):
        out.append(f'<text class="lease-label" x="{x0 + 2:.1f}" y="{y + 13.5:.1f}">{escape(name)}</text>')
    elif _fits(f"g{lease.lease.lease_generation}", x1 - x0):
        out.append(
            f'<text class="lease-label" x="{x0 + 2:.1f}" y="{y + 13.5:.1f}">g{lease.lease.lease_generation}</text>'
        )
    for tick, value in lease.renewals:
        xr = axis.x(tick)
        out.append(
            f'<text class="lease-label" x="{xr - 4:.1f}" y="{y + 3:.1f}">↻'
            f"<title>renewed until {escape(_hhmmss(value))}</title></text>"
        )
    if lease.how in ("finished", "failed") and lease.end is not None:
        xs = axis.x(lease.end)
        colour = "var(--bad)" if lease.settled_late else ("var(--finish)" if lease.how == "finished" else "var(--reap)")
        mark = "✓" if lease.how == "finished" else "✗"
        late = " after its lease ran out" if lease.settled_late else ""
        out.append(
            f'<g class="settle"><text x="{xs - 4:.1f}" y="{y + 15:.1f}" fill="{colour}">{mark}</text>'
            f"<title>{escape(lease.how)} at tick {lease.end}{late}</title></g>"
        )
    if lease.stale_finish is not None:
        tick, status = lease.stale_finish
        xs = axis.x(tick)
        out.append(
            f'<g class="settle stale"><text x="{xs - 4:.1f}" y="{y + 15:.1f}" fill="var(--bad)">!</text>'
            f"<title>a finish ({escape(status)}) of this lease accepted at tick {tick}, after it was "
            f"{escape(lease.how)}</title></g>"
        )
    out.append("</g>")
    return "".join(out)


def _generation_markup(history: History, key: d.CommunityKey, axis: _Axis, y: float) -> list[str]:
    out = []
    for at, text in _generations(history, key):
        x = LEFT + 2 if at is None else axis.x(at) + 2
        width = len(text) * 5.4 + 6
        out.append(
            f'<g class="generation" data-at="{"start" if at is None else at}"><rect x="{x:.1f}" y="{y + 28:.1f}" '
            f'width="{width:.1f}" height="12" rx="6"/><text x="{x + 3:.1f}" y="{y + 37.5:.1f}">{escape(text)}</text>'
            f"<title>the row as the barrier read it: {escape(text)}</title></g>"
        )
    return out


def _reap_markup(op: Operation, history: History, key: d.CommunityKey, axis: _Axis, y: float) -> str:
    tick = op.returned if op.returned is not None else op.invoked
    x = axis.x(tick)
    after = [b for b in history.barriers if b.at > op.invoked and b.state is not None]
    generation = ""
    if after:
        state = min(after, key=lambda b: b.at).state
        row = state.deliveries.get(key) if isinstance(state, d.DeliverySystem) else None
        generation = f" → g{row.lease_generation}" if row is not None else ""
    return (
        f'<g class="reap" data-op="{op.id}">'
        f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y + 2:.1f}" y2="{y + ROW_LANE - 2:.1f}"/>'
        f'<text x="{x + 3:.1f}" y="{y + 37:.1f}">reap{escape(generation)}</text>'
        f"<title>{escape(op.client)}'s reap returned the expired lease to pending{escape(generation)}</title></g>"
    )
