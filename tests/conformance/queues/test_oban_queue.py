"""oban (`oban_queue.ObanQueue`, in a child process under Python 3.12 or newer) judged on a real server: it
holds every guarantee its API can be judged on, its fence is the attempt's `attempted_at`, and its rescue
keeps the lease boundary."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.queues import matrix
from leaseproof.conformance.queues import run as runs
from leaseproof.conformance.queues.subjects import SubjectUnavailable, make, oban_queue
from leaseproof.model.queue import Answer, Guarantee

SUBJECT = "leaseproof.conformance.queues.subjects.oban_queue:ObanQueue"
SEED = 1
# Established on seeds 1, 2 and 3 at the defaults (500 programs, 100 rounds of each race, half with a cut):
# nothing violated; these need a heartbeat or a deadline, which oban's API does not have.
NOT_APPLICABLE = {Guarantee.NO_STALE_HEARTBEAT, Guarantee.EXPIRED_CANNOT_RENEW, Guarantee.EXPIRED_CANNOT_COMPLETE}


@pytest.fixture
def oban(pg_server: Server) -> Iterator[Any]:
    with make(SUBJECT, lambda: scratch_database(pg_server, prefix="lp_queue")) as queue:
        yield queue


def test_oban_holds_every_guarantee_its_api_can_be_judged_on(oban: Any, tmp_path: Path) -> None:
    row = matrix.judge_subject(
        oban, seed=SEED, examples=40, races=6, traces=tmp_path, terminate=0.5, database=oban.dsn, reference=SUBJECT
    )
    cells = {cell.guarantee: cell.verdict for cell in row.cells}
    assert cells == {g: "n/a" if g in NOT_APPLICABLE else "holds" for g in Guarantee}, row.cells
    assert not list(tmp_path.iterdir())


def test_the_rescue_takes_a_job_only_after_the_instant_its_lease_ends_and_the_old_holder_is_fenced(
    oban: Any,
) -> None:
    """`rescue_jobs.sql` takes `attempted_at < now() - rescue_after`: at the lease's last instant the job
    stays claimed, a second later it is pending; the old holder's ack (`attempted_at` of its fetch) then
    matches nothing, and the new holder's does."""
    oban.reset(runs.TIMING.start, 30)
    job = oban.enqueue()
    first = oban.fetch()
    assert first is not None and first.job == job and oban.fetch() is None
    oban.advance(30)
    oban.rescue()
    assert oban.rows()[job].status == "claimed"
    oban.advance(1)
    oban.rescue()
    assert oban.rows()[job].status == "pending"
    second = oban.fetch()
    assert second is not None and second.job == job
    assert oban.complete(first.handle, "finished") is Answer.REFUSED and oban.rows()[job].status == "claimed"
    assert oban.complete(second.handle, "failed") is Answer.APPLIED and oban.rows()[job].status == "failed"
    assert oban.complete(second.handle, "finished") is Answer.REFUSED  # a job's worker returns once


def test_a_holder_whose_lease_ran_out_still_completes_until_a_rescue(oban: Any) -> None:
    """No deadline: the ack is fenced by the attempt, not by the time."""
    oban.reset(runs.TIMING.start + dt.timedelta(days=1), 30)
    job = oban.enqueue()
    held = oban.fetch()
    assert held is not None
    oban.advance(120)
    assert oban.complete(held.handle, "finished") is Answer.APPLIED and oban.rows()[job].status == "finished"


def test_without_python_3_12_or_newer_the_subject_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oban_queue, "MINIMUM", (99, 0))
    with pytest.raises(SubjectUnavailable, match=r"oban needs Python 3\.12 or newer"):
        oban_queue.interpreter()
