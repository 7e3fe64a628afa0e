"""pgmq (the Python client `pgmq`, `PGMQueue`, with the pgmq SQL 1.13.0 it bundles), driven through its public API,
as a lease queue.

- install: `pgmq.install_pgmq_from_sql(conn=...)` (pgmq's SQL without the extension) and
  `queue.create_queue(QUEUE)`, through a connection on the search-path clock (`clock.py`): pgmq's functions read
  an unqualified `clock_timestamp()` (in their dynamic SQL too), and its tables' `now()` defaults bind there;
- every client is a `PGMQueue(pool=...)` on a pool of our own whose connections have the clock's search path: a
  `PGMQueue` made from a conninfo rebuilds its DSN from host, port, dbname, user and password, and drops the
  `options` that carry that search path;
- enqueue: `queue.send(QUEUE, {})`: visible at once (`vt = clock_timestamp()`);
- fetch: `queue.read(QUEUE, vt=lease)`: the oldest visible message (`vt <= clock_timestamp()`), its `vt` moved to
  now + lease and its `read_ct` counted. A read also takes a message whose `vt` has passed, whoever read it
  before: pgmq's redelivery is the read itself (takeover). The holder is the read: (msg_id, read_ct), and the vt it
  was given;
- heartbeat: `queue.set_vt(QUEUE, msg_id, lease)`: applied iff it returns the message. pgmq's API takes a msg_id
  alone: nothing of the holder (read_ct, vt) reaches the database;
- complete: `queue.archive(QUEUE, msg_id)`, what pgmq's README does "when done" (`queue.delete`, the other way
  to complete, has the same `WHERE msg_id = $1`): applied iff it returns true;
- rows: the queue table `pgmq.q_leaseproof` by msg_id: a message read (`read_ct > 0`) whose `vt` has not come
  (`vt > now`) claimed, any other pending, by pgmq's own rule; the archive table `pgmq.a_leaseproof` finished
  (archive is the only completion sent); a message in neither, no row (lost). pgmq's read takes a message again
  from `vt <= clock_timestamp()` on: its lease is over at the instant `vt`, which it declares
  (`Capability.ENDS_AT_EXPIRY`), so a read at that instant is a takeover, not a double claim.

Capabilities: heartbeat, takeover, and its lease boundary (ends-at-expiry). No deadline: a holder is refused by
nothing but its message having left the queue table (archive, delete, set_vt match `msg_id` alone), so an expired
holder's acts are judged as a stale holder's (its row shows the message pending once its vt has passed). No rescue:
there is no call to run one; a message whose vt passed is visible again by time alone, and the next read takes it.
No fail: pgmq has no failed state (its archive holds completed messages, and says nothing of how they ended); a
holder that fails leaves its message, which the next read after vt takes again.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
from typing import Any

import attrs
import psycopg

from leaseproof.conformance.queues.protocol import Held, SubjectUnavailable
from leaseproof.conformance.queues.subjects import clock
from leaseproof.model.queue import Answer, Capability, Seen

QUEUE = "leaseproof"
_TABLES = f"pgmq.q_{QUEUE}, pgmq.a_{QUEUE}"
# A read message is claimed until the instant its vt comes, when pgmq's read may take it again.
_ROWS = f"""
    SELECT msg_id, CASE WHEN read_ct > 0 AND vt > clock_timestamp() THEN 'claimed' ELSE 'pending' END
    FROM pgmq.q_{QUEUE}
    UNION ALL
    SELECT msg_id, 'finished' FROM pgmq.a_{QUEUE}
"""


@attrs.frozen
class Lease:
    """A holder: the read that handed out `msg_id` (its `read_ct`-th read), and the vt it was given. Data only:
    any client can act as it; pgmq's API takes only its `msg_id`."""

    msg_id: int
    read_ct: int
    vt: dt.datetime


def _client(dsn: str) -> Any:
    """A `PGMQueue` on a pool of one connection to `dsn` (the clock's conninfo)."""
    try:
        import pgmq  # type: ignore[import-not-found, unused-ignore]
        from psycopg_pool import ConnectionPool
    except ImportError as exc:
        raise SubjectUnavailable(f"pgmq is not installed: pip install 'pgmq==1.1.4' ({exc})") from exc
    pool = ConnectionPool(dsn, min_size=1, max_size=1, open=True, check=ConnectionPool.check_connection)
    return pgmq.PGMQueue(conn_string=dsn, pool=pool, init_extension=False)


class _Client:
    """One pgmq client (its own pool of one connection)."""

    def __init__(self, dsn: str, lease_seconds: int) -> None:
        self.lease_seconds = lease_seconds
        self.queue = _client(dsn)

    def fetch(self) -> Held | None:
        message = self.queue.read(QUEUE, vt=self.lease_seconds)
        if message is None:
            return None
        return Held(str(message.msg_id), Lease(message.msg_id, message.read_ct, message.vt))

    def complete(self, handle: Any, outcome: str) -> Answer | None:
        if outcome != "finished":  # no Capability.FAIL: the profile sends only "finished"
            raise ValueError(f"pgmq has no failed state, and is never asked to complete as {outcome!r}")
        return Answer.APPLIED if self.queue.archive(QUEUE, handle.msg_id) else Answer.REFUSED

    def heartbeat(self, handle: Any) -> Answer:
        renewed = self.queue.set_vt(QUEUE, handle.msg_id, self.lease_seconds)
        return Answer.REFUSED if renewed is None else Answer.APPLIED

    def rescue(self) -> None:
        raise NotImplementedError("pgmq has no rescue: a message is visible again once its vt passed")

    def close(self) -> None:
        self.queue.close()


class PgmqQueue(_Client):
    name = "pgmq"
    capabilities = frozenset({Capability.HEARTBEAT, Capability.TAKEOVER, Capability.ENDS_AT_EXPIRY})

    def __init__(self, dsn: str) -> None:
        try:
            import pgmq  # type: ignore[import-not-found, unused-ignore]
        except ImportError as exc:
            raise SubjectUnavailable(f"pgmq is not installed: pip install 'pgmq==1.1.4' ({exc})") from exc
        self.version = importlib.metadata.version("pgmq")
        clock.install(dsn)
        self.dsn = clock.conninfo(dsn)
        with psycopg.connect(self.dsn, autocommit=False) as conn:
            pgmq.install_pgmq_from_sql(conn=conn)
        super().__init__(self.dsn, 30)
        self.queue.create_queue(QUEUE)
        self.sql = psycopg.connect(self.dsn, autocommit=True)

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        self.lease_seconds = lease_seconds
        clock.start_over(self.sql, start, f"TRUNCATE {_TABLES} RESTART IDENTITY")

    def enqueue(self) -> str:
        return str(self.queue.send(QUEUE, {}))

    def advance(self, seconds: int) -> None:
        clock.advance(self.sql, seconds)

    def rows(self) -> dict[str, Seen]:
        return {str(msg): Seen(status) for msg, status in self.sql.execute(_ROWS).fetchall()}

    def session(self) -> _Client:
        return _Client(self.dsn, self.lease_seconds)

    def close(self) -> None:
        try:
            self.sql.close()
        finally:
            super().close()
