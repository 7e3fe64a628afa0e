"""The queues the profile judges: the bundled store, and real libraries through their public APIs.

`make(name, new_database)` opens one on a scratch database of its own (the
library's schema installed there by the library) and closes it after. A
library that is not installed raises `SubjectUnavailable`, saying how to
install it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from leaseproof.conformance.queues.protocol import QueueAdapter

# name -> (module under this package, the class; the install hint when it is missing)
SUBJECTS: dict[str, tuple[str, str, str]] = {
    "leaseproof": ("bundled", "BundledQueue", ""),
}


class SubjectUnavailable(Exception):
    """A subject's library is not installed (or cannot run here)."""


@contextlib.contextmanager
def make(name: str, new_database: Callable[[], AbstractContextManager[str]]) -> Iterator[QueueAdapter]:
    module_name, class_name, hint = SUBJECTS[name]
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as exc:
        raise SubjectUnavailable(f"{name} is not installed ({exc.name}): {hint}") from exc
    with new_database() as dsn:
        queue: QueueAdapter = getattr(module, class_name)(dsn)
        try:
            yield queue
        finally:
            queue.close()
