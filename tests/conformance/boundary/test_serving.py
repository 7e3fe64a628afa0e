"""`serve`, the adapter side of the wire protocol, in process: it answers every request
in order, a fault for each that breaks the protocol (which never reaches the adapter) and
for each failure of the adapter, and goes on serving; it runs sessions, and says which were
lost. tests/conformance/boundary/test_wire.py runs it in a child, behind the harness."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from typing import Any

import psycopg
import pytest
from helpers import ModelAdapter

from leaseproof.conformance.boundary import codec, serving, wire
from leaseproof.conformance.boundary.protocols import ALL_OPERATIONS, CORE_OPERATIONS
from leaseproof.conformance.boundary.serving import serve
from leaseproof.model import delivery as m
from leaseproof.model.errors import InvalidValue

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
COMMUNITY = uuid.UUID("00000000-0000-4000-8000-00000000000c")


# -- requests and replies -------------------------------------------------------------------------


def exchange(requests: list[Any], adapter: Any = None, **options: Any) -> tuple[list[dict[str, Any]], io.StringIO]:
    """Feed `requests` (objects, or raw lines) to `serve`; its replies, and its stdin."""
    stdin = io.StringIO("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests))
    stdout = io.StringIO()
    serve(adapter or ModelAdapter(), implementation="model under test", stdin=stdin, stdout=stdout, **options)
    assert stdout.getvalue().endswith("\n") or stdout.getvalue() == ""
    return [json.loads(line) for line in stdout.getvalue().splitlines()], stdin


def execute(id_: int, command: Any) -> dict[str, Any]:
    return {"id": id_, "method": "execute", "params": {"machine": "delivery", "command": codec.encode(command)}}


def test_serve_answers_each_request_in_order() -> None:
    replies, _ = exchange(
        [
            {"id": 1, "method": "hello", "params": {"protocol": 1}},
            {"id": 2, "method": "reset", "params": {"machine": "delivery", "start": codec.encode(START)}},
            execute(3, m.CreateCommunity(COMMUNITY)),
            execute(4, m.CreateCommunity(COMMUNITY)),
            execute(5, m.AdvanceClock(dt.timedelta(seconds=30))),
            {"id": 6, "method": "snapshot", "params": {"machine": "delivery"}},
        ]
    )
    assert replies == [
        {
            "id": 1,
            "result": {
                "protocol": 1,
                "implementation": "model under test",
                "machines": {"delivery": sorted(ALL_OPERATIONS)},
            },
        },
        {"id": 2, "result": None},
        {"id": 3, "result": {"type": "Ok"}},
        {"id": 4, "result": codec.encode(m.AlreadyExists("community", COMMUNITY, COMMUNITY))},
        {"id": 5, "result": {"type": "Ok"}},
        {
            "id": 6,
            "result": {
                "type": "DeliverySystem",
                "now": "2026-01-01T00:00:30.000000Z",
                "communities": [{"id": str(COMMUNITY), "state": "active"}],
                "workflows": [],
                "runs": [],
                "events": [],
                "deliveries": [],
                "retired": [],
            },
        },
    ]


HELLO = {"id": 1, "method": "hello", "params": {"protocol": 2}}
RESET = {"id": 2, "method": "reset", "params": {"machine": "delivery", "start": codec.encode(START)}}


class _Counting(ModelAdapter):
    """The model as an adapter, counting the calls that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def reset(self, start: dt.datetime) -> None:
        self.calls += 1
        super().reset(start)

    def execute(self, command: m.Command) -> m.Outcome:
        self.calls += 1
        return super().execute(command)

    def snapshot(self) -> m.DeliverySystem:
        self.calls += 1
        return super().snapshot()


def test_serve_reports_an_adapter_failure_as_an_implementation_fault_and_keeps_serving() -> None:
    replies, _ = exchange([HELLO, execute(3, m.Reap()), RESET, execute(4, m.Reap())])  # the model raises before reset
    assert replies[1] == {"id": 3, "fault": {"code": "implementation", "message": "RuntimeError: execute before reset"}}
    assert replies[3] == {"id": 4, "result": {"type": "Reaped", "count": 0}}


_COMMUNITY = codec.encode(m.CreateCommunity(COMMUNITY))


@pytest.mark.parametrize(
    ("request_", "code", "says"),
    [
        (b"\xff\xfe{}", "not-json", "not UTF-8 (byte 0)"),
        ('{"id": NaN, "method": "hello"}', "not-json", "NaN is not a JSON value"),
        ('{"id": 1, "method": "hello", "params": {"protocol": Infinity}}', "not-json", "Infinity"),
        ('{"id": 1, "method": ', "not-json", "not JSON"),
        ([1, 2], "not-an-object", "not a JSON object"),
        ({"id": True, "method": "hello"}, "bad-request", '"id" must be an integer or a string, not true'),
        ({"id": 1.5, "method": "hello"}, "bad-request", "not 1.5"),
        ({"id": 7, "method": "hello", "extra": 1}, "bad-request", "unknown members ['extra']"),
        ({"id": 7, "method": "frobnicate"}, "unknown-method", 'unknown method "frobnicate": the methods are hello'),
        ({"id": 7, "params": {}}, "unknown-method", "unknown method null"),
        ({"id": 7, "method": "execute", "params": [1]}, "bad-params", '"params" of execute must be an object'),
        ({"id": 7, "method": "execute", "params": {"machine": "delivery"}}, "bad-params", "needs params ['command']"),
        ({"id": 7, "method": "snapshot", "params": {"machine": "delivery", "x": 1}}, "bad-params", "no params ['x']"),
        (
            {"id": 7, "method": "reset", "params": {"start": codec.encode(START)}},
            "bad-params",
            "needs params ['machine']",
        ),
        (
            {"id": 7, "method": "execute", "params": {"machine": "lifecycle", "command": _COMMUNITY}},
            "wrong-machine",
            "serves the 'delivery' machine, not \"lifecycle\"",
        ),
        (
            {"id": 7, "method": "execute", "params": {"machine": "delivery", "command": {"type": "Teleport"}}},
            "malformed-value",
            "execute: command.type: 'Teleport' is not",
        ),
        (
            {"id": 7, "method": "execute", "params": {"machine": "delivery", "command": {"type": "Ok"}}},
            "malformed-value",
            "Ok is not a delivery command",
        ),
        (
            {"id": 7, "method": "reset", "params": {"machine": "delivery", "start": "yesterday"}},
            "malformed-value",
            "reset: start",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 20 else None,
)
def test_serve_refuses_a_malformed_request_with_a_typed_fault_that_changes_nothing(
    request_: Any, code: str, says: str
) -> None:
    counting = _Counting()
    line = request_.decode("latin-1") if isinstance(request_, bytes) else request_
    stdin = io.BytesIO(
        b"".join(
            (r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode()) + b"\n"
            for r in (HELLO, RESET, request_, {"id": 9, "method": "snapshot", "params": {"machine": "delivery"}})
        )
    )
    stdout = io.StringIO()
    serve(counting, implementation="model under test", stdin=stdin, stdout=stdout)
    replies = [json.loads(text) for text in stdout.getvalue().splitlines()]
    assert len(replies) == 4, line
    fault = replies[2]["fault"]
    assert fault["code"] == code and says in fault["message"], fault
    assert "result" not in replies[2]
    assert counting.calls == 2  # the reset, and the snapshot after: the refused request reached nothing
    assert replies[3] == {"id": 9, "result": codec.encode_state(m.initial_state(START))}


def test_serve_executes_nothing_before_hello() -> None:
    counting = _Counting()
    replies, _ = exchange([RESET, execute(3, m.CreateCommunity(COMMUNITY)), HELLO, RESET], adapter=counting)
    assert [r["fault"]["code"] for r in replies[:2]] == ["hello-first", "hello-first"]
    assert replies[0]["fault"]["message"] == "reset before hello: the session starts with a hello"
    assert replies[3] == {"id": 2, "result": None} and counting.calls == 1


class _InADatabase(ModelAdapter):
    """The model as an adapter that says which database it uses, as the bundled ones do (`dsn`)."""

    dsn = "host=/tmp/nowhere dbname=lp_example"


@pytest.mark.parametrize(("protocol", "announced"), [(3, {"delivery": _InADatabase.dsn}), (2, None), (1, None)])
def test_serve_announces_its_databases_from_protocol_3(protocol: int, announced: Any) -> None:
    replies, _ = exchange([{"id": 1, "method": "hello", "params": {"protocol": protocol}}], adapter=_InADatabase())
    assert replies[0]["result"].get("databases") == announced
    plain, _ = exchange([{"id": 1, "method": "hello", "params": {"protocol": 3}}])
    assert "databases" not in plain[0]["result"]  # an adapter with no database announces none


def test_serve_refuses_an_operation_it_does_not_offer() -> None:
    replies, _ = exchange([HELLO, RESET, execute(3, m.Reap())], operations=frozenset(CORE_OPERATIONS - {"Reap"}))
    assert replies[2]["fault"]["code"] == "malformed-value"
    assert "Reap is not among the operations this adapter offers" in replies[2]["fault"]["message"]


def test_serve_stops_at_close_and_leaves_the_rest_unread() -> None:
    after_close = json.dumps({"id": 3, "method": "hello", "params": {}}) + "\n"
    replies, stdin = exchange(
        [{"id": 1, "method": "hello", "params": {}}, {"id": 2, "method": "close", "params": {}}, after_close.strip()]
    )
    assert [reply["id"] for reply in replies] == [1, 2]
    assert replies[1] == {"id": 2, "result": None}
    assert stdin.read() == after_close


def test_serve_stops_at_end_of_input() -> None:
    replies, _ = exchange([{"id": 1, "method": "hello", "params": {}}])
    assert [reply["id"] for reply in replies] == [1]
    assert exchange([])[0] == []


def test_serve_announces_only_the_operations_it_is_given() -> None:
    replies, _ = exchange([{"id": 1, "method": "hello", "params": {}}], operations=CORE_OPERATIONS)
    assert replies[0]["result"]["machines"] == {"delivery": sorted(CORE_OPERATIONS)}


class _Recorder(ModelAdapter):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def execute(self, command: m.Command) -> m.Outcome:
        self.seen.append(command)
        return super().execute(command)


def test_serve_hands_the_adapter_model_values() -> None:
    recorder = _Recorder()
    lease = m.Lease(COMMUNITY, COMMUNITY, b"\x01" * 32, 1, START)
    replies, _ = exchange(
        [
            HELLO,
            {"id": 2, "method": "reset", "params": {"machine": "delivery", "start": "2026-01-01T00:00:00.000000Z"}},
            execute(3, m.Renew(lease, 30)),
        ],
        adapter=recorder,
    )
    assert recorder.state is not None and recorder.state.now == START
    assert recorder.seen == [m.Renew(lease, 30)]
    assert replies[2] == {"id": 3, "result": {"type": "UnknownCommunity", "community_id": str(COMMUNITY)}}


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("this is not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ("", "not JSON"),
        ('"hello"', "not a JSON object"),
    ],
    ids=["not JSON", "an array", "blank line", "a string"],
)
def test_serve_answers_a_malformed_request_with_a_fault_and_goes_on(line: str, says: str) -> None:
    replies, _ = exchange([line, {"id": 2, "method": "hello", "params": {}}])
    assert len(replies) == 2
    assert replies[0]["id"] is None and "result" not in replies[0]
    assert says in replies[0]["fault"]["message"]
    assert replies[1]["id"] == 2 and replies[1]["result"]["protocol"] == 3  # no version asked: its newest


def test_serve_refuses_a_machine_it_does_not_serve() -> None:
    replies, _ = exchange([HELLO, {"id": 2, "method": "snapshot", "params": {"machine": "lifecycle"}}])
    assert replies[0]["result"]["machines"].keys() == {"delivery"}
    assert replies[1]["fault"]["code"] == "wrong-machine"


def test_serve_refuses_instants_and_clock_moves_the_model_does_not_know() -> None:
    """Both sides agree: the model refuses them (InvalidValue), so the codec does, and serve never sends them on."""
    counting = _Counting()
    far = {"id": 3, "method": "reset", "params": {"machine": "delivery", "start": "9999-12-31T00:00:00.000000Z"}}
    huge = {
        "id": 4,
        "method": "execute",
        "params": {"machine": "delivery", "command": {"type": "AdvanceClock", "by": 10**18}},
    }
    replies, _ = exchange([HELLO, RESET, far, huge], adapter=counting)
    assert (
        replies[2]["fault"]["code"] == "malformed-value" and "later than 9999-01-01" in replies[2]["fault"]["message"]
    )
    assert replies[3]["fault"]["code"] == "malformed-value" and "at most 366 days" in replies[3]["fault"]["message"]
    assert counting.calls == 1  # the first reset only
    with pytest.raises(InvalidValue, match="at most 366 days"):
        m.AdvanceClock(dt.timedelta(days=367))
    latest = m.initial_state(dt.datetime(9999, 1, 1, tzinfo=dt.UTC))  # the latest instant is one
    with pytest.raises(InvalidValue, match="no later than 9999-01-01"):
        m.step(latest, m.AdvanceClock(dt.timedelta(microseconds=1)))  # a move past it is refused by the model


# -- sessions -------------------------------------------------------------------------------------


class _SessionModel(ModelAdapter):
    """The model behind the boundary, with sessions that share its state (one at a time)."""

    def session(self) -> _SessionModel:
        return self

    def close(self) -> None:
        pass


def test_serve_refuses_an_unknown_or_reopened_session() -> None:
    open_ = {"id": 3, "method": "open_session", "params": {"machine": "delivery", "session": "w1"}}
    on_w2 = execute(5, m.Reap()) | {"params": {"machine": "delivery", "session": "w2", "command": {"type": "Reap"}}}
    replies, _ = exchange([HELLO, RESET, open_, open_ | {"id": 4}, on_w2], adapter=_SessionModel())
    assert replies[0]["result"]["sessions"] is True
    assert replies[2] == {"id": 3, "result": None}
    assert replies[3]["fault"] == {"code": "bad-params", "message": "session 'w1' is already open"}
    assert replies[4]["fault"] == {"code": "bad-params", "message": "no session 'w2' is open"}


class _CutAsItOpens(_SessionModel):
    """Sessions whose opening fails: its connection cut (a psycopg OperationalError), or a bug."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def session(self) -> _SessionModel:
        raise self.error


@pytest.mark.parametrize(
    ("error", "code"),
    [(psycopg.OperationalError("terminating connection due to administrator command"), "session-lost"),
     (ValueError("a bug"), "implementation")],
)  # fmt: skip
def test_serve_says_a_session_cut_as_it_opens_was_lost(error: Exception, code: str) -> None:
    open_ = {"id": 3, "method": "open_session", "params": {"machine": "delivery", "session": "w1"}}
    replies, _ = exchange([HELLO, RESET, open_, open_ | {"id": 4}], adapter=_CutAsItOpens(error))
    assert replies[2]["fault"]["code"] == code and replies[3]["fault"]["code"] == code  # nothing half-opened


def test_an_adapter_without_sessions_says_so() -> None:
    replies, _ = exchange([HELLO])
    assert "sessions" not in replies[0]["result"]  # the model adapter has no session()


# -- where it is imported from --------------------------------------------------------------------


def test_serve_and_stdout_for_protocol_are_still_found_in_wire() -> None:
    """Adapters written before serving.py import them from wire.py; it hands them serving's own."""
    assert wire.serve is serving.serve  # type: ignore[attr-defined]
    assert wire.stdout_for_protocol is serving.stdout_for_protocol  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="has no attribute '_request'"):
        wire._request  # type: ignore[attr-defined]  # noqa: B018 - the private names moved without a way back
