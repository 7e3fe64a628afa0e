"""The owner lock of an embedded server's folder, and the removal of folders whose run was
killed outright (SIGKILL, the OOM killer) and so could not clean up.

A run holds an exclusive lock on `owner.lock` in its folder for as long as it lives; the
kernel releases it when the run dies, however it dies. So a folder whose lock can be taken
is a dead run's: `remove_leftovers()` stops its postgres and removes it. A live run's
folder, whose lock is held, is never touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from leaseproof.conformance.harness.server import Log, quiet

__all__ = ["FOLDER_PREFIX", "hold_owner_lock", "remove_leftovers"]

FOLDER_PREFIX = "leaseproof-pg-"
_OWNER_LOCK = "owner.lock"
_LEFTOVER_STOP_DEADLINE = 10.0


def hold_owner_lock(folder: Path) -> int:
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
    """Where embedded servers' folders are made (see embedded.py's `_EmbeddedCluster._make_folder`)."""
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
    tell: Log = say or quiet
    removed: list[Path] = []
    for parent in _temp_parents():
        try:
            folders = sorted(p for p in parent.iterdir() if p.name.startswith(FOLDER_PREFIX))
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
