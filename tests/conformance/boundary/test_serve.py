"""`python -m leaseproof.conformance.boundary.serve` leaves no scratch database behind, however it ends."""

from __future__ import annotations

import datetime as dt
import shlex
import signal
import sys

import pytest

from leaseproof.conformance.boundary.wire import SubprocessAdapter
from leaseproof.conformance.harness.provision import Server, databases_named

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _serving(server: Server) -> tuple[SubprocessAdapter, str]:
    """A serve process that has answered hello and a reset, and the scratch database it made."""
    before = set(databases_named(server, "lp_serve"))
    adapter = SubprocessAdapter(
        f"{shlex.quote(sys.executable)} -m leaseproof.conformance.boundary.serve --dsn {shlex.quote(server.dsn)}"
    )
    adapter.reset(START)
    (made,) = set(databases_named(server, "lp_serve")) - before
    assert f"_{adapter.process.pid}_" in made  # named after its owner
    return adapter, made


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_ends_serve_and_drops_its_database(pg_server: Server, signum: signal.Signals) -> None:
    adapter, made = _serving(pg_server)
    adapter.process.send_signal(signum)
    assert adapter.process.wait(timeout=60) == 130
    assert made not in databases_named(pg_server, "lp_serve")
    assert any("its scratch database is dropped" in line for line in adapter.stderr_tail())


def test_end_of_input_ends_serve_and_drops_its_database(pg_server: Server) -> None:
    adapter, made = _serving(pg_server)
    adapter.close()
    assert adapter.process.returncode == 0
    assert made not in databases_named(pg_server, "lp_serve")


def test_a_database_left_by_a_killed_serve_is_dropped_by_the_next(pg_server: Server) -> None:
    killed, left = _serving(pg_server)
    killed.process.kill()
    killed.process.wait(timeout=30)
    assert left in databases_named(pg_server, "lp_serve")  # SIGKILL: nothing could run
    successor, made = _serving(pg_server)
    try:
        assert left not in databases_named(pg_server, "lp_serve")
        assert any(f"dropping {left}" in line for line in successor.stderr_tail())
        assert made in databases_named(pg_server, "lp_serve")
    finally:
        successor.close()
