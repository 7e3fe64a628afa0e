"""A foreign implementation through the wire: the Node.js example adapter.

`conformance/examples/node/adapter.js` implements both machines in memory,
in plain JavaScript (`delivery.js`, `lifecycle.js`, and `common.js`, what they
share), from `specs/delivery.md`, `specs/lifecycle.md` and
`specs/adapter-protocol.md`. These tests run the real CLI against it as a
user would (`leaseproof verify --adapter-cmd "node …"`): it must conform on
both machines, and its mutants must be caught.
`--adapter-cmd` provisions no database, so no PostgreSQL is needed here.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

NODE = shutil.which("node")
ADAPTER = REPO / "conformance" / "examples" / "node" / "adapter.js"

pytestmark = pytest.mark.skipif(
    NODE is None, reason="Node.js (`node`) is not on PATH: the Node example adapter cannot run"
)


def _verify(adapter_args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = f"{shlex.quote(str(NODE))} {shlex.quote(str(ADAPTER))}{adapter_args}"
    argv = [
        sys.executable, "-m", "leaseproof.conformance.frontends.cli", "verify",
        "--adapter-cmd", command, "--max-examples", "30", "--seed", "5",
    ]  # fmt: skip
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,  # a counterexample trace, if any, lands here, not in the repository
    )


def test_the_node_adapter_conforms_on_both_machines(tmp_path: Path) -> None:
    run = _verify("", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    for machine in ("delivery", "lifecycle"):  # its hello announces both, so verify checks both
        assert f"verifying the {machine} machine against node in-memory" in run.stdout
    assert run.stdout.count("verdict: CONFORMS —") == 2
    assert run.stdout.count("never reached: none") == 2  # every outcome variant and transition was compared


def test_verify_catches_the_node_mutant(tmp_path: Path) -> None:
    run = _verify(" --mutant reconcile-unfenced", tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "verdict: DOES NOT CONFORM" in run.stdout
    # It dies in a fixed scenario, which no seed chooses: the report says so, and names no seed to replay.
    assert "counterexample (a fixed scenario: every run checks it first, whatever the seed" in run.stdout
    # Finding 1: a stale holder's finish is told the newer holder's terminal.
    assert "outcome mismatch for Finish" in run.stdout
    assert "LeaseLost" in run.stdout and "implementation: AlreadyTerminal" in run.stdout


def _exchange(*requests: dict[str, object], args: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], int]:
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    run = subprocess.run([str(NODE), str(ADAPTER), *args], input=lines, capture_output=True, text=True, timeout=60)
    return [json.loads(line) for line in run.stdout.splitlines()], run.returncode


def test_a_bad_request_is_a_fault_reply_not_a_crash() -> None:
    replies, code = _exchange(
        {"id": 1, "method": "hello", "params": {"protocol": 2}},
        {"id": 2, "method": "teleport", "params": {}},
        {"id": 3, "method": "execute", "params": {"machine": "delivery", "command": {"type": "Claim"}}},
        {"id": 4, "method": "close", "params": {}},
    )
    assert code == 0
    assert [r["id"] for r in replies] == [1, 2, 3, 4]
    hello = replies[0]["result"]
    assert hello["protocol"] == 2 and hello["implementation"] == "node in-memory" and hello["sessions"] is True
    assert len(hello["machines"]["delivery"]) == 16 and len(hello["machines"]["lifecycle"]) == 10
    assert "unknown method" in replies[1]["fault"]["message"]
    assert "message" in replies[2]["fault"]
    assert replies[3] == {"id": 4, "result": None}


def test_asked_for_version_1_it_is_a_version_1_adapter() -> None:
    """The newest version both speak: for a version-1 harness, the delivery machine alone, no sessions."""
    replies, code = _exchange(
        {"id": 1, "method": "hello", "params": {"protocol": 1}},
        {"id": 2, "method": "snapshot", "params": {"machine": "lifecycle"}},
        {"id": 3, "method": "open_session", "params": {"machine": "delivery", "session": "s1"}},
        {"id": 4, "method": "hello", "params": {"protocol": 4}},
        {"id": 5, "method": "close", "params": {}},
    )
    assert code == 0
    hello = replies[0]["result"]
    assert hello["protocol"] == 1 and hello["machines"].keys() == {"delivery"} and "sessions" not in hello
    assert 'not "lifecycle"' in replies[1]["fault"]["message"]
    assert "protocol 1 has no sessions" in replies[2]["fault"]["message"]
    assert replies[3]["result"]["protocol"] == 3  # a harness newer than it: its own newest


def test_unknown_arguments_print_usage_and_exit_2() -> None:
    run = subprocess.run([str(NODE), str(ADAPTER), "--frobnicate"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "usage:" in run.stderr and run.stdout == ""


def test_verify_catches_the_node_lifecycle_mutant(tmp_path: Path) -> None:
    run = _verify(" --mutant admission-trusts-cache", tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    delivery, lifecycle = run.stdout.split("verifying the lifecycle machine")
    assert "verdict: CONFORMS" in delivery  # the mutant is the lifecycle's
    # The seeds' stale cross-replica admission: a replica admits what its cache holds.
    assert "verdict: DOES NOT CONFORM" in lifecycle and "outcome mismatch for Fire" in lifecycle


def _stress(adapter_args: str, cwd: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = f"{shlex.quote(str(NODE))} {shlex.quote(str(ADAPTER))}{adapter_args}"
    argv = [
        sys.executable, "-m", "leaseproof.conformance.frontends.cli", "stress",
        "--adapter-cmd", command, "--seed", "1", "--workers", "4", *options,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd)


def test_stress_drives_the_node_adapters_sessions_and_catches_its_race_mutant(tmp_path: Path) -> None:
    passing = _stress("", tmp_path, "--duration", "2")  # both machines, ~40 programs each
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert passing.stdout.count("verdict: LINEARIZABLE") == 2, passing.stdout
    # The mutant is the delivery machine's; the lifecycle would only pass again.
    # Stress stops at the first finding: the bound is how long a loaded machine may take to meet it.
    racy = _stress(" --mutant claim-read-then-update", tmp_path, "--duration", "60", "--machine", "delivery")
    assert racy.returncode == 1 and "verdict: NOT LINEARIZABLE" in racy.stdout, racy.stdout + racy.stderr
    # One operation at a time it is right: only concurrency shows it.
    assert _verify(" --mutant claim-read-then-update", tmp_path).returncode == 0
