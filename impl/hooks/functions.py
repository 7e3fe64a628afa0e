"""Put a variant of the shipped functions in a test database, or the shipped ones back.

A variant of the bundled stores (a mutant: `impl/mutants/`) differs from them in the
database functions it calls, not in Python: its store class lists its edits of the
shipped functions (`FUNCTIONS`: `leaseproof.impl.migrate.Patch`es, and `Addition`s,
functions it adds beside them). The
adapters call `install` once the database is migrated; it reads every function's
body from the catalog and creates again only those that differ from what the store
class wants, so a database that served one variant serves the next (or the bundled
store) correctly, and a database that already holds them costs one query. Test
tooling: production databases run the migrations and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from leaseproof.impl.migrate import Addition, Patch, patched


def install(conn: psycopg.Connection[Any], patches: Sequence[Patch | Addition] = ()) -> list[str]:
    """Make the database's functions the shipped ones with `patches` applied; return the
    names of those it created again (none when the database already held them)."""
    wanted = patched(patches)
    with conn.cursor(row_factory=tuple_row) as cursor:
        current: dict[str, str] = dict(
            cursor.execute(
                "SELECT proname::text, prosrc FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
                " AND proname = ANY(%s)",
                (list(wanted),),
            ).fetchall()
        )
    changed = [name for name, function in wanted.items() if current.get(name) != function.body]
    if changed:
        with conn.transaction():
            for name in changed:
                conn.execute(wanted[name].definition.encode())
    return changed


def patches_of(*classes: Any) -> tuple[Patch | Addition, ...]:
    """The patches every class of a variant lists (`FUNCTIONS`), in order, each once."""
    seen: list[Patch | Addition] = []
    for cls in classes:
        for patch in _listed(cls):
            if patch not in seen:
                seen.append(patch)
    return tuple(seen)


def _listed(cls: Any) -> Iterable[Patch | Addition]:
    return getattr(cls, "FUNCTIONS", ())
