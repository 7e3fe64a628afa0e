"""An adapter's process killed and started again (specs/adapter-protocol.md, section 5,
"Restarts"): the harness's `SubprocessAdapter.restart`, the hello's `attach` and the
`attach` request, and the bundled `serve`, which adopts its predecessor's database."""

from __future__ import annotations

import datetime as dt
import io
import json
import shlex
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import MODEL_CLASS

from leaseproof.conformance.boundary.serving import serve
from leaseproof.conformance.boundary.wire import AdapterFault, SessionLost, SubprocessAdapter, _check_hello
from leaseproof.conformance.harness.databases import databases_named, process_alive
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep import world as w
from leaseproof.model import delivery as m

PYTHON = shlex.quote(sys.executable)
A, T1 = w.COMMUNITIES["A"], w.TARGETS["T1"]

# The delivery model behind `serve`, in a database it names (a fake: nothing connects to
# it). It logs each start and each request's method to argv[1]. Modes (argv[2]):
# "fixed", every process announces the same database; "moving", each its own, and it
# offers no attach; "attaching", each its own, and it attaches to the one asked for.
# A Reap sent by a session never returns (a command in flight when the process dies).
MODEL_IN_A_DATABASE = (
    """
import os, sys, threading, time
from leaseproof.conformance.boundary import serving
from leaseproof.model import delivery as m

LOG, MODE = sys.argv[1], sys.argv[2]


def log(line):
    with open(LOG, "a") as f:
        f.write(line + "\\n")


class Session:
    def __init__(self, model):
        self.model = model

    def execute(self, command):
        if isinstance(command, m.Reap):
            time.sleep(600)
        return self.model.execute(command)

    def close(self):
        pass


"""
    + MODEL_CLASS
    + """

log(f"start {os.getpid()}")
original = serving._request
serving._request = lambda line, served: (lambda parsed: (log(parsed[1]), parsed)[1])(original(line, served))
dsn = "dbname=lp_fixed" if MODE == "fixed" else f"dbname=lp_{os.getpid()}"
attach = {"delivery": lambda asked: (log(f"attached {asked}"), Model(asked))[1]} if MODE == "attaching" else None
serving.serve(Model(dsn), implementation="the model in a database", stdout=serving.stdout_for_protocol(), attach=attach)
"""
)


def _adapter(tmp_path: Path, mode: str) -> tuple[SubprocessAdapter, Path]:
    script, log = tmp_path / "adapter.py", tmp_path / "adapter.log"
    script.write_text(textwrap.dedent(MODEL_IN_A_DATABASE))
    command = " ".join([PYTHON, shlex.quote(str(script)), shlex.quote(str(log)), mode])
    adapter = SubprocessAdapter(command, reply_timeout=30)
    adapter.reset(w.START)
    return adapter, log


def _log(log: Path) -> list[str]:
    return log.read_text().splitlines()


class _InADatabase:
    """The delivery model as an in-process adapter that names a database (as the bundled ones do)."""

    name = "the model"

    def __init__(self, dsn: str = "dbname=lp_first") -> None:
        self.dsn = dsn
        self.state = m.initial_state(w.START)

    def reset(self, start: dt.datetime) -> None:
        self.state = m.initial_state(start)

    def execute(self, command: m.Command) -> m.Outcome:
        self.state, outcome = m.step(self.state, command)
        return outcome

    def snapshot(self) -> m.DeliverySystem:
        return self.state

    def session(self) -> _InADatabase:
        return self

    def close(self) -> None:
        pass


def exchange(requests: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    """`serve`'s replies to `requests`, for an `_InADatabase`."""
    stdin, stdout = io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), io.StringIO()
    serve(_InADatabase(), implementation="the model", stdin=stdin, stdout=stdout, **options)
    return [json.loads(line) for line in stdout.getvalue().splitlines()]


HELLO = {"id": 1, "method": "hello", "params": {"protocol": 3}}
ATTACH = {"id": 2, "method": "attach", "params": {"machine": "delivery", "database": "dbname=lp_old"}}


def test_a_command_in_flight_when_the_process_dies_is_lost_and_its_session_goes_on(tmp_path: Path) -> None:
    adapter, log = _adapter(tmp_path, "fixed")
    try:
        session = adapter.session()
        first = adapter.process.pid
        lost: list[BaseException] = []

        def hang() -> None:
            try:
                session.execute(m.Reap())  # never answered: the process dies under it
            except BaseException as exc:  # noqa: BLE001 - the test reads what it was
                lost.append(exc)

        thread = threading.Thread(target=hang)
        thread.start()
        while "execute" not in _log(log):
            thread.join(0.01)
        adapter.restart()
        thread.join(30)
        assert len(lost) == 1 and isinstance(lost[0], SessionLost), lost
        assert "killed while it ran" in str(lost[0])
        assert adapter.process.pid != first and not process_alive(first)
        # The same database both times: nothing to attach.
        assert [line.split()[0] for line in _log(log) if line.startswith(("start", "attached"))] == ["start", "start"]
        # The session's next command opens a session on the new process first.
        adapter.reset(w.START)
        assert session.execute(m.CreateCommunity(A)) == m.Ok()
        assert _log(log)[-3:] == ["reset", "open_session", "execute"]
    finally:
        adapter.close()


def test_a_process_started_again_in_another_database_is_told_to_attach_to_the_first(tmp_path: Path) -> None:
    adapter, log = _adapter(tmp_path, "attaching")
    try:
        first = adapter.databases["delivery"]
        adapter.restart()
        assert adapter.databases["delivery"] == first
        assert f"attached {first}" in _log(log)
        assert _log(log).index(f"attached {first}") > _log(log).index("hello", 2)
    finally:
        adapter.close()


def test_a_restart_into_another_database_without_attach_is_a_fault(tmp_path: Path) -> None:
    adapter, _ = _adapter(tmp_path, "moving")
    try:
        with pytest.raises(AdapterFault, match="started again with another database for the delivery machine"):
            adapter.restart()
    finally:
        adapter.close()


def test_an_adapter_that_announces_no_database_cannot_be_restarted(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(
        "import sys\n"
        "from leaseproof.conformance.boundary.serving import serve, stdout_for_protocol\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[2])!r}]\n"  # it, and helpers
        "from test_restart import _InADatabase\n"
        "adapter = _InADatabase()\n"
        "del adapter.dsn\n"
        "serve(adapter, implementation='plain', stdout=stdout_for_protocol())\n"
    )
    adapter = SubprocessAdapter(f"{PYTHON} {shlex.quote(str(script))}")
    try:
        assert adapter.databases == {}
        assert "announces no database for the delivery machine" in adapter.why_no_restart()
    finally:
        adapter.close()


@pytest.mark.parametrize(
    ("attach", "refused"),
    [(["delivery"], False), (["lifecycle"], True), ("delivery", True), ([None], True)],
)
def test_a_hello_s_attach_names_machines_whose_databases_it_announces(attach: Any, refused: bool) -> None:
    hello = {
        "protocol": 3,
        "implementation": "x",
        "machines": {"delivery": ["Claim"], "lifecycle": ["Fire"]},
        "databases": {"delivery": "dbname=x"},
        "attach": attach,
    }
    if not refused:
        assert _check_hello(hello)["attach"] == attach
        return
    with pytest.raises(AdapterFault, match="attach must list machines whose databases it announces"):
        _check_hello(hello)


def test_serve_offers_attach_and_swaps_the_machine_s_adapter() -> None:
    attached: list[str] = []

    def attach(dsn: str) -> _InADatabase:
        attached.append(dsn)
        return _InADatabase(dsn)

    replies = exchange([HELLO, ATTACH, {**HELLO, "id": 3}], attach={"delivery": attach})
    assert replies[0]["result"]["attach"] == ["delivery"]
    assert replies[1] == {"id": 2, "result": None} and attached == ["dbname=lp_old"]
    assert replies[2]["result"]["databases"] == {"delivery": "dbname=lp_old"}  # the adapter it serves now


@pytest.mark.parametrize(
    ("before", "database"),
    [
        ([], ""),
        ([], 7),
        ([{"id": 5, "method": "open_session", "params": {"machine": "delivery", "session": "s1"}}], "dbname=lp_old"),
    ],
    ids=["empty", "not-a-string", "after-a-session"],
)
def test_serve_refuses_an_attach_it_cannot_do(before: list[dict[str, Any]], database: Any) -> None:
    request = {**ATTACH, "params": {"machine": "delivery", "database": database}}
    replies = exchange([HELLO, *before, request], attach={"delivery": _InADatabase})
    assert replies[-1]["fault"]["code"] == "bad-params", replies


def test_serve_without_attach_or_at_protocol_2_offers_none() -> None:
    plain = exchange([HELLO, ATTACH])
    assert "attach" not in plain[0]["result"] and plain[1]["fault"]["code"] == "unknown-method"
    older = exchange([{**HELLO, "params": {"protocol": 2}}, ATTACH], attach={"delivery": _InADatabase})
    assert "attach" not in older[0]["result"] and older[1]["fault"]["code"] == "unknown-method"


def test_the_bundled_serve_killed_and_started_again_keeps_its_state(pg_server: Server) -> None:
    command = f"{PYTHON} -m leaseproof.conformance.boundary.serve --dsn {shlex.quote(pg_server.dsn)}"
    adapter = SubprocessAdapter(command)
    try:
        adapter.reset(w.START)
        for command_ in (m.CreateCommunity(A), m.CreateWorkflow(A, w.WORKFLOWS["W1"])):
            adapter.execute(command_)
        session = adapter.session()
        assert session.execute(m.Claim(A, T1, 30)) == m.ClaimMiss()
        before, first = adapter.snapshot(), adapter.process.pid
        adopted = json.dumps(adapter.databases["delivery"])
        adapter.restart()
        assert adapter.process.pid != first and adapter.snapshot() == before
        # Its first reset drops what the killed process left, but not the database it adopted.
        adapter.reset(w.START)
        assert adapter.execute(m.CreateCommunity(A)) == m.Ok()
        assert isinstance(session.execute(m.CreateCommunity(A)), m.AlreadyExists)
        name = json.loads(adopted).split("dbname=")[1].split()[0]
        assert name in databases_named(pg_server, "lp_serve")
    finally:
        adapter.close()
    assert name not in databases_named(pg_server, "lp_serve")  # dropped when its adopter ended


# A session whose Reap runs a statement in the database named by argv[2] that sleeps, then
# commits a table (autocommit): a backend that finishes after its client was killed.
SLOW_WRITER = (
    """
import sys, threading, time
import psycopg
from leaseproof.conformance.boundary import serving
from leaseproof.model import delivery as m

LOG, DSN = sys.argv[1], sys.argv[2]


class Session:
    def __init__(self, model):
        self.model = model

    def execute(self, command):
        if isinstance(command, m.Reap):
            with open(LOG, "a") as f:
                f.write("writing\\n")
            with psycopg.connect(DSN, autocommit=True) as conn:
                conn.execute("SELECT pg_sleep(1); CREATE TABLE written_after_the_kill ()")
        return self.model.execute(command)

    def close(self):
        pass


"""
    + MODEL_CLASS
    + """

serving.serve(Model(DSN), implementation="a slow writer", stdout=serving.stdout_for_protocol())
"""
)


def test_a_kill_s_operations_end_only_once_the_backends_it_left_are_gone(tmp_path: Path, scratch_dsn: str) -> None:
    """A killed client's backend finishes its statement and commits it: the kill's operations
    are lost (their interval ends) only after that, or a barrier could read what no
    operation in flight explains."""
    from leaseproof.conformance.concurrent.faults import Cut, Killer

    script, log = tmp_path / "adapter.py", tmp_path / "adapter.log"
    script.write_text(textwrap.dedent(SLOW_WRITER))
    command = " ".join([PYTHON, shlex.quote(str(script)), shlex.quote(str(log)), shlex.quote(scratch_dsn)])
    adapter = SubprocessAdapter(command)
    killer = Killer(adapter, scratch_dsn, 1.0, 1)
    seen: list[bool] = []
    try:
        adapter.reset(w.START)
        session = adapter.session()

        def reap() -> None:
            try:
                session.execute(m.Reap())
            except SessionLost:
                with psycopg.connect(scratch_dsn) as conn:
                    row = conn.execute("SELECT to_regclass('written_after_the_kill') IS NOT NULL").fetchone()
                    seen.append(row is not None and row[0])

        thread = threading.Thread(target=reap)
        thread.start()
        while not log.exists():
            thread.join(0.01)
        thread.join(0.2)  # the statement is running in its backend
        assert killer.during_round(threading.Event(), Cut(0.0, 0.0, "kill"))
        thread.join(30)
        assert seen == [True]
    finally:
        killer.close()
        adapter.close()
