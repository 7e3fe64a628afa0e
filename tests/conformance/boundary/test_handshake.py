"""Protocol versions over the wire: the handshake of specs/adapter-protocol.md, section 6.

A version-1 adapter, written to the version-1 page (delivery only, one request
at a time, no sessions), keeps working with `verify` and `replay`, and is
refused, naming the version, where a version-2 feature is needed: `stress`
(sessions) and the lifecycle machine. A version-2 adapter gets both. An answer
of a version the harness does not speak, or a version-1 answer announcing
version-2 features, is refused. And each `--adapter-cmd` run starts its child
once: the hello that says which machines to check is the run's own.
"""

from __future__ import annotations

import io
import json
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, leaseproof

from leaseproof.conformance.boundary.protocols import ALL_OPERATIONS
from leaseproof.conformance.boundary.serving import serve
from leaseproof.conformance.boundary.wire import (
    LIFECYCLE_OPERATIONS,
    PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    AdapterFault,
    SubprocessAdapter,
)
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.traces.trace import record
from leaseproof.conformance.traces.trace import write as write_trace
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc

PYTHON = shlex.quote(sys.executable)
CORPUS_TRACE = REPO / "conformance" / "traces" / "corpus" / "reconcile-unfenced.jsonl"

# An adapter written to the version-1 page: the model's delivery machine behind a
# plain request loop. It logs each start and each hello's protocol to argv[1].
# "strict" faults on a hello for any version but 1, as that page allowed;
# "lenient" ignores the version asked and answers 1; "announcing" answers 1 but
# announces the lifecycle machine and sessions (the version-2 features).
VERSION_1 = f"""
import datetime as dt, json, sys
from leaseproof.conformance.boundary import codec
from leaseproof.model import delivery as m

LOG, MODE = sys.argv[1], sys.argv[2]
OPERATIONS = {sorted(ALL_OPERATIONS)!r}


def log(line):
    with open(LOG, "a") as f:
        f.write(line + "\\n")


def send(message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()


log("start")
state = None
for line in sys.stdin:
    request = json.loads(line)
    id_, method, params = request["id"], request["method"], request.get("params") or {{}}
    if method == "hello":
        log(f"hello {{params.get('protocol')}}")
        if MODE == "strict" and params.get("protocol") != 1:
            send({{"id": id_, "fault": {{"message": f"I speak protocol 1, not {{params.get('protocol')}}"}}}})
            continue
        result = {{"protocol": 1, "implementation": "a version-1 adapter", "machines": {{"delivery": OPERATIONS}}}}
        if MODE == "announcing":
            result["machines"]["lifecycle"] = []
            result["sessions"] = True
        send({{"id": id_, "result": result}})
    elif method == "reset":
        state = m.initial_state(codec.decode(params["start"], dt.datetime, "start"))
        send({{"id": id_, "result": None}})
    elif method == "execute":
        state, outcome = m.step(state, codec.decode(params["command"], object, "command"))
        send({{"id": id_, "result": codec.encode(outcome)}})
    elif method == "snapshot":
        send({{"id": id_, "result": codec.encode_state(state)}})
    elif method == "close":
        send({{"id": id_, "result": None}})
        break
    else:
        send({{"id": id_, "fault": {{"message": f"unknown method {{method}}"}}}})
"""

# A version-2 adapter: the bundled `serve` over both models, with sessions
# (commands of all sessions run one at a time under a lock). It logs each start.
VERSION_2 = """
import sys, threading
from leaseproof.conformance.boundary.serving import serve, stdout_for_protocol
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc

with open(sys.argv[1], "a") as f:
    f.write("start\\n")


class Model:
    def __init__(self, machine, name):
        self.machine, self.name, self.state, self.lock = machine, name, None, threading.Lock()

    def reset(self, start):
        self.state = self.machine.initial_state(start)

    def execute(self, command):
        with self.lock:
            self.state, outcome = self.machine.step(self.state, command)
            return outcome

    def snapshot(self):
        return self.state

    def session(self):
        return self

    def close(self):
        pass


protocol = stdout_for_protocol()
serve(Model(m, "delivery model"), implementation="a version-2 adapter", lifecycle=Model(lc, "lifecycle model"),
      stdout=protocol)
"""


def _adapter(tmp_path: Path, source: str, *args: str) -> tuple[str, Path]:
    """The command that runs `source` (logging to the file returned), with `args`."""
    script, log = tmp_path / "adapter.py", tmp_path / "adapter.log"
    script.write_text(textwrap.dedent(source))
    return " ".join([PYTHON, shlex.quote(str(script)), shlex.quote(str(log)), *args]), log


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(("mode", "hellos"), [("strict", ["hello 3", "hello 1"]), ("lenient", ["hello 3"])])
def test_a_version_1_adapter_passes_verify_and_replay(tmp_path: Path, mode: str, hellos: list[str]) -> None:
    command, log = _adapter(tmp_path, VERSION_1, mode)
    run = leaseproof("verify", "--adapter-cmd", command, "--seed", "3", "--max-examples", "5", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verifying the delivery machine against a version-1 adapter" in run.stdout
    assert "lifecycle" not in run.stdout  # version 1 has the delivery machine alone
    assert "verdict: CONFORMS —" in run.stdout and "never reached: none" in run.stdout
    # One child for the whole run, its hello the run's own: the newest version
    # first; a strict version-1 adapter faults on it and is asked again at 1.
    assert _lines(log) == ["start", *hellos]
    log.unlink()
    replayed = leaseproof("replay", str(CORPUS_TRACE), "--adapter-cmd", command, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert f"pass  {CORPUS_TRACE}" in replayed.stdout and "1 passed, 0 failed" in replayed.stdout
    assert _lines(log) == ["start", *hellos]


def test_a_version_1_adapter_is_refused_what_needs_version_2_naming_the_version(tmp_path: Path) -> None:
    command, log = _adapter(tmp_path, VERSION_1, "strict")
    stress = leaseproof("stress", "--adapter-cmd", command, "--duration", "1", "--seed", "1", cwd=tmp_path)
    assert stress.returncode == 2, stress.stdout + stress.stderr
    assert (
        "a version-1 adapter cannot be run concurrently: it speaks protocol 1, which has no sessions" in stress.stderr
    )
    assert "need protocol 2's" in stress.stderr and "Traceback" not in stress.stderr
    lifecycle = leaseproof("verify", "--adapter-cmd", command, "--machine", "lifecycle", cwd=tmp_path)
    assert lifecycle.returncode == 2, lifecycle.stdout + lifecycle.stderr
    said = "speaks protocol 1, which carries the delivery machine alone: the lifecycle machine needs protocol 2"
    assert said in lifecycle.stderr and "Traceback" not in lifecycle.stderr
    trace = tmp_path / "lifecycle.jsonl"
    write_trace(record("a lifecycle trace", w.START, [lc.RefreshCache("r1")], machine="lifecycle"), trace)
    replayed = leaseproof("replay", str(trace), "--adapter-cmd", command, cwd=tmp_path)
    assert replayed.returncode == 2 and said in replayed.stderr, replayed.stdout + replayed.stderr
    assert _lines(log).count("start") == 3  # one child per run, and nothing run on it


def test_a_version_1_answer_that_announces_version_2_features_is_refused(tmp_path: Path) -> None:
    command, _ = _adapter(tmp_path, VERSION_1, "announcing")
    with pytest.raises(AdapterFault) as fault:
        SubprocessAdapter(command, machine=None)
    message = str(fault.value)
    assert "it answered protocol 1 but announces the lifecycle machine and sessions" in message, message
    assert 'answer the version that has them, "protocol": 3' in message, message


def test_a_version_2_adapter_gets_the_lifecycle_machine_and_sessions_from_one_child(tmp_path: Path) -> None:
    """VERSION_2 is the bundled serve, which speaks version 3 (version 2's machines and sessions, and request keys)."""
    command, log = _adapter(tmp_path, VERSION_2)
    adapter = SubprocessAdapter(command, machine=None)
    try:
        assert (adapter.protocol, adapter.sessions, adapter.announced()) == (3, True, ["delivery", "lifecycle"])
    finally:
        adapter.close()
    log.unlink()
    run = leaseproof("verify", "--adapter-cmd", command, "--seed", "3", "--max-examples", "5", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("verdict: CONFORMS —") == 2 and "verifying the lifecycle machine" in run.stdout
    assert _lines(log) == ["start"]  # the probe, delivery and lifecycle: one child (it used to be three)
    log.unlink()
    args = ("--duration", "1", "--seed", "1", "--workers", "2", "--machine", "delivery")
    stress = leaseproof("stress", "--adapter-cmd", command, *args, cwd=tmp_path)
    assert stress.returncode == 0 and "verdict: LINEARIZABLE" in stress.stdout, stress.stdout + stress.stderr
    assert _lines(log) == ["start"]


@pytest.mark.parametrize("answer", [4, 0, "2", True, None])
def test_an_answer_of_a_version_the_harness_does_not_speak_is_refused(tmp_path: Path, answer: Any) -> None:
    source = f"""
        import json, sys
        for line in sys.stdin:
            request = json.loads(line)
            result = {{"protocol": {answer!r}, "implementation": "from the future", "machines": {{"delivery": []}}}}
            sys.stdout.write(json.dumps({{"id": request["id"], "result": result}}) + "\\n")
            sys.stdout.flush()
    """
    command, _ = _adapter(tmp_path, source)
    with pytest.raises(AdapterFault) as fault:
        SubprocessAdapter(command)
    assert f"it speaks protocol {answer!r}; this harness speaks 1, 2 and 3" in str(fault.value)
    run = leaseproof("verify", "--adapter-cmd", command, cwd=tmp_path)
    assert run.returncode == 2 and "this harness speaks 1, 2 and 3" in run.stderr, run.stdout + run.stderr


class _Model:
    """A model behind `serve`, with sessions (they share its state)."""

    def __init__(self, machine: Any) -> None:
        self.machine, self.name = machine, machine.__name__
        self.state = machine.initial_state(w.START)

    def reset(self, start: Any) -> None:
        self.state = self.machine.initial_state(start)

    def execute(self, command: Any) -> Any:
        self.state, outcome = self.machine.step(self.state, command)
        return outcome

    def snapshot(self) -> Any:
        return self.state

    def session(self) -> _Model:
        return self

    def close(self) -> None:
        pass


def _exchange(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stdin, stdout = io.StringIO("".join(json.dumps(r) + "\n" for r in requests)), io.StringIO()
    serve(_Model(m), implementation="the models", lifecycle=_Model(lc), stdin=stdin, stdout=stdout)
    return [json.loads(line) for line in stdout.getvalue().splitlines()]


def test_serve_answers_the_newest_version_both_speak() -> None:
    """Asked for 1, the bundled serve is a version-1 adapter: the delivery machine
    alone and no sessions; requests for the lifecycle machine or a session are refused."""
    lifecycle = {"id": 2, "method": "snapshot", "params": {"machine": "lifecycle"}}
    open_ = {"id": 3, "method": "open_session", "params": {"machine": "delivery", "session": "s1"}}
    for asked, answered in [(1, 1), (2, 2), (3, 3), (4, 3), (None, 3)]:
        hello = {"id": 1, "method": "hello", "params": {} if asked is None else {"protocol": asked}}
        replies = _exchange([hello, lifecycle, open_])
        result = replies[0]["result"]
        assert result["protocol"] == answered, (asked, result)
        if answered == 1:
            assert result["machines"].keys() == {"delivery"} and "sessions" not in result
            assert replies[1]["fault"]["code"] == "wrong-machine"
            assert replies[2]["fault"] == {
                "code": "unknown-method",
                "message": "this adapter offers no sessions (protocol 1 has none)",
            }
        else:
            assert result["machines"].keys() == {"delivery", "lifecycle"} and result["sessions"] is True
            assert replies[1]["result"]["type"] == "LifecycleSystem"
            assert replies[2] == {"id": 3, "result": None}
    for bad in (0, "2", True):
        replies = _exchange([{"id": 1, "method": "hello", "params": {"protocol": bad}}])
        assert replies[0]["fault"]["code"] == "bad-params", replies
    assert (PROTOCOL_VERSIONS, PROTOCOL_VERSION) == ((1, 2, 3), 3)


def test_a_child_that_dies_on_one_machine_is_not_asked_for_the_next(tmp_path: Path) -> None:
    """The one child serves every machine: one that crashed during the first ends the run."""
    source = f"""
        import json, sys
        with open(sys.argv[1], "a") as f:
            f.write("start\\n")
        machines = {{"delivery": {sorted(ALL_OPERATIONS)!r}, "lifecycle": {sorted(LIFECYCLE_OPERATIONS)!r}}}
        for line in sys.stdin:
            request = json.loads(line)
            if request["method"] == "execute":
                sys.exit(3)
            hello = {{"protocol": 2, "implementation": "crashes", "machines": machines}}
            result = hello if request["method"] == "hello" else None
            sys.stdout.write(json.dumps({{"id": request["id"], "result": result}}) + "\\n")
            sys.stdout.flush()
    """
    command, log = _adapter(tmp_path, source)
    run = leaseproof("verify", "--adapter-cmd", command, "--max-examples", "2", cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "verifying the delivery machine" in run.stdout and "verdict: NONE" in run.stdout
    assert "exited (status 3) before the lifecycle machine's turn" in run.stderr, run.stderr
    assert "verifying the lifecycle machine" not in run.stdout
    assert _lines(log) == ["start"]


def test_claims_carry_request_keys_only_to_an_adapter_of_protocol_3_or_in_process() -> None:
    import types

    from leaseproof.conformance.boundary.protocols import takes_request_keys

    versioned = [types.SimpleNamespace(name="wire", protocol=p) for p in (1, 2, 3)]
    assert [takes_request_keys(adapter) for adapter in versioned] == [False, False, True]
    assert takes_request_keys(types.SimpleNamespace(name="in process"))  # it has no protocol version
