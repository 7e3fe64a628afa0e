"""Is a concurrent history linearizable? The Wing–Gong/Lowe search, as in Porcupine.

A history is linearizable if its operations can be put in one order that respects
real time and in which the model, one command at a time, gives every recorded
outcome; an indeterminate operation may have taken effect at any point after its
invocation, or not at all. The search is Lowe's: depth-first, every visited
configuration (operations linearized, model state) remembered. Barriers (quiescent
points, which may carry the implementation's state) split a history into epochs
checked apart, and within an epoch operations whose footprints are disjoint are
checked apart too. The checker knows a machine only through a `Spec`.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import attrs

from leaseproof.conformance.concurrent.history import Barrier, History, Indeterminate, Operation, Stall

LINEARIZABLE = "linearizable"
NOT_LINEARIZABLE = "not linearizable"
UNKNOWN = "unknown"

NO_ORDER = "no order of these operations explains their outcomes"
WRONG_END = "some order explains every outcome, but none ends in the recorded state"
UNTOUCHED = "no operation touched these keys, yet the recorded state differs from the start"

DEFAULT_BUDGET = 200_000  # configurations per partition
SHRINK_BUDGET = 5_000  # configurations per attempt while shrinking a violation
SHRINK_TOTAL = 25_000  # configurations of every attempt of one shrink: it stops there, with what it has
DEFAULT_MAX_END_STATES = 256  # possible states carried across a barrier that recorded none
EXHAUSTIVE_LIMIT = 10  # operations the reference checker accepts
FORGOTTEN = "outcome not needed"


@attrs.frozen
class Spec:
    """What the checker knows of one machine.

    `footprint(start, command)` is every partition key the command can read
    or write when run anywhere in an epoch that starts in `start` (None: it
    may touch anything). `keys(state)` is every key the state holds entries
    for. `restrict(state, keys)` is the state holding only those keys'
    entries, plus the unkeyed global fields; a command whose footprint lies
    within `keys` must behave on it exactly as on the full state, because
    each partition is searched from its restricted start.
    """

    name: str
    step: Callable[[Any, Any], tuple[Any, Any]]
    footprint: Callable[[Any, Any], frozenset[Any] | None]
    keys: Callable[[Any], frozenset[Any]]
    restrict: Callable[[Any, AbstractSet[Any]], Any]
    describe_command: Callable[[Any], str]
    describe_outcome: Callable[[Any], str]
    describe_key: Callable[[Any], str] = repr
    # For a machine whose implementation chooses some values (fresh ids):
    # step with sight of the recorded outcome, to adopt the chosen value.
    # It may raise `Ambiguous` when the history cannot tell which value was
    # chosen (an indeterminate operation took one); the partition is then
    # "unknown", never judged.
    step_seen: Callable[[Any, Any, Any], tuple[Any, Any]] | None = None
    # For a machine whose operations pass over what other transactions hold
    # locked (SKIP LOCKED): what the other operations of a group, and the
    # history's stalls, allow each operation (`allowances(ops, stalls)`: by
    # operation id, computed once per group), and the steps under its allowance
    # (`step_allowed(state, command, seen, allowance)`): the model's own step
    # first, then each other (state, outcome) the allowance admits, which may
    # give the recorded outcome where the model's own step would not. An
    # operation with no allowance takes the plain step.
    allowances: Callable[[Sequence[Operation], Sequence[Stall]], Mapping[int, Any]] | None = None
    step_allowed: Callable[[Any, Any, Any, Any], Sequence[tuple[Any, Any]]] | None = None
    # The model's (operation, guard, outcome variant) for a command in a
    # state: with it, the checker counts the behaviours a linearization used.
    behaviour: Callable[[Any, Any], tuple[str, str, str]] | None = None


class Ambiguous(Exception):
    """The history does not determine a value the implementation chose."""


@attrs.frozen
class Violation:
    """Where the history stops being linearizable, and the smallest piece that shows it.

    `piece` is a history of its own: the violating partition's operations
    that are still needed, from the partition's start state, ending (if the
    end state is part of the problem) in the recorded state. Operations in
    `forgotten` stay as context, but their outcomes are not needed: the piece
    records them as indeterminate.
    """

    epoch: int  # 1-based
    keys: frozenset[Any] | None  # the partition; None: the whole state
    reason: str
    piece: History
    forgotten: frozenset[int]
    partition_size: int  # operations in the violating partition, before shrinking
    operations: tuple[Operation, ...]  # the piece's operations as recorded, outcomes and all


@attrs.frozen
class CheckResult:
    verdict: str
    operations: int
    epochs: int
    partitions: int
    configurations: int
    seconds: float
    violation: Violation | None = None
    exhausted: tuple[tuple[int, frozenset[Any] | None], ...] = ()  # (epoch, partition) out of budget
    # The model's behaviours along the orders that explained the history
    # (epochs without a recorded end state are not counted).
    behaviours: collections.Counter[tuple[str, str, str]] = attrs.field(factory=collections.Counter)

    @property
    def linearizable(self) -> bool:
        return self.verdict == LINEARIZABLE

    def summary(self) -> str:
        text = (
            f"{self.verdict}: {self.operations} operations, {self.epochs} epochs, "
            f"{self.partitions} partitions, {self.configurations} configurations, {self.seconds:.2f}s"
        )
        if self.exhausted:
            text += f"; {len(self.exhausted)} partitions ran out of budget (first in epoch {self.exhausted[0][0]})"
        return text


# -- epochs ----------------------------------------------------------------------


@attrs.frozen
class _Epoch:
    number: int
    operations: tuple[Operation, ...]
    opening: Barrier | None  # None: the history's initial state
    closing: Barrier | None  # None: the final epoch, with no end check


def split_epochs(history: History) -> list[_Epoch]:
    """Split at barriers, after checking that the history's ticks make sense."""
    barriers = sorted(history.barriers, key=lambda b: b.at)
    ats = [b.at for b in barriers]
    if len(set(ats)) != len(ats):
        raise ValueError(f"two barriers share a tick: {ats}")
    groups: list[list[Operation]] = [[] for _ in range(len(barriers) + 1)]
    for op in history.operations:
        where = f"operation {op.id} ({op.client}: {op.command!r})"
        if isinstance(op.outcome, Indeterminate) != (op.returned is None):
            raise ValueError(f"{where}: returned must be None exactly when the outcome is Indeterminate")
        if op.returned is not None and op.returned <= op.invoked:
            raise ValueError(f"{where}: returned at tick {op.returned}, not after its invocation at {op.invoked}")
        index = bisect.bisect_right(ats, op.invoked)
        if index > 0 and ats[index - 1] == op.invoked:
            raise ValueError(f"{where}: invoked at tick {op.invoked}, the tick of a barrier")
        if index < len(barriers) and op.returned is not None and op.returned >= ats[index]:
            raise ValueError(
                f"{where}: returned at tick {op.returned}, after the barrier at tick {ats[index]};"
                " a barrier is a point where no operation is in flight"
            )
        groups[index].append(op)
    for stall in history.stalls:
        if not stall.began < stall.patient < stall.letting_go < stall.ended:
            raise ValueError(f"a stall's ticks must rise (began < patient < letting_go < ended), not {stall!r}")
        if bisect.bisect_right(ats, stall.began) != bisect.bisect_right(ats, stall.ended):
            raise ValueError(f"a stall across a barrier: {stall!r}")
    epochs = [
        _Epoch(i + 1, tuple(ops), barriers[i - 1] if i else None, barriers[i] if i < len(barriers) else None)
        for i, ops in enumerate(groups)
    ]
    return epochs if epochs[-1].operations else epochs[:-1] or epochs


# -- the search --------------------------------------------------------------------


class _Visited:
    """The configurations seen: (linearized set, state) pairs.

    States are compared, not hashed, while few share a set: a new state
    shares almost every row with its parent, so equality is a quick
    identity walk, whereas hashing rehashes every row. Only a set that
    collects many states is hashed.
    """

    def __init__(self) -> None:
        self._states: dict[int, list[Any] | set[Any]] = {}

    def add(self, mask: int, state: Any) -> bool:
        """Remember the configuration; False if it was already seen."""
        states = self._states.setdefault(mask, [])
        if state in states:
            return False
        if isinstance(states, list) and len(states) >= 8:
            states = self._states[mask] = set(states)
        states.add(state) if isinstance(states, set) else states.append(state)
        return True


@attrs.define
class _Search:
    verdict: str
    explained: bool  # some order explained every determinate outcome
    explored: int
    ends: set[Any]
    witness: list[tuple[Any, Operation]] = attrs.Factory(list)  # (state before, operation) of the order found


def steps_of(
    spec: Spec, state: Any, op: Operation, allowed: Mapping[int, Any], adopt: bool = True
) -> Sequence[tuple[Any, Any]]:
    """The states `op` may leave and the outcome each gives: the model's step, and under its
    allowance, if it has one, every other the allowance admits; `adopt`: through
    `step_seen`, where the spec has one."""
    if op.id in allowed and spec.step_allowed is not None:
        return spec.step_allowed(state, op.command, op.outcome, allowed[op.id])
    if adopt and spec.step_seen is not None:
        return (spec.step_seen(state, op.command, op.outcome),)
    return (spec.step(state, op.command),)


def _search(
    spec: Spec,
    ops: Iterable[Operation],
    start: Any,
    want: Any,
    budget: int,
    collect: bool = False,
    stalls: Sequence[Stall] = (),
) -> _Search:
    """Lowe's search from `start`; success ends in `want` (None: anywhere).

    With `collect`, explore everything and gather every state the epoch can
    end in. Determinate operations are tried first, each group in invocation
    order; indeterminate ones never return, so they never force backtracking.
    An operation that may leave several states (`steps_of`) tries each in turn.
    """
    det = sorted((op for op in ops if not op.indeterminate), key=lambda op: op.invoked)
    ind = sorted((op for op in ops if op.indeterminate), key=lambda op: op.invoked)
    order = det + ind
    n, d = len(order), len(det)
    all_det = (1 << d) - 1
    invoked = [op.invoked for op in order]
    # The determinate operations by return tick, so that the earliest return
    # among those not yet linearized (which bounds what may go next) is the
    # lowest clear bit of a second mask.
    by_return = sorted(range(d), key=lambda i: order[i].returned)  # type: ignore[arg-type, return-value]  # determinate ops have returned
    return_rank = [0] * d
    for rank, i in enumerate(by_return):
        return_rank[i] = rank
    returns = [order[i].returned for i in by_return]
    never = float("inf")

    def lowest_clear(mask: int) -> int:
        return (~mask & (mask + 1)).bit_length() - 1

    def bound(rmask: int) -> float:
        r = lowest_clear(rmask)
        return returns[r] if r < d else never  # type: ignore[return-value]  # determinate ops have returned

    def next_candidate(mask: int, j: int, limit: float) -> int | None:
        """The first operation at or after `j` that may be linearized next: not yet
        linearized, and invoked before every unlinearized operation returned."""
        while j < d:
            if invoked[j] > limit:
                j = d
                break
            if not mask >> j & 1:
                return j
            j += 1
        while j < n and invoked[j] <= limit:
            if not mask >> j & 1:
                return j
            j += 1
        return None

    found = _Search(NOT_LINEARIZABLE, False, 1, set())
    allowed = spec.allowances(order, stalls) if spec.allowances is not None else {}

    def arrived(mask: int, state: Any) -> bool:
        """Every determinate operation is linearized: is this an end the epoch may have?"""
        if mask & all_det != all_det:
            return False
        found.explained = True
        if collect:
            found.ends.add(state)
            return False
        return want is None or state == want

    if arrived(0, start):
        found.verdict = LINEARIZABLE
        return found
    seen = _Visited()
    seen.add(0, start)
    # mask, return mask, state, next candidate, bound, the last candidate's other steps to try
    frames: list[list[Any]] = [[0, 0, start, 0, bound(0), []]]
    while frames:
        frame = frames[-1]
        mask, rmask, state, j, limit, others = frame
        if others:
            j = j - 1  # the candidate whose other steps these are
            after, outcome = others.pop()
        else:
            j = next_candidate(mask, j, limit)
            if j is None:
                frames.pop()
                continue
            frame[3] = j + 1
            try:
                steps = steps_of(spec, state, order[j], allowed)
            except Ambiguous:
                found.verdict = UNKNOWN
                return found
            after, outcome = steps[0]
            if len(steps) > 1:
                frame[5] = list(reversed(steps[1:]))
        op = order[j]
        if j < d and outcome != op.outcome:
            continue
        mask |= 1 << j
        if not seen.add(mask, after):
            continue
        found.explored += 1
        if found.explored > budget:
            found.verdict = UNKNOWN
            return found
        if arrived(mask, after):
            found.verdict = LINEARIZABLE
            found.witness = [(f[2], order[f[3] - 1]) for f in frames]
            return found
        if j < d:
            rmask |= 1 << return_rank[j]
        frames.append([mask, rmask, after, lowest_clear(mask), bound(rmask), []])
    if collect and found.ends:
        found.verdict = LINEARIZABLE
    return found


# -- partitions ---------------------------------------------------------------------


def _partitions(
    spec: Spec, ops: tuple[Operation, ...], start: Any
) -> list[tuple[frozenset[Any] | None, list[Operation]]]:
    """Connected groups of operations whose footprints overlap, with their keys."""
    footprints = [spec.footprint(start, op.command) for op in ops]
    if any(f is None for f in footprints):
        return [(None, list(ops))] if ops else []
    parent: dict[Any, Any] = {}

    def root(key: Any) -> Any:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for footprint in footprints:
        keys = list(footprint)  # type: ignore[arg-type]  # no footprint is None past the check above
        for key in keys:
            parent.setdefault(key, key)
        for key in keys[1:]:
            parent[root(key)] = root(keys[0])
    groups: dict[Any, tuple[set[Any], list[Operation]]] = {}
    # an empty footprint touches nothing: such an operation is a partition of its own
    lone: list[tuple[frozenset[Any] | None, list[Operation]]] = []
    for op, footprint in zip(ops, footprints, strict=True):  # footprints has one entry per op
        if not footprint:
            lone.append((frozenset(), [op]))
            continue
        group_keys, members = groups.setdefault(root(next(iter(footprint))), (set(), []))
        group_keys.update(footprint)
        members.append(op)
    grouped: list[tuple[frozenset[Any] | None, list[Operation]]] = [
        (frozenset(group_keys), members) for group_keys, members in groups.values()
    ]
    return grouped + lone


@attrs.frozen
class _Failure:
    keys: frozenset[Any] | None
    ops: tuple[Operation, ...]
    start: Any  # restricted to `keys`
    want: Any  # restricted to `keys`; None: no end check
    reason: str


@attrs.define
class _Tally:
    partitions: int = 0
    configurations: int = 0
    exhausted: list[tuple[int, frozenset[Any] | None]] = attrs.Factory(list)
    behaviours: collections.Counter[tuple[str, str, str]] = attrs.Factory(collections.Counter)


def _check_epoch(
    spec: Spec, epoch: _Epoch, start: Any, target: Any, budget: int, tally: _Tally, stalls: Sequence[Stall]
) -> tuple[str, _Failure | None]:
    """One epoch from one start state, partition by partition; `target` None: no end check."""
    verdict = LINEARIZABLE
    touched: set[Any] = set()
    used: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for keys, ops in _partitions(spec, epoch.operations, start):
        if keys is None:
            part_start, want = start, target
        else:
            touched |= keys
            part_start = spec.restrict(start, keys)
            want = None if target is None else spec.restrict(target, keys)
        found = _search(spec, ops, part_start, want, budget, stalls=stalls)
        tally.partitions += 1
        tally.configurations += found.explored
        if spec.behaviour is not None:
            used.update(spec.behaviour(state, op.command) for state, op in found.witness)
        if found.verdict == UNKNOWN:
            tally.exhausted.append((epoch.number, keys))
            verdict = UNKNOWN if verdict == LINEARIZABLE else verdict
        elif found.verdict == NOT_LINEARIZABLE:
            reason = WRONG_END if found.explained else NO_ORDER
            return NOT_LINEARIZABLE, _Failure(keys, tuple(ops), part_start, want, reason)
        if keys is None:
            tally.behaviours.update(used)
            return verdict, None  # one partition held everything, end state included
    if target is not None:
        # Whatever no operation touched must be as it was: this, with every
        # partition's own end check, is the whole end state.
        untouched = (spec.keys(start) | spec.keys(target)) - touched
        before, after = spec.restrict(start, untouched), spec.restrict(target, untouched)
        if before != after:
            # Name only the keys that changed (all of them, if a global field did).
            changed = frozenset(k for k in untouched if spec.restrict(start, {k}) != spec.restrict(target, {k}))
            before, after = spec.restrict(start, changed), spec.restrict(target, changed)
            return NOT_LINEARIZABLE, _Failure(changed, (), before, after, UNTOUCHED)
    tally.behaviours.update(used)
    return verdict, None


def _judge(
    history: History, spec: Spec, budget: int, max_end_states: int
) -> tuple[str, int, _Tally, tuple[int, _Failure] | None]:
    epochs = split_epochs(history)
    tally = _Tally()
    verdict = LINEARIZABLE
    starts: list[Any] | None = [history.initial]
    for epoch in epochs:
        if epoch.opening is not None and epoch.opening.state is not None:
            starts = [epoch.opening.state]
        if starts is None:  # too many possible starts were carried over
            tally.exhausted.append((epoch.number, None))
            verdict = UNKNOWN
            continue
        closing = epoch.closing
        if closing is not None and closing.state is None:
            # Nothing recorded to start the next epoch from: carry every state
            # this one can end in. States cannot be merged across partitions,
            # so such an epoch is searched whole.
            ends: set[Any] = set()
            outcomes = []
            for start in starts:
                found = _search(spec, epoch.operations, start, None, budget, collect=True, stalls=history.stalls)
                tally.partitions += 1
                tally.configurations += found.explored
                outcomes.append(found.verdict)
                ends |= found.ends
            if UNKNOWN in outcomes or len(ends) > max_end_states:  # the set of ends is incomplete
                tally.exhausted.append((epoch.number, None))
                verdict, starts = UNKNOWN, None
                continue
            if ends:
                starts = sorted(ends, key=repr)  # a stable order keeps runs repeatable
                continue
            failure = _Failure(None, epoch.operations, starts[0], None, NO_ORDER)
            return NOT_LINEARIZABLE, len(epochs), tally, (epoch.number, failure)
        target = closing.state if closing is not None else None
        results = []
        for start in starts:
            results.append(_check_epoch(spec, epoch, start, target, budget, tally, history.stalls))
            if results[-1][0] == LINEARIZABLE:
                break
        verdicts = {v for v, _ in results}
        if LINEARIZABLE in verdicts:
            continue
        if UNKNOWN in verdicts:
            verdict = UNKNOWN
            continue
        return NOT_LINEARIZABLE, len(epochs), tally, (epoch.number, results[0][1])  # type: ignore[return-value]  # a failed epoch has its _Failure
    return verdict, len(epochs), tally, None


def check(
    history: History, spec: Spec, *, budget: int = DEFAULT_BUDGET, max_end_states: int = DEFAULT_MAX_END_STATES
) -> CheckResult:
    """Is `history` linearizable with respect to `spec`'s model?

    `budget` bounds the configurations explored per partition; a partition
    that runs out makes the verdict "unknown", never a pass.
    """
    began = time.perf_counter()
    verdict, epochs, tally, failed = _judge(history, spec, budget, max_end_states)
    violation = None
    if failed is not None:
        number, failure = failed
        violation = _shrink(history.machine, spec, number, failure, budget, max_end_states, history.stalls)
    return CheckResult(
        verdict=verdict,
        operations=len(history.operations),
        epochs=epochs,
        partitions=tally.partitions,
        configurations=tally.configurations,
        seconds=time.perf_counter() - began,
        violation=violation,
        exhausted=tuple(tally.exhausted),
        behaviours=tally.behaviours,
    )


# -- the minimal piece ------------------------------------------------------------------


def _shrink(
    machine: str,
    spec: Spec,
    epoch: int,
    failure: _Failure,
    budget: int,
    max_end_states: int,
    stalls: Sequence[Stall] = (),
) -> Violation:
    """Shrink a violating partition to the operations whose outcomes are needed.

    Forgetting an outcome (making the operation indeterminate) only ever
    relaxes the history, so a piece that is still violated after it proves the
    original violated. Removing an operation is not a relaxation: dropping
    the commit that created a row leaves a later claim unexplainable for a
    trivial reason. So outcomes are forgotten first (greedily, latest first),
    and a forgotten operation is then removed only if every outcome still
    needed stays needed: the piece must fail for the same reason, not a new one.
    """
    # The stalls stay whole: each one's allowances are part of what the piece is judged by.
    within = tuple(stall for stall in stalls if any(stall.overlaps(op) for op in failure.ops))
    at = max((*(op.returned or op.invoked for op in failure.ops), *(stall.ended for stall in within)), default=0) + 1
    ops = {op.id: op for op in failure.ops}
    forgotten: set[int] = set()
    want = failure.want

    def piece(ids: Iterable[int], forget: set[int], end: Any) -> History:
        chosen = [
            attrs.evolve(ops[i], outcome=Indeterminate(FORGOTTEN), returned=None) if i in forget else ops[i]
            for i in sorted(ids)
        ]
        barriers = (Barrier(at, end),) if end is not None else ()
        return History(machine, failure.start, tuple(chosen), barriers, within)

    # Every forgotten outcome can double the search, so each attempt gets a
    # small budget: one that runs out shows nothing, and the operation stays. And
    # the attempts share one budget (a count, so the same history shrinks the same
    # everywhere): once it is spent, what is not yet tried stays as it is.
    left = [SHRINK_TOTAL]

    def violated(ids: Iterable[int], forget: set[int], end: Any) -> bool:
        attempt = min(budget, SHRINK_BUDGET, left[0])
        if attempt <= 0:
            return False
        verdict, _, tally, _ = _judge(piece(ids, forget, end), spec, attempt, max_end_states)
        left[0] -= tally.configurations
        return verdict == NOT_LINEARIZABLE

    kept = set(ops)
    if want is not None and violated(kept, forgotten, None):
        want = None
    latest_first = sorted(ops, key=lambda i: ops[i].invoked, reverse=True)
    for i in latest_first:
        if not ops[i].indeterminate and violated(kept, forgotten | {i}, want):
            forgotten.add(i)
    needed = [i for i in kept if i not in forgotten and not ops[i].indeterminate]
    for i in latest_first:
        if i in forgotten or ops[i].indeterminate:
            rest = kept - {i}
            if violated(rest, forgotten, want) and not any(violated(rest, forgotten | {n}, want) for n in needed):
                kept = rest
    forgotten &= kept
    shrunk = piece(kept, forgotten, want)
    reason = failure.reason
    if kept != set(ops) or want is not failure.want:
        _, _, _, failed = _judge(shrunk, spec, budget, max_end_states)
        reason = failed[1].reason if failed else reason
    recorded = tuple(ops[i] for i in sorted(kept))
    return Violation(epoch, failure.keys, reason, shrunk, frozenset(forgotten), len(failure.ops), recorded)


# -- the timeline ---------------------------------------------------------------------


def timeline(violation: Violation, spec: Spec, width: int = 100) -> str:
    """A lane diagram of the minimal piece: one lane per client, each operation
    a bar from its invocation to its response, placed by the rank of its ticks."""
    ops = sorted(violation.operations, key=lambda op: op.invoked)
    ticks = sorted({t for op in ops for t in (op.invoked, op.returned) if t is not None})
    rank = {t: i for i, t in enumerate(ticks)}
    gutter = max((len(op.client) for op in ops), default=0) + 1
    unit = max(3, min(40, (width - gutter - 40) // max(1, len(ticks))))
    lanes: dict[str, list[str]] = {}  # client -> its rows of text
    for op in ops:
        begin = rank[op.invoked] * unit
        label = spec.describe_command(op.command)
        if op.id in violation.forgotten:
            said = f"({FORGOTTEN})"
        elif op.indeterminate:
            said = f"? {op.outcome.reason}"
        else:
            said = spec.describe_outcome(op.outcome)
        # An operation that never returned stays open to the end of the diagram.
        end = rank[op.returned] * unit if op.returned is not None else len(ticks) * unit
        inner = end - begin - 1
        if len(label) + 3 <= inner:
            fill = "--" + label + "-" * (inner - 2 - len(label))
        else:  # too short to hold its name: the name goes after it
            fill, said = "-" * inner, f"{label}: {said}"
        bar = "|" + fill + ("|" if op.returned is not None else ">")
        rows = lanes.setdefault(op.client, [])
        row = next((i for i, text in enumerate(rows) if len(text) + 2 <= begin), None)
        if row is None:
            rows.append("")
            row = len(rows) - 1
        rows[row] = rows[row].ljust(begin) + bar + " " + said
    if violation.keys is None:
        where = "the whole state"
    else:
        where = ", ".join(sorted(spec.describe_key(k) for k in violation.keys)) or "no keys"
    lines = [f"epoch {violation.epoch}, partition {where}:"]
    for client, rows in lanes.items():
        for index, text in enumerate(rows):
            line = (client if index == 0 else "").ljust(gutter) + text
            lines.append(line if len(line) <= width else line[: width - 1] + "…")
    lines.append(violation.reason)
    if violation.piece.barriers:
        lines.append("(the piece ends in the state recorded at the barrier that closed the epoch)")
    # What the model answers to each needed operation run first, from the state
    # the epoch began in: next to what was recorded, it shows where they part.
    needed = [op for op in ops if op.id not in violation.forgotten and not op.indeterminate][:4]
    if needed:
        lines.append("the model's answer to each, run first from the state the epoch began in:")
        for op in needed:
            _, answer = spec.step(violation.piece.initial, op.command)
            line = f"  {spec.describe_command(op.command)} → {spec.describe_outcome(answer)}"
            lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return "\n".join(lines)


# -- the reference checker -------------------------------------------------------------------


def exhaustive_check(history: History, spec: Spec) -> str:
    """Linearizability by its definition, for tiny histories: try every subset of
    the indeterminate operations and every order of the chosen operations and
    the barriers that real time allows, running the model over the full state."""
    split_epochs(history)  # the same validation as `check`
    if len(history.operations) > EXHAUSTIVE_LIMIT:
        raise ValueError(f"exhaustive_check takes at most {EXHAUSTIVE_LIMIT} operations")

    def before(x: Operation | Barrier, y: Operation | Barrier) -> bool:
        if isinstance(x, Barrier):
            return x.at < (y.at if isinstance(y, Barrier) else y.invoked)
        if isinstance(y, Barrier):
            return x.invoked < y.at  # quiescence: everything invoked before a barrier is done by then
        return x.returned is not None and x.returned < y.invoked

    allowed: dict[int, Any] = {}
    if spec.allowances is not None:
        for epoch in split_epochs(history):
            allowed.update(spec.allowances(epoch.operations, history.stalls))

    def some_order(state: Any, remaining: tuple[Operation | Barrier, ...]) -> bool:
        if not remaining:
            return True
        for x in remaining:
            if any(before(y, x) for y in remaining if y is not x):
                continue
            if isinstance(x, Barrier):
                if x.state is not None and state != x.state:
                    continue
                after = state
            else:
                for after, outcome in steps_of(spec, state, x, allowed, adopt=False):  # the definition adopts nothing
                    if (x.indeterminate or outcome == x.outcome) and some_order(
                        after, tuple(y for y in remaining if y is not x)
                    ):
                        return True
                continue
            if some_order(after, tuple(y for y in remaining if y is not x)):
                return True
        return False

    determinate = [op for op in history.operations if not op.indeterminate]
    optional = [op for op in history.operations if op.indeterminate]
    for size in range(len(optional) + 1):
        for chosen in itertools.combinations(optional, size):
            if some_order(history.initial, (*determinate, *chosen, *history.barriers)):
                return LINEARIZABLE
    return NOT_LINEARIZABLE
