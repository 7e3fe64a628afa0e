"""The fault proxy, in front of a real server, with real clients: queries pass through it unchanged,
and each fault does what it says (an answer lost after the commit, a request reset, a delay, a
blackhole); close() is bounded and leaves no thread behind; an unreachable server closes the client."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leaseproof.conformance.harness.proxy import THREAD_PREFIX, FaultProxy

Connection = psycopg.Connection[tuple[Any, ...]]

_HANG = 30.0  # seconds after which a client call that should have returned is reported as hung


def _threads_of(proxy: FaultProxy) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(f"{THREAD_PREFIX}-{proxy.port}-")]


@pytest.fixture
def proxy(scratch_dsn: str) -> Iterator[FaultProxy]:
    """A started proxy in front of the scratch database's server; closed after, with no thread left."""
    with FaultProxy(scratch_dsn) as started:
        yield started
    assert _threads_of(started) == []


def _through(proxy: FaultProxy, dsn: str, **options: Any) -> Connection:
    return psycopg.connect(proxy.dsn_through(dsn), autocommit=True, connect_timeout=10, **options)


def _direct(dsn: str) -> Connection:
    return psycopg.connect(dsn, autocommit=True, connect_timeout=10)


def _rows(dsn: str) -> int:
    with _direct(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM t").fetchone()
        assert row is not None
        return int(row[0])


def _within(proxy: FaultProxy, call: Callable[[], object]) -> object:
    """`call()`, on a thread; if it has not returned after _HANG seconds, the proxy is closed (which ends
    the call) and the test fails: a client waiting on the proxy fails instead of hanging."""
    outcome: list[object] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(_HANG)
    if thread.is_alive():
        proxy.close()
        thread.join()
        pytest.fail(f"the client waited on the proxy for {_HANG} s")
    if failure:
        raise failure[0]
    return outcome[0]


def _assert_lost(error: psycopg.OperationalError, conn: Connection) -> None:
    """The error is the connection's loss, not an error the server reported."""
    assert error.sqlstate is None, error
    assert conn.closed


# -- passing through -------------------------------------------------------------------------------


def test_queries_pass_through_unchanged(proxy: FaultProxy, scratch_dsn: str) -> None:
    with _through(proxy, scratch_dsn) as conn:
        assert conn.execute("SELECT 1, 'one'").fetchall() == [(1, "one")]
        # psycopg sends a query with parameters by the extended protocol (Parse, Bind, Execute, Sync).
        assert conn.execute("SELECT %s::int + %s::int, %s::text", (2, 3, "five")).fetchone() == (5, "five")
        conn.execute("CREATE TABLE t (x int)")
        with conn.transaction():
            conn.execute("INSERT INTO t VALUES (1), (2)")
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (%s)", (3,))
        conn.execute("ROLLBACK")
        assert conn.execute("SELECT array_agg(x ORDER BY x) FROM t").fetchone() == ([1, 2],)
        # A long answer, many network reads long, and an error, which leaves the connection usable.
        assert conn.execute("SELECT sum(i), count(*) FROM generate_series(1, 200000) i").fetchone() == (
            20000100000,
            200000,
        )
        assert len(conn.execute("SELECT repeat('x', 1000) FROM generate_series(1, 5000)").fetchall()) == 5000
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        assert conn.execute("SELECT 2").fetchone() == (2,)
    assert _rows(scratch_dsn) == 2
    assert proxy.connections == 1
    assert sum(proxy.counts.values()) == 0


def test_several_connections_at_once(proxy: FaultProxy, scratch_dsn: str) -> None:
    connections = [_through(proxy, scratch_dsn) for _ in range(4)]
    try:
        pids = {conn.info.backend_pid for conn in connections}
        assert len(pids) == 4  # one server connection for each client
        results: dict[int, list[int]] = {}

        def work(index: int, conn: Connection) -> None:
            answers = results[index] = []
            for i in range(50):
                row = conn.execute("SELECT %s::int * 10", (i,)).fetchone()
                assert row is not None
                answers.append(row[0])

        threads = [threading.Thread(target=work, args=(i, conn)) for i, conn in enumerate(connections)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(_HANG)
        assert results == {i: [n * 10 for n in range(50)] for i in range(4)}
        for conn in connections:  # each still answers its own: the backends are not shuffled
            assert conn.execute("SELECT pg_backend_pid()").fetchone() == (conn.info.backend_pid,)
    finally:
        for conn in connections:
            conn.close()
    assert proxy.connections == 4


def test_copy_pipelines_and_notifications_pass_through(proxy: FaultProxy, scratch_dsn: str) -> None:
    with _through(proxy, scratch_dsn) as conn:
        conn.execute("CREATE TABLE t (x int)")

        def copy_in_and_out() -> list[tuple[Any, ...]]:
            # COPY FROM: the server answers CopyInResponse and waits for the client's data.
            with conn.cursor() as cur, cur.copy("COPY t (x) FROM STDIN") as copy:
                for x in range(1000):
                    copy.write_row((x,))
            with conn.cursor() as cur, cur.copy("COPY (SELECT x FROM t ORDER BY x LIMIT 3) TO STDOUT") as copy:
                return list(copy.rows())

        assert _within(proxy, copy_in_and_out) == [("0",), ("1",), ("2",)]

        def pipeline() -> object:
            # psycopg fetches inside a pipeline with a Flush, before any Sync: the answer must come.
            with conn.pipeline():
                cur = conn.execute("SELECT %s::int", (7,))
                return cur.fetchone()

        assert _within(proxy, pipeline) == (7,)

        # A notification arrives while no request is outstanding: it is forwarded at once.
        conn.execute("LISTEN proxy_test")
        with _direct(scratch_dsn) as other:
            other.execute("NOTIFY proxy_test, 'hello'")
        received = list(conn.notifies(timeout=_HANG, stop_after=1))
        assert [(n.channel, n.payload) for n in received] == [("proxy_test", "hello")]
    assert _rows(scratch_dsn) == 1000
    assert sum(proxy.counts.values()) == 0


# -- lose_next_answer ------------------------------------------------------------------------------


def test_an_answer_lost_after_an_autocommit_statement_committed(proxy: FaultProxy, scratch_dsn: str) -> None:
    with _direct(scratch_dsn) as conn:
        conn.execute("CREATE TABLE t (x int)")
    proxy.lose_next_answer()
    with _through(proxy, scratch_dsn) as conn:
        with pytest.raises(psycopg.OperationalError) as lost:
            conn.execute("INSERT INTO t VALUES (1)")
        _assert_lost(lost.value, conn)
    assert _rows(scratch_dsn) == 1  # the server committed it
    assert proxy.counts["lose-answer"] == 1
    # It fired once: the next statement, on a new connection, is answered.
    with _through(proxy, scratch_dsn) as conn:
        conn.execute("INSERT INTO t VALUES (%s)", (2,))
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
    assert proxy.counts["lose-answer"] == 1


def test_inside_a_transaction_the_answer_lost_is_the_commits(proxy: FaultProxy, scratch_dsn: str) -> None:
    with _direct(scratch_dsn) as conn:
        conn.execute("CREATE TABLE t (x int)")
    with _through(proxy, scratch_dsn) as conn:
        proxy.lose_next_answer()
        conn.execute("BEGIN")  # answered with ReadyForQuery 'T': not lost
        conn.execute("INSERT INTO t VALUES (1)")  # 'T' again
        assert proxy.counts["lose-answer"] == 0
        with pytest.raises(psycopg.OperationalError) as lost:
            conn.execute("COMMIT")
        _assert_lost(lost.value, conn)
    assert _rows(scratch_dsn) == 1
    assert proxy.counts["lose-answer"] == 1


def test_an_answer_without_a_command_complete_is_not_lost(proxy: FaultProxy, scratch_dsn: str) -> None:
    with _direct(scratch_dsn) as conn:
        conn.execute("CREATE TABLE t (x int)")
    with _through(proxy, scratch_dsn) as conn:
        proxy.lose_next_answer()
        with pytest.raises(psycopg.errors.DivisionByZero):  # an ErrorResponse, then ReadyForQuery 'I'
            conn.execute("SELECT 1 / 0")
        assert proxy.counts["lose-answer"] == 0
        with pytest.raises(psycopg.OperationalError) as lost:
            conn.execute("INSERT INTO t VALUES (%s)", (1,))  # extended protocol: lost at its Sync's answer
        _assert_lost(lost.value, conn)
    assert _rows(scratch_dsn) == 1
    assert proxy.counts["lose-answer"] == 1


# -- reset_next_request ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "params"),
    [("INSERT INTO t VALUES (1)", None), ("INSERT INTO t VALUES (%s)", (1,))],
    ids=["query", "extended-sync"],
)
def test_a_request_reset_before_its_answer(
    proxy: FaultProxy, scratch_dsn: str, statement: str, params: tuple[int] | None
) -> None:
    with _direct(scratch_dsn) as conn:
        conn.execute("CREATE TABLE t (x int)")
    # The table is locked: the server cannot answer the INSERT while the lock is held, so the error is
    # the reset's. (A request the proxy failed to reset would end in the server's lock_timeout error.)
    with _direct(scratch_dsn) as locker, _through(proxy, scratch_dsn, options="-c lock_timeout=20s") as conn:
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        proxy.reset_next_request()
        with pytest.raises(psycopg.OperationalError) as reset:
            conn.execute(statement, params)
        _assert_lost(reset.value, conn)
        assert proxy.counts["reset"] == 1
        locker.execute("ROLLBACK")
    # It fired once: the next request, on a new connection, is answered.
    with _through(proxy, scratch_dsn) as conn:
        assert conn.execute("SELECT %s::int", (3,)).fetchone() == (3,)
        assert conn.execute("SELECT 4").fetchone() == (4,)
    assert proxy.counts["reset"] == 1


def test_a_reset_is_a_tcp_reset(proxy: FaultProxy, scratch_dsn: str) -> None:
    params = conninfo_to_dict(scratch_dsn)
    options = b"".join(
        name + b"\0" + str(params[key]).encode() + b"\0" for name, key in ((b"user", "user"), (b"database", "dbname"))
    )
    startup = struct.pack("!ii", 8 + len(options) + 1, 196608) + options + b"\0"  # protocol 3.0
    query = b"SELECT 1\0"
    proxy.reset_next_request()
    with socket.create_connection(proxy.address, timeout=_HANG) as client:
        client.sendall(startup + b"Q" + struct.pack("!i", 4 + len(query)) + query)
        with pytest.raises(ConnectionResetError):  # not an end of stream (a FIN): a RST
            while client.recv(65536):
                pass
    assert proxy.counts["reset"] == 1


# -- delay and blackhole ---------------------------------------------------------------------------


def test_a_delayed_answer_comes_late_and_right(proxy: FaultProxy, scratch_dsn: str) -> None:
    with _through(proxy, scratch_dsn) as conn:
        start = time.monotonic()
        proxy.delay(0.3, for_seconds=60)
        assert conn.execute("SELECT %s::int * 2", (21,)).fetchone() == (42,)
        assert time.monotonic() - start >= 0.3
        assert proxy.counts["delayed"] == 1
        assert conn.execute("SELECT 'again'").fetchone() == ("again",)
        assert proxy.counts["delayed"] == 2


def test_a_delay_window_that_passed_delays_nothing(proxy: FaultProxy, scratch_dsn: str) -> None:
    with _through(proxy, scratch_dsn) as conn:
        proxy.delay(60, for_seconds=0)
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert proxy.counts["delayed"] == 0


def test_a_blackholed_request_is_answered_after_the_blackhole(proxy: FaultProxy, scratch_dsn: str) -> None:
    with _through(proxy, scratch_dsn) as conn:
        start = time.monotonic()
        proxy.blackhole(0.3)
        assert conn.execute("SELECT %s::text || 'b'", ("a",)).fetchone() == ("ab",)
        assert time.monotonic() - start >= 0.3
        assert conn.execute("SELECT 'after'").fetchone() == ("after",)
    assert proxy.counts["blackholed"] == 1


# -- close, an unreachable server, loopback ----------------------------------------------------------


def test_close_ends_connections_and_threads_during_a_blackhole(scratch_dsn: str) -> None:
    proxy = FaultProxy(scratch_dsn).start()
    idle = _through(proxy, scratch_dsn)
    busy = _through(proxy, scratch_dsn)
    try:
        proxy.blackhole(60)
        failures: list[BaseException] = []

        def held() -> None:
            try:
                busy.execute("SELECT 1")
            except BaseException as exc:  # noqa: BLE001 - checked in the test's thread
                failures.append(exc)

        thread = threading.Thread(target=held)
        thread.start()
        start = time.monotonic()
        proxy.close()
        assert time.monotonic() - start < 10
        thread.join(_HANG)
        assert not thread.is_alive()
        assert len(failures) == 1
        assert isinstance(failures[0], psycopg.OperationalError), failures
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")
        assert _threads_of(proxy) == []
        proxy.close()  # again: nothing happens
    finally:
        idle.close()
        busy.close()
        proxy.close()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_an_unreachable_server_closes_the_client_at_once(scratch_dsn: str, tmp_path: Path, transport: str) -> None:
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))  # bound, not listening: a connection to it is refused
        if transport == "tcp":
            nowhere = make_conninfo(scratch_dsn, host="127.0.0.1", port=str(reserved.getsockname()[1]))
        else:
            nowhere = make_conninfo(scratch_dsn, host=str(tmp_path), port="5432")  # no socket there
        with FaultProxy(nowhere) as proxy:
            with pytest.raises(psycopg.OperationalError) as refused:
                psycopg.connect(make_conninfo(proxy.dsn_through(nowhere), connect_timeout="5"))
            # Closed by the proxy, not given up on by the client.
            assert "timeout" not in str(refused.value)
            assert proxy.connections == 1
    assert _threads_of(proxy) == []


def test_it_listens_on_loopback_only(proxy: FaultProxy) -> None:
    assert proxy.address == ("127.0.0.1", proxy.port)
    # Bound to 127.0.0.1 itself, not to every address: another address of this host is refused (on Linux,
    # 127.0.0.2 is one; where it is not configured, the connection fails all the same).
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", proxy.port), timeout=10).close()


def test_the_dsn_through_the_proxy_names_it(proxy: FaultProxy, scratch_dsn: str) -> None:
    through = conninfo_to_dict(proxy.dsn_through(make_conninfo(scratch_dsn, hostaddr="10.1.2.3", sslmode="require")))
    assert through["host"] == "127.0.0.1"
    assert through["port"] == str(proxy.port)
    assert through["sslmode"] == "disable"
    assert "hostaddr" not in through
    assert through["dbname"] == conninfo_to_dict(scratch_dsn)["dbname"]
