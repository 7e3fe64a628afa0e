"""pg-boss (Node.js), driven through its public API by `node/pgboss.mjs`, as a lease queue.

pg-boss is pinned in `node/package-lock.json`. On first use it is installed, with `npm ci`, into
a cache folder named after the lockfile and the script (`$XDG_CACHE_HOME/leaseproof`, else
`~/.cache/leaseproof`), once; it needs Node.js 20 or newer and npm on the PATH. One child
process runs one `PgBoss` (its pool of connections) on the search-path clock (`clock.py`).
This process sends it one JSON request per line; the requests of several sessions run at once
there, each on a connection of the pool.

- install: `boss.start()` (pg-boss's migrations) and `createQueue`;
- enqueue: `boss.send(queue, {}, {expireInSeconds: lease, retryLimit: 1000, retryDelay: 0,
  startAfter: a second before now})`. pg-boss hands a job out only once `start_after < now()`,
  and under a pinned clock a job due at the instant it was sent would never be;
- fetch: `boss.fetch(queue, {batchSize: 1})`; the handle is the job's id;
- complete: `boss.complete(queue, id)`; applied iff it says it affected the job;
- rescue: `boss.expire()`, which returns every active job whose `started_on + expire_in` is
  past to the queue (state `retry`, due from that instant on: fetched from the next);
- rows: `pgboss.job` of the queue: created and retry pending, active claimed, completed
  finished, failed and cancelled failed.

Capabilities: rescue. pg-boss 10 has no heartbeat. It has no deadline: its `complete` matches
the job's id and `state = 'active'`. It has no permanent failure: with retries left, `fail()`
retries the job, so holders only complete as finished.

pg-boss 12 needs Node.js 22 (its `engines` field), and this machine has Node 20, so the row is
pg-boss 10.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.queues.protocol import Held
from leaseproof.conformance.queues.subjects import clock
from leaseproof.model.queue import Answer, Capability, Seen

SOURCE = Path(__file__).parent / "node"
FILES = ("package.json", "package-lock.json", "pgboss.mjs")
QUEUE = "leaseproof"
START_TIMEOUT = 120.0  # seconds for the child to start pg-boss (its migrations) and answer ready
CALL_TIMEOUT = 60.0  # seconds any one request may take
INSTALL_TIMEOUT = 600.0  # seconds `npm ci` may take
_STATUS = {
    "created": "pending", "retry": "pending", "active": "claimed",
    "completed": "finished", "failed": "failed", "cancelled": "failed",
}  # fmt: skip


class Unavailable(Exception):
    """Node.js or npm is missing, or the install failed."""


def installed() -> Path:
    """The cache folder holding the pinned pg-boss and the script, installed if it is not yet."""
    digest = hashlib.sha256(b"".join((SOURCE / name).read_bytes() for name in FILES)).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "leaseproof" / f"node-{digest}"
    if (cache / "node_modules" / "pg-boss" / "package.json").is_file():
        return cache
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise Unavailable(f"pg-boss needs Node.js 20 or newer and npm on the PATH ({tool} is not)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".install.lock", "w") as lock:  # one install at a time (pytest-xdist workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cache / "node_modules" / "pg-boss" / "package.json").is_file():
            for name in FILES:
                shutil.copyfile(SOURCE / name, cache / name)
            done = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=cache, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise Unavailable(f"npm ci of pg-boss failed in {cache}: {done.stderr.strip()[-2000:]}")
    return cache


class _Child:
    """The node process: requests by id, replies matched by a reader thread."""

    def __init__(self, config: dict[str, Any]) -> None:
        folder = installed()
        self.errors: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed with the child
        self.process = subprocess.Popen(
            ["node", str(folder / "pgboss.mjs"), json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True, bufsize=1,
        )  # fmt: skip
        self.lock = threading.Lock()
        self.next_id = 0
        self.waiting: dict[int, tuple[threading.Event, list[Any]]] = {0: (threading.Event(), [])}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self._wait(0, START_TIMEOUT)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            reply = json.loads(line)
            with self.lock:
                event, box = self.waiting[reply["id"]]
            box.append(reply)
            event.set()
        with self.lock:  # the child is gone: every caller still waiting learns it
            for event, _ in self.waiting.values():
                event.set()

    def _wait(self, request: int, timeout: float) -> Any:
        with self.lock:
            event, box = self.waiting[request]
        answered = event.wait(timeout)
        with self.lock:
            del self.waiting[request]
        if not answered:
            raise TimeoutError(f"pg-boss did not answer request {request} within {timeout:g}s")
        if not box:
            self.errors.seek(0)
            raise RuntimeError(f"the pg-boss process ended: {self.errors.read()[-2000:]}")
        if "error" in box[0]:
            raise RuntimeError(f"pg-boss: {box[0]['error']}")
        return box[0]["ok"]

    def call(self, op: str, **args: Any) -> Any:
        with self.lock:
            self.next_id += 1
            request = self.next_id
            self.waiting[request] = (threading.Event(), [])
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"id": request, "op": op, **args}) + "\n")
            self.process.stdin.flush()
        return self._wait(request, CALL_TIMEOUT)

    def close(self) -> None:
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()  # it stops pg-boss and exits
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            self.errors.close()


class _Session:
    """Another client: its requests run concurrently with the others' in the same child."""

    def __init__(self, child: _Child) -> None:
        self.child = child

    def fetch(self) -> Held | None:
        job = self.child.call("fetch")
        return None if job is None else Held(str(job), str(job))

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        return Answer.APPLIED if self.child.call("complete", job=handle) == 1 else Answer.REFUSED

    def rescue(self) -> None:
        self.child.call("expire")

    def close(self) -> None:
        pass  # the child is the adapter's


class PgBossQueue(_Session):
    name = "pg-boss"
    capabilities = frozenset({Capability.RESCUE})

    def __init__(self, dsn: str) -> None:
        clock.install(dsn)
        self.sql = psycopg.connect(clock.conninfo(dsn), autocommit=True)
        given = conninfo_to_dict(clock.conninfo(dsn))
        config = {
            "host": given.get("host"), "port": int(given.get("port") or 5432), "user": given.get("user"),
            "password": given.get("password"), "database": given.get("dbname"), "options": given.get("options"),
        }  # fmt: skip
        try:
            super().__init__(_Child({k: v for k, v in config.items() if v is not None}))
        except BaseException:
            self.sql.close()
            raise
        self.version = str(self.child.call("version"))
        self.lease_seconds = 30

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.lease_seconds = lease_seconds
        with self.sql.transaction():
            self.sql.execute("DELETE FROM pgboss.job WHERE name = %s", (QUEUE,))
            clock.pin(self.sql, start)

    def enqueue(self) -> str:
        due = clock.now(self.sql) - dt.timedelta(seconds=1)
        return str(self.child.call("enqueue", lease=self.lease_seconds, start_after=due.isoformat()))

    def heartbeat(self, handle: Any) -> Answer:
        raise NotImplementedError("pg-boss 10 has no heartbeat")

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds)

    def rows(self) -> dict[str, Seen]:
        found = self.sql.execute("SELECT id::text, state::text FROM pgboss.job WHERE name = %s", (QUEUE,)).fetchall()
        return {job: Seen(_STATUS[state]) for job, state in found}

    def session(self) -> _Session:
        return _Session(self.child)

    def close(self) -> None:
        try:
            self.child.close()
        finally:
            self.sql.close()
