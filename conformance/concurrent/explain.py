"""The order a page draws: the linearization of a history, or the longest partial one.

The checker (conformance/concurrent/linearizability.py) answers whether some order
explains a history, and keeps neither the order it found nor, on a violation, how far
an order got. A page needs both, so this searches again, over pieces small enough to
search whole (each epoch's partitions of a linearizable history, or the violation's
shrunk piece), stepping the model through the checker's `Spec` exactly as the checker
does, so any order it finds is one the checker accepts. On a violation it keeps the
deepest order it reached, the state there, and each operation that could have gone
next with the model's answer to it: the point where the history stops being
explainable, which `explain` turns into one sentence in the model's words.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from leaseproof.conformance.concurrent.history import History, Operation, RefusedByTheDatabase, Stall
from leaseproof.conformance.concurrent.linearizability import UNTOUCHED, Ambiguous, Spec, Violation, steps_of
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.rows import rows_of
from leaseproof.model import delivery as d

SEARCH_BUDGET = 50_000  # configurations a page spends on one piece before it draws no order
ATTEMPTS_KEPT = 64  # refused tries remembered per operation


@attrs.frozen
class Placed:
    """One operation of an order: the state before it, the outcome the model gave it
    (the recorded one, for a determinate operation), and the state after."""

    op: Operation
    before: Any
    outcome: Any
    after: Any


@attrs.frozen
class Blocked:
    """An operation that could have gone next at the deepest point, and why it could not:
    the model's answer to it there (None: the model raised, or left it ambiguous)."""

    op: Operation
    answer: Any
    state: Any = None  # the state it was tried in


@attrs.frozen
class Order:
    """What the search found for one piece.

    `complete`: every determinate operation is in `placed` and the end state (if
    one was recorded) is reached. Otherwise `placed` is the longest partial
    order and `blocked` the operations that could not follow it; `end` is set
    when every outcome fitted but no order ended in the recorded state (the
    state the best such order ended in, against `want`)."""

    placed: tuple[Placed, ...]
    complete: bool
    blocked: tuple[Blocked, ...] = ()
    exhausted: bool = False  # the budget ran out: `placed` is the deepest seen, not proven the deepest
    end: Any = None
    want: Any = None
    # Every state (and the order that led there) in which an operation was tried and the model
    # answered otherwise than recorded, a few per operation: the sentence picks the most telling.
    attempts: Mapping[int, tuple[tuple[Any, Any, tuple[Placed, ...]], ...]] = attrs.field(factory=dict)


def search(
    spec: Spec,
    ops: Sequence[Operation],
    start: Any,
    want: Any = None,
    budget: int = SEARCH_BUDGET,
    stalls: Sequence[Stall] = (),
) -> Order:
    """An order of `ops` from `start` that respects real time, gives every determinate
    operation its recorded outcome and ends in `want` (None: anywhere); else the
    longest partial one and where it stopped. Indeterminate operations may be left out."""
    det = sorted((op for op in ops if not op.indeterminate), key=lambda op: op.invoked)
    ind = sorted((op for op in ops if op.indeterminate), key=lambda op: op.invoked)
    order = det + ind
    allowed = spec.allowances(order, stalls) if spec.allowances is not None else {}
    needed = len(det)
    best: list[Placed] = []
    best_score = (-1, -1)
    best_blocked: list[Blocked] = []
    ends: list[tuple[list[Placed], Any]] = []
    seen: set[tuple[frozenset[int], Any]] = set()
    explored = 0
    attempts: dict[int, list[tuple[Any, Any, tuple[Placed, ...]]]] = {}

    def limit(done: frozenset[int]) -> float:
        """The earliest return among determinate operations not yet placed: nothing invoked after it may go next."""
        pending = [op.returned for op in det if op.id not in done and op.returned is not None]
        return min(pending) if pending else float("inf")

    def visit(path: list[Placed], done: frozenset[int], state: Any, placed_det: int) -> list[Placed] | None:
        nonlocal best, best_score, best_blocked, explored
        if placed_det == needed:
            if want is None or state == want:
                return path
            ends.append((list(path), state))
        bound = limit(done)
        blocked: list[Blocked] = []
        for op in order:
            if op.id in done or op.invoked > bound:
                continue
            try:
                steps = steps_of(spec, state, op, allowed)
            except Ambiguous:
                blocked.append(Blocked(op, None, state))
                continue
            fitting = [(after, outcome) for after, outcome in steps if op.indeterminate or outcome == op.outcome]
            if not fitting:
                outcome = steps[0][1]  # the model's own
                blocked.append(Blocked(op, outcome, state))
                tried = attempts.setdefault(op.id, [])
                if len(tried) < ATTEMPTS_KEPT:
                    tried.append((state, outcome, tuple(path)))
                continue
            for after, outcome in fitting:
                key = (done | {op.id}, after)
                if key in seen:
                    continue
                seen.add(key)
                explored += 1
                if explored > budget:
                    raise _OutOfBudget
                found = visit(
                    [*path, Placed(op, state, outcome, after)],
                    done | {op.id},
                    after,
                    placed_det + (not op.indeterminate),
                )
                if found is not None:
                    return found
        score = (placed_det, -len(path))  # the most outcomes explained, by the fewest operations
        if score > best_score:
            best, best_score, best_blocked = list(path), score, blocked
        return None

    exhausted = False
    try:
        found = visit([], frozenset(), start, 0)
    except _OutOfBudget:
        found, exhausted = None, True
    if found is not None:
        return Order(tuple(found), True)
    tried = {op_id: tuple(kept) for op_id, kept in attempts.items()}
    if ends and not exhausted:
        path, end = ends[0]
        return Order(tuple(path), False, (), end=end, want=want, attempts=tried)
    return Order(tuple(best), False, tuple(best_blocked), exhausted=exhausted, attempts=tried)


class _OutOfBudget(Exception):
    pass


# -- epochs and partitions of a whole history ------------------------------------------


@attrs.frozen
class EpochOrder:
    """The orders of one epoch: one per partition, keyed by the partition's keys."""

    number: int  # 1-based, as the checker counts them
    partitions: tuple[tuple[frozenset[Any] | None, Order], ...]
    note: str = ""  # why no order is drawn, if none is


def epochs(history: History) -> list[tuple[int, tuple[Operation, ...], Any, Any]]:
    """(number, operations, state at its start, state recorded at its end) of each epoch, split at barriers
    as the checker splits them; a state is None where no barrier recorded it."""
    barriers = sorted(history.barriers, key=lambda b: b.at)
    ats = [b.at for b in barriers]
    groups: list[list[Operation]] = [[] for _ in range(len(barriers) + 1)]
    for op in history.operations:
        groups[bisect.bisect_right(ats, op.invoked)].append(op)
    result = []
    for index, ops in enumerate(groups):
        start = history.initial if index == 0 else barriers[index - 1].state
        end = barriers[index].state if index < len(barriers) else None
        if ops or index < len(barriers):
            result.append((index + 1, tuple(ops), start, end))
    while result and not result[-1][1] and len(result) > 1:
        result.pop()
    return result


def _partitions(
    spec: Spec, ops: Sequence[Operation], start: Any
) -> list[tuple[frozenset[Any] | None, list[Operation]]]:
    footprints = [spec.footprint(start, op.command) for op in ops]
    if any(f is None for f in footprints):
        return [(None, list(ops))]
    groups: list[tuple[set[Any], list[Operation]]] = []
    for op, footprint in zip(ops, footprints, strict=True):
        keys = set(footprint or ())
        joined = [g for g in groups if g[0] & keys] if keys else []
        merged: tuple[set[Any], list[Operation]] = (set(keys), [op])
        for group in joined:
            merged[0].update(group[0])
            merged[1].extend(group[1])
            groups.remove(group)
        groups.append(merged)
    return [(frozenset(keys), sorted(members, key=lambda o: o.invoked)) for keys, members in groups]


def history_orders(history: History, spec: Spec, budget: int = SEARCH_BUDGET) -> list[EpochOrder]:
    """The order that explains each epoch of `history`, partition by partition, as the
    checker splits them (an epoch whose start no barrier recorded has none drawn)."""
    result = []
    for number, ops, start, end in epochs(history):
        if not ops:
            continue
        if start is None:
            result.append(EpochOrder(number, (), "no state was recorded at its start"))
            continue
        parts = []
        for keys, members in _partitions(spec, ops, start):
            part_start = start if keys is None else spec.restrict(start, keys)
            want = None if end is None else (end if keys is None else spec.restrict(end, keys))
            parts.append((keys, search(spec, members, part_start, want, budget, history.stalls)))
        result.append(EpochOrder(number, tuple(parts)))
    return result


# -- the sentence ------------------------------------------------------------------------


def _changed_by(path: Sequence[Placed], key: d.CommunityKey, field: str) -> Placed | None:
    """The last operation of `path` that changed `field` of the delivery row `key`."""
    for placed in reversed(path):
        before = getattr(placed.before, "deliveries", {}).get(key)
        after = getattr(placed.after, "deliveries", {}).get(key)
        if (before is None) != (after is None) or (
            before is not None and after is not None and getattr(before, field) != getattr(after, field)
        ):
            return placed
    return None


def _moved_by(placed: Placed | None) -> str:
    if placed is None:
        return "before the epoch began"
    kind = type(placed.op.command).__name__.lower()
    return f"{placed.op.client}'s {kind}" if kind != "reap" else "reap"


def _lease_sentence(verb: str, op: Operation, state: Any, path: Sequence[Placed], answer: Any) -> tuple[int, str]:
    lease = op.command.lease
    key = (lease.community_id, lease.delivery_id)
    name = w.name_of(lease.delivery_id)
    row = state.deliveries.get(key) if isinstance(state, d.DeliverySystem) else None
    head = f"{verb} of {name} at generation {lease.lease_generation} accepted ({op.client})"
    if row is None:
        return 2, f"{head} though the row is gone ({_moved_by(_changed_by(path, key, 'status'))} removed it)"
    if row.lease_generation != lease.lease_generation:
        mover = _changed_by(path, key, "lease_generation")
        return 0, f"{head} after {_moved_by(mover)} moved the row to generation {row.lease_generation}"
    if row.status.terminal:
        settler = _changed_by(path, key, "status")
        by = f" by {settler.op.client}'s finish" if settler is not None else " before the epoch began"
        return 1, f"{head} though the row was already {row.status.value}{by}"
    if row.lease_until is not None and row.lease_until < state.now:
        return 1, f"{head} after its lease ran out at {_clock(row.lease_until)} (the clock is at {_clock(state.now)})"
    return 3, f"{head}, where the model answers {type(answer).__name__}"


def _clock(value: Any) -> str:
    return str(value.strftime("%H:%M:%S"))


def _claim_sentence(
    op: Operation, state: Any, answer: Any, path: Sequence[Placed], ops: Sequence[Operation]
) -> tuple[int, str] | None:
    claim, seen = op.command, op.outcome
    target = w.name_of(claim.target_pubkey)
    if isinstance(seen, d.Claimed):
        key = (seen.lease.community_id, seen.lease.delivery_id)
        name = w.name_of(seen.lease.delivery_id)
        head = f"claim of {name} handed out generation {seen.lease.lease_generation} ({op.client})"
        row = state.deliveries.get(key) if isinstance(state, d.DeliverySystem) else None
        if (
            row is not None
            and row.status is d.Status.CLAIMED
            and row.lease_until is not None
            and row.lease_until >= state.now
        ):
            holder = _changed_by(path, key, "lease_generation")
            whose = f"{holder.op.client}'s lease" if holder is not None else "a lease taken before the epoch began"
            return (
                0,
                f"{head} while {whose} at generation {row.lease_generation} was still held: two holders of one row",
            )
        if isinstance(answer, d.Claimed) and answer.lease.delivery_id == seen.lease.delivery_id:
            others = sorted(
                {
                    o.client
                    for o in ops
                    if o.id != op.id
                    and isinstance(o.outcome, d.Claimed)
                    and o.outcome.lease.delivery_id == seen.lease.delivery_id
                }
            )  # fmt: skip
            also = f"; {', '.join(others)} claimed the same row too" if others else ""
            return 1, (
                f"{head}, but the row was at generation {answer.lease.lease_generation - 1}, so a claim gives "
                f"generation {answer.lease.lease_generation}{also}"
            )
        if isinstance(answer, d.Claimed):
            return (
                2,
                f"claim took {name} ({op.client}) while the oldest pending row for {target} was "
                f"{w.name_of(answer.lease.delivery_id)}",
            )
        if isinstance(answer, d.ClaimMiss):
            return 3, f"claim took {name} ({op.client}) though no row for {target} was pending"
    if isinstance(seen, d.ClaimMiss) and isinstance(answer, d.Claimed):
        return 1, f"claim missed ({op.client}) though {w.name_of(answer.lease.delivery_id)} was pending for {target}"
    return None


def _told(
    op: Operation, state: Any, answer: Any, path: Sequence[Placed], spec: Spec, ops: Sequence[Operation]
) -> tuple[int, str]:
    """How telling one refused try of `op` is (lower is more), and its sentence."""
    command, seen = op.command, op.outcome
    if isinstance(seen, RefusedByTheDatabase):
        return -1, (
            f"the database refused {op.client}'s {spec.describe_command(command)} ({seen.constraint}): "
            "the implementation attempted a transition no order of the model's steps makes"
        )
    if answer is not None:
        if isinstance(command, d.Finish) and isinstance(seen, d.Settled):
            return _lease_sentence("finish", op, state, path, answer)
        if isinstance(command, d.Renew) and isinstance(seen, d.Renewed):
            return _lease_sentence("renew", op, state, path, answer)
        if isinstance(command, d.Claim):
            said = _claim_sentence(op, state, answer, path, ops)
            if said is not None:
                return said
        if isinstance(command, d.Reap) and isinstance(seen, d.Reaped) and isinstance(answer, d.Reaped):
            return 2, (
                f"reap ({op.client}) returned {seen.count} expired leases to pending where, in every order of the "
                f"others, {answer.count} had expired"
            )
    given = "nothing it could settle on" if answer is None else spec.describe_outcome(answer)
    after = f"after {len(path)} operations that fit" if path else "from the state the epoch began in"
    return 9, (
        f"{spec.describe_command(command)} by {op.client} was answered {spec.describe_outcome(seen)}, "
        f"but {after} the model answers {given}"
    )


def _tries(order: Order, spec: Spec, ops: Sequence[Operation], only: set[int] | None) -> list[tuple[int, int, str]]:
    """Every refused try of the operations that could not follow `order` (of those in `only`,
    if given), with how telling each is."""
    tries: list[tuple[int, int, str]] = []
    for b in order.blocked:
        if b.op.indeterminate or (only is not None and b.op.id not in only):
            continue
        rank, text = _told(b.op, b.state, b.answer, order.placed, spec, ops)
        tries.append((rank, b.op.invoked, text))
        for seen_state, answer, path in order.attempts.get(b.op.id, ()):
            rank, text = _told(b.op, seen_state, answer, path, spec, ops)
            tries.append((rank, b.op.invoked, text))
    return tries


def end_difference(order: Order) -> list[str]:
    """The rows where the best order's end state and the recorded one part, in world names."""
    if order.end is None or order.want is None:
        return []
    ours, theirs = rows_of(order.end), rows_of(order.want)
    lines = []
    for entity in sorted(ours.keys() | theirs.keys()):
        a, b = ours.get(entity), theirs.get(entity)
        if a == b:
            continue
        if a is None or b is None:
            lines.append(
                f"{entity[0]} {entity[1]} is "
                + ("only in the recorded state" if a is None else "missing from the recorded state")
            )
            continue
        fields = [
            f"{f} {b.get(f, '-')} (the model: {a.get(f, '-')})" for f in a.keys() | b.keys() if a.get(f) != b.get(f)
        ]
        lines.append(f"{entity[0]} {entity[1]}: " + ", ".join(sorted(fields)))
    return lines


def explain(order: Order, spec: Spec, ops: Sequence[Operation], reason: str = "", also: Sequence[Order] = ()) -> str:
    """One sentence, in the model's words, on why `order` could go no further: which
    operation's recorded outcome no order gives, and what made the model answer otherwise
    (e.g. "finish of R1/s1/T2 at generation 3 accepted (w2) after reap moved the row to
    generation 4"). `also`: searches of the same operations among more of their history
    (the whole partition of the epoch, where the shrunk piece forgot what a reap did):
    the most telling try of any of them is the sentence."""
    if order.complete:
        return "an order of the model's steps explains every outcome"
    if reason == UNTOUCHED:
        differs = end_difference(order)
        where = differs[0] if differs else reason
        return f"no operation touched these rows, yet the state read at the barrier differs: {where}"
    if order.end is not None:
        differs = end_difference(order)
        where = differs[0] if differs else "the state"
        return f"every outcome fits an order, but none ends in the state read at the barrier: {where}"
    blocked = {b.op.id for b in order.blocked if not b.op.indeterminate}
    tries = _tries(order, spec, ops, None)
    for other in also:  # the same operations, tried in the states of a wider search
        tries += _tries(other, spec, ops, blocked)
    if not tries:
        return "no order of these operations explains their outcomes"
    return min(tries)[2]


def violation_order(violation: Violation, spec: Spec) -> Order:
    """The longest partial order of the checker's minimal piece, from its barrier state."""
    piece = violation.piece
    want = piece.barriers[0].state if piece.barriers else None
    return search(spec, piece.operations, piece.initial, want, stalls=piece.stalls)


def partition_orders(violation: Violation, spec: Spec, history: History | None) -> list[Order]:
    """The search over the violating epoch's partition in the whole history, every outcome as recorded."""
    if history is None:
        return []
    for number, ops, start, end in epochs(history):
        if number != violation.epoch or start is None:
            continue
        keys = violation.keys
        if keys is not None:
            ops = tuple(op for op in ops if (spec.footprint(start, op.command) or frozenset()) & keys)
            start = spec.restrict(start, keys)
            end = None if end is None else spec.restrict(end, keys)
        return [search(spec, ops, start, end, stalls=history.stalls)] if ops else []
    return []


def violation_sentence(violation: Violation, spec: Spec, history: History | None = None) -> str:
    """The one sentence a page leads with: why the piece has no order, in the model's words.
    With the whole `history`, the operations the piece needs are also tried among everything
    their partition did (a reap the shrunk piece left out, say)."""
    also = partition_orders(violation, spec, history)
    return explain(violation_order(violation, spec), spec, violation.operations, violation.reason, also)
