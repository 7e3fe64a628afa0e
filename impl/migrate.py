"""Versioned schema migrations: `migrations/NNNN_name.sql`, applied once each, in order."""

from __future__ import annotations

from importlib import resources
from typing import Any

import psycopg

# Serialises concurrent migrators on one database.
_MIGRATION_LOCK = 0x1EA5E0F


def available() -> list[tuple[str, str]]:
    """(version, sql) of every shipped migration, oldest first."""
    folder = resources.files("leaseproof.impl") / "migrations"
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [(f.name.removesuffix(".sql"), f.read_text(encoding="utf-8")) for f in files]


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply every pending migration, each in its own transaction; return the versions applied."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS lp_schema_migrations ("
            " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
    for version, sql in available():
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            done = conn.execute("SELECT 1 FROM lp_schema_migrations WHERE version = %s", (version,)).fetchone()
            if done:
                continue
            conn.execute(sql.encode("utf-8"))
            conn.execute("INSERT INTO lp_schema_migrations (version) VALUES (%s)", (version,))
            applied.append(version)
    return applied
