"""pgmq (`pgmq_queue.PgmqQueue`) judged on a real server: what its API allows, with traces that replay, and the
lease boundary it declares (its lease over at the instant its vt comes)."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leaseproof.conformance.frontends import cli
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.queues import matrix
from leaseproof.conformance.queues import run as runs
from leaseproof.conformance.queues.subjects import make
from leaseproof.conformance.queues.subjects.pgmq_queue import PgmqQueue
from leaseproof.model.queue import Guarantee

SUBJECT = "leaseproof.conformance.queues.subjects.pgmq_queue:PgmqQueue"
SEED = 1
# Established on seeds 1, 2 and 3 at the defaults (500 programs, 100 rounds of each race, half with a cut).
VIOLATED = {Guarantee.NO_STALE_COMPLETION, Guarantee.NO_STALE_HEARTBEAT}
NOT_APPLICABLE = {
    Guarantee.EXPIRED_CANNOT_RENEW,
    Guarantee.EXPIRED_CANNOT_COMPLETE,
    Guarantee.RESCUE_ONLY_EXPIRED,
    Guarantee.RESCUE_TAKES_EXPIRED,
    Guarantee.COMPLETION_RACING_RESCUE,
}


@pytest.fixture
def pgmq(pg_server: Server) -> Iterator[Any]:
    with make(SUBJECT, lambda: scratch_database(pg_server, prefix="lp_queue")) as queue:
        yield queue


def _replay(trace: str, dsn: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["guarantees", "--replay", trace, "--dsn", dsn])
    return cli.load("guarantees").command(args, out, err), out.getvalue() + err.getvalue()


def test_pgmq_breaks_what_its_api_allows_and_its_traces_replay(pgmq: Any, pg_server: Server, tmp_path: Path) -> None:
    row = matrix.judge_subject(
        pgmq, seed=SEED, examples=100, races=10, traces=tmp_path, terminate=0.5, database=pgmq.dsn, reference=SUBJECT
    )
    cells = {cell.guarantee: cell for cell in row.cells}
    assert {g for g, c in cells.items() if c.verdict == "violated"} == VIOLATED, row.cells
    assert {g for g, c in cells.items() if c.verdict == "n/a"} == NOT_APPLICABLE, row.cells
    assert {g for g, c in cells.items() if c.verdict == "holds"} == set(Guarantee) - VIOLATED - NOT_APPLICABLE
    for guarantee in VIOLATED:
        code, out = _replay(str(cells[guarantee].trace), pg_server.dsn)
        assert code == 1 and f"breaks {guarantee.value}" in out, out


def test_a_read_takes_a_message_over_at_the_instant_its_vt_ends_which_its_boundary_allows(pgmq: PgmqQueue) -> None:
    """pgmq's read takes `vt <= clock_timestamp()`: at the instant `vt` the message is visible again
    (pending, by pgmq's rule) and handed out again, by the pinned clock. The adapter declares that
    boundary, so the profile judges the read a takeover, not a double claim."""
    pgmq.reset(runs.TIMING.start, 30)
    job = pgmq.enqueue()
    first = pgmq.fetch()
    assert first is not None and first.job == job and first.handle.vt == runs.TIMING.start + dt.timedelta(seconds=30)
    pgmq.advance(29)
    assert pgmq.fetch() is None and pgmq.rows()[job].status == "claimed"
    pgmq.advance(1)
    assert pgmq.rows()[job].status == "pending"
    second = pgmq.fetch()
    assert second is not None and second.job == job and second.handle.read_ct == 2
    ran = runs.run(pgmq, [["enqueue"], ["fetch"], ["advance", 30], ["fetch"]], drain=False)
    assert ran.divergence is None and not ran.violations, ran.trace
