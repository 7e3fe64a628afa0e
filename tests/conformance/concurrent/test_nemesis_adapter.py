"""`leaseproof nemesis --adapter-cmd`: any implementation with sessions, under faults in its
rounds (its process killed and started again, paused, its backends ended, a tenant stalled,
its traffic cut), judged by the model; run from the command line as a user would."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import uuid
from pathlib import Path

import pytest
from helpers import MODEL_CLASS, REPO, leaseproof

from leaseproof.conformance.boundary.wire import SessionLost, SubprocessAdapter
from leaseproof.conformance.harness.proxy import FaultProxy
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep import world as w
from leaseproof.model import delivery as m

NODE = shutil.which("node")
NODE_EXAMPLE = f"{shlex.quote(str(NODE))} {shlex.quote(str(REPO / 'conformance' / 'examples' / 'node' / 'adapter.js'))}"


def _serve(server: Server | None, mutant: str = "") -> str:
    """serve's command: on `server`, or, with None, on the server its LEASEPROOF_DSN names."""
    command = f"{shlex.quote(sys.executable)} -m leaseproof.conformance.boundary.serve"
    command += f" --dsn {shlex.quote(server.dsn)}" if server is not None else ""
    return command + (f" --mutant {mutant}" if mutant else "")


def _landed(output: str) -> dict[str, int]:
    line = next(line for line in output.splitlines() if line.startswith("faults: "))
    return {kind: int(count.replace(",", "")) for kind, count in re.findall(r"([\w-]+) ([\d,]+) \(of", line)}


def test_the_bundled_serve_survives_every_fault_that_applies(pg_server: Server, tmp_path: Path) -> None:
    """Killed and started again, paused, its backends ended, a tenant stalled, and, started with
    LEASEPROOF_DSN through the proxy, its answers lost, its requests reset, delayed and
    blackholed; the lifecycle machine, whose fires must not be cut mid-way, paused, stalled,
    delayed and blackholed."""
    # Seed 11's first faulted rounds are a kill, a lost answer, an ended backend and a lost
    # answer again, so a short run meets both kinds asserted below.
    run = leaseproof(
        "nemesis", "--adapter-cmd", _serve(None), "--dsn", pg_server.dsn,
        "--duration", "4", "--seed", "11", "--rate", "1", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    delivery, lifecycle = (_landed(part) for part in run.stdout.split("nemesis of the lifecycle machine"))
    assert set(delivery) == {"kill", "pause", "terminate", "stall", "lose-answer", "reset", "delay", "blackhole"}
    assert delivery["kill"] > 0 and delivery["lose-answer"] + delivery["reset"] > 0, run.stdout
    assert set(lifecycle) == {"pause", "stall", "delay", "blackhole"}, run.stdout
    assert delivery["stall"] > 0 and lifecycle["stall"] > 0, run.stdout
    assert len(re.findall(r"stalls: [1-9][\d,]* rows held in all", run.stdout)) == 2, run.stdout  # they held rows
    for kind in ("kill", "terminate", "lose-answer", "reset"):
        assert f"no {kind} fault: the lifecycle machine: a fire cut mid-way" in run.stdout
    assert run.stdout.count("verdict: LINEARIZABLE") == 2


def test_an_adapter_command_is_given_the_server_named_so_its_state_outlives_a_kill(
    pg_server: Server, tmp_path: Path
) -> None:
    """serve without --dsn takes its server from LEASEPROOF_DSN: the harness sets it to the server
    named, not a proxy (no network fault asked), so a kill finds the database it left."""
    run = leaseproof(
        "nemesis", "--adapter-cmd", _serve(None), "--dsn", pg_server.dsn, "--machine", "delivery",
        "--faults", "kill", "--duration", "2", "--seed", "1", "--rate", "1", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert _landed(run.stdout)["kill"] > 0 and "verdict: LINEARIZABLE" in run.stdout


def test_an_in_process_adapter_gets_its_backends_ended_and_a_tenant_stalled_and_nothing_else(
    pg_server: Server, tmp_path: Path
) -> None:
    run = leaseproof(
        "nemesis", "--adapter", "leaseproof.impl.delivery.adapter:PostgresDeliveryAdapter", "--dsn", pg_server.dsn,
        "--duration", "2", "--seed", "5", "--rate", "1", cwd=tmp_path,
    )  # fmt: skip
    # Every round faulted: an ended backend is then looked for at once, and lands (at half
    # the rounds, an ended backend aimed at a point of a round met none busy in one CI run).
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no kill fault: an in-process adapter has no process of its own to kill and start again" in run.stdout
    assert "no pause fault: an in-process adapter has no process of its own to stop" in run.stdout
    landed = _landed(run.stdout)
    assert set(landed) == {"terminate", "stall"} and landed["terminate"] > 0 and landed["stall"] > 0, run.stdout
    assert "verdict: LINEARIZABLE" in run.stdout


@pytest.mark.skipif(NODE is None, reason="Node.js (`node`) is not on PATH")
def test_the_node_example_is_paused_on_both_machines_and_told_why_nothing_else_applies(tmp_path: Path) -> None:
    run = leaseproof("nemesis", "--adapter-cmd", NODE_EXAMPLE, "--duration", "2", "--seed", "1", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("verdict: LINEARIZABLE") == 2
    assert "no kill fault: its hello announces no database for the delivery machine" in run.stdout
    assert "no terminate fault: leaseproof did not give it its database" in run.stdout
    assert "no stall fault: leaseproof did not give it its database" in run.stdout
    assert "no kill fault: the lifecycle machine: a fire cut mid-way" in run.stdout
    # Why the proxy's faults do not apply depends on whether LEASEPROOF_DSN names a server here.
    assert re.search(
        r"no lose-answer fault: (no server is named \(--dsn or LEASEPROOF_DSN\)|its command made no connection"
        r" through the proxy)",
        run.stdout,
    ), run.stdout
    faults = [line for line in run.stdout.splitlines() if line.startswith("faults: ")]
    assert len(faults) == 2 and all(re.fullmatch(r"faults: pause [1-9][\d,]* \(of [\d,]+ due\)", f) for f in faults)


@pytest.mark.skipif(NODE is None, reason="Node.js (`node`) is not on PATH")
def test_a_fault_asked_for_that_does_not_apply_is_a_usage_error(tmp_path: Path) -> None:
    run = leaseproof(
        "nemesis", "--adapter-cmd", NODE_EXAMPLE, "--machine", "delivery", "--faults", "kill,pause", "--seed", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "leaseproof: no kill fault: its hello announces no database" in run.stderr
    assert "no fault of kill, pause applies to node in-memory as asked" in run.stderr
    assert "verdict" not in run.stdout


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            ["--faults", "restart"],
            "--faults takes kill, pause, terminate, stall, lose-answer, reset, delay, blackhole, not",
        ),
        (["--mutant", "reap-deletes"], "--mutant applies to the bundled store's nemesis"),
    ],
)
def test_bad_arguments_with_an_adapter_are_usage_errors(extra: list[str], says: str, tmp_path: Path) -> None:
    run = leaseproof("nemesis", "--adapter-cmd", "true", *extra, cwd=tmp_path)
    assert run.returncode == 2 and says in run.stderr, run.stdout + run.stderr


def test_machine_without_an_adapter_is_a_usage_error(tmp_path: Path) -> None:
    run = leaseproof("nemesis", "--machine", "lifecycle", cwd=tmp_path)
    assert run.returncode == 2 and "--machine applies with an adapter" in run.stderr


def _two_pending(adapter: SubprocessAdapter) -> uuid.UUID:
    """Reset `adapter` to community A with two pending deliveries for target T1; A's id."""
    adapter.reset(w.START)
    a = w.COMMUNITIES["A"]
    for command in (
        m.CreateCommunity(a),
        m.CreateWorkflow(a, w.WORKFLOWS["W1"]),
        m.CreateRun(a, w.WORKFLOWS["W1"], w.RUNS["R1"]),
        m.PublishEvent(a, w.MESSAGES["M1"]),
    ):
        adapter.execute(command)
    for step in ("s1", "s2"):
        binding = w.binding("A", "W1", "R1", step, "T1", "D1", "M1", "event:E1")
        delivery = m.NewDelivery(w.delivery_id(w.FRESH, "R1", step, "T1"), binding)
        adapter.execute(m.CommitDeliveries(a, w.RUNS["R1"], w.STEPS[step], [delivery]))
    return a


def test_a_service_that_remembers_request_keys_in_its_process_differs_only_after_a_restart(pg_server: Server) -> None:
    """What the kill fault is there to show (the mutant keys-remembered-in-process): a claim
    sent again under its key returns the lease the key holds, while the process lives; after
    a restart the mutant takes a second delivery. The bundled store is the same both times."""
    answers = {}
    for mutant in ("", "keys-remembered-in-process"):
        adapter = SubprocessAdapter(_serve(pg_server, mutant))
        try:
            a = _two_pending(adapter)
            claim = m.Claim(a, w.TARGETS["T1"], 30, request_key=w.REQUEST_KEY)
            session = adapter.session()
            first = session.execute(claim)
            again = session.execute(claim)  # the process lives: the key's lease
            adapter.restart()
            after = session.execute(claim)  # the process was started again
            assert isinstance(first, m.Claimed) and again == first
            answers[mutant] = after == first
        finally:
            adapter.close()
    assert answers == {"": True, "keys-remembered-in-process": False}


@pytest.mark.parametrize(("mutant", "resent"), [("", False), ("resends-after-a-lost-answer", True)])
def test_a_session_that_resends_after_a_lost_answer_claims_twice(pg_server: Server, mutant: str, resent: bool) -> None:
    """What the proxy's lost answer is there to show (the mutant resends-after-a-lost-answer):
    a claim whose answer is lost after the server committed it is lost to the bundled serve
    (its session says so), and sent again by the mutant, which takes a second delivery."""
    with FaultProxy(pg_server.dsn) as proxy:
        adapter = SubprocessAdapter(_serve(None, mutant), env={"LEASEPROOF_DSN": proxy.dsn_through(pg_server.dsn)})
        try:
            a = _two_pending(adapter)
            session = adapter.session()
            proxy.lose_next_answer()
            try:
                session.execute(m.Claim(a, w.TARGETS["T1"], 30))
            except SessionLost:
                lost = True
            else:
                lost = False
            claimed = [d for d in adapter.snapshot().deliveries.values() if d.status is m.Status.CLAIMED]
        finally:
            adapter.close()
    assert proxy.counts["lose-answer"] == 1
    assert (lost, len(claimed)) == ((False, 2) if resent else (True, 1))


# An in-process adapter whose state is the model's, in memory, and whose database (given by
# leaseproof) holds only a table with a uuid column that names no tenant: stalls hold nothing.
_HOLDS_NOTHING = (
    """
import threading
import psycopg
from leaseproof.model import delivery as m


class Session:
    def __init__(self, model):
        self.model = model

    def execute(self, command):
        return self.model.execute(command)

    def close(self):
        pass
"""
    + MODEL_CLASS
    + """

class Adapter(Model):
    name = "the model, in memory"

    def __init__(self, dsn):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS unrelated (id serial PRIMARY KEY, other uuid)")
        super().__init__(dsn)
"""
)


def test_stalls_asked_for_that_held_nothing_are_a_usage_error(pg_server: Server, tmp_path: Path) -> None:
    (tmp_path / "holds_nothing.py").write_text(_HOLDS_NOTHING)
    run = leaseproof(
        "nemesis", "--adapter", "holds_nothing:Adapter", "--dsn", pg_server.dsn, "--machine", "delivery",
        "--faults", "stall", "--duration", "1", "--seed", "1", "--rate", "1", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "stalls: 0 rows held in all" in run.stdout
    assert "leaseproof: the stalls held no row" in run.stderr
