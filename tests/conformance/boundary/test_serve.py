"""`python -m leaseproof.conformance.boundary.serve` leaves no scratch database behind, however it ends."""

from __future__ import annotations

import datetime as dt
import secrets
import shlex
import signal
import subprocess
import sys

import psycopg
import pytest
from psycopg import sql

from leaseproof.conformance.boundary.serve import _HOST, _PREFIX
from leaseproof.conformance.boundary.wire import SubprocessAdapter
from leaseproof.conformance.harness.databases import databases_named, drop_database
from leaseproof.conformance.harness.server import Server

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _serving(server: Server, ignoring_sigint: bool = False) -> tuple[SubprocessAdapter, set[str]]:
    """A serve process that has answered hello and a reset, and the scratch databases it made
    (one per machine); started, if asked, with SIGINT ignored, as a background job's child is."""
    before = set(databases_named(server, "lp_serve"))
    command = f"{shlex.quote(sys.executable)} -m leaseproof.conformance.boundary.serve --dsn {shlex.quote(server.dsn)}"
    if ignoring_sigint:
        command = "sh -c " + shlex.quote(f"trap '' INT; exec {command}")
    adapter = SubprocessAdapter(command)
    adapter.reset(START)
    # Named after their owner; others' (a test run beside this one on the same server) are not counted.
    made = {name for name in set(databases_named(server, "lp_serve")) - before if f"_{adapter.process.pid}_" in name}
    assert len(made) == 2, made
    return adapter, made


@pytest.mark.parametrize("ignoring_sigint", [False, True], ids=["", "started-ignoring-sigint"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_ends_serve_and_drops_its_database(
    pg_server: Server, signum: signal.Signals, ignoring_sigint: bool
) -> None:
    adapter, made = _serving(pg_server, ignoring_sigint)
    adapter.process.send_signal(signum)
    assert adapter.process.wait(timeout=60) == 130
    assert not made & set(databases_named(pg_server, "lp_serve"))
    assert any("its scratch databases are dropped" in line for line in adapter.stderr_tail())


def test_end_of_input_ends_serve_and_drops_its_database(pg_server: Server) -> None:
    adapter, made = _serving(pg_server)
    adapter.close()
    assert adapter.process.returncode == 0
    assert not made & set(databases_named(pg_server, "lp_serve"))


def test_a_database_left_by_a_killed_serve_is_dropped_by_the_next(pg_server: Server) -> None:
    killed, left = _serving(pg_server)
    killed.process.kill()
    killed.process.wait(timeout=30)
    assert left <= set(databases_named(pg_server, "lp_serve"))  # SIGKILL: nothing could run
    successor, made = _serving(pg_server)
    try:
        assert not left & set(databases_named(pg_server, "lp_serve"))
        assert all(any(f"dropping {name}" in line for line in successor.stderr_tail()) for name in left)
        assert made <= set(databases_named(pg_server, "lp_serve"))
    finally:
        successor.close()


def _of(server: Server, *pids: int) -> set[str]:
    return {name for name in databases_named(server, "lp_serve") if any(f"_{pid}_" in name for pid in pids)}


def test_what_killed_serves_left_is_dropped_when_their_restarted_successor_ends(pg_server: Server) -> None:
    # As the nemesis does: kills and restarts, each successor attached and never reset.
    adapter, _ = _serving(pg_server)
    pids = [adapter.process.pid]
    try:
        for _ in range(2):
            adapter.restart()
            pids.append(adapter.process.pid)
        assert len(_of(pg_server, *pids)) == 6  # the first's two, and each successor's own two
    finally:
        adapter.close()
    assert adapter.process.returncode == 0
    assert not _of(pg_server, *pids)


def test_a_killed_serve_s_database_is_spared_while_the_process_that_started_it_runs(pg_server: Server) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    # Named as serve names them: a maker that is gone, under a parent that runs (another
    # harness, which may yet start a serve to attach to it) or is gone too.
    spared = f"{_PREFIX}_{_HOST}_{gone.pid}_1_{secrets.token_hex(6)}"
    dropped = f"{_PREFIX}_{_HOST}_{gone.pid}_{gone.pid}_{secrets.token_hex(6)}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        for name in (spared, dropped):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        adapter, _ = _serving(pg_server)
        adapter.close()
        left = set(databases_named(pg_server, "lp_serve"))
        assert spared in left and dropped not in left
    finally:
        for name in (spared, dropped):
            drop_database(pg_server, name)
