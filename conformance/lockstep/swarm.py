"""Swarm testing: every generated program turns some of the generator's features off.

A program that may do everything does a little of each, and some bugs need a lot of one
thing without the others: many claims and clock moves with no fence to refuse them,
deletions and re-commits with nothing else in between. Swarm testing (Groce et al., ISSTA
2012) draws, per program, a set of features to leave out (rules, and families of argument
values), so that across programs every combination of emphasis occurs. The configuration
is drawn once, by the machine's set-up (a `st.shared` value the rules' argument strategies
read), so it sits at the very start of the program's choices, where the shrinker can widen
it without deleting any step; it shrinks towards everything enabled. Hypothesis's own
rule-level swarm draws its flags inside whichever step first asks about a rule, and
deleting that step redraws them, leaving padding steps in shrunk programs: it is not used.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st


@attrs.frozen
class Swarm:
    """The features one program leaves out."""

    off: frozenset[str] = frozenset()

    def on(self, feature: str | None) -> bool:
        return feature is None or feature not in self.off

    def __repr__(self) -> str:
        return f"Swarm(off={sorted(self.off)!r})" if self.off else "Swarm()"


# The most a program leaves out of each feature, in tenths. Measured with the
# model as the adapter over 5 seeds of 300 programs: at up to 90 % (as
# Hypothesis's own rule swarm draws), programs lacking a claim, a clock move or
# a renewal reached the lease corners (an expired holder renewing or
# finishing, a finish at the exact deadline) about half as often as with no
# swarm; at up to 50 % (Groce et al.'s coin) they reach them as often, and the
# stale-replica corners (a fire of a stale record) several times as often.
MOST_LEFT_OUT = 5


def swarm(features: Sequence[str], key: str) -> st.SearchStrategy[Swarm]:
    """A program's swarm over `features`, shared by every draw under `key`: a
    share p (0 to MOST_LEFT_OUT tenths, shrinking to 0) is drawn, then each
    feature is left out with probability p."""

    # One strategy per share, built once: a strategy made afresh in every draw is
    # validated afresh too, which cost about 4 ms a program (a quarter of the
    # harness's time between two programs, while the implementation waited).
    @functools.cache
    def leave_out(tenths: int) -> st.SearchStrategy[Swarm]:
        coins = [st.integers(0, 9).map(lambda x: x >= 10 - tenths) for _ in features]
        return st.tuples(*coins).map(lambda off: Swarm(frozenset(f for f, o in zip(features, off, strict=True) if o)))

    return st.shared(st.integers(0, MOST_LEFT_OUT).flatmap(leave_out), key=key)


Option = tuple[Any, str | None]  # a value, and the feature that brings it (None: always on)


def values(shared: st.SearchStrategy[Swarm], options: Sequence[Option]) -> st.SearchStrategy[Any]:
    """One of `options` (repeat an option to weight it) whose feature the program's
    swarm leaves on; all of them if it leaves none on. Shrinks to the first."""
    listed = tuple(options)

    @functools.lru_cache(maxsize=256)
    def among(program: Swarm) -> st.SearchStrategy[Any]:
        allowed = [value for value, feature in listed if program.on(feature)]
        return st.sampled_from(allowed or [value for value, _ in listed])

    return shared.flatmap(among)


def weighted(common: Sequence[Any], rare: Sequence[Any], weight: int, feature: str | None) -> list[Option]:
    """`common` values (always on) `weight` times as likely as `rare` ones, which `feature` brings."""
    return [(v, None) for v in common] * weight + [(v, feature) for v in rare]


class EveryRule:
    """Hypothesis's rule-level feature flags, with every rule enabled: see the module docstring."""

    def is_enabled(self, name: object) -> bool:
        return True


def without_hypothesis_rule_swarm(machine: Any) -> bool:
    """Turn off Hypothesis's own rule-level swarm on one state machine (its rules are
    switched by this module's swarm instead). True if the installed Hypothesis has
    the hook; `tests/conformance/lockstep/test_search.py` asserts it does."""
    rules = getattr(machine, "_rules_strategy", None)
    if rules is None or not hasattr(rules, "enabled_rules_strategy"):
        return False
    rules.enabled_rules_strategy = st.just(EveryRule())
    return True


# Hypothesis follows each program it generates with up to five "mutations" of
# it: copies of one span of its choices over another span with the same label
# (`ConjectureRunner.generate_mutations_from`), to make repeated structure
# likelier. In a lockstep program most such copies change nothing the
# machine sends (a copied choice lands in a step that ignores it), or one
# step: measured with the model as the adapter, over a third of verify's
# programs repeated the program before them, and the rest came in families
# of near copies, so a seed's first program to reach a corner came late
# (past program 100 on one seed of five for a corner the programs reach
# about one time in six). Collisions are the generators' own business here
# (see "Collisions" in specs/delivery.md), so verify draws every program
# afresh: 284 of 300 programs distinct instead of about 190, and the first
# program to reach each hand-written mutant's corner came by program 44 on
# every seed (it had been as late as 185).
_MUTATOR = ("hypothesis.internal.conjecture.engine", "ConjectureRunner", "generate_mutations_from")


@contextlib.contextmanager
def independent_programs() -> Iterator[bool]:
    """While entered, Hypothesis draws each program afresh, without mutating
    the one before. Yields whether the installed Hypothesis has the hook
    (`tests/conformance/lockstep/test_search.py` asserts it does); without it,
    nothing changes."""
    module, owner, name = _MUTATOR
    runner = getattr(importlib.import_module(module), owner, None)
    original = getattr(runner, name, None) if runner is not None else None
    if original is None:
        yield False
        return
    setattr(runner, name, _no_mutations)
    try:
        yield True
    finally:
        setattr(runner, name, original)


def _no_mutations(runner: Any, data: Any) -> None:
    """The mutator, turned off."""


# Hypothesis also draws, one integer or string in twenty, from a pool of the
# constants it finds in the "local" modules loaded so far (those outside
# site-packages: with `pip install -e`, leaseproof's own; under pytest, the
# test files, and any a test writes and imports). The pool grows as modules
# load, so the same seed drew other programs in a second run in one process,
# and other programs again from an installed wheel: measured, two in-process
# runs of one seed sent 131 and then 130 programs. verify draws from no such
# pool; Hypothesis's own fixed constants still apply.
_LOCAL_CONSTANTS = ("hypothesis.internal.conjecture.providers", "_get_local_constants", "CONSTANTS_CACHE")


@contextlib.contextmanager
def without_local_constants() -> Iterator[bool]:
    """While entered, Hypothesis's draws ignore the constants of the modules loaded.
    Yields whether the installed Hypothesis has the hook
    (`tests/conformance/lockstep/test_search.py` asserts it does); without it,
    nothing changes."""
    module_name, name, cache_name = _LOCAL_CONSTANTS
    module = importlib.import_module(module_name)
    original, constants = getattr(module, name, None), getattr(module, "Constants", None)
    cache: Any = getattr(getattr(module, cache_name, None), "cache", None)
    if original is None or constants is None or cache is None:
        yield False
        return
    empty = constants()
    cache.clear()  # permitted values already computed from the pool
    setattr(module, name, lambda: empty)
    try:
        yield True
    finally:
        setattr(module, name, original)
        cache.clear()
