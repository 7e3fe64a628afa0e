"""Absurd (`absurd-sdk`, its schema from `absurdctl`), driven through its public API, as a lease queue.

Absurd's queue is its SQL schema (`absurd.*` functions); the Python SDK calls them. A job is an
Absurd task; each claim of it is a run (a new `run_id`, attempt k+1 after k), and the run's
`claim_expires_at` is its lease.

- install: `absurdctl init` (its CLI, which pipes the schema it bundles into `psql`), through a
  connection on the search-path clock (`clock.py`); then `Absurd.create_queue("leaseproof")`;
- enqueue: `Absurd.spawn("noop", {}, queue=..., max_attempts=1_000_000)`, so a takeover (which
  fails the run and retries the task) never runs the task out of attempts;
- fetch: `Absurd.claim_tasks(batch_size=1, claim_timeout=lease, worker_id=<new>)`, a new worker id
  each time; the holder is the run it returned (task id, run id). `absurd.claim_task` first fails
  (`absurd.fail_run`) one run whose claim expired, which retries its task as a new pending run:
  Absurd's rescue is inside the claim (takeover), at `claim_expires_at <= now`;
- heartbeat: `absurd.extend_claim(queue, run, lease)`, the statement the SDK's
  `TaskContext.heartbeat` issues (a context exists only inside a handler the SDK's worker runs);
  applied unless it raises (refused: the run is no longer running);
- complete: `absurd.complete_run(queue, run, result)`, the statement the SDK's worker issues when a
  handler returns; applied unless it raises (refused: the run already failed, completed or was
  cancelled). "failed" would be `absurd.fail_run`, which retries the task: no `fail`;
- rows: the queue's task table `absurd.t_leaseproof` by task id: pending (or sleeping) pending,
  running claimed, completed finished, failed failed.

Time: every function of the schema reads `absurd.current_time()`, which answers the session's
`absurd.fake_now` setting if set, else an unqualified `clock_timestamp()` (absurd.sql 37-52). The
adapter leaves `absurd.fake_now` unset, so the search-path clock answers that `clock_timestamp()`
for every client at once (`reset` checks that `absurd.current_time()` reads the pinned instant).
Only ids read the real clock: `absurd.portable_uuidv7()` calls PostgreSQL 18's `uuidv7()`.

The lease boundary: a claim takes a run over once `claim_expires_at <= now` (absurd.sql 994, in
`absurd.claim_task`): its claim is over at the instant it expires, which the adapter declares
(`Capability.ENDS_AT_EXPIRY`), so the profile judges a claim at that instant as the takeover it is.

Capabilities: heartbeat, takeover, and its lease boundary (ends-at-expiry). No rescue on demand
(only a claim fails expired runs), no deadline (`complete_run` and `extend_claim` accept a run whose
claim expired, as long as no claim took it over: Absurd documents that overlapping execution is
possible), no `fail` (retried).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import uuid
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.harness.embedded import client_bin_dir
from leaseproof.conformance.queues.protocol import Held, SubjectUnavailable
from leaseproof.conformance.queues.subjects import clock
from leaseproof.model.queue import Answer, Capability, Seen

QUEUE = "leaseproof"
TASK = "noop"
MAX_ATTEMPTS = 1_000_000  # no run reaches it: a takeover or a failure always retries the task
_TABLES = ", ".join(f"absurd.{prefix}_{QUEUE}" for prefix in ("t", "r", "c", "e", "w"))
_STATUS = {
    "pending": "pending",
    "sleeping": "pending",
    "running": "claimed",
    "completed": "finished",
    "failed": "failed",
}
_INSTALL_TIMEOUT = 120  # seconds
_MISSING = "absurd is not installed: pip install absurd-sdk==0.5.1 absurdctl==0.5.1"


def _refused(exc: psycopg.Error) -> bool:
    """Absurd's refusal of an act on a run that is not running: its state errors AB001 (the task
    was cancelled) and AB002 (the run already failed), or a plain `raise exception 'Run "..." ...'`
    (not currently running, not found, no active claim)."""
    return exc.sqlstate in ("AB001", "AB002") or (exc.sqlstate == "P0001" and str(exc).startswith('Run "'))


class _Client:
    """One Absurd client on its own connection (autocommit: each call is its own transaction)."""

    def __init__(self, dsn: str, lease_seconds: int) -> None:
        try:
            from absurd_sdk import Absurd  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise SubjectUnavailable(_MISSING) from None
        self.lease_seconds = lease_seconds
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.absurd = Absurd(self.conn, queue_name=QUEUE)

    def fetch(self) -> Held | None:
        worker = f"leaseproof-{uuid.uuid4()}"  # a new worker: a new holder
        claimed = self.absurd.claim_tasks(batch_size=1, claim_timeout=self.lease_seconds, worker_id=worker)
        if not claimed:
            return None
        task, run = str(claimed[0]["task_id"]), str(claimed[0]["run_id"])
        return Held(task, (task, run))  # plain data: any client can act as this holder

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        _, run = handle
        if outcome == "finished":
            return self._act("SELECT absurd.complete_run(%s, %s, %s)", (QUEUE, run, json.dumps(None)))
        reason = json.dumps({"name": "Failed", "message": "failed by leaseproof"})
        return self._act("SELECT absurd.fail_run(%s, %s, %s, %s)", (QUEUE, run, reason, None))

    def heartbeat(self, handle: Any) -> Answer:
        _, run = handle
        return self._act("SELECT absurd.extend_claim(%s, %s, %s)", (QUEUE, run, self.lease_seconds))

    def _act(self, statement: str, values: tuple[Any, ...]) -> Answer:
        try:
            self.conn.execute(statement, values)
        except psycopg.Error as exc:
            if _refused(exc):
                return Answer.REFUSED
            raise
        return Answer.APPLIED

    def rescue(self) -> None:
        raise NotImplementedError("Absurd has no rescue on demand: a claim fails expired runs (takeover)")

    def close(self) -> None:
        self.conn.close()


def _uri(conninfo: str) -> str:
    """`conninfo` as a postgresql:// URI, the form absurdctl's `-d` passes to psql as it is."""
    return "postgresql://?" + urlencode(conninfo_to_dict(conninfo), quote_via=quote)  # libpq reads no "+" as a space


class AbsurdQueue(_Client):
    name = "absurd"
    capabilities = frozenset({Capability.HEARTBEAT, Capability.TAKEOVER, Capability.ENDS_AT_EXPIRY})

    def __init__(self, dsn: str) -> None:
        try:
            self.version = importlib.metadata.version("absurd-sdk")
            importlib.metadata.version("absurdctl")
        except importlib.metadata.PackageNotFoundError:
            raise SubjectUnavailable(_MISSING) from None
        clock.install(dsn)
        self.dsn = clock.conninfo(dsn)
        self._install()
        super().__init__(self.dsn, 30)
        self.absurd.create_queue(QUEUE)

    def _install(self) -> None:
        """`absurdctl init -d URI`, absurdctl's console script (`absurdctl:main`) run by this interpreter."""
        path = os.environ.get("PATH", "")
        bundled = client_bin_dir()  # psql from the embedded server's binaries, where PATH has none
        if shutil.which("psql") is None and bundled is not None:
            path = f"{bundled}{os.pathsep}{path}"
        if shutil.which("psql", path=path) is None:
            raise SubjectUnavailable("absurdctl init needs psql (PostgreSQL's client) on PATH")
        command = [sys.executable, "-c", "import absurdctl; absurdctl.main()", "init", "-d", _uri(self.dsn)]
        env = {**os.environ, "PATH": path}
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT, check=False, env=env
            )
        except subprocess.TimeoutExpired:
            raise SubjectUnavailable(f"absurdctl init did not finish within {_INSTALL_TIMEOUT}s") from None
        if done.returncode != 0:
            problem = (done.stderr or done.stdout).strip()
            raise SubjectUnavailable(f"absurdctl init failed: {problem}")

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.lease_seconds = lease_seconds
        clock.start_over(self.conn, start, f"TRUNCATE {_TABLES}")
        row = self.conn.execute("SELECT absurd.current_time() = lpclock.now()").fetchone()
        if row != (True,):
            raise RuntimeError("absurd.current_time() does not read the pinned clock (is absurd.fake_now set?)")

    def enqueue(self) -> str:
        spawned = self.absurd.spawn(TASK, {}, max_attempts=MAX_ATTEMPTS, queue=QUEUE)
        return str(spawned["task_id"])

    def advance(self, seconds: int) -> None:
        clock.advance(self.conn, seconds)

    def rows(self) -> dict[str, Seen]:
        found = self.conn.execute(f"SELECT task_id, state FROM absurd.t_{QUEUE}").fetchall()
        return {str(task): Seen(_STATUS[state]) for task, state in found}

    def session(self) -> _Client:
        return _Client(self.dsn, self.lease_seconds)
