"""oban (Python's port of Elixir's Oban), driven through its public API by `oban/child.py`, as a lease queue.

oban needs Python 3.12 or newer, and leaseproof runs on 3.11: so it runs in a child process, under
an interpreter of 3.12 or newer (this one if it is, else `python3.12`, `python3.13`, `python3.14` on
the PATH, else pyenv's versions), in a virtualenv made on first use in a cache folder named after
the pinned requirements (`oban/requirements.txt`; `$XDG_CACHE_HOME/leaseproof`, else
`~/.cache/leaseproof`), under a file lock, with pip (erlpack, which oban needs, builds from source:
a C compiler). The child speaks JSON lines as `nodejs.Child`'s do; the sessions' requests run at once there.

- install: `oban.schema.install(pool)`, through a pool on the search-path clock (`clock.py`);
- enqueue: `Oban.enqueue(Hold.new({}))` of a worker whose jobs have 20,000 attempts: inserted
  `available` at `now()`;
- fetch: oban has no call that takes one job (a node's producer fetches whenever it is told to,
  and runs each job's worker), so a new node (its own node name and producer uuid: a new holder)
  starts the queue paused with limit 1 (`start_queue`), resumes it (`resume_queue`): its producer
  fetches once (`fetch_jobs.sql`), and the node is paused and shut down at once, its worker holding
  the job; a fetch is None when `oban.producer.get.stop` (telemetry) says it took nothing;
- complete: the held worker returns (nothing: `completed`; `Cancel`: `cancelled`, a failure for
  good), and the node's shutdown writes the producer's ack (`ack_job.sql`: by id, `state =
  'executing'` and the fetch's `attempted_at`): applied iff `oban.producer.ack.stop` counts the job;
- rescue: one run of oban's Lifeline (`rescue_jobs.sql`: `executing` jobs whose `attempted_at` is
  more than `rescue_after`, the lease, before `now()`), by a node elected leader of a name of its own;
- rows: `oban_jobs` by id: available, scheduled, retryable, suspended pending; executing claimed;
  completed finished; cancelled, discarded failed.
Capabilities: rescue, fail. No heartbeat: a job's lease is its `attempted_at`, which nothing renews
(a producer's refresh renews its `oban_producers` row, which no rescue reads); no deadline (the ack
is fenced by the attempt's `attempted_at`, not by the time); no takeover (a fetch takes `available`
jobs only). Every time oban's SQL reads is `timezone('UTC', now())`, the search-path clock's.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import psycopg

from leaseproof.conformance.queues.protocol import Held, SubjectUnavailable
from leaseproof.conformance.queues.subjects import clock, nodejs
from leaseproof.model.queue import Answer, Capability, Seen

SOURCE = Path(__file__).parent / "oban"
REQUIREMENTS = SOURCE / "requirements.txt"
QUEUE = "leaseproof"
ATTEMPTS = 20_000  # oban's max_attempts is a smallint; no run reaches it
MINIMUM = (3, 12)  # the Python oban needs
START_TIMEOUT = 120.0  # seconds for the child to install the schema and answer ready
INSTALL_TIMEOUT = 900.0  # seconds the virtualenv and pip may take (erlpack builds from source)
PROBE_TIMEOUT = 30.0  # seconds an interpreter may take to say its version
_STATUS = {
    "available": "pending", "scheduled": "pending", "retryable": "pending", "suspended": "pending",
    "executing": "claimed", "completed": "finished", "cancelled": "failed", "discarded": "failed",
}  # fmt: skip
_TABLES = "oban_jobs, oban_producers, oban_leaders"
__all__ = ["ObanQueue", "Unavailable"]


class Unavailable(SubjectUnavailable):
    """No Python 3.12 or newer, or the virtualenv could not be made."""


def _version(python: str) -> tuple[int, int] | None:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = done.stdout.split()
    if done.returncode != 0 or len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None  # a pyenv shim of a version pyenv does not select, say
    return int(parts[0]), int(parts[1])


def interpreter() -> str:
    """A Python of 3.12 or newer: this one, else one on the PATH, else one of pyenv's."""
    if sys.version_info >= MINIMUM:
        return sys.executable
    candidates = [found for name in ("python3.12", "python3.13", "python3.14") if (found := shutil.which(name))]
    versions = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates += [str(python) for python in sorted(versions.glob("3.*/bin/python3"))]
    for python in candidates:
        version = _version(python)
        if version is not None and version >= MINIMUM:
            return python
    raise Unavailable(
        "oban needs Python 3.12 or newer, and none was found (python3.12, python3.13 or python3.14 on the PATH, "
        f"or under {versions}): install one (e.g. `pyenv install 3.12`)"
    )


def installed() -> Path:
    """The virtualenv's Python, with oban and its pinned requirements; made if it is not yet."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "leaseproof" / f"oban-{digest}"
    python, done = cache / "venv" / "bin" / "python", cache / "venv" / ".leaseproof-installed"
    if done.is_file():
        return python
    base = interpreter()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".install.lock", "w") as lock:  # one install at a time (pytest-xdist workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(cache / "venv", ignore_errors=True)  # what an interrupted install left
            for step in (
                [base, "-m", "venv", str(cache / "venv")],
                [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
                 "-r", str(REQUIREMENTS)],
            ):  # fmt: skip
                ran = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
                if ran.returncode != 0:
                    raise Unavailable(f"{' '.join(step[:3])} failed in {cache}: {ran.stderr.strip()[-2000:]}")
            done.write_text(REQUIREMENTS.read_text(encoding="utf-8"), encoding="utf-8")
    return python


class _Child(nodejs.Child):
    """The child process (`oban/child.py` under the virtualenv's Python), spoken to as a Node.js one."""

    def __init__(self, config: dict[str, Any]) -> None:
        python = installed()
        self.name = "oban/child.py"
        self.errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed with the child
        self.process = subprocess.Popen(
            [str(python), str(SOURCE / "child.py"), json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True, bufsize=1,
        )  # fmt: skip
        self.lock = threading.Lock()
        self.next_id = 0
        self.waiting = {0: (threading.Event(), [])}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        try:
            self._wait(0, START_TIMEOUT)
        except BaseException:
            self.close()
            raise


class _Session:
    """A client of the queue: its requests run at once with the others' in the same child."""

    def __init__(self, child: _Child) -> None:
        self.child = child

    def fetch(self) -> Held | None:
        got = self.child.call("fetch")
        return None if got is None else Held(str(got["job"]), str(got["holder"]))

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        answer = self.child.call("complete", holder=handle, outcome=outcome)
        return Answer.APPLIED if answer == "applied" else Answer.REFUSED

    def rescue(self) -> None:
        self.child.call("rescue")

    def close(self) -> None:
        pass  # a session holds nothing: the child is the adapter's


class ObanQueue(_Session):
    name = "oban"
    capabilities = frozenset({Capability.RESCUE, Capability.FAIL})

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn  # the queue's database
        clock.install(dsn)
        self.sql = psycopg.connect(clock.conninfo(dsn), autocommit=True)
        try:
            super().__init__(_Child({"conninfo": clock.conninfo(dsn), "queue": QUEUE, "attempts": ATTEMPTS}))
        except BaseException:
            self.sql.close()
            raise
        self.version = str(self.child.call("version"))

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.child.call("reset", lease=float(lease_seconds))  # every held job let go, then forgotten
        clock.start_over(self.sql, start, f"TRUNCATE {_TABLES} RESTART IDENTITY")

    def enqueue(self) -> str:
        return str(self.child.call("enqueue"))

    def heartbeat(self, handle: Any) -> Answer:
        raise NotImplementedError("oban has no heartbeat of a job")

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds)

    def rows(self) -> dict[str, Seen]:
        found = self.sql.execute("SELECT id::text, state::text FROM oban_jobs").fetchall()
        return {job: Seen(_STATUS[state]) for job, state in found}

    def session(self) -> _Session:
        return _Session(self.child)

    def close(self) -> None:
        try:
            self.child.close()
        finally:
            self.sql.close()
