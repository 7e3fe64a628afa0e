"""Where the judged libraries' log records go during `leaseproof guarantees`: a file beside the traces,
not the terminal.

The libraries log through Python's `logging` (a pool discarding a connection that a cut ended, a
worker's progress); with no handler configured, Python prints their warnings on stderr, between
the run's progress lines and the matrix. While `captured(path)` is open, the root logger's only
handler writes every record of level INFO and above, and every `warnings.warn`, to `path`
(created with the first record, its folder too), and counts them by level for the one line the
run prints (`summary`). On the way out the logging set-up is as it was.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

LEVEL = logging.INFO
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LibraryLog(logging.Handler):
    """Writes each record to a file opened at the first one; counts them by level."""

    def __init__(self, path: Path) -> None:
        super().__init__(LEVEL)
        self.path = path
        self.counts: collections.Counter[str] = collections.Counter()
        self.file: TextIO | None = None
        self.setFormatter(logging.Formatter(FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.file = self.path.open("w", encoding="utf-8")
            self.file.write(self.format(record) + "\n")
            self.file.flush()
            self.counts[record.levelname.lower()] += 1
        except Exception:  # noqa: BLE001 - a log record must never break the run: logging's own policy
            self.handleError(record)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        super().close()

    def summary(self) -> str:
        """The one line a run prints: how many records, by level, and where they are."""
        if not self.counts:
            return "library log: no records"
        levels = ", ".join(f"{level} {n}" for level, n in sorted(self.counts.items()))
        return f"library log: {sum(self.counts.values())} records ({levels}) in {self.path}"


@contextlib.contextmanager
def captured(path: Path) -> Iterator[LibraryLog]:
    """Every log record (INFO and above) and warning of the libraries goes to `path` while open."""
    root = logging.getLogger()
    handler = LibraryLog(path)
    handlers, level = root.handlers[:], root.level
    root.handlers = [handler]
    root.setLevel(LEVEL)
    logging.captureWarnings(True)
    try:
        yield handler
    finally:
        logging.captureWarnings(False)
        root.handlers = handlers
        root.setLevel(level)
        handler.close()
