"""Cleanup on every exit: real `leaseproof verify` processes on their own embedded server,
ended by a signal or killed outright (SIGKILL), and the run after them.

Each test gives its runs a temporary directory of their own (TMPDIR) and no
LEASEPROOF_DSN and no Docker, so each run starts an embedded server there.
Nothing sleeps for time: each step waits, with a bounded deadline, for a line
the run prints or for the run's exit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseproof.conformance.frontends.exits import EXIT_INTERRUPTED

_DEADLINE = 120.0  # seconds a run may take to reach a line, or to exit


class Run:
    """One `leaseproof verify` process, its stderr read line by line as it comes."""

    def __init__(self, tmpdir: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("LEASEPROOF_DSN", "LEASEPROOF_PG_BIN")}
        # PYTHONFAULTHANDLER: a run that does not end in time is sent SIGABRT, and its
        # processes' Python stacks go to the stderr the failure shows (`finish`).
        env.update(TMPDIR=str(tmpdir), DOCKER_HOST="unix:///nonexistent/docker.sock", PYTHONFAULTHANDLER="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "leaseproof.conformance.frontends.cli", "verify", "--machine", "delivery", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmpdir,
            preexec_fn=_default_signals,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first stderr line (from the start of the run) that matches `pattern`."""
        compiled = re.compile(pattern)
        for line in self.lines:
            if found := compiled.search(line):
                return found
        deadline = time.monotonic() + _DEADLINE
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {_DEADLINE:.0f}s:\n{self.stderr}")
            try:
                got = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if got is None:
                raise AssertionError(f"the run ended before a line matching {pattern!r}:\n{self.stderr}")
            self.lines.append(got)
            if found := compiled.search(got):
                return found

    def running_server(self) -> tuple[Path, int]:
        """Once the run is under way: its embedded server's folder and postmaster pid."""
        folder = Path(self.wait_for(r"starting embedded PostgreSQL in (\S+)").group(1))
        self.wait_for(r"example \d+/")
        pid = int((folder / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
        assert serves(pid, folder), f"postgres (pid {pid}) does not serve {folder}"
        return folder, pid

    def finish(self) -> int:
        try:
            code = self.process.wait(timeout=_DEADLINE)
        except subprocess.TimeoutExpired:
            where = self._stacks()
            raise AssertionError(f"the run did not end within {_DEADLINE:.0f}s; where it was:\n{where}") from None
        while (line := self._queue.get(timeout=_DEADLINE)) is not None:
            self.lines.append(line)
        return code

    def _stacks(self) -> str:
        """The process tree of a run that hangs, and (SIGABRT, with the fault handler on)
        the Python stacks of the run and its forked children, in its stderr."""
        pid = str(self.process.pid)
        ps = ["ps", "-o", "pid,ppid,stat,etime,args", "-p", pid, "--ppid", pid]
        tree = subprocess.run(ps, capture_output=True, text=True, timeout=10).stdout
        forks = subprocess.run(["pgrep", "-P", pid, "-f", "leaseproof"], capture_output=True, text=True, timeout=10)
        for each in [self.process.pid, *map(int, forks.stdout.split())]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        with contextlib.suppress(queue.Empty):
            while (line := self._queue.get(timeout=5)) is not None:
                self.lines.append(line)
        return f"{tree}\n{self.stderr}"

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=_DEADLINE)


def _default_signals() -> None:
    """In the child, before the run starts: the signals the tests send take their
    default action, as in a terminal. A run keeps a signal its parent ignored
    (nohup's SIGHUP, a non-interactive shell's SIGINT for a background job), so
    under such a parent the test would otherwise wait for a run that never ends."""
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def owner_lock_released(folder: Path) -> bool:
    """Whether, within _DEADLINE, no process holds `folder`'s owner lock (a run and its forks
    hold it while any of them lives); taken and let go at once when it is free."""
    deadline = time.monotonic() + _DEADLINE
    fd = os.open(folder / "owner.lock", os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                threading.Event().wait(0.01)  # polling a lock, not waiting for time
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
    finally:
        os.close(fd)


def serves(pid: int, folder: Path) -> bool:
    """Whether `pid` runs (a zombie does not) with `folder` in its command line."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and str(folder) in command


def processes_of(folder: Path) -> list[int]:
    """Every live process whose command line names `folder` (the postmaster and its backends)."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and serves(int(p.name), folder)]


@pytest.fixture
def tmpdir_for_runs() -> Iterator[Path]:
    """A TMPDIR for the runs: under /tmp and world-traversable, as the embedded server's
    user (`nobody` when the tests run as root) must reach its folder."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("these tests read /proc to find processes")
    path = Path(tempfile.mkdtemp(prefix="lp-cleanup-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    for pid in processes_of(path):  # a failed test's leftovers: servers these runs started
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


LONG = ("--seed", "1", "--max-examples", "100000")  # still running when the test ends it


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_stops_the_embedded_server_and_removes_its_folder(
    tmpdir_for_runs: Path, signum: signal.Signals
) -> None:
    run = Run(tmpdir_for_runs, *LONG)
    try:
        folder, pid = run.running_server()
        run.process.send_signal(signum)
        code = run.finish()
    finally:
        run.kill()
    assert code == EXIT_INTERRUPTED, run.stderr
    assert "leaseproof: interrupted; cleaned up" in run.stderr
    assert "Traceback" not in run.stderr
    assert not folder.exists()
    assert not serves(pid, folder)
    assert processes_of(folder) == []
    assert list(tmpdir_for_runs.glob("leaseproof-pg-*")) == []


def test_the_next_run_removes_a_killed_runs_server_and_folder_and_spares_a_live_one(tmpdir_for_runs: Path) -> None:
    live, killed = Run(tmpdir_for_runs, *LONG), Run(tmpdir_for_runs, *LONG)
    try:
        live_folder, live_pid = live.running_server()
        killed_folder, killed_pid = killed.running_server()
        killed.kill()  # SIGKILL: nothing of the run's own cleanup can run
        assert killed_folder.exists() and serves(killed_pid, killed_folder)  # what it leaves behind
        # The run's forked adapter child holds the folder's owner lock too, and exits once it
        # reads the end of its pipe: until then the run is not all gone, and its folder is
        # rightly a live one (CI's run met that, starting the next run a moment too soon).
        assert owner_lock_released(killed_folder), "the killed run's forks still hold its folder"

        after = Run(tmpdir_for_runs, "--seed", "1", "--max-examples", "2")
        assert after.finish() == 0, after.stderr
        assert f"removing {killed_folder}, left by a run that was killed" in after.stderr
        assert not killed_folder.exists()
        assert not serves(killed_pid, killed_folder) and processes_of(killed_folder) == []

        # The live run's server and folder are untouched, and it ends as it should.
        assert str(live_folder) not in after.stderr.replace(f"removing {killed_folder}", "")
        assert live_folder.exists() and serves(live_pid, live_folder)
        live.process.send_signal(signal.SIGTERM)
        assert live.finish() == EXIT_INTERRUPTED, live.stderr
        assert not live_folder.exists() and processes_of(live_folder) == []
    finally:
        live.kill()
        killed.kill()
