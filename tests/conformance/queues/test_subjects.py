"""Subjects from outside the package: `leaseproof guarantees` judges a queue adapter of the user's own,
named as `--subject MODULE:CLASS` (found in the current folder) or registered by an installed
distribution in the `leaseproof.subjects` entry-point group. The example subject
(docs/examples/queue-subject/, a lease queue on PostgreSQL) holds every guarantee; a variant of
it whose completion is not fenced is caught, and its trace replays from the folder it was judged in."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from helpers import REPO, leaseproof

from leaseproof.conformance.frontends import cli
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.queues import matrix
from leaseproof.model.queue import Guarantee

EXAMPLE = REPO / "docs" / "examples" / "queue-subject"
MODULE = "leaseproof_example_queue"
BUDGET = ("--seed", "3", "--examples", "60", "--races", "10")

# The example queue with its completion unfenced: any holder that ever fetched the job settles it,
# whatever became of its lease (the bug class of procrastinate's finish by worker).
UNFENCED = f"""
from {MODULE} import ExampleQueue, Queue


class Unfenced(Queue):
    def complete(self, job: int, attempt: int, outcome: str) -> bool:
        done = self.conn.execute(
            "UPDATE example_jobs SET status = %s, lease_until = NULL WHERE id = %s AND status = 'claimed'",
            (outcome, job),
        )
        return done.rowcount == 1


class UnfencedQueue(ExampleQueue):
    name = "unfenced-example-queue"
    queue_class = Unfenced
"""


def _row(out: str, subject: str) -> dict[Guarantee, str]:
    """The matrix's column of `subject` (the only column), by guarantee."""
    lines = out.splitlines()
    assert lines[0] == f"| guarantee | {subject} |", out
    cells = {}
    for line in lines[2 : 2 + len(Guarantee)]:
        guarantee, verdict = (cell.strip() for cell in line.strip("|").split("|"))
        cells[Guarantee(guarantee)] = verdict
    return cells


def _folder(tmp_path: Path) -> Path:
    """A copy of the example subject's folder, as a user's checkout of their queue would be."""
    folder = tmp_path / "myqueue"
    shutil.copytree(EXAMPLE, folder)
    return folder


def test_a_subject_named_by_module_and_class_is_judged_from_the_current_folder(
    pg_server: Server, tmp_path: Path
) -> None:
    folder = _folder(tmp_path)
    done = leaseproof("guarantees", "--subject", f"{MODULE}:ExampleQueue", *BUDGET, "--dsn", pg_server.dsn, cwd=folder)
    assert done.returncode == 0, done.stderr
    assert _row(done.stdout, "example-queue (1.0.0)") == dict.fromkeys(Guarantee, "holds")
    assert "example-queue (1.0.0): capabilities deadline, fail, heartbeat, rescue; 60 programs" in done.stdout


def test_a_subject_an_installed_distribution_registers_is_judged_by_its_name(pg_server: Server, tmp_path: Path) -> None:
    """The entry point is read from the distribution's metadata (a dist-info folder, as pip writes
    it), from a folder that is not the module's: only the entry point can have found it."""
    site = tmp_path / "site"
    dist = site / "leaseproof_example_queue-1.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: leaseproof-example-queue\nVersion: 1.0.0\n")
    (dist / "entry_points.txt").write_text(
        f"[leaseproof.subjects]\nexample-queue = {MODULE}:ExampleQueue\npgqueuer = {MODULE}:ExampleQueue\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": f"{site}:{EXAMPLE}"}
    done = leaseproof("guarantees", "--subjects", "example-queue", *BUDGET, "--dsn", pg_server.dsn,
                      "--traces", str(tmp_path / "traces"), cwd=elsewhere, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _row(done.stdout, "example-queue (1.0.0)") == dict.fromkeys(Guarantee, "holds")
    # A name a distribution claims beside a built-in subject is refused, naming both.
    clash = leaseproof("guarantees", "--subjects", "pgqueuer", "--dsn", pg_server.dsn, cwd=elsewhere, env=env)
    assert clash.returncode == 2 and clash.stdout == "", clash.stderr
    assert "subject 'pgqueuer' is claimed twice" in clash.stderr
    assert f"{MODULE}:ExampleQueue (entry point of leaseproof-example-queue)" in clash.stderr


def test_a_broken_subject_from_outside_is_caught_and_its_trace_replays(pg_server: Server, tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "unfenced.py").write_text(UNFENCED)
    done = leaseproof("guarantees", "--subject", "unfenced:UnfencedQueue", *BUDGET, "--dsn", pg_server.dsn, cwd=folder)
    assert done.returncode == 0, done.stderr  # another queue's violations are findings, not failures
    row = _row(done.stdout, "unfenced-example-queue (1.0.0)")
    assert row[Guarantee.NO_STALE_COMPLETION] == row[Guarantee.EXPIRED_CANNOT_COMPLETE] == "violated", row
    assert row[Guarantee.NO_DOUBLE_CLAIM] == row[Guarantee.NO_STALE_HEARTBEAT] == "holds", row
    trace = folder / "guarantee-traces" / "unfenced-example-queue--no-stale-completion.json"
    body = json.loads(trace.read_text())
    assert (body["subject"], body["source"]) == ("unfenced-example-queue", "unfenced:UnfencedQueue")
    again = leaseproof("guarantees", "--replay", str(trace), "--dsn", pg_server.dsn, cwd=folder)
    assert again.returncode == 1, again.stderr
    assert "reproduced: unfenced-example-queue (1.0.0) breaks no-stale-completion" in again.stdout


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ("nosuch:Queue", "nosuch:Queue (--subject, nosuch:Queue): cannot load it: No module named 'nosuch'"),
        (f"{MODULE}:NoSuchClass", f"cannot load it: module '{MODULE}' has no attribute 'NoSuchClass'"),
        (f"{MODULE}:Queue", f"{MODULE}:Queue is not a QueueAdapter: it has no reset, advance, rows, session"),
        (f"{MODULE}:SCHEMA", f"{MODULE}:SCHEMA is not a QueueAdapter: it is not a class"),
    ],
)
def test_a_subject_that_cannot_be_loaded_is_a_usage_error_before_anything_starts(
    subject: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["guarantees", "--subject", subject, "--dsn", "host=/nonexistent"])
    assert cli.load("guarantees").command(args, out, err) == 2
    assert out.getvalue() == "" and problem in err.getvalue(), err.getvalue()


# The example queue as a library that reads the time with CURRENT_TIMESTAMP, not now(): a keyword
# PostgreSQL binds to pg_catalog, which no search path moves.
KEYWORDS = f"""
from typing import Any

from {MODULE} import ExampleQueue, Queue


class _SaysCurrentTimestamp:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = None) -> Any:
        return self.conn.execute(sql.replace("now()", "CURRENT_TIMESTAMP"), params)

    def transaction(self) -> Any:
        return self.conn.transaction()

    def close(self) -> None:
        self.conn.close()


class KeywordQueue(Queue):
    def __init__(self, dsn: str, lease_seconds: int) -> None:
        super().__init__(dsn, lease_seconds)
        self.conn = _SaysCurrentTimestamp(self.conn)


class Declared(ExampleQueue):
    name = "keyword-queue"
    queue_class = KeywordQueue
    clock_keywords = True


class Undeclared(Declared):
    clock_keywords = False
"""


def test_a_subject_whose_sql_says_current_timestamp_is_judged_on_the_pinned_clock_when_it_asks(
    pg_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Declared (`clock_keywords = True`), its clients connect through the proxy that makes the
    keyword over: the pinned clock moves it, and it holds what the example holds. Undeclared, its
    leases never run out as the profile's clock moves, and the profile says so."""
    (tmp_path / "keywords.py").write_text(KEYWORDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    verdicts = {}
    for name in ("Declared", "Undeclared"):
        with matrix.subject(pg_server, f"keywords:{name}") as opened:
            row = matrix.judge_subject(opened.queue, seed=3, examples=40, races=0, traces=tmp_path / name)
        verdicts[name] = {cell.guarantee: cell.verdict for cell in row.cells}
    holds = {g: "inconclusive" if g is Guarantee.COMPLETION_RACING_RESCUE else "holds" for g in Guarantee}
    assert verdicts["Declared"] == holds, verdicts["Declared"]
    assert verdicts["Undeclared"][Guarantee.EXPIRED_CANNOT_COMPLETE] == "violated", verdicts["Undeclared"]
