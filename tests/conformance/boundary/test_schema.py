"""specs/adapter-protocol.schema.json: every message the protocol carries, checked against real runs."""

from __future__ import annotations

import functools
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import REPO, SPECS, leaseproof

from leaseproof.conformance.boundary import codec, schema
from leaseproof.conformance.boundary.wire import SubprocessAdapter
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep import world as w
from leaseproof.model import delivery as m

PYTHON = shlex.quote(sys.executable)
SCHEMA = json.loads((SPECS / "adapter-protocol.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

# Sits between the harness and an adapter, copying every line both ways and
# logging it ("> " a request, "< " a reply) to the file it is given.
TEE = """
import subprocess, sys, threading
log = open(sys.argv[1], "a", buffering=1)
lock = threading.Lock()
child = subprocess.Popen(sys.argv[2:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
def replies():
    for line in child.stdout:
        with lock:
            log.write("< " + line)
        sys.stdout.write(line)
        sys.stdout.flush()
pump = threading.Thread(target=replies)
pump.start()
for line in sys.stdin:
    with lock:
        log.write("> " + line)
    child.stdin.write(line)
    child.stdin.flush()
child.stdin.close()
pump.join()
sys.exit(child.wait())
"""


@functools.cache
def _validator(definition: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": SCHEMA["$defs"]})


def _valid(value: Any, definition: str) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in _validator(definition).iter_errors(value)]


def check_exchange(lines: list[str]) -> int:
    """Validate a log of "> request" and "< reply" lines: every request, every reply,
    and each reply's result against its request's method. The number of replies checked."""
    methods: dict[Any, str] = {}
    checked = 0
    for line in lines:
        mark, message = line[:2], json.loads(line[2:])
        if mark == "> ":
            assert not _valid(message, "request"), (message, _valid(message, "request"))
            methods[message["id"]] = message["method"]
            continue
        assert not _valid(message, "reply"), (message, _valid(message, "reply"))
        result = schema.RESULTS[methods[message["id"]]]
        if "result" in message:
            null = [] if message["result"] is None else ["not null"]
            errors = _valid(message["result"], result) if result else null
            assert not errors, (methods[message["id"]], message, errors[:3])
        checked += 1
    return checked


def test_the_schema_is_a_valid_2020_12_schema_and_current() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert (SPECS / "adapter-protocol.schema.json").read_text() == schema.render()  # also `leaseproof spec --check`


def test_every_exchange_on_the_spec_page_is_valid() -> None:
    page = (SPECS / "adapter-protocol.md").read_text().splitlines()
    exchange = [line for line in page if line.startswith(("> {", "< {"))]
    assert len(exchange) >= 20
    assert check_exchange(exchange) == sum(line.startswith("< ") for line in exchange)


def test_every_value_the_codec_encodes_is_valid_and_nothing_else_is() -> None:
    lease = m.Lease(w.COMMUNITIES["A"], w.DELIVERIES["d1"], w.TARGETS["T1"], 1, w.START)
    state = m.initial_state(w.START)
    assert not _valid(codec.encode(m.Renew(lease, 30)), "command")
    assert not _valid(codec.encode(m.AlreadyTerminal(m.Status.FINISHED)), "outcome")
    assert not _valid(codec.encode_state(state), "snapshot")
    renew = codec.encode(m.Renew(lease, 30))
    for broken in (
        {**renew, "extra": 1},  # a member the class does not have
        {k: v for k, v in renew.items() if k != "lease_seconds"},  # a field missing
        {**renew, "lease": {**renew["lease"], "lease_until": "2026-01-01T00:00:00Z"}},  # an instant without micros
        {**renew, "lease": {**renew["lease"], "community_id": "A"}},  # not a UUID
        {**renew, "type": "Teleport"},
    ):
        assert _valid(broken, "command"), broken
    assert _valid({**codec.encode_state(state), "retired": [{"community_id": "x"}]}, "snapshot")
    assert _valid({"id": 1, "method": "execute", "params": {"machine": "lifecycle"}}, "request")  # no command
    assert _valid({"id": 1, "method": "reset", "params": {"machine": "other", "start": "x"}}, "request")


def _logged(tmp_path: Path, command: str) -> tuple[str, Path]:
    (tmp_path / "tee.py").write_text(TEE)
    log = tmp_path / "exchange.log"
    return f"{PYTHON} {shlex.quote(str(tmp_path / 'tee.py'))} {shlex.quote(str(log))} {command}", log


_cli = leaseproof


def _lines(log: Path) -> list[str]:
    """The log's lines, split at newlines only: JSON text may carry U+2028 or U+0085 raw
    (JavaScript's JSON.stringify does not escape them), which str.splitlines() splits at."""
    return [line for line in log.read_text(encoding="utf-8").split("\n") if line]


def test_every_message_of_verify_and_stress_over_the_wire_is_valid(tmp_path: Path, pg_server: Server) -> None:
    serve = f"{PYTHON} -m leaseproof.conformance.boundary.serve --dsn {shlex.quote(pg_server.dsn)}"
    command, log = _logged(tmp_path, serve)
    run = _cli("verify", "--adapter-cmd", command, "--seed", "1", "--max-examples", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    args = ("--seed", "1", "--duration", "1", "--workers", "3", "--machine", "delivery")
    run = _cli("stress", "--adapter-cmd", command, *args)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _lines(log)
    methods = {json.loads(line[2:]).get("method") for line in lines if line.startswith("> ")}
    # Every method crossed the wire, but attach, which follows a restart (the next test).
    assert methods == set(schema.RESULTS) - {"attach"}, methods
    machines = {json.loads(line[2:])["params"].get("machine") for line in lines if line.startswith("> {")}
    assert {"delivery", "lifecycle"} <= machines
    assert check_exchange(lines) > 1000


def test_a_restart_s_messages_are_valid(pg_server: Server) -> None:
    """The hello of serve started again, which offers attach, and the attach the harness sends."""
    serve = f"{PYTHON} -m leaseproof.conformance.boundary.serve --dsn {shlex.quote(pg_server.dsn)}"
    adapter = SubprocessAdapter(serve)
    try:
        first = adapter.databases["delivery"]
        sent: list[str] = []
        call = adapter._call

        def logged(method: str, params: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            request = {"id": adapter._next_id + 1, "method": method, "params": params}
            result = call(method, params, *args, **kwargs)
            sent.extend([f"> {json.dumps(request)}", f"< {json.dumps({'id': request['id'], 'result': result})}"])
            return result

        adapter._call = logged  # type: ignore[method-assign]  # the test reads what the restart sends
        adapter.restart()
    finally:
        adapter.close()
    methods = [json.loads(line[2:]).get("method") for line in sent if line.startswith("> ")]
    assert methods == ["hello", "attach", "close"]  # the restart's, then the adapter's close
    assert json.loads(sent[2][2:])["params"] == {"machine": "delivery", "database": first}
    assert check_exchange(sent) == 3


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js (`node`) is not on PATH")
def test_every_message_of_the_node_adapter_is_valid(tmp_path: Path) -> None:
    node = REPO / "conformance" / "examples" / "node" / "adapter.js"
    command, log = _logged(tmp_path, f"{shlex.quote(str(shutil.which('node')))} {shlex.quote(str(node))}")
    run = _cli("verify", "--adapter-cmd", command, "--seed", "1", "--max-examples", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    assert check_exchange(_lines(log)) > 500


def test_a_hello_announces_only_what_its_version_has() -> None:
    """Section 6: a version-1 hello has the delivery machine alone and no sessions."""
    delivery, lifecycle = ["Reap"], ["Fire"]
    v1 = {"protocol": 1, "implementation": "v1", "machines": {"delivery": delivery}}
    v2 = {"protocol": 2, "implementation": "v2", "machines": {"delivery": delivery, "lifecycle": lifecycle}}
    assert not _valid(v1, "hello-result") and not _valid(v1 | {"sessions": False}, "hello-result")
    assert not _valid(v2, "hello-result") and not _valid(v2 | {"sessions": True}, "hello-result")
    assert _valid(v1 | {"sessions": True}, "hello-result")
    assert _valid(v1 | {"machines": v2["machines"]}, "hello-result")
    assert _valid(v2 | {"protocol": 4}, "hello-result") and _valid(v2 | {"protocol": 0}, "hello-result")
    assert not _valid(v2 | {"protocol": 3, "sessions": True}, "hello-result")
    assert _valid({"id": 1, "method": "hello", "params": {"protocol": 0}}, "request")
