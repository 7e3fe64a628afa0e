"""The pinned clock: tests set and move the database's clock, which production only reads.

Every statement reads `lp_now()`, the transaction time unless `lp_clock`
holds a pinned instant (impl/migrations/). `PinnedClock` writes that row;
the bundled stores never do.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg


class PinnedClock:
    """Test control of the DB clock: pins `lp_now()` through the same function production reads."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def pin(self, at: dt.datetime) -> None:
        self.conn.execute(
            "INSERT INTO lp_clock (pinned_at) VALUES (%s)"
            " ON CONFLICT (singleton) DO UPDATE SET pinned_at = excluded.pinned_at",
            (at,),
        )

    def advance(self, by: dt.timedelta) -> None:
        updated = self.conn.execute("UPDATE lp_clock SET pinned_at = pinned_at + %s RETURNING 1", (by,)).fetchone()
        if updated is None:
            raise RuntimeError("the clock is not pinned: call pin() first")

    def unpin(self) -> None:
        self.conn.execute("DELETE FROM lp_clock")
