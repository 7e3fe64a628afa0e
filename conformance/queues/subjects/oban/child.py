"""oban (Python 3.12 or newer) behind leaseproof's queue lines, run by `oban_queue.py` in a virtualenv of its own.

One JSON request per line on stdin ({"id": n, "op": name, ...}), one JSON reply per line on stdout
({"id": n, "ok": value} or {"id": n, "error": text}), in any order: each request runs as soon as it
arrives, as a task of one event loop, so the races of `leaseproof guarantees` are real. "ready"
(id 0) says the schema is installed; the end of stdin lets every held job go and exits.

    python child.py '{"conninfo": "...", "queue": "leaseproof", "attempts": 20000}'

Only oban's public API: `oban.schema.install`; `Oban` (as a client: `enqueue`; as a node:
`start`, `start_queue`, `resume_queue`, `pause_queue`, `is_leader`, `stop`); the `worker`
decorator and `Cancel`; and `oban.telemetry`'s events, which say what each part of oban did.

oban has no call that takes one job: a node's producer fetches for its queue whenever it is told
to, and runs each job's worker. So a fetch is a new node (a new holder: its own node name and
producer uuid, the job's `attempted_by`) whose queue is started paused (`limit` 1) once the
node's stager ran its first stage (which notifies the producers of queues it finds jobs in), and
then resumed: its producer fetches once. The node's other loops are put off. The worker holds the
job until the holder completes it, and the node is paused and shut down at once (its `stop` waits
for the held job, then writes the producer's ack). A completion lets the worker return (nothing:
completed; `Cancel`: cancelled, a failure for good) and answers what the producer's ack query said
(`oban.producer.ack.stop`'s count: its UPDATE matched the job, or not). A rescue is one run of
oban's Lifeline (`rescue_after` = the lease) by a node elected leader of a name of its own.

Telemetry handlers are global, so each act's tasks carry a context variable naming the act they
serve (asyncio tasks copy the context they start in). Every node's connections come from one pool
that checks each connection as it is taken (oban's `pool_check`): one whose backend a race ended
while it sat idle is replaced, and fails no later act.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.metadata
import itertools
import json
import logging
import sys
import threading
from typing import Any, cast

from oban import Cancel, Oban, telemetry, worker  # type: ignore[import-not-found, unused-ignore]
from oban.schema import install  # type: ignore[import-not-found, unused-ignore]
from psycopg_pool import AsyncConnectionPool

CALL_TIMEOUT = 45.0  # seconds any one wait of a request may take (the parent waits 60 s for a reply)
FOREVER = 24 * 3600.0  # seconds: the interval of every loop of a node that is not the act's
RESCUE_INTERVAL = 0.005  # seconds: a rescuer's Lifeline runs almost at once
POOL_SIZE = 16

config = json.loads(sys.argv[1])
QUEUE: str = config["queue"]
ATTEMPTS: int = config["attempts"]  # no run uses them up: a rescue returns a job to `available`

_ACT: contextvars.ContextVar[_Act | None] = contextvars.ContextVar("leaseproof_act", default=None)
_ids = itertools.count(1)
_anomalies: list[str] = []  # what oban did that no request asked for: every request fails until a reset


def _quiet(**loops: Any) -> dict[str, Any]:
    """A node's settings with every periodic loop (staging, pruning, producers' refresh, the
    Lifeline) put off, but those in `loops`; each act runs its own part of oban on demand."""
    settings: dict[str, Any] = {
        "stager": {"interval": FOREVER},
        "pruner": {"interval": FOREVER},
        "refresher": {"interval": FOREVER},
        "lifeline": {"interval": FOREVER},
    }
    settings.update(loops)
    return settings


class _Act:
    """What one act waits for, told by oban's telemetry events in the tasks that serve it."""

    def event(self, name: str, meta: dict[str, Any]) -> None:
        raise NotImplementedError


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], meta: dict[str, Any]) -> None:
    if not future.done():
        future.set_exception(RuntimeError(f"{meta.get('error_type')}: {meta.get('error_message')}"))


class _Holder(_Act):
    """One fetch: a node with one producer, and then the holder of the job it took."""

    def __init__(self, key: str) -> None:
        loop = asyncio.get_running_loop()
        self.key = key
        self.staged: asyncio.Future[None] = loop.create_future()  # the node's stager ran its first stage
        self.found: asyncio.Future[Any] = loop.create_future()  # the job its producer took, or None
        self.release: asyncio.Future[str] = loop.create_future()  # the holder's outcome
        self.acked: asyncio.Future[int] = loop.create_future()  # how many jobs the producer's ack updated
        self.stopped: asyncio.Future[Any] | None = None  # the node's shutdown
        self.recorded = False  # the worker returned: the producer's next ack carries its outcome
        self.acking = False

    def event(self, name: str, meta: dict[str, Any]) -> None:
        if name in ("oban.stager.stage.stop", "oban.stager.stage.exception"):
            _settle(self.staged, None)
        elif name == "oban.producer.get.stop" and meta.get("count") == 0:
            _settle(self.found, None)
        elif name == "oban.producer.get.exception":
            _fail(self.found, meta)
        elif name in ("oban.job.stop", "oban.job.exception"):
            self.recorded = True  # the executor appends its ack right after this event, in the same step
        elif name == "oban.producer.ack.start" and self.recorded and not self.acked.done():
            self.acking = True
        elif name == "oban.producer.ack.stop" and self.acking:
            self.acking = False
            _settle(self.acked, int(meta.get("count", 0)))
        elif name == "oban.producer.ack.exception" and self.acking:
            self.acking = False
            _fail(self.acked, meta)

    async def hold(self, job: Any) -> Any:
        """The worker: hand the job to the fetch, hold it until the holder completes it."""
        if self.found.done():
            _anomalies.append(f"the producer of holder {self.key} took job {job.id} after its one fetch")
            raise RuntimeError("leaseproof: a job its holder did not fetch")
        self.found.set_result(job)
        if await self.release == "finished":
            return None  # completed
        return Cancel("leaseproof: the holder failed the job")  # cancelled: a failure for good


class _Rescuer(_Act):
    def __init__(self) -> None:
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def event(self, name: str, meta: dict[str, Any]) -> None:
        if name == "oban.lifeline.rescue.stop":
            _settle(self.done, int(meta.get("rescued_count", 0)))
        elif name == "oban.lifeline.rescue.exception":
            _fail(self.done, meta)


def _on_event(name: str, meta: dict[str, Any]) -> None:
    act = _ACT.get()
    if act is not None:
        act.event(name, meta)


@worker(queue=QUEUE, max_attempts=ATTEMPTS)  # type: ignore[untyped-decorator, unused-ignore]
class Hold:
    async def process(self, job: Any) -> Any:
        act = _ACT.get()
        if not isinstance(act, _Holder):
            raise RuntimeError("leaseproof: a job run outside of a fetch")
        return await act.hold(job)


async def _stop(node: Any) -> None:
    await asyncio.wait_for(node.stop(), CALL_TIMEOUT)


class Queue:
    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.client = Oban(pool=pool, name="leaseproof-client")  # no queues: a client, never started
        self.holders: dict[str, _Holder] = {}
        self.lease = 30.0
        self.free_names: list[str] = []  # rescuers' names (and nodes) whose leader row was resigned

    async def version(self) -> str:
        return importlib.metadata.version("oban")

    async def enqueue(self) -> str:
        job = await self.client.enqueue(cast(Any, Hold).new({}))  # `new`: the decorator's
        return str(job.id)

    async def fetch(self) -> dict[str, str] | None:
        key = f"leaseproof-holder-{next(_ids)}"
        holder = _Holder(key)
        _ACT.set(holder)  # this request's task: the node's tasks, started from it, carry it
        node = Oban(
            pool=self.pool, name="leaseproof-holder", node=key, leadership=False, shutdown_grace_period=None, **_quiet()
        )
        try:
            await node.start()
            # The stager's first stage notifies the producers of the queues it finds jobs in (all of
            # them if it fails): a producer that exists by then may fetch on it. So the queue starts after.
            await asyncio.wait_for(asyncio.shield(holder.staged), CALL_TIMEOUT)
            await node.start_queue(queue=QUEUE, limit=1, paused=True, node=key)
            await node.resume_queue(QUEUE, node=key)  # its producer fetches once
            job = await asyncio.wait_for(asyncio.shield(holder.found), CALL_TIMEOUT)
        except BaseException:
            await _stop(node)
            raise
        if job is None:
            await _stop(node)
            return None
        self.holders[key] = holder
        try:
            await node.pause_queue(QUEUE, node=key)  # no other fetch once its job is done
        except Exception as exc:  # noqa: BLE001 - the stop below stops the producer as well
            logging.getLogger("leaseproof").warning("pausing holder %s: %s", key, exc)
        holder.stopped = asyncio.ensure_future(node.stop())  # shut down at once: it waits for the held job
        return {"job": str(job.id), "holder": key}

    async def complete(self, holder: str, outcome: str) -> str:
        held = self.holders.pop(holder, None)
        if held is None:
            return "refused"  # this holder completed already: a job's worker returns once
        held.release.set_result(outcome)
        try:
            count = await asyncio.wait_for(asyncio.shield(held.acked), CALL_TIMEOUT)
        finally:
            assert held.stopped is not None
            await asyncio.wait_for(held.stopped, CALL_TIMEOUT)
        return "applied" if count == 1 else "refused"

    async def rescue(self) -> None:
        name = self.free_names.pop() if self.free_names else f"leaseproof-rescuer-{next(_ids)}"
        rescuer = _Rescuer()
        _ACT.set(rescuer)
        lifeline = {"interval": RESCUE_INTERVAL, "rescue_after": self.lease}
        node = Oban(pool=self.pool, name=name, node=name, leadership=True, **_quiet(lifeline=lifeline))
        try:
            await node.start()
            if not node.is_leader:
                raise RuntimeError(f"rescuer {name} was not elected leader: its Lifeline would not rescue")
            await asyncio.wait_for(asyncio.shield(rescuer.done), CALL_TIMEOUT)
        finally:
            await _stop(node)
        self.free_names.append(name)

    async def reset(self, lease: float) -> None:
        """Every held job let go (a failure, fenced as any), then forgotten, and the lease set."""
        await self.forget()
        self.lease = lease
        _anomalies.clear()

    async def forget(self) -> None:
        held, self.holders = list(self.holders.values()), {}
        for holder in held:
            _settle(holder.release, "failed")
        for holder in held:
            if holder.stopped is not None:
                await asyncio.wait_for(holder.stopped, CALL_TIMEOUT)


async def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    telemetry.attach("leaseproof", list(telemetry.EVENTS), _on_event)
    # `check`: each connection is checked as it is taken from the pool (oban's `pool_check` setting),
    # so one whose backend was ended while it sat idle is replaced, not handed to the next act.
    pool = AsyncConnectionPool(
        config["conninfo"], min_size=1, max_size=POOL_SIZE, check=AsyncConnectionPool.check_connection, open=False
    )
    await pool.open(wait=True)
    await install(pool)
    queue = Queue(pool)
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()

    def reply(body: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(body) + "\n")
        sys.stdout.flush()

    async def serve(line: str) -> None:
        request: dict[str, Any] = {"id": None}
        try:
            request = json.loads(line)
            if _anomalies and request["op"] != "reset":
                raise RuntimeError("; ".join(_anomalies))
            args = {key: value for key, value in request.items() if key not in ("id", "op")}
            reply({"id": request["id"], "ok": await getattr(queue, request["op"])(**args)})
        except Exception as exc:  # noqa: BLE001 - every failure is the request's answer
            reply({"id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"})

    def start(line: str) -> None:
        task = loop.create_task(serve(line), context=contextvars.Context())  # each request's own context
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(start, line)
        loop.call_soon_threadsafe(ended.set)

    reply({"id": 0, "ok": "ready"})
    threading.Thread(target=read, daemon=True).start()
    await ended.wait()
    try:
        await queue.forget()
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(main())
