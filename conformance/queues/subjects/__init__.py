"""The queues the profile judges: the bundled store, real libraries through their public APIs, and
subjects from outside the package.

A subject is named one of three ways:

- a name: one of the built-in `SUBJECTS`, or one that an installed distribution registers in the
  `leaseproof.subjects` entry-point group (`name = "module:Class"`);
- `leaseproof:MUTANT`: the bundled store with one of its shipped mutants (`leaseproof mutants` lists
  them), the evidence that the profile catches the bug classes it names;
- `MODULE:CLASS` (`leaseproof guarantees --subject`): a class of a module found in the current folder
  first, then on sys.path, as `--adapter` finds its factory.

`make(reference, new_database)` opens one on a scratch database of its own, as `Class(dsn)` (the
library's schema installed there by the adapter), and closes it after. The contract a class meets
is `protocol.QueueAdapter`'s. A library that is not installed, or cannot run here, raises
`SubjectUnavailable`, saying how to install it; a built-in adapter's module is imported only once
its library is found.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import attrs

from leaseproof.conformance.boundary.loading import LoadError, import_target
from leaseproof.conformance.queues.protocol import QueueAdapter, SubjectUnavailable

__all__ = ["ENTRY_POINTS", "MUTANT_PREFIX", "SUBJECTS", "Source", "SubjectUnavailable", "UnknownSubject", "make"]

ENTRY_POINTS = "leaseproof.subjects"  # the entry-point group subjects from other distributions register in
MUTANT_PREFIX = "leaseproof:"
_HERE = __name__


@attrs.frozen
class Source:
    """Where a subject's adapter class is: `target` ("module:Class"), the library it needs (None: none
    this can check for) and how to install it, and where the name came from."""

    name: str
    target: str
    library: str | None = None
    hint: str = ""
    origin: str = "built in"


def _built_in(name: str, module: str, cls: str, library: str | None = None, hint: str = "") -> Source:
    return Source(name, f"{_HERE}.{module}:{cls}", library, hint)


_QUEUES_EXTRA = "pip install -e '.[queues]'"
SUBJECTS: dict[str, Source] = {
    s.name: s
    for s in (
        _built_in("leaseproof", "bundled", "BundledQueue"),
        _built_in("procrastinate", "procrastinate_queue", "ProcrastinateQueue", "procrastinate", _QUEUES_EXTRA),
        _built_in("pgqueuer", "pgqueuer_queue", "PgQueuerQueue", "pgqueuer", _QUEUES_EXTRA),
        _built_in("pg-boss", "pgboss_queue", "PgBossQueue"),  # Node.js: installed with npm on first use
        _built_in("graphile-worker", "graphile_queue", "GraphileQueue"),  # likewise
        _built_in("pgmq", "pgmq_queue", "PgmqQueue", "pgmq", _QUEUES_EXTRA),
        _built_in("absurd", "absurd_queue", "AbsurdQueue", "absurd_sdk", _QUEUES_EXTRA),
        _built_in("chancy", "chancy_queue", "ChancyQueue", "chancy", _QUEUES_EXTRA),
        # Python 3.12 or newer, in a virtualenv of its own, made on first use (oban/requirements.txt).
        _built_in("oban", "oban_queue", "ObanQueue"),
    )
}


# What protocol.QueueAdapter's class must define (its name, version and capabilities may be set by its
# constructor, and are looked for once it is made).
_METHODS = ("reset", "enqueue", "fetch", "heartbeat", "complete", "rescue", "advance", "rows", "session", "close")


class UnknownSubject(ValueError):
    """A reference names no subject (or two distributions claim its name); the message says which."""


def registered() -> dict[str, list[Source]]:
    """The subjects installed distributions register in `ENTRY_POINTS`, by name (more than one
    source under a name is a clash, reported when the name is used)."""
    found: dict[str, list[Source]] = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        dist = entry.dist.name if entry.dist is not None else "an unnamed distribution"
        found.setdefault(entry.name, []).append(Source(entry.name, entry.value, origin=f"entry point of {dist}"))
    return found


def is_target(reference: str) -> bool:
    """Whether `reference` is a `MODULE:CLASS` (not a name, not `leaseproof:MUTANT`)."""
    return ":" in reference and not reference.startswith(MUTANT_PREFIX)


def source(reference: str) -> Source | None:
    """The source of a subject named by `reference`; None for `leaseproof:MUTANT`. Raises
    `UnknownSubject` for a name nothing provides, a mutant that does not exist, or a name that a
    built-in subject and an entry point, or two entry points, both claim."""
    if reference.startswith(MUTANT_PREFIX):
        if reference.removeprefix(MUTANT_PREFIX) not in mutant_stores():
            raise UnknownSubject(f"no shipped mutant {reference.removeprefix(MUTANT_PREFIX)!r} (leaseproof mutants)")
        return None
    if is_target(reference):
        return Source(reference, reference, origin="--subject")
    claims = ([SUBJECTS[reference]] if reference in SUBJECTS else []) + registered().get(reference, [])
    if not claims:
        names = sorted({*SUBJECTS, *registered()})
        raise UnknownSubject(
            f"unknown subject {reference!r}: from {', '.join(names)}, leaseproof:MUTANT or MODULE:CLASS"
        )
    if len(claims) > 1:
        raise UnknownSubject(
            f"subject {reference!r} is claimed twice: " + " and ".join(f"{c.target} ({c.origin})" for c in claims)
        )
    return claims[0]


def load(found: Source) -> Callable[[str], QueueAdapter]:
    """The adapter class of `found`, imported (its library checked for first, if it names one)."""
    if found.library is not None and importlib.util.find_spec(found.library) is None:
        raise SubjectUnavailable(f"{found.name} is not installed: {found.hint}")
    try:
        cls = import_target(found.target, "MODULE:CLASS, e.g. myqueue.leaseproof_subject:MyQueue")
    except LoadError as exc:
        raise SubjectUnavailable(f"{found.name} ({found.origin}, {found.target}): {exc}") from None
    missing = [name for name in _METHODS if not callable(getattr(cls, name, None))]
    if not isinstance(cls, type) or missing:
        lacks = f"it has no {', '.join(missing)}" if isinstance(cls, type) else "it is not a class"
        raise SubjectUnavailable(f"{found.name} ({found.origin}): {found.target} is not a QueueAdapter: {lacks}")
    return cls


def mutant_stores() -> dict[str, type[Any]]:
    from leaseproof.impl.mutants.delivery import MUTANTS
    from leaseproof.impl.mutants.faults import FAULT_MUTANTS
    from leaseproof.impl.mutants.race import DELIVERY_RACE

    return {mutant.name: mutant.store for mutant in (*MUTANTS, *DELIVERY_RACE, *FAULT_MUTANTS)}


@contextlib.contextmanager
def make(reference: str, new_database: Callable[[], AbstractContextManager[str]]) -> Iterator[QueueAdapter]:
    found = source(reference)
    if found is None:
        from leaseproof.conformance.queues.subjects.bundled import BundledQueue

        store = mutant_stores()[reference.removeprefix(MUTANT_PREFIX)]
        with new_database() as dsn:
            mutant = BundledQueue(dsn, store, name=reference)
            try:
                yield mutant
            finally:
                mutant.close()
        return
    cls = load(found)
    with new_database() as dsn:
        try:
            queue = cls(dsn)
        except SubjectUnavailable as exc:
            raise SubjectUnavailable(f"{found.name}: {exc}") from exc
        try:
            missing = [name for name in ("name", "version", "capabilities") if not hasattr(queue, name)]
            if missing:
                raise SubjectUnavailable(f"{found.target} is not a QueueAdapter: it has no {', '.join(missing)}")
            yield queue
        finally:
            queue.close()
