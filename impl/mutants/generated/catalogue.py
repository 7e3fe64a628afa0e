"""Every generated mutant of the two bundled machines.

Each operation of either machine is one database function the stores call (`lp_claim`,
...; `impl/migrations/0006_database_api.sql`), which calls helpers of its own (`lp_enter`,
`lp_now`, ...). A generated mutant is one single-site mutation (`sql.py`) of the body of
one of those functions: the bundled store class with that body in `FUNCTIONS` (a `Patch`
of the whole body), which the adapters install in their database. Which functions are
mutated is read off the code: those the machine's store classes call (their `SQL_*`
statements), then every function those call, and so on; `not_mutated()` names those
left out (the row guards, the CHECK function, the test-database mark), each with why.
A function both machines run gives each machine its own mutants of it (the lifecycle's
prefixed `lifecycle:`): a bug in shared code is in both machines at once, and each
machine's checks are measured on it.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import re
from collections.abc import Mapping
from typing import Any

import attrs

from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.impl.migrate import Function, Patch
from leaseproof.impl.migrate import functions as shipped_functions
from leaseproof.impl.mutants.generated.sql import (
    Kind,
    Mutation,
    collapse_whitespace,
    drops_try_lock_outcome,
    lock_only_spans,
    mutations,
    tokenize,
)

MACHINES = ("delivery", "lifecycle")

# The lock operators change nothing one operation at a time: only a forced
# interleaving (two transactions at the lock) can tell such a mutant apart. So
# does any other operator's change of what only chooses a lock (an advisory
# lock's key, the condition that says whether to take it: `sql.lock_only_spans`),
# or a dropped conjunct that reads whether a try-lock succeeded
# (`sql.drops_try_lock_outcome`: one operation at a time, every try-lock does).
RACE_OPERATORS = frozenset({"drop-lock", "drop-skip-locked", "try-advisory-lock"})


# The functions that decide who may call what (`lp_role_scope`, the isolation level). The
# model has no roles, so no lockstep program can see a mutant of them, or of a condition
# that calls one or reads session_user: the scope check judges those
# (`conformance/evidence/scopes.py`).
SCOPE_FUNCTIONS = frozenset(
    {
        "lp_may_act",
        "lp_is_fleet",
        "lp_require_scope",
        "lp_require_fleet",
        "lp_scope_refused",
        "lp_require_read_committed",
    }
)


def kind_of(mutation: Mutation, function: str, body: str) -> str:
    """ "scope" for a mutation of who may call, "race" for one that changes only locking,
    "sequential" for any other."""
    if mutation.operator in RACE_OPERATORS:
        return "race"
    site = site_of(mutation, body)
    group_start, group_end = _group_around(body, site)
    around = (mutation.before, body[group_start:group_end])
    if function in SCOPE_FUNCTIONS or any(
        name in text for name in (*SCOPE_FUNCTIONS, "session_user") for text in around
    ):
        return "scope"
    only_contended = any(start <= site < end for start, end in lock_only_spans(body))
    return "race" if only_contended or drops_try_lock_outcome(mutation, body) else "sequential"


def site_of(mutation: Mutation, body: str) -> int:
    """The offset in `body` (the function's shipped body) where `mutation` first changes it."""
    return next((k for k, (a, b) in enumerate(zip(body, mutation.sql, strict=False)) if a != b), len(body))


def _group_around(body: str, site: int) -> tuple[int, int]:
    """The span of the innermost parenthesised group of `body` that holds `site` (outside
    string literals); the empty span at `site` if none does."""
    opened: list[int] = []
    around = (site, site)
    quoted = False
    for k, char in enumerate(body):
        if char == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif char == "(":
            opened.append(k)
        elif char == ")" and opened:
            start = opened.pop()
            if start < site <= k and (around == (site, site) or start > around[0]):
                around = (start, k + 1)
    return around


@attrs.frozen
class Role:
    """One class an adapter is given, by its keyword; `runs` limits it to the
    statements the machine runs through it (None: every statement it has)."""

    keyword: str
    cls: type[Any]
    runs: frozenset[str] | None = None


ROLES: Mapping[str, tuple[Role, ...]] = {
    "delivery": (Role("store_class", PostgresDeliveryStore),),
    "lifecycle": (
        Role("store_class", LifecycleStore),
        Role("engine_class", ReplicaEngine),
        Role("resumer_class", RunResumer),
        # The lifecycle adapter creates communities and changes their state
        # through the delivery store, and runs nothing else of it.
        Role(
            "communities_class", PostgresDeliveryStore, frozenset({"SQL_CREATE_COMMUNITY", "SQL_SET_COMMUNITY_STATE"})
        ),
    ),
}

# Functions the machines reach that are not mutated, and why.
_GUARD = (
    "a row guard (a trigger function): it refuses rows that no function writes, so a mutant of it shows only "
    "as a refusal of rows every operation writes (killed by any check at once) or not at all"
)
_SPECIAL: Mapping[str, str] = {
    "lp_delivery_shape": "the delivery table's CHECK constraint: " + _GUARD.split(": ", 1)[1],
    "lp_test_hooks": "the test-database mark: true in every database the checks run on, and read by nothing "
    "the model describes (the pinned clock, the reset's deletions)",
}


@functools.cache
def _functions() -> Mapping[str, Function]:
    return shipped_functions()


def _is_trigger(function: Function) -> bool:
    head = function.definition[: function.definition.index(function.body)]
    return re.search(r"\bRETURNS\s+trigger\b", head, re.IGNORECASE) is not None


@functools.cache
def not_mutated() -> Mapping[str, str]:
    """Every shipped function left out of the mutants, with why."""
    left = {name: _GUARD for name, function in _functions().items() if _is_trigger(function)}
    return {**left, **{name: why for name, why in _SPECIAL.items() if name in _functions()}}


@attrs.frozen
class NamedStatement:
    """A statement attribute (`SQL_*`) of a store class, as its defining class has it."""

    owner: type[Any]
    attribute: str
    value: str

    def texts(self) -> tuple[tuple[None, str]]:
        return ((None, self.value),)


def _definer(cls: type[Any], attribute: str) -> type[Any] | None:
    """The class of `cls`'s MRO whose own attribute `attribute` is; None if it has none."""
    return next((k for k in cls.__mro__ if attribute in vars(k)), None)


def _roles(machine: str) -> tuple[Role, ...]:
    if machine not in ROLES:
        raise ValueError(f"unknown machine {machine!r}: one of {', '.join(MACHINES)}")
    return ROLES[machine]


def statements(machine: str) -> tuple[NamedStatement, ...]:
    """Every statement (`SQL_*`: a call of a database function) `machine`'s store classes
    run, each once, in role then MRO then definition order."""
    found: dict[tuple[type[Any], str], NamedStatement] = {}
    for role in _roles(machine):
        for klass in role.cls.__mro__:
            for attribute, value in vars(klass).items():
                if not attribute.startswith("SQL_") or not isinstance(value, str):
                    continue
                if _definer(role.cls, attribute) is not klass:
                    continue  # overridden further down: the machine never runs this text
                if role.runs is None or attribute in role.runs:
                    found.setdefault((klass, attribute), NamedStatement(klass, attribute, value))
    return tuple(found.values())


def _calls(text: str) -> list[str]:
    """The shipped functions `text` calls (a name followed by `(`), in order, each once."""
    known = _functions()
    sig = [t for t in tokenize(text) if t.kind not in (Kind.SPACE, Kind.COMMENT)]
    found: list[str] = []
    for token, after in itertools.pairwise(sig):
        name = token.text.lower()
        if token.kind is Kind.WORD and after.kind is Kind.OPEN and name in known and name not in found:
            found.append(name)
    return found


@functools.cache
def functions_of(machine: str) -> tuple[str, ...]:
    """The functions `machine`'s mutants are made of: those its store classes call, then
    those these call, and so on (first seen first), less the ones left out (`not_mutated`)."""
    reached: list[str] = []
    pending = [name for statement in statements(machine) for name in _calls(statement.value)]
    while pending:
        name = pending.pop(0)
        if name in reached:
            continue
        reached.append(name)
        pending += _calls(_functions()[name].body)
    skipped = not_mutated()
    return tuple(name for name in reached if name not in skipped)


@attrs.frozen
class GeneratedMutant:
    """One single-site mutation of the body of one function of one machine."""

    name: str  # e.g. "lp_renew/drop-conjunct/4", "lifecycle:lp_enter/drop-not/1"
    machine: str
    function: str
    mutation: Mutation
    kind: str  # "race" (visible only under concurrency), "scope" (who may call) or "sequential"
    stands_for: str

    @property
    def patch(self) -> Patch:
        """The edit of the shipped function: its whole body, mutated at the one site."""
        return Patch(self.function, _functions()[self.function].body, self.mutation.sql)

    @property
    def diff(self) -> str:
        """The mutant as a unified diff of the function's body."""
        original = _functions()[self.function].body.splitlines(keepends=True)
        mutated = self.mutation.sql.splitlines(keepends=True)
        return "".join(difflib.unified_diff(original, mutated, self.function, self.name, n=1))

    def classes(self) -> dict[str, type[Any]]:
        """The adapter's keyword arguments: each role class, the first one carrying the patch."""
        return dict(_mutant_classes(self))

    def adapter(self, dsn: str) -> Any:
        """The bundled adapter of this mutant's machine running the mutated function, on database `dsn`."""
        classes = self.classes()
        if self.machine == "delivery":
            from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter

            return PostgresDeliveryAdapter(dsn, classes["store_class"])
        from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter

        return PostgresLifecycleAdapter(
            dsn,
            store_class=classes["store_class"],
            engine_class=classes["engine_class"],
            resumer_class=classes["resumer_class"],
            communities_class=classes["communities_class"],
        )


@functools.cache
def _mutant_classes(mutant: GeneratedMutant) -> Mapping[str, type[Any]]:
    """The role classes, the first subclassed to list the patch (the adapter installs the
    patches every role class lists, so one is enough)."""
    slug = re.sub(r"\W+", "_", mutant.name.removeprefix("lifecycle:")).strip("_")
    classes: dict[str, type[Any]] = {}
    for k, role in enumerate(_roles(mutant.machine)):
        cls = role.cls
        if k == 0:
            cls = type(f"{cls.__name__}__{slug}", (cls,), {"FUNCTIONS": (*cls.FUNCTIONS, mutant.patch)})
        classes[role.keyword] = cls
    return classes


def generated_mutants(machine: str | None = None) -> tuple[GeneratedMutant, ...]:
    """Every generated mutant of `machine` (both, delivery first, when None), in a fixed order."""
    if machine is None:
        return tuple(m for each in MACHINES for m in _generated(each))
    return _generated(machine)


@functools.cache
def _generated(machine: str) -> tuple[GeneratedMutant, ...]:
    # A function the delivery machine runs too has a delivery mutant of the same name:
    # the lifecycle one is prefixed.
    shared = set(functions_of("delivery")) if machine == "lifecycle" else set()
    found: list[GeneratedMutant] = []
    for name in functions_of(machine):
        body = _functions()[name].body
        prefix = "lifecycle:" if name in shared else ""
        found.extend(
            GeneratedMutant(
                name=f"{prefix}{name}/{mutation.operator}/{mutation.site}",
                machine=machine,
                function=name,
                mutation=mutation,
                kind=kind_of(mutation, name, body),
                stands_for=f"{name}: {describe(mutation, body)}",
            )
            for mutation in mutations(body)
        )
    return tuple(found)


def by_name(name: str) -> GeneratedMutant:
    """The generated mutant called `name`; a ValueError naming the nearest names otherwise."""
    index = _by_name()
    if name in index:
        return index[name]
    near = difflib.get_close_matches(name, index, n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise ValueError(f"no generated mutant named {name!r}{hint}")


@functools.cache
def _by_name() -> Mapping[str, GeneratedMutant]:
    return {m.name: m for m in generated_mutants()}


# -- what a mutant stands for ---------------------------------------------------------


def _quoted(fragment: str, limit: int = 90) -> str:
    return '"' + (fragment if len(fragment) <= limit else fragment[: limit - 1] + "…") + '"'


def _site_line(original: str, mutated: str) -> str:
    """The original line where the mutation starts, as context for a one-token change."""
    at = next((k for k, (a, b) in enumerate(zip(original, mutated, strict=False)) if a != b), len(original))
    start = original.rfind("\n", 0, at) + 1
    end = original.find("\n", at)
    return collapse_whitespace(original[start : len(original) if end < 0 else end])


def _operand(fragment: str, joiner: str) -> str:
    """A removed chain operand without the AND/OR that joined it."""
    return fragment.removeprefix(joiner + " ").removesuffix(" " + joiner)


def describe(mutation: Mutation, original: str) -> str:
    """One line on what the mutation changes, in the function's own words."""
    op, before, after = mutation.operator, mutation.before, mutation.after
    line = _quoted(_site_line(original, mutation.sql))
    if op == "drop-conjunct":
        if after == "true":
            return f"replaces the condition {_quoted(before)} with true"
        return f"drops the conjunct {_quoted(_operand(before, 'AND'))}"
    if op == "drop-disjunct":
        return f"drops the disjunct {_quoted(_operand(before, 'OR'))}"
    if op in ("off-by-one", "replace-literal"):
        return f"{before} becomes {after} in {line}"
    if op == "shift-clock":
        return f"reads the clock one microsecond {'ahead' if ' + ' in after else 'behind'} in {line}"
    if op == "drop-order-key":
        return f"drops the order key {_quoted(before.strip(', '))}"
    if op == "drop-lock":
        return f"drops the row lock {_quoted(before)} in {line}"
    if op == "drop-skip-locked":
        return "waits for rows another transaction holds: drops SKIP LOCKED"
    if op == "try-advisory-lock":
        return f"try-locks and ignores the result (no mutual exclusion when contended) in {line}"
    if op == "drop-in-element":
        return f"drops {before.strip(', ')} from the IN list in {line}"
    if op == "drop-distinct":
        return f"drops DISTINCT in {line}"
    if op == "left-join":
        return f"keeps unmatched rows: JOIN becomes LEFT JOIN in {line}"
    if op == "drop-on-conflict":
        return f"drops {_quoted(before)}: a duplicate raises instead of being skipped"
    if op == "drop-statement":
        return f"skips the statement {_quoted(before)}"
    if op == "drop-return":
        return f"goes on past the RETURN in {line}"
    if op == "drop-assignment" and before.startswith(":="):
        return f"leaves the variable NULL: drops the initial value in {line}"
    if op == "drop-assignment" and not after:
        return f"skips the assignment {_quoted(before)}"
    if op == "negate-condition":
        return f"takes the other branch: {_quoted(before)} becomes {_quoted(after)}"
    # flip-comparison, flip-arithmetic, reverse-order-key, drop-assignment (SET), drop-not
    return f"{_quoted(before)} becomes {_quoted(after)}"


__all__ = [
    "MACHINES",
    "RACE_OPERATORS",
    "ROLES",
    "SCOPE_FUNCTIONS",
    "GeneratedMutant",
    "NamedStatement",
    "Role",
    "by_name",
    "describe",
    "functions_of",
    "generated_mutants",
    "kind_of",
    "not_mutated",
    "site_of",
    "statements",
]
