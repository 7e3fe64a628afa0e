"""Absurd (absurd-sdk and absurdctl 0.5.1) judged through its public API on a real server
(conformance/queues/subjects/absurd_queue.py).

`absurd.claim_task` takes a run over once `claim_expires_at <= now`: its claim is over at the
instant it expires, which the adapter declares (`Capability.ENDS_AT_EXPIRY`). Judged by that
boundary, absurd holds every guarantee it is judged on; judged by the profile's default (a lease
live through its last instant), the same claim is a double claim, or a taken-over job left pending
that the profile cannot follow."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseproof.conformance.frontends import cli
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.queues import matrix
from leaseproof.conformance.queues import run as runs
from leaseproof.conformance.queues.subjects import make
from leaseproof.conformance.queues.subjects.absurd_queue import AbsurdQueue
from leaseproof.model.queue import Answer, Capability, Guarantee, Seen

SUBJECT = "leaseproof.conformance.queues.subjects.absurd_queue:AbsurdQueue"
SEED = 6  # meets the boundary within 60 programs
EXAMPLES = 60
START = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
LEASE = 30
NOT_APPLICABLE = {
    Guarantee.EXPIRED_CANNOT_RENEW,  # no deadline: extend_claim renews any running run
    Guarantee.EXPIRED_CANNOT_COMPLETE,  # no deadline: complete_run completes any running run
    Guarantee.RESCUE_ONLY_EXPIRED,  # no rescue on demand: only a claim takes runs over
    Guarantee.RESCUE_TAKES_EXPIRED,
    Guarantee.COMPLETION_RACING_RESCUE,
}


@pytest.fixture
def absurd(pg_server: Server) -> Iterator[AbsurdQueue]:
    with make(SUBJECT, lambda: scratch_database(pg_server, prefix="lp_queue")) as queue:
        assert isinstance(queue, AbsurdQueue)
        yield queue


def _replay(trace: str | Path | None, dsn: str) -> tuple[int, str]:
    assert trace is not None
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["guarantees", "--replay", str(trace), "--dsn", dsn])
    return cli.load("guarantees").command(args, out, err), out.getvalue()


def test_absurd_reads_the_pinned_clock(absurd: AbsurdQueue) -> None:
    absurd.reset(START, LEASE)
    absurd.advance(7)
    row = absurd.conn.execute("SELECT absurd.current_time()").fetchone()
    assert row == (START + dt.timedelta(seconds=7),)


def test_a_claim_takes_a_run_over_at_the_instant_its_claim_expires(absurd: AbsurdQueue) -> None:
    absurd.reset(START, LEASE)
    job = absurd.enqueue()
    first = absurd.fetch()
    assert first is not None and first.job == job
    absurd.advance(LEASE - 1)
    assert absurd.fetch() is None  # live: nothing to hand out
    absurd.advance(1)  # now == claim_expires_at: the profile's lease is still live
    second = absurd.fetch()
    assert second is not None and second.job == job and second.handle != first.handle
    assert absurd.complete(first.handle, "finished") is Answer.REFUSED  # its run failed ($ClaimTimeout)
    assert absurd.heartbeat(first.handle) is Answer.REFUSED
    # No deadline: a holder whose claim expired, not yet taken over, renews and completes.
    absurd.advance(LEASE + 1)
    assert absurd.heartbeat(second.handle) is Answer.APPLIED
    absurd.advance(LEASE + 1)
    assert absurd.complete(second.handle, "finished") is Answer.APPLIED
    assert absurd.rows() == {job: Seen("finished")}


class _BoundaryUndeclared(AbsurdQueue):
    """Absurd judged as if its claim were live through the instant it expires (the default)."""

    capabilities = AbsurdQueue.capabilities - {Capability.ENDS_AT_EXPIRY}


def test_a_claim_at_the_instant_of_expiry_is_a_takeover_by_the_declared_boundary(
    absurd: AbsurdQueue, pg_server: Server
) -> None:
    at_expiry: runs.Program = [["enqueue"], ["fetch"], ["advance", LEASE], ["fetch"]]
    with_older: runs.Program = [["enqueue"], ["fetch"], ["enqueue"], ["advance", LEASE], ["fetch"]]
    for program in (at_expiry, with_older):
        ran = runs.run(absurd, program)
        assert not ran.violations and ran.divergence is None, ran.trace
    with scratch_database(pg_server, prefix="lp_queue") as dsn:
        undeclared = _BoundaryUndeclared(dsn)
        try:
            ran = runs.run(undeclared, at_expiry)
            assert [v.guarantee for v in ran.violations] == [Guarantee.NO_DOUBLE_CLAIM]
            ran = runs.run(undeclared, with_older)
            assert not ran.violations and ran.divergence is not None
            assert ran.divergence.why.endswith("should be claimed (attempt 1); its row says pending")
        finally:
            undeclared.close()


def test_the_absurd_row(absurd: AbsurdQueue, tmp_path: Path) -> None:
    """Scenarios and programs only (seeded: the same row on every run)."""
    row = matrix.judge_subject(absurd, seed=SEED, examples=EXAMPLES, races=0, traces=tmp_path, reference=SUBJECT)
    verdicts = {cell.guarantee: cell.verdict for cell in row.cells}
    assert verdicts == {g: "n/a" if g in NOT_APPLICABLE else "holds" for g in Guarantee}, row.cells
