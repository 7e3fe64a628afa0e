"""chancy (`subjects/chancy_queue.py`) judged by the lease-queue profile on a real server.

Over seeds 1 to 3 at the default budget (500 programs, 100 rounds of each race, half with a cut
connection) chancy 0.26.0 held every guarantee it can be judged on; the two a deadline needs are
not applicable. The race of two rescues and a fetch breaks rescue-only-expired rarely (3 of about
5,000 rounds measured): a `Recovery` sweep whose statement began before the job was rescued and
fetched again takes the new holder's live lease. What decides it happens inside that statement,
which a replay cannot hold at the wire; the last test makes the interleaving certain.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.queues import matrix
from leaseproof.conformance.queues.subjects import make
from leaseproof.conformance.queues.subjects.chancy_queue import ChancyClient
from leaseproof.model.queue import Answer, Guarantee, Seen

SUBJECT = "leaseproof.conformance.queues.subjects.chancy_queue:ChancyQueue"
SEED = 20261204
NOT_APPLICABLE = {Guarantee.EXPIRED_CANNOT_RENEW, Guarantee.EXPIRED_CANNOT_COMPLETE}  # no deadline


@pytest.fixture
def chancy(pg_server: Server) -> Iterator[Any]:
    with make(SUBJECT, lambda: scratch_database(pg_server, prefix="lp_queue")) as queue:
        yield queue


def test_chancy_holds_every_guarantee_it_can_be_judged_on(chancy: Any, tmp_path: Path) -> None:
    """Scenarios, programs and a few rounds of the races whose verdict is steady (the race of two
    rescues and a fetch is the next tests')."""
    races_of = frozenset({Guarantee.COMPLETION_RACING_RESCUE, Guarantee.NO_DOUBLE_CLAIM})
    row = matrix.judge_subject(chancy, seed=SEED, examples=80, races=10, races_of=races_of, traces=tmp_path)
    verdicts = {cell.guarantee: cell.verdict for cell in row.cells}
    assert verdicts == {g: "n/a" if g in NOT_APPLICABLE else "holds" for g in Guarantee}, row.cells
    assert row.programs == 80 and not list(tmp_path.glob("*.json"))


def test_a_holder_is_fenced_by_its_claim_and_its_workers_heartbeat(chancy: Any) -> None:
    """What each verdict rests on: a rescue takes a job once its worker's heartbeat is older than
    the lease, not at the instant it ends; the old holder's heartbeat and completion then change
    nothing, the new holder's apply."""
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    chancy.reset(start, 30)
    job = chancy.enqueue()
    first = chancy.fetch()
    assert first is not None and first.job == job and chancy.fetch() is None
    chancy.advance(30)
    chancy.rescue()
    assert chancy.rows() == {job: Seen("claimed")}  # the lease's last instant: still live
    chancy.advance(1)
    chancy.rescue()
    assert chancy.rows() == {job: Seen("pending")}
    second = chancy.fetch()
    assert second is not None and second.job == job
    assert chancy.heartbeat(first.handle) is Answer.REFUSED
    assert chancy.complete(first.handle, "finished") is None and chancy.rows() == {job: Seen("claimed")}
    assert chancy.heartbeat(second.handle) is Answer.APPLIED
    chancy.complete(second.handle, "finished")
    assert chancy.rows() == {job: Seen("finished")}


# The clock, made to wait for the test's go in a connection that asks for it. VOLATILE: the planner
# would evaluate a stable now() to estimate a plan, before the statement's snapshot.
STALL = """
    CREATE OR REPLACE FUNCTION lpclock.now() RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        IF current_setting('leaseproof.stall', true) = 'on' THEN  -- wait for the test's go
            PERFORM pg_advisory_lock_shared(4242);
            PERFORM pg_advisory_unlock_shared(4242);
        END IF;
        RETURN coalesce((SELECT at FROM lpclock.pinned), pg_catalog.now());
    END $$
"""


def test_a_recovery_sweep_that_began_before_a_job_was_rescued_and_fetched_takes_the_new_lease(chancy: Any) -> None:
    """The race of two rescues and a fetch, made certain. Recovery's one statement
    (chancy/plugins/recovery.py, `recover`) picks running jobs whose worker has no fresh row in
    `chancy_workers` (`NOT EXISTS ... last_seen >= NOW() - interval`) `FOR UPDATE OF cj SKIP
    LOCKED`. Under READ COMMITTED, a sweep whose statement began before another sweep rescued the
    job and a new worker announced itself and fetched it locks the job's newest row, rechecks
    `state = 'running'` on it (true again), but reads `chancy_workers` as of its start, where the
    new worker is not: it sets the job, under a live lease, back to pending. Here the late sweep's
    connection waits inside its first `now()` (the clock is made to wait for the test's go there)."""
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    chancy.reset(start, 30)
    job = chancy.enqueue()
    first = chancy.fetch()
    assert first is not None
    chancy.advance(31)  # the first holder's lease ran out
    chancy.sql.execute(STALL)
    options = conninfo_to_dict(chancy.dsn).get("options") or ""
    stalled = ChancyClient(make_conninfo(chancy.dsn, options=f"{options} -c leaseproof.stall=on"), 30)
    gate = psycopg.connect(chancy.dsn, autocommit=True)
    gate.execute("SELECT pg_advisory_lock(4242)")
    sweep = threading.Thread(target=stalled.rescue, daemon=True)
    try:
        sweep.start()
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        for _ in range(500):  # bounded: until the late sweep waits in its statement
            if gate.execute(waiting).fetchone() == (1,):
                break
            threading.Event().wait(0.01)
        else:
            pytest.fail("the late sweep never reached its now()")
        chancy.rescue()  # another sweep takes the expired job
        assert chancy.rows() == {job: Seen("pending")}
        second = chancy.fetch()  # a new worker announces itself and fetches it: a live lease
        assert second is not None and second.job == job and chancy.rows() == {job: Seen("claimed")}
        gate.execute("SELECT pg_advisory_unlock(4242)")
        sweep.join(30)
        assert not sweep.is_alive()
    finally:
        gate.close()
        stalled.close()
    assert chancy.rows() == {job: Seen("pending")}  # the late sweep took the live lease
    assert chancy.heartbeat(second.handle) is Answer.REFUSED
