"""What provisioning says: a DSN that does not parse, a role that may not do what a run
needs (tried on a real server), binaries named by LEASEPROOF_PG_BIN called what they
are, advice that names binaries this machine has; and, for every command that
provisions, one line, `leaseproof: `, exit 2, in a real process."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from helpers import leaseproof
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leaseproof.conformance.harness import embedded, provision
from leaseproof.conformance.harness.databases import drop_database, scratch_database
from leaseproof.conformance.harness.provision import DsnError, ProvisioningError, postgres_server
from leaseproof.conformance.harness.server import Server
from leaseproof.impl.connection import connect
from leaseproof.impl.hooks.clock import TEST_HOOKS_SETTING, is_test_database, mark_test_database
from leaseproof.impl.migrate import migrate

SYSTEM_BIN = Path("/usr/lib/postgresql/15/bin")


def _must_not_be_tried(*args: object, **kwargs: object) -> object:
    raise AssertionError("a named DSN must not fall through to other sources")


@pytest.fixture
def named_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A named DSN is all there is: Docker and the embedded server must not be tried."""
    monkeypatch.delenv(provision.DSN_ENV, raising=False)
    monkeypatch.setattr(provision, "docker_engine", _must_not_be_tried)
    monkeypatch.setattr(provision, "embedded_server", _must_not_be_tried)


# -- a DSN that does not parse: a usage error naming what is wrong, never the password ---------


@pytest.mark.parametrize(
    ("dsn", "problem"),
    [
        ("postgresql://x:s3cret@host:notaport/db", "its port 'notaport' is not a port number, 1 to 65535"),
        ("postgresql://x:s3cret@host:99999/db", "its port '99999' is not a port number, 1 to 65535"),
        ("host=h port=5432,x password=s3cret", "its port 'x' is not a port number, 1 to 65535"),
        ("host=h connect_timeout=soon password=s3cret", "its connect_timeout 'soon' is not a whole number of seconds"),
        ("not a dsn", 'missing "=" after "not" in connection info string'),
        ("host=h password=s3cret nosuch=1", 'invalid connection option "nosuch"'),
        ("postgres://u:s3cret@h/db?nosuch=1", 'invalid URI query parameter: "nosuch"'),
        ("host=h password='s3cret", "unterminated quoted string in connection info string"),
        # libpq quotes the whole URI here, password and all
        ("postgresql://x:s3cret@[::1/db", 'in IPv6 host address in URI: "postgresql://x:***@[::1/db"'),
        ("postgresql://x:s3%2Fcret@[::1/db", 'in IPv6 host address in URI: "postgresql://x:***@[::1/db"'),
    ],
)
@pytest.mark.parametrize("via", ["argument", "env"])
def test_a_dsn_that_does_not_parse_is_a_usage_error_naming_what_is_wrong(
    named_only: None, monkeypatch: pytest.MonkeyPatch, dsn: str, problem: str, via: str
) -> None:
    if via == "env":
        monkeypatch.setenv(provision.DSN_ENV, dsn)
    logged: list[str] = []
    with pytest.raises(DsnError) as info, postgres_server(dsn if via == "argument" else None, log=logged.append):
        pytest.fail("a DSN that does not parse was yielded")
    message = str(info.value)
    name = "--dsn" if via == "argument" else "LEASEPROOF_DSN"
    assert message.startswith(f"{name} does not parse as a PostgreSQL DSN: ") and problem in message, message
    assert "s3cret" not in message and "s3%2Fcret" not in message, "the password leaked"
    assert "\n" not in message and "connect" not in message.split(":")[0]
    assert isinstance(info.value, ProvisioningError)  # what every command already turns into exit 2
    assert logged == [], "nothing is said of a server before the DSN parses"


# -- what a named role needs, tried on a real server --------------------------------------------


@pytest.fixture
def role(pg_server: Server) -> Iterator[tuple[str, str]]:
    """A role (its name, and the DSN of the server's maintenance database as it) that may
    log in and do nothing else; dropped afterwards, with any database it created."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        superuser = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (superuser and superuser[0]):
            pytest.skip("the test server's role is no superuser, so it cannot make roles")
        name, password = f"lp_role_{secrets.token_hex(4)}", secrets.token_hex(8)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
    try:
        yield name, make_conninfo(pg_server.dsn, user=name, password=password)
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            owned = conn.execute(
                "SELECT datname FROM pg_database WHERE datdba = (SELECT oid FROM pg_roles WHERE rolname = %s)", (name,)
            ).fetchall()
            for (database,) in owned:
                drop_database(pg_server, database)
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _as_superuser(pg_server: Server, statement: sql.Composed) -> None:
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(statement)


def _server_version(pg_server: Server) -> int:
    with psycopg.connect(pg_server.dsn) as conn:
        return conn.info.server_version


def test_a_role_that_may_not_create_databases_is_refused_at_once_with_the_grants_it_needs(
    named_only: None, pg_server: Server, role: tuple[str, str]
) -> None:
    name, dsn = role
    started = time.monotonic()
    with pytest.raises(ProvisioningError) as info, postgres_server(dsn):
        pytest.fail("a role that may not create databases was yielded")
    assert time.monotonic() - started < 6
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"The role {name} named by --dsn (")
    assert "may not create databases" in message
    assert f"ALTER ROLE {name} CREATEDB; GRANT SET ON PARAMETER {TEST_HOOKS_SETTING} TO {name}" in message
    assert str(conninfo_to_dict(dsn)["password"]) not in message
    # ... and it is true: the role cannot create the database every run needs.
    with pytest.raises(psycopg.errors.InsufficientPrivilege), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE lp_never")


def test_createdb_alone_creates_databases_but_cannot_mark_them_and_is_told_the_grant(
    named_only: None, pg_server: Server, role: tuple[str, str]
) -> None:
    name, dsn = role
    _as_superuser(pg_server, sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(name)))
    logged: list[str] = []
    with postgres_server(dsn, log=logged.append) as server, scratch_database(server) as database:
        warned = [line for line in logged if line.startswith(f"the role {name} may create databases but not mark")]
        assert len(warned) == 1, logged
        assert f"GRANT SET ON PARAMETER {TEST_HOOKS_SETTING} TO {name}" in warned[0]
        # ... and it is true: the bundled implementation's mark fails as this role.
        with connect(database) as conn:
            migrate(conn)
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=TEST_HOOKS_SETTING):
                mark_test_database(conn)


def test_createdb_and_set_on_the_parameter_is_all_a_role_needs(
    named_only: None, pg_server: Server, role: tuple[str, str]
) -> None:
    if _server_version(pg_server) < 150000:
        pytest.skip("GRANT SET ON PARAMETER came in PostgreSQL 15; before, only a superuser may mark")
    name, dsn = role
    _as_superuser(pg_server, sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(name)))
    grant = sql.SQL("GRANT SET ON PARAMETER {} TO {}").format(sql.Identifier(TEST_HOOKS_SETTING), sql.Identifier(name))
    _as_superuser(pg_server, grant)
    logged: list[str] = []
    with postgres_server(dsn, log=logged.append) as server, scratch_database(server) as database:
        assert not [line for line in logged if "may not" in line or "not mark" in line], logged
        with connect(database) as conn:
            migrate(conn)
            mark_test_database(conn)
            assert is_test_database(conn)


def test_a_superuser_is_told_nothing_more(named_only: None, pg_server: Server) -> None:
    with psycopg.connect(pg_server.dsn) as conn:
        superuser = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    if not (superuser and superuser[0]):
        pytest.skip("the test server's role (LEASEPROOF_DSN) is no superuser")
    logged: list[str] = []
    with postgres_server(pg_server.dsn, log=logged.append):
        pass
    assert len(logged) == 1 and logged[0].startswith("using the PostgreSQL server from the dsn argument (--dsn): ")


# -- binaries named by LEASEPROOF_PG_BIN are called what they are --------------------------------


@pytest.mark.skipif(not (SYSTEM_BIN / "initdb").is_file(), reason=f"no PostgreSQL binaries in {SYSTEM_BIN}")
def test_a_server_from_named_binaries_is_never_called_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(provision.DSN_ENV, raising=False)
    monkeypatch.setenv(embedded.PG_BIN_ENV, str(SYSTEM_BIN))
    monkeypatch.setattr(provision, "docker_engine", lambda timeout=2.0: (False, "disabled by the test"))
    logged: list[str] = []
    with postgres_server(log=logged.append) as server:
        description = server.description
        with psycopg.connect(server.dsn) as conn:
            version = conn.execute("SHOW server_version").fetchone()
    assert version is not None
    assert description.startswith(f"PostgreSQL {version[0]} from {SYSTEM_BIN}, in "), description
    assert (
        logged[0]
        == f"no Docker engine (disabled by the test); using PostgreSQL from {SYSTEM_BIN} ({embedded.PG_BIN_ENV})"
    )
    assert logged[1].startswith(f"starting PostgreSQL from {SYSTEM_BIN} in ")
    assert logged[2].startswith(f"PostgreSQL {version[0]} from {SYSTEM_BIN} ready in ")
    assert logged[-1].startswith(f"stopping PostgreSQL from {SYSTEM_BIN} (pid ")
    assert not [line for line in [description, *logged] if "embedded" in line], logged


def test_the_advice_names_binaries_this_machine_has(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(provision.DSN_ENV, raising=False)
    monkeypatch.setenv(embedded.PG_BIN_ENV, str(tmp_path))
    monkeypatch.setattr(provision, "docker_engine", lambda timeout=2.0: (False, "disabled by the test"))
    with pytest.raises(ProvisioningError) as info, postgres_server():
        pytest.fail("a server was yielded from an empty folder")
    message = str(info.value)
    if (SYSTEM_BIN / "initdb").is_file():
        newest = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
        assert f"e.g. {newest[-1].parent}, which this machine has)" in message
    else:
        assert "e.g. /usr/lib/postgresql/15/bin (Debian 12's postgresql-15 package)" in message
    assert "/16/" not in message
    assert "a superuser, or a role with CREATEDB and SET on the parameter leaseproof.test_hooks" in message
    assert f"PostgreSQL from LEASEPROOF_PG_BIN={tmp_path}: no executable initdb" in message


# -- every command that provisions: one line, exit 2, in a real process -------------------------

BAD = {
    "verify": "postgresql://x:s3cret@host:notaport/db",
    "stress": "not a dsn",
    "mutants": "postgresql://x:s3cret@[::1/db",
    "nemesis": "not a dsn",
    "guarantees": "postgresql://x:s3cret@host:notaport/db",
    "throughput": "host=h password=s3cret port=nope",
}


@pytest.mark.parametrize("command", sorted(BAD))
def test_a_command_given_a_dsn_that_does_not_parse_says_so_in_one_line_and_exits_2(command: str) -> None:
    run = leaseproof(command, "--dsn", BAD[command], timeout=60)
    assert "Traceback" not in run.stderr, run.stderr
    assert (run.returncode, run.stdout) == (2, ""), run.stderr
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith("leaseproof: --dsn does not parse as a PostgreSQL DSN: ")
    assert "s3cret" not in run.stderr


@pytest.mark.parametrize("generated", [False, True], ids=["kill matrix", "mutation score"])
def test_the_mutant_checks_refuse_a_role_that_cannot_mark_test_databases(
    pg_server: Server, role: tuple[str, str], generated: bool
) -> None:
    """Every check of a mutant would fail in its set-up (the pinned clock), and a failure counts
    as a kill: refused before anything runs, exit 2, in one line."""
    name, dsn = role
    _as_superuser(pg_server, sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(name)))
    if generated:
        args = ["mutants", "--generated", "--dsn", dsn, "--fast", "--jobs", "1"]
    else:
        args = ["mutants", "--dsn", dsn, "--fast", "--mutant", "reconcile-unfenced"]
    run = leaseproof(*args, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "killed" not in run.stdout and "Traceback" not in run.stderr
    what = "the mutation score" if generated else "the kill matrix"
    refusal = [line for line in run.stderr.splitlines() if line.startswith(f"leaseproof: {what} needs a server")]
    assert len(refusal) == 1 and f"GRANT SET ON PARAMETER {TEST_HOOKS_SETTING}" in refusal[0], run.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "--machine", "delivery", "--max-examples", "3"],
        ["stress", "--machine", "delivery", "--duration", "1"],
        ["guarantees", "--subjects", "leaseproof", "--examples", "3", "--races", "1"],
    ],
    ids=lambda args: args[0],
)
def test_the_bundled_implementation_is_refused_a_role_that_cannot_mark_test_databases(
    pg_server: Server, role: tuple[str, str], args: list[str]
) -> None:
    """Its pinned clock needs the mark: refused in one line, exit 2, never a verdict or a traceback."""
    name, dsn = role
    _as_superuser(pg_server, sql.SQL("ALTER ROLE {} CREATEDB").format(sql.Identifier(name)))
    run = leaseproof(*args, "--dsn", dsn, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert "verdict" not in run.stdout
    assert [line for line in run.stderr.splitlines() if line.startswith("leaseproof: the bundled")], run.stderr
