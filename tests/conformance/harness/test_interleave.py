"""Recording and forcing the order of several clients' statements at the wire
(conformance/harness/interleave.py), on a real server through the proxy: a recorded order is
forced on clients that start in the other order; a statement that waited on another's lock
waits for it again; a client that sends what nobody recorded ends the forcing, saying so; and
a race of `leaseproof guarantees` records its interleaving, which its replay forces."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from leaseproof.conformance.frontends import cli
from leaseproof.conformance.harness.interleave import Event, Interleaver, in_finishing_order, signatures
from leaseproof.conformance.harness.proxy import FaultProxy
from leaseproof.conformance.harness.server import Server

Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def wired(scratch_dsn: str) -> Iterator[tuple[Interleaver, Callable[[], Conn], str]]:
    """The interleaver of a proxy in front of a scratch database holding one cell (v = 1), and a
    way to connect through the proxy; the database's own DSN."""
    with psycopg.connect(scratch_dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE cell (id int PRIMARY KEY, v int NOT NULL)")
        setup.execute("INSERT INTO cell VALUES (1, 1)")
    with FaultProxy(scratch_dsn) as proxy:
        interleaver = Interleaver(proxy)
        opened: list[Conn] = []

        def connect() -> Conn:
            conn = psycopg.connect(proxy.dsn_through(scratch_dsn), autocommit=True)
            opened.append(conn)
            return conn

        yield interleaver, connect, scratch_dsn
        for conn in opened:
            conn.close()


def _both(first: Callable[[], None], second: Callable[[], None]) -> None:
    """Start `first`'s thread, then `second`'s; wait for both (bounded)."""
    threads = [threading.Thread(target=body) for body in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)


def _value(connect: Callable[[], Conn]) -> object:
    row = connect().execute("SELECT v FROM cell WHERE id = 1").fetchone()
    assert row is not None
    return row[0]


def test_a_statement_that_waited_on_a_lock_waits_again_though_its_client_starts_first(
    wired: tuple[Interleaver, Callable[[], Conn], str],
) -> None:
    """Recorded: A adds 1 in a transaction; B's doubling waits on A's row lock; A commits; B's
    doubling then sees 2: 4. Forced, with B's thread started first, B's doubling is held until A's
    update came back and sent while A's transaction is open, as recorded: 4 again. Unforced, B
    started first doubles first: 3."""
    interleaver, connect, direct = wired
    a, b = connect(), connect()
    with interleaver.recording() as events:
        a.execute("BEGIN")
        a.execute("UPDATE cell SET v = v + 1 WHERE id = 1")
        doubling = threading.Thread(target=lambda: b.execute("UPDATE cell SET v = v * 2 WHERE id = 1"))
        doubling.start()
        _until_a_lock_is_waited_for(direct)
        a.execute("COMMIT")
        doubling.join(10)
    assert _value(connect) == 4
    kinds = [(e.role, e.kind) for e in events]
    assert kinds[:5] == [(0, "send"), (0, "reply"), (0, "send"), (0, "reply"), (1, "send")], kinds
    assert kinds.index((1, "reply")) > kinds.index((0, "send"), 4), kinds  # B answered after A's commit went
    recorded = list(events)

    def transaction(conn: Conn) -> Callable[[], None]:
        def body() -> None:
            conn.execute("BEGIN")
            conn.execute("UPDATE cell SET v = v + 1 WHERE id = 1")
            conn.execute("COMMIT")

        return body

    for forced_run in range(3):
        connect().execute("UPDATE cell SET v = 1 WHERE id = 1")
        a, b = connect(), connect()
        with interleaver.forcing(recorded) as forced:
            _both(lambda b=b: b.execute("UPDATE cell SET v = v * 2 WHERE id = 1"), transaction(a))  # type: ignore[misc]
        assert forced.followed, forced.divergences
        assert _value(connect) == 4, forced_run
    connect().execute("UPDATE cell SET v = 1 WHERE id = 1")
    b = connect()
    b.execute("UPDATE cell SET v = v * 2 WHERE id = 1")  # unforced, B first
    transaction(connect())()
    assert _value(connect) == 3


def _until_a_lock_is_waited_for(dsn: str) -> None:
    """Wait (bounded) until a statement waits on a lock, asking the server straight, not through the
    proxy (the question would be recorded)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = threading.Event()
        for _ in range(1000):
            row = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
            if row is not None and row[0]:
                return
            done.wait(0.01)  # the server's state is what is waited for; this bounds the asking
    raise AssertionError("no statement came to wait on the row lock within 10 s")


def test_a_client_that_sends_what_nobody_recorded_ends_the_forcing_saying_so(
    wired: tuple[Interleaver, Callable[[], Conn], str],
) -> None:
    interleaver, connect, _ = wired
    recorded = [Event(0, "send", "select ?"), Event(0, "reply")]
    conn = connect()
    with interleaver.forcing(recorded) as forced:
        conn.execute("SELECT 2 + 2")
        conn.execute("SELECT 1")  # not held: the forcing ended at the first
    assert forced.divergences == ["a connection sent ['select ? + ?'], which no recorded connection began with"]
    with interleaver.forcing(recorded) as forced:
        pass
    assert forced.divergences == ["the run ended before connection 1 sent 'select ?'"]


def test_signatures_and_the_finishing_order() -> None:
    text = b"SELECT  'it''s', 42,\n $1  \x00"
    query = b"Q" + (4 + len(text)).to_bytes(4, "big") + text
    assert signatures(query) == ["select ?, ?, $1"]
    events = [Event(0, "send", "a"), Event(1, "send", "b"), Event(1, "reply"), Event(0, "reply"), Event(0, "send", "c")]
    assert in_finishing_order(events) == [
        Event(1, "send", "b"),
        Event(1, "reply"),
        Event(0, "send", "a"),
        Event(0, "reply"),
        Event(0, "send", "c"),
    ]


def _race_trace(pg_server: Server, tmp_path: Path) -> dict[str, Any]:
    """The trace of claim-read-then-update's double claim, found by a race of `guarantees`."""
    argv = ["--subjects", "leaseproof:claim-read-then-update", "--examples", "0", "--races", "300",
            "--terminate", "0", "--races-of", "no-double-claim", "--seed", "1", "--traces", str(tmp_path),
            "--dsn", pg_server.dsn]  # fmt: skip
    args = cli.build_parser().parse_args(["guarantees", *argv])
    assert cli.load("guarantees").command(args, io.StringIO(), io.StringIO()) == 0
    trace: dict[str, Any] = json.loads(
        (tmp_path / "leaseproof-claim-read-then-update--no-double-claim.json").read_text()
    )
    return trace


def test_a_race_of_guarantees_records_its_interleaving_and_its_replay_forces_it(
    pg_server: Server, tmp_path: Path
) -> None:
    """claim-read-then-update: two fetches that both read the job before either claims it both get
    it. The trace holds the two claims' statements in the order they went; the replay forces it."""
    trace = _race_trace(pg_server, tmp_path)
    interleaving = [Event.from_json(item) for item in trace["trace"][0]["interleaving"]]
    claims = [e for e in interleaving if e.kind == "send" and "lp_claim" in e.what]
    assert len(claims) == 2 and claims[0].role != claims[1].role, interleaving
    out = io.StringIO()
    replay = cli.build_parser().parse_args(["guarantees", "--replay", trace["replay"].split()[-1], "--dsn",
                                            pg_server.dsn])  # fmt: skip
    assert cli.load("guarantees").command(replay, out, io.StringIO()) == 1, out.getvalue()
    assert out.getvalue().startswith("forcing race_fetches to its recorded interleaving: ")
    assert "reproduced in forced run " in out.getvalue() and "breaks no-double-claim" in out.getvalue()


def test_a_race_whose_clients_leave_the_forced_order_runs_as_luck_has_it_and_says_it_was_not_forced(
    pg_server: Server, tmp_path: Path
) -> None:
    """When the clients send what the recorded interleaving does not hold, the forcing ends, saying
    where; the replay then runs the race as luck has it, and if the guarantee holds there too it
    exits 3 (not forced), not 0: a held guarantee says nothing of a race that was never forced."""
    trace = _race_trace(pg_server, tmp_path)
    for item in trace["trace"][0]["interleaving"]:  # statements that no client of the store sends
        if item[1] == "send":
            item[2] = "select ? as nobody_sends_this"
    # Judged on the bundled store, which holds no-double-claim however its fetches meet.
    trace["subject"] = trace["source"] = "leaseproof"
    path = tmp_path / "unforceable.json"
    path.write_text(json.dumps(trace))
    out = io.StringIO()
    replay = cli.build_parser().parse_args(["guarantees", "--replay", str(path), "--races", "5", "--dsn",
                                            pg_server.dsn])  # fmt: skip
    assert cli.load("guarantees").command(replay, out, io.StringIO()) == 3, out.getvalue()
    text = out.getvalue()
    assert text.startswith("forcing race_fetches to its recorded interleaving: ")
    assert "could not be forced: in 4 of 4 runs the clients left the order they were held to" in text, text
    assert "which no recorded connection began with" in text  # where they left it
    assert "then up to 5 rounds as luck has it:" in text
    assert "not reproduced in 5 rounds of race_fetches: leaseproof held no-double-claim" in text
