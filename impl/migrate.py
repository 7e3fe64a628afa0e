"""Versioned schema migrations: `migrations/NNNN_name.sql`, applied once each, in order."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any

import attrs
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


_FUNCTION_HEAD = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)\s*\(", re.IGNORECASE)


@attrs.frozen
class Function:
    """One function the migrations define, as the last migration that (re)defines it states it."""

    name: str
    definition: str  # the whole CREATE OR REPLACE FUNCTION statement, without its final semicolon
    body: str  # the text between its dollar quotes: what pg_proc.prosrc holds

    def replaced(self, body: str) -> Function:
        """The same function with another body (its signature and attributes unchanged)."""
        start = self.definition.index(self.body)
        definition = self.definition[:start] + body + self.definition[start + len(self.body) :]
        return Function(self.name, definition, body)


def functions() -> dict[str, Function]:
    """Every function the shipped migrations define, by name, as the last one to define it
    states it (each with its body between `$$` quotes, as every migration writes them)."""
    found: dict[str, Function] = {}
    for _, sql in available():
        for function in _parse(sql):
            found[function.name] = function
    return found


def _parse(sql: str) -> Iterator[Function]:
    """Each function `sql` defines, in order."""
    for head in _FUNCTION_HEAD.finditer(sql):
        open_quote = sql.index("$$", head.end())
        close_quote = sql.index("$$", open_quote + 2)
        end = sql.find(";", close_quote)
        text = sql[head.start() : len(sql) if end < 0 else end].strip()
        definition = re.sub(r"^CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION", "CREATE OR REPLACE FUNCTION", text)
        yield Function(head.group(1), definition, sql[open_quote + 2 : close_quote])


@attrs.frozen
class Patch:
    """One edit of one shipped function's body: `old`, which must occur exactly once, becomes
    `new`. A variant of the bundled stores (a mutant) is the shipped functions with its
    patches applied; `leaseproof.impl.hooks.functions.install` puts them in a test database."""

    function: str
    old: str
    new: str

    def apply(self, function: Function) -> Function:
        count = function.body.count(self.old)
        if count != 1:
            raise ValueError(f"{self.function}: the patched text occurs {count} times, not once: {self.old!r}")
        return function.replaced(function.body.replace(self.old, self.new))


@attrs.frozen
class Addition:
    """A function a variant adds beside the shipped ones (a helper of a mutant, or a test
    hook a variant's patched body calls): its whole CREATE FUNCTION statement, its body
    between `$$` quotes."""

    definition: str

    @property
    def function(self) -> Function:
        parsed = list(_parse(self.definition))
        if len(parsed) != 1:
            raise ValueError(f"an addition defines one function, not {len(parsed)}: {self.definition[:80]!r}")
        return parsed[0]


def patched(patches: Sequence[Patch | Addition]) -> dict[str, Function]:
    """The shipped functions with `patches` applied (and additions added), in order, by name."""
    found = functions()
    for patch in patches:
        if isinstance(patch, Addition):
            added = patch.function
            if added.name in found:
                raise ValueError(f"{added.name!r} is defined already: an Addition adds a function, a Patch edits one")
            found[added.name] = added
            continue
        if patch.function not in found:
            raise ValueError(f"no shipped function is called {patch.function!r}")
        found[patch.function] = patch.apply(found[patch.function])
    return found
