"""The Node.js queues' processes: the pinned packages, installed once, and a child spoken to in lines.

`node/package-lock.json` pins the packages. On first use they are installed, with `npm ci`, into
a cache folder named after the lockfile and the scripts (`$XDG_CACHE_HOME/leaseproof`, else
`~/.cache/leaseproof`), under a file lock (pytest-xdist workers install once); it needs Node.js
20 or newer and npm on the PATH. A `Child` runs one script of `node/` (`pgboss.mjs`,
`graphile.mjs`) with the database's connection settings, and sends it one JSON request per line;
the requests of several sessions run at once there.
"""

from __future__ import annotations

import abc
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, ClassVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.queues.protocol import Held, SubjectUnavailable
from leaseproof.conformance.queues.subjects import clock
from leaseproof.model.queue import Answer

SOURCE = Path(__file__).parent / "node"
FILES = ("package.json", "package-lock.json", "lines.mjs", "pgboss.mjs", "graphile.mjs")
START_TIMEOUT = 120.0  # seconds for the child to start pg-boss (its migrations) and answer ready
CALL_TIMEOUT = 60.0  # seconds any one request may take
INSTALL_TIMEOUT = 600.0  # seconds `npm ci` may take


class Unavailable(SubjectUnavailable):
    """Node.js or npm is missing, or the install failed."""


def installed() -> Path:
    """The cache folder holding the pinned packages and the scripts, installed if it is not yet."""
    digest = hashlib.sha256(b"".join((SOURCE / name).read_bytes() for name in FILES)).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "leaseproof" / f"node-{digest}"
    if (cache / "node_modules" / "pg-boss" / "package.json").is_file():
        return cache
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise Unavailable(f"the Node.js queues need Node.js 20 or newer and npm on the PATH ({tool} is not)")
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
                raise Unavailable(f"npm ci failed in {cache}: {done.stderr.strip()[-2000:]}")
    return cache


class Child:
    """One node process running `script` (of `node/`): requests by id, replies matched by a reader thread."""

    def __init__(self, script: str, config: dict[str, Any]) -> None:
        folder = installed()
        self.name = script
        self.errors: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed with the child
        self.process = subprocess.Popen(
            ["node", str(folder / script), json.dumps(config)],
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
            raise TimeoutError(f"{self.name} did not answer request {request} within {timeout:g}s")
        if not box:
            self.errors.seek(0)
            raise RuntimeError(f"the {self.name} process ended: {self.errors.read()[-2000:]}")
        if "error" in box[0]:
            raise RuntimeError(f"{self.name}: {box[0]['error']}")
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
                self.process.stdin.close()  # it stops its library and exits
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            self.errors.close()


def connection(dsn: str) -> dict[str, Any]:
    """node-postgres's connection settings for `dsn`, on the search-path clock."""
    given = conninfo_to_dict(clock.conninfo(dsn))
    config = {
        "host": given.get("host"), "port": int(given.get("port") or 5432), "user": given.get("user"),
        "password": given.get("password"), "database": given.get("dbname"), "options": given.get("options"),
    }  # fmt: skip
    return {key: value for key, value in config.items() if value is not None}


class NodeSession(abc.ABC):
    """A client of a Node.js queue: its requests run at once with the others' in the same child.
    A subclass says what each act is, in the child's calls."""

    def __init__(self, child: Child) -> None:
        self.child = child

    @abc.abstractmethod
    def fetch(self) -> Held | None: ...

    @abc.abstractmethod
    def complete(self, handle: Any, outcome: str) -> Answer | None: ...

    @abc.abstractmethod
    def rescue(self) -> None: ...

    def close(self) -> None:  # noqa: B027 - a session holds nothing: the child is the adapter's
        pass


class NodeQueue:
    """What the adapter of a Node.js queue shares: the search-path clock, a connection that reads
    the rows and moves the clock, and the child running `script`. A subclass says its sessions'
    class and what each act is."""

    name: ClassVar[str]
    script: ClassVar[str]
    session_class: ClassVar[type[NodeSession]]

    def __init__(self, dsn: str) -> None:
        clock.install(dsn)
        self.sql = psycopg.connect(clock.conninfo(dsn), autocommit=True)
        try:
            self.child = Child(self.script, connection(dsn))
        except BaseException:
            self.sql.close()
            raise
        self.version = str(self.child.call("version"))

    def heartbeat(self, handle: Any) -> Any:
        raise NotImplementedError(f"{self.name} has no heartbeat")

    def session(self) -> NodeSession:
        return self.session_class(self.child)

    def close(self) -> None:
        try:
            self.child.close()
        finally:
            self.sql.close()
