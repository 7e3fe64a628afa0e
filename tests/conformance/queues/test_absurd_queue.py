"""Absurd (absurd-sdk and absurdctl 0.5.1) judged through its public API on a real server
(conformance/queues/subjects/absurd_queue.py).

Its one finding is at the lease boundary: `absurd.claim_task` takes a run over once
`claim_expires_at <= now`, the instant the profile still counts as live (`lease_until >= now`).
A fetch at that instant hands out the same job again (no-double-claim, whose trace replays), or,
with an older job pending, hands out that one and leaves the taken-over job pending, which no
guarantee explains: a search whose runs meet that leaves the guarantees no run broke inconclusive
(seeds 1 and 2 at 500 programs; this seed's 60 do not). One second later on every claim, absurd
holds every guarantee it is judged on."""

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
from leaseproof.model.queue import Answer, Guarantee, Seen

SUBJECT = "leaseproof.conformance.queues.subjects.absurd_queue:AbsurdQueue"
SEED = 6  # meets the boundary (a double claim, no divergence) within 60 programs
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


def test_the_boundary_is_a_double_claim_or_a_divergence(absurd: AbsurdQueue) -> None:
    ran = runs.run(absurd, [["enqueue"], ["fetch"], ["advance", LEASE], ["fetch"]])
    assert [v.guarantee for v in ran.violations] == [Guarantee.NO_DOUBLE_CLAIM]
    # An older job pending: the claim hands it out, and the job it took over goes back to pending.
    ran = runs.run(absurd, [["enqueue"], ["fetch"], ["enqueue"], ["advance", LEASE], ["fetch"]])
    assert not ran.violations and ran.divergence is not None
    assert ran.divergence.why.endswith("should be claimed (attempt 1); its row says pending")
    # A second later, both are what the profile expects.
    assert not runs.run(absurd, [["enqueue"], ["fetch"], ["advance", LEASE + 1], ["fetch"]]).broken


def test_the_absurd_row(absurd: AbsurdQueue, pg_server: Server, tmp_path: Path) -> None:
    """Scenarios and programs only (seeded: the same row on every run)."""
    row = matrix.judge_subject(absurd, seed=SEED, examples=EXAMPLES, races=0, traces=tmp_path, reference=SUBJECT)
    cells = {cell.guarantee: cell for cell in row.cells}
    violated = {Guarantee.NO_DOUBLE_CLAIM}
    assert {g: c.verdict for g, c in cells.items()} == {
        g: "violated" if g in violated else "n/a" if g in NOT_APPLICABLE else "holds" for g in Guarantee
    }, row.cells
    assert "was fetched while attempt 1 held a live lease" in cells[Guarantee.NO_DOUBLE_CLAIM].detail
    code, out = _replay(cells[Guarantee.NO_DOUBLE_CLAIM].trace, pg_server.dsn)
    assert code == 1 and "breaks no-double-claim" in out, out


class _ClaimsASecondLonger(AbsurdQueue):
    """Every claim and extension a second longer than the profile's lease: absurd's takeover
    (`claim_expires_at <= now`) then lands on the profile's first expired instant."""

    def reset(self, start: dt.datetime, lease_seconds: int) -> None:
        super().reset(start, lease_seconds)
        self.lease_seconds = lease_seconds + 1


def test_off_the_boundary_absurd_holds_what_it_is_judged_on(pg_server: Server, tmp_path: Path) -> None:
    with scratch_database(pg_server, prefix="lp_queue") as dsn:
        queue = _ClaimsASecondLonger(dsn)
        try:
            row = matrix.judge_subject(queue, seed=SEED, examples=EXAMPLES, races=0, traces=tmp_path)
        finally:
            queue.close()
    verdicts = {cell.guarantee: cell.verdict for cell in row.cells}
    assert verdicts == {g: "n/a" if g in NOT_APPLICABLE else "holds" for g in Guarantee}, row.cells
