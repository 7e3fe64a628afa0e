"""Deliberately wrong variants of the bundled machines: written by hand, racy, and generated."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class _Named(Protocol):
    @property
    def name(self) -> str: ...


M = TypeVar("M", bound=_Named)


def by_name(catalogue: Iterable[M], name: str) -> M:
    """The mutant called `name` in `catalogue` (`MUTANTS`, `LIFECYCLE_MUTANTS`, `RACE_MUTANTS`, or any mix)."""
    for mutant in catalogue:
        if mutant.name == name:
            return mutant
    raise LookupError(f"no mutant named {name!r}")
