"""The report pages (conformance/report/), each written from real runs on the test
server: a shipped mutant's counterexample, a race mutant's failing stress run, a
linearizable history, a replay batch and the kill matrix. Each is read back as
markup, and the counterexample's and the stress failure's also in real headless
Chromium: the DOM after the page's own script ran, and a screenshot that must not
be blank. Chromium is required, not optional: without it the browser tests fail
and say how to install it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from browser import assert_not_blank, page, rendered, screenshot
from helpers import REPO

from leaseproof.conformance.concurrent.explain import violation_sentence
from leaseproof.conformance.concurrent.history import Barrier, History, Operation
from leaseproof.conformance.concurrent.linearizability import check
from leaseproof.conformance.concurrent.models import SPECS
from leaseproof.conformance.concurrent.stress import StressReport
from leaseproof.conformance.evidence.killmatrix import run_matrix, select
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.verify import Verdict
from leaseproof.conformance.report import (
    ReplayResult,
    run_trace,
    write_counterexample_report,
    write_history_report,
    write_matrix_report,
    write_replay_report,
    write_stress_report,
)
from leaseproof.conformance.traces.trace import read, trace_of
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS
from leaseproof.model import delivery as d

SEQUENTIAL_MUTANT = "reconcile-unfenced"
STATE_MUTANT = "reap-keeps-generation"  # its counterexample is a state difference, not an outcome

# -- the counterexample ----------------------------------------------------------------------


def _counterexample_page(verdict: Verdict, dsn: str, folder: Path) -> Path:
    """The page `verify --mutant reconcile-unfenced --report DIR` writes: the trace run again on the mutant."""
    adapter = by_name(MUTANTS, SEQUENTIAL_MUTANT).adapter(dsn)
    try:
        return write_counterexample_report(folder, verdict, machine="delivery", implementation=adapter)
    finally:
        adapter.close()


def test_a_counterexample_page_shows_every_step_and_the_rows_the_failing_step_touched(
    counterexample: Verdict, delivery_dsn: str, tmp_path: Path
) -> None:
    path = _counterexample_page(counterexample, delivery_dsn, tmp_path)
    assert path == tmp_path / f"counterexample-delivery-{counterexample.seed}.html"
    dom = page(path)
    trace = trace_of(counterexample.recorded)
    assert trace is not None
    steps = dom.find("details", "step")
    assert len(steps) == len(trace.steps)
    diverged = dom.find("details", "diverged")
    assert len(diverged) == 1, "the lockstep stops at its first divergence, and so does the page"
    failing = diverged[0]
    number = int(failing.attrs["data-step"])
    command = trace.steps[number - 1].command
    # The step verify names ("outcome mismatch for Finish(...)") is the one the page marks.
    assert w.describe(command) in counterexample.failure.splitlines()[0]
    assert "open" in failing.attrs
    # Its outcomes, model's against implementation's, and the row it touched, on three sides.
    assert "LeaseLost()" in failing.text and "AlreadyTerminal(status=failed)" in failing.text
    tables = dom.find("table", "rows", within=failing)
    headers = [th.text for table in tables for th in dom.find("th", within=table)]
    assert "delivery R1/s1/T2 of community A" in headers
    assert {"before", "model after", "implementation after"} <= set(headers)
    assert "generation" in {td.text for td in dom.find("td", within=tables[0])}
    # Every step before it agreed; none after it was sent.
    assert all("unsent" not in s.classes() and "diverged" not in s.classes() for s in steps[: number - 1])
    assert all("unsent" in s.classes() for s in steps[number:])
    explanation = dom.by_id("explanation").text
    assert f"step {number}" in explanation and "LeaseLost" in explanation and "AlreadyTerminal" in explanation
    assert counterexample.counterexample.splitlines()[0] in dom.by_id("program").text


def test_without_the_implementation_the_page_shows_the_model_side_and_says_so(
    counterexample: Verdict, tmp_path: Path
) -> None:
    dom = page(write_counterexample_report(tmp_path, counterexample, machine="delivery"))
    steps = dom.find("details", "step")
    assert steps and all("unsent" in s.classes() for s in steps)
    assert dom.find("details", "diverged") == []
    assert "model's side" in dom.by_id("explanation").text
    assert "outcome mismatch" in dom.by_id("failure").text  # verify's own text is kept


def test_a_replay_page_marks_the_fields_an_implementation_gets_wrong(delivery_dsn: str, tmp_path: Path) -> None:
    """`replay` of two corpus traces against `reap-keeps-generation`: its own trace fails on a
    row's generation (a state difference, marked field by field), the other one passes."""
    corpus = REPO / "conformance" / "traces" / "corpus"
    adapter = by_name(MUTANTS, STATE_MUTANT).adapter(delivery_dsn)
    try:
        results = []
        for name in (STATE_MUTANT, "claim-newest-first"):
            run = run_trace(read(corpus / f"{name}.jsonl"), adapter)
            status = "FAIL" if run.first_divergence is not None else "pass"
            results.append(ReplayResult(corpus / f"{name}.jsonl", status, run=run))
    finally:
        adapter.close()
    assert [r.status for r in results] == ["FAIL", "pass"]
    dom = page(write_replay_report(tmp_path, results, subject=adapter.name))
    rows = dom.find("tr")
    assert [r.attrs.get("data-status") for r in rows if "data-status" in r.attrs] == ["FAIL", "pass"]
    failing = dom.find("details", "diverged")
    assert len(failing) == 1
    fields = {}
    for tr in dom.find("tr", within=failing[0]):
        cells = dom.find("td", within=tr)
        if cells:
            fields[cells[0].text] = cells
    generation = fields["generation"]  # before, model after, implementation after
    assert "differs" in generation[-1].classes() and "differs" not in generation[2].classes()
    assert generation[2].text != generation[3].text
    assert all("differs" not in cells[-1].classes() for name, cells in fields.items() if name in ("target", "id"))
    assert dom.by_id("trace-1").text.count("agreed with the model at every step") == 1


# -- stress ---------------------------------------------------------------------------------


def test_a_stress_failure_page_explains_the_violation_and_draws_the_lease_timeline(
    race: StressReport, tmp_path: Path
) -> None:
    assert race.finding is not None and race.finding.result.violation is not None
    violation, history = race.finding.result.violation, race.finding.history
    dom = page(write_stress_report(tmp_path, race, subject="postgres:ClaimReadThenUpdate"))
    sentence = dom.by_id("explanation").text
    assert sentence == violation_sentence(violation, SPECS["delivery"], history)
    # Whatever the race did this time, the sentence names a claim whose outcome is needed, by its client.
    needed = [op for op in violation.operations if op.id not in violation.forgotten and not op.indeterminate]
    assert "claim" in sentence and any(f"({op.client})" in sentence for op in needed), sentence
    piece = dom.by_id("piece-timeline")
    assert len(dom.find("g", "operation", within=piece)) == len(violation.operations)
    assert dom.find("rect", "failing", within=piece), "the operation no order gets past is not marked"
    whole = dom.by_id("history-timeline")
    assert len(dom.find("g", "operation", within=whole)) == len(history)
    claimed = sum(isinstance(op.outcome, d.Claimed) for op in history)
    assert claimed and len(dom.find("g", "lease-interval", within=whole)) == claimed
    moves = sum(isinstance(op.command, d.AdvanceClock) for op in history)
    assert len(dom.find("line", "clock-move", within=whole)) == moves
    assert dom.find("g", "generation", within=whole), "the rows' generations are not drawn"
    shaded = dom.find("rect", "epoch-failed", within=whole)
    assert [r.attrs["data-epoch"] for r in shaded] == [str(violation.epoch)]
    order = dom.by_id("partial-order")
    assert dom.find("li", "failing", within=order)


def test_a_linearizable_history_page_numbers_every_operation_in_the_order_found(
    linearizable: tuple[History, object], tmp_path: Path
) -> None:
    history, result = linearizable
    dom = page(write_history_report(tmp_path, history, check(history, SPECS["delivery"])))
    assert dom.by_id("verdict").text == "LINEARIZABLE"
    assert [e for e in dom.elements if e.attrs.get("id") == "explanation"] == []
    timeline = dom.by_id("history-timeline")
    numbered = [t for t in dom.find("text", "order", within=timeline) if t.text.startswith("#")]
    listed = [li for ol in dom.find("ol", "order") for li in dom.find("li", within=ol)]
    assert len(listed) == len(history), "every operation has its place in an order"
    assert 0 < len(numbered) <= len(history)
    assert result is not None


def _stale_finish_history() -> History:
    """A holder's lease expires and a reap takes the row back; then the stale holder's
    finish is accepted. The model refuses it (LeaseLost), so no order explains it."""
    binding = w.binding("A", "W1", "R1", "s1", "T1", "D1", "M1", "event:E1")
    delivery = w.delivery_id(w.FRESH, "R1", "s1", "T1")
    state = d.initial_state(w.START)
    ops: list[Operation] = []
    barriers: list[Barrier] = []
    tick = 0

    def run(client: str, command: d.Command, outcome: object | None = None) -> object:
        nonlocal state, tick
        state, answer = d.step(state, command)
        tick += 2
        ops.append(Operation(len(ops) + 1, client, command, answer if outcome is None else outcome, tick - 1, tick))
        return answer

    a, workflow, run_id = w.COMMUNITIES["A"], w.WORKFLOWS["W1"], w.RUNS["R1"]
    commit = d.CommitDeliveries(a, run_id, w.STEPS["s1"], (d.NewDelivery(delivery, binding),))
    prefix: tuple[d.Command, ...] = (
        d.CreateCommunity(a), d.CreateWorkflow(a, workflow), d.CreateRun(a, workflow, run_id),
        d.PublishEvent(a, w.MESSAGES["M1"]), commit,
    )  # fmt: skip
    for command in prefix:
        run("prefix", command)
    claimed = run("w1", d.Claim(a, w.TARGETS["T1"], 30))
    assert isinstance(claimed, d.Claimed)
    tick += 1
    barriers.append(Barrier(tick, state))
    run("coordinator", d.AdvanceClock(dt.timedelta(seconds=60)))
    tick += 1
    barriers.append(Barrier(tick, state))
    assert run("w2", d.Reap()) == d.Reaped(1)
    assert run("w1", d.Finish(claimed.lease, d.Status.FINISHED), d.Settled(d.Status.FINISHED)) == d.LeaseLost()
    barriers.append(Barrier(tick + 1, state))  # the state read after: the row pending at generation 2
    return History("delivery", d.initial_state(w.START), tuple(ops), tuple(barriers))


def test_the_sentence_names_a_stale_finish_accepted_after_a_reap(tmp_path: Path) -> None:
    history = _stale_finish_history()
    result = check(history, SPECS["delivery"])
    assert result.violation is not None
    sentence = violation_sentence(result.violation, SPECS["delivery"], history)
    assert sentence == "finish of R1/s1/T1 at generation 1 accepted (w1) after reap moved the row to generation 2"
    dom = page(write_history_report(tmp_path, history, result))
    assert dom.by_id("explanation").text == sentence
    whole = dom.by_id("history-timeline")
    (reap,) = dom.find("g", "reap", within=whole)
    assert "reap → g2" in reap.text
    (lease,) = dom.find("g", "lease-interval", within=whole)
    assert "settled-late" in lease.classes(), "the finish after the lease ran out is not marked"
    assert len(dom.find("line", "clock-move", within=whole)) == 1


# -- the kill matrix --------------------------------------------------------------------------


def test_the_kill_matrix_page_links_each_counterexample(
    pg_server: Server, counterexample: Verdict, tmp_path: Path
) -> None:
    matrix = run_matrix(pg_server, select([SEQUENTIAL_MUTANT]), fast=True)
    assert matrix.rows and all(row.killed for row in matrix.rows)
    inline = page(write_matrix_report(tmp_path, matrix, filename="inline.html"))
    rows = [tr for tr in inline.find("tr") if "data-mutant" in tr.attrs]
    assert len(rows) == len(matrix.rows)
    for tr in rows:
        (link,) = inline.find("a", "counterexample", within=tr)
        assert link.attrs["href"].startswith("#row-")
        assert SEQUENTIAL_MUTANT in inline.by_id(link.attrs["href"][1:]).text
    own = write_counterexample_report(tmp_path / "pages", counterexample, machine="delivery")
    linked = page(write_matrix_report(tmp_path, matrix, pages={SEQUENTIAL_MUTANT: own}))
    hrefs = {a.attrs["href"] for a in linked.find("a", "counterexample")}
    assert hrefs == {"pages/" + own.name} and (tmp_path / "pages" / own.name).is_file()


# -- in the browser -------------------------------------------------------------------------------


def test_the_counterexample_page_renders_in_headless_chromium(
    counterexample: Verdict, delivery_dsn: str, tmp_path: Path
) -> None:
    path = _counterexample_page(counterexample, delivery_dsn, tmp_path)
    dom = rendered(path, tmp_path)
    html = dom.find("html")[0]
    assert html.attrs.get("data-script") == "ran", "the page's script did not run"
    (failing,) = dom.find("details", "diverged")
    assert "open" in failing.attrs
    assert dom.find("table", "rows", within=failing), "the failing step's row diff is not in the rendered page"
    assert "LeaseLost" in dom.by_id("explanation").text
    assert_not_blank(screenshot(path, tmp_path))


def test_the_counterexample_page_opens_at_the_failing_step_with_a_lease_timeline(
    counterexample: Verdict, delivery_dsn: str, tmp_path: Path
) -> None:
    """In Chromium: the verdict shows the failing step first (its answers and rows) with a link
    to its place among the steps; the steps before it that agreed are folded into one line;
    the leases the program handed out are drawn, the failing step marked."""
    path = _counterexample_page(counterexample, delivery_dsn, tmp_path)
    dom = rendered(path, tmp_path)
    summary = dom.by_id("summary")
    (lead,) = dom.find("div", "failing-step", within=summary)
    (failing,) = dom.find("details", "diverged")
    number = int(failing.attrs["data-step"])
    assert f"{number}." in lead.text and "LeaseLost()" in lead.text and dom.find("table", "rows", within=lead)
    (link,) = dom.find("a", within=dom.by_id("explanation"))
    assert link.attrs["href"] == f"#step-{number}" and dom.by_id(f"step-{number}") is not None
    (setup,) = dom.find("details", "setup")
    folded = dom.find("details", "step", within=setup)
    assert int(setup.attrs["data-setup"]) == len(folded) == number - 3 > 0
    assert all("agrees" in step.text for step in folded)
    timeline = dom.by_id("lease-timeline")
    assert timeline.tag == "svg" and dom.find("rect", "lease", within=timeline), "no lease drawn"
    # The lease section comes right after the verdict, before the program and the steps.
    order = [section.attrs.get("id") for section in dom.find("section")]
    assert order.index("leases") == order.index("summary") + 1 < order.index("trace")
    assert_not_blank(screenshot(path, tmp_path))


def test_the_stress_failure_page_renders_its_lease_timeline_in_headless_chromium(
    race: StressReport, tmp_path: Path
) -> None:
    assert race.finding is not None and race.finding.result.violation is not None
    path = write_stress_report(tmp_path, race)
    dom = rendered(path, tmp_path)
    assert dom.find("html")[0].attrs.get("data-script") == "ran"
    whole = dom.by_id("history-timeline")
    assert whole.tag == "svg"
    # The page opens with what failed in view, however wide the history: the box scrolled to it.
    focus = float(whole.attrs["data-focus-x"])
    left, right = (int(v) for v in whole.attrs["data-in-view"].split())
    assert left <= focus <= right, (left, focus, right)
    assert float(whole.attrs["width"]) > right - left, "the history fits its box: this page shows no scrolling"
    assert dom.find("rect", "lease", within=whole), "no lease interval in the rendered timeline"
    assert len(dom.find("g", "operation", within=whole)) == len(race.finding.history)
    assert dom.find("rect", "op", within=dom.by_id("piece-timeline"))
    sentence = violation_sentence(race.finding.result.violation, SPECS["delivery"], race.finding.history)
    assert dom.by_id("explanation").text == sentence
    assert_not_blank(screenshot(path, tmp_path, size="1500,1600"))


def test_a_long_generated_name_is_cut_in_what_the_lanes_show() -> None:
    from leaseproof.conformance.report.timeline import LONG_NAME, shortened

    step = "a" * 64  # a generated step id, as long as one may be
    label = shortened(f"Commit(A, R1/{step}, T1)")
    assert label == f"Commit(A, R1/{'a' * (LONG_NAME - 1)}…, T1)"
    assert shortened("Claim(A, T2, 30s)") == "Claim(A, T2, 30s)"
