"""Every generated mutant of the two bundled machines.

The stores name each SQL statement they run as a class attribute (`SQL_*`),
so a mutant is the bundled class with one attribute replaced by one
single-site mutation of its text (`impl/mutants/generated/sql.py`). This module finds
the statements each machine's adapter actually runs (by walking the MRO of
the classes the adapter is given), applies every operator to each, and
builds, on demand, the mutant classes and the bundled adapter that runs them.

A statement defined once on a base class and inherited by several classes of
one machine (`FencedWriter.SQL_COMMUNITY_STATE`, read by every lifecycle
writer) is one statement of that machine: its mutant installs the mutated
text in every class of the machine that inherits it, since a bug in a shared
statement is in all its callers at once.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from typing import Any

import attrs

from leaseproof.impl.delivery.store import PostgresDeliveryStore
from leaseproof.impl.lifecycle.store import LifecycleStore, ReplicaEngine, RunResumer
from leaseproof.impl.mutants.generated.sql import Mutation, collapse_whitespace, mutations

MACHINES = ("delivery", "lifecycle")

# The lock operators change nothing one operation at a time: only a forced
# interleaving (two transactions at the lock) can tell such a mutant apart.
RACE_OPERATORS = frozenset({"drop-lock", "drop-skip-locked", "try-advisory-lock"})

# A tuple-valued attribute is a sequence of statements run in order; this
# replaces one of them by a statement that does nothing, keeping the length.
DROPPED_STATEMENT = "SELECT 1"


@attrs.frozen
class Role:
    """One class an adapter is given, by its keyword; `runs` limits it to the
    statements the machine runs through it (None: every statement it has)."""

    keyword: str
    cls: type[Any]
    runs: frozenset[str] | None = None


ROLES: Mapping[str, tuple[Role, ...]] = {
    # The delivery machine runs every statement of the store but the sweep's
    # report of what it left (`sweep()`, outside the model; its tests are in
    # tests/impl/test_bounded_waits.py).
    "delivery": (
        Role(
            "store_class",
            PostgresDeliveryStore,
            frozenset(a for a in dir(PostgresDeliveryStore) if a.startswith("SQL_")) - {"SQL_SWEEP_LEFT"},
        ),
    ),
    "lifecycle": (
        Role("store_class", LifecycleStore),
        Role("engine_class", ReplicaEngine),
        Role("resumer_class", RunResumer),
        # The lifecycle adapter creates communities and changes their state
        # through the delivery store, and runs nothing else of it.
        Role(
            "communities_class",
            PostgresDeliveryStore,
            frozenset({"SQL_CREATE_COMMUNITY", "SQL_COMMUNITY_FOR_UPDATE", "SQL_SET_COMMUNITY_STATE"}),
        ),
    ),
}


@attrs.frozen
class NamedStatement:
    """A statement attribute as its defining class has it: a str, or a tuple of str."""

    owner: type[Any]
    attribute: str
    value: str | tuple[str, ...]

    def texts(self) -> tuple[tuple[int | None, str], ...]:
        """(element index or None, text) of each statement it holds."""
        if isinstance(self.value, str):
            return ((None, self.value),)
        return tuple(enumerate(self.value))


def _is_statement(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, tuple) and all(isinstance(v, str) for v in value))


def _definer(cls: type[Any], attribute: str) -> type[Any] | None:
    """The class of `cls`'s MRO whose own attribute `attribute` is; None if it has none."""
    return next((k for k in cls.__mro__ if attribute in vars(k)), None)


def statements(machine: str) -> tuple[NamedStatement, ...]:
    """Every statement `machine` runs, each once, in role then MRO then definition order."""
    found: dict[tuple[type[Any], str], NamedStatement] = {}
    for role in _roles(machine):
        for klass in role.cls.__mro__:
            for attribute, value in vars(klass).items():
                if not attribute.startswith("SQL_") or not _is_statement(value):
                    continue
                if _definer(role.cls, attribute) is not klass:
                    continue  # overridden further down: the machine never runs this text
                if role.runs is None or attribute in role.runs:
                    found.setdefault((klass, attribute), NamedStatement(klass, attribute, value))
    return tuple(found.values())


def _roles(machine: str) -> tuple[Role, ...]:
    if machine not in ROLES:
        raise ValueError(f"unknown machine {machine!r}: one of {', '.join(MACHINES)}")
    return ROLES[machine]


@attrs.frozen
class GeneratedMutant:
    """One single-site mutation of one statement of one machine."""

    name: str  # e.g. "PostgresDeliveryStore.SQL_RENEW/drop-conjunct/4"
    machine: str
    owner: str  # the class that defines the statement
    attribute: str
    element: int | None  # index inside a tuple-valued attribute, else None
    mutation: Mutation
    kind: str  # "race" (visible only under concurrency) or "sequential"
    stands_for: str

    def mutated_value(self, original: str | tuple[str, ...]) -> str | tuple[str, ...]:
        """The attribute's value with this mutation in place: the tuple keeps its length."""
        if self.element is None:
            return self.mutation.sql
        elements = list(original)
        elements[self.element] = self.mutation.sql
        return tuple(elements)

    def classes(self) -> dict[str, type[Any]]:
        """The adapter's keyword arguments: each role class, mutated where it inherits the statement."""
        return dict(_mutant_classes(self))

    def adapter(self, dsn: str) -> Any:
        """The bundled adapter of this mutant's machine running the mutated classes, on database `dsn`."""
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
    """One subclass per role that inherits the mutated statement, differing in that attribute only."""
    slug = re.sub(r"\W+", "_", mutant.name.removeprefix("lifecycle:").split(".", 1)[1]).strip("_")
    classes: dict[str, type[Any]] = {}
    for role in _roles(mutant.machine):
        cls = role.cls
        definer = _definer(cls, mutant.attribute)
        if definer is not None and definer.__name__ == mutant.owner:
            mutated = mutant.mutated_value(getattr(cls, mutant.attribute))
            cls = type(f"{cls.__name__}__{slug}", (cls,), {mutant.attribute: mutated})
        classes[role.keyword] = cls
    return classes


def generated_mutants(machine: str | None = None) -> tuple[GeneratedMutant, ...]:
    """Every generated mutant of `machine` (both, delivery first, when None), in a fixed order."""
    if machine is None:
        return tuple(m for each in MACHINES for m in _generated(each))
    return _generated(machine)


@functools.cache
def _generated(machine: str) -> tuple[GeneratedMutant, ...]:
    # A statement the lifecycle machine borrows from the delivery store has a
    # delivery mutant of the same name: the lifecycle one is prefixed.
    borrowed = {(s.owner, s.attribute) for s in statements("delivery")} if machine == "lifecycle" else set()
    found: list[GeneratedMutant] = []
    for statement in statements(machine):
        prefix = "lifecycle:" if (statement.owner, statement.attribute) in borrowed else ""
        for element, text in statement.texts():
            label = statement.attribute + ("" if element is None else f"[{element}]")
            site_mutations = mutations(text)
            if element is not None and collapse_whitespace(text) != DROPPED_STATEMENT:
                dropped = collapse_whitespace(text)
                site_mutations.append(Mutation("drop-statement", 1, dropped, DROPPED_STATEMENT, DROPPED_STATEMENT))
            found.extend(
                GeneratedMutant(
                    name=f"{prefix}{statement.owner.__name__}.{label}/{mutation.operator}/{mutation.site}",
                    machine=machine,
                    owner=statement.owner.__name__,
                    attribute=statement.attribute,
                    element=element,
                    mutation=mutation,
                    kind="race" if mutation.operator in RACE_OPERATORS else "sequential",
                    stands_for=f"{label}: {describe(mutation, text)}",
                )
                for mutation in site_mutations
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
    """One line on what the mutation changes, in the statement's own words."""
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
        return f"drops the row lock {_quoted(before)}"
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
    # flip-comparison, flip-arithmetic, reverse-order-key, drop-assignment, drop-not
    return f"{_quoted(before)} becomes {_quoted(after)}"


__all__ = [
    "MACHINES",
    "RACE_OPERATORS",
    "GeneratedMutant",
    "NamedStatement",
    "Role",
    "by_name",
    "describe",
    "generated_mutants",
    "statements",
]
