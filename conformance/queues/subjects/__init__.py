"""The queues the profile judges: the bundled store, and real libraries through their public APIs.

`make(name, new_database)` opens one on a scratch database of its own (the
library's schema installed there by the library) and closes it after. A
library that is not installed raises `SubjectUnavailable`, saying how to
install it. Besides the named subjects, `leaseproof:MUTANT` is the bundled
store with one of its shipped mutants (`leaseproof mutants` lists them): the
evidence that the profile catches the bug classes it names.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from leaseproof.conformance.queues.protocol import QueueAdapter

# name -> (the adapter's module under this package, its class, the library it needs (None: none),
# how to install that library)
SUBJECTS: dict[str, tuple[str, str, str | None, str]] = {
    "leaseproof": ("bundled", "BundledQueue", None, ""),
    "procrastinate": ("procrastinate_queue", "ProcrastinateQueue", "procrastinate", "pip install -e '.[queues]'"),
    "pgqueuer": ("pgqueuer_queue", "PgQueuerQueue", "pgqueuer", "pip install -e '.[queues]'"),
    "pg-boss": ("pgboss_queue", "PgBossQueue", None, ""),  # Node.js: installed with npm on first use
    "graphile-worker": ("graphile_queue", "GraphileQueue", None, ""),  # likewise
}


class SubjectUnavailable(Exception):
    """A subject's library is not installed (or cannot run here)."""


MUTANT_PREFIX = "leaseproof:"


def known(name: str) -> bool:
    """Whether `name` is a subject: one of `SUBJECTS`, or `leaseproof:` and a shipped delivery mutant."""
    return name in SUBJECTS or (name.startswith(MUTANT_PREFIX) and name.removeprefix(MUTANT_PREFIX) in mutant_stores())


def mutant_stores() -> dict[str, type[Any]]:
    from leaseproof.impl.mutants.delivery import MUTANTS
    from leaseproof.impl.mutants.faults import FAULT_MUTANTS
    from leaseproof.impl.mutants.race import DELIVERY_RACE

    return {mutant.name: mutant.store for mutant in (*MUTANTS, *DELIVERY_RACE, *FAULT_MUTANTS)}


@contextlib.contextmanager
def make(name: str, new_database: Callable[[], AbstractContextManager[str]]) -> Iterator[QueueAdapter]:
    if name.startswith(MUTANT_PREFIX):
        from leaseproof.conformance.queues.subjects.bundled import BundledQueue

        store = mutant_stores()[name.removeprefix(MUTANT_PREFIX)]
        with new_database() as dsn:
            mutant = BundledQueue(dsn, store, name=name)
            try:
                yield mutant
            finally:
                mutant.close()
        return
    module_name, class_name, library, hint = SUBJECTS[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    if library is not None and importlib.util.find_spec(library) is None:
        raise SubjectUnavailable(f"{name} is not installed: {hint}")
    with new_database() as dsn:
        try:
            queue: QueueAdapter = getattr(module, class_name)(dsn)
        except getattr(module, "Unavailable", ()) as exc:
            raise SubjectUnavailable(f"{name}: {exc}") from exc
        try:
            yield queue
        finally:
            queue.close()
