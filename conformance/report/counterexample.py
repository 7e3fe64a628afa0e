"""Pages for sequential evidence: a lockstep counterexample (`leaseproof verify`)
and a batch of replayed traces (`leaseproof replay`).

A `Verdict` carries its counterexample as a trace (the commands, with the
model's outcome and state after each), not the implementation's side of each
step. `run_trace` gets that side the way the lockstep got it: it resets an
implementation and sends it the trace's commands one at a time, reading its
full state after each, until the first step where it parts from the model. A
page then shows every step, and for each the rows it touched, before it, in
the model after it and in the implementation after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from leaseproof.conformance.concurrent.history import Barrier, History, Operation
from leaseproof.conformance.concurrent.models import SPECS as CONCURRENT_SPECS
from leaseproof.conformance.lockstep import world as w
from leaseproof.conformance.lockstep.rows import RowDiff, touched
from leaseproof.conformance.lockstep.verify import Verdict
from leaseproof.conformance.report import page
from leaseproof.conformance.report.timeline import Marks, timeline_svg
from leaseproof.conformance.traces.trace import SPECS, Trace, trace_of


@attrs.frozen
class StepRun:
    """One step of a trace, as the model took it and (if it was sent) as the implementation did."""

    number: int  # 1-based
    command: Any
    before: Any  # the model's state before the step
    model_outcome: Any
    model_state: Any
    recorded_outcome: Any  # what the trace recorded
    sent: bool  # the implementation was sent this step
    outcome: Any = None  # the implementation's answer, if sent
    state: Any = None  # its full state after the step, if read
    raised: str = ""  # what it raised instead of answering, or while its state was read

    @property
    def outcome_differs(self) -> bool:
        return self.sent and not self.raised and self.outcome != self.model_outcome

    @property
    def state_differs(self) -> bool:
        return self.sent and not self.raised and self.state is not None and self.state != self.model_state

    @property
    def diverged(self) -> bool:
        """The implementation parted from the model here: another answer, another state, or it raised."""
        return bool(self.raised) or self.outcome_differs or self.state_differs

    def rows(self) -> list[RowDiff]:
        return touched(self.command, self.before, self.model_state, self.state if self.sent else None)


@attrs.frozen
class TraceRun:
    """A trace's steps on the model and, up to its first divergence, on an implementation."""

    trace: Trace
    implementation: str  # the implementation's name; "" when only the model ran
    steps: tuple[StepRun, ...]

    @property
    def first_divergence(self) -> StepRun | None:
        return next((step for step in self.steps if step.diverged), None)


def run_trace(trace: Trace, implementation: Any | None = None) -> TraceRun:
    """The trace's steps on its machine's model, and on `implementation` (anything with
    `reset(start)`, `execute(command)`, `snapshot()` and a `name`: an adapter, an
    `--adapter-cmd` child's machine, a mutant's adapter) if given. The implementation
    is reset first and is sent each step until the first one at which its answer or
    its state differs from the model's, or it raises; the steps after it are the
    model's alone, as in the lockstep, which stops there too."""
    spec = SPECS[trace.machine]
    state = spec.initial_state(trace.start)
    live = implementation is not None
    steps = []
    if implementation is not None:
        implementation.reset(trace.start)
    for number, recorded in enumerate(trace.steps, 1):
        before = state
        state, outcome = spec.step(state, recorded.command)
        step = StepRun(number, recorded.command, before, outcome, state, recorded.outcome, sent=live)
        if live:
            assert implementation is not None
            step = _sent(step, implementation)
            live = not step.diverged
        steps.append(step)
    return TraceRun(trace, "" if implementation is None else str(getattr(implementation, "name", "")), tuple(steps))


def _sent(step: StepRun, implementation: Any) -> StepRun:
    try:
        outcome = implementation.execute(step.command)
    except Exception as exc:  # noqa: BLE001 - what it raised is the step's account
        return attrs.evolve(step, raised=f"{type(exc).__name__}: {exc}")
    try:
        snapshot = implementation.snapshot()
    except Exception as exc:  # noqa: BLE001 - the answer stands; its state could not be read
        return attrs.evolve(step, outcome=outcome, raised=f"its state could not be read: {type(exc).__name__}: {exc}")
    return attrs.evolve(step, outcome=outcome, state=snapshot)


# -- the markup -----------------------------------------------------------------------------


def _cell(fields: Any, name: str, css: str) -> str:
    if fields is None:
        return '<td class="absent">absent</td>'
    value = fields.get(name)
    if value is None:
        return '<td class="absent">-</td>'
    return f'<td class="{css}">{page.escape(value)}</td>' if css else f"<td>{page.escape(value)}</td>"


def row_table(diff: RowDiff) -> str:
    """One touched entity: a field per line, before / model after / implementation after.
    A field the implementation has otherwise than the model is marked `differs`; one the
    step changed, `changed`."""
    kind, name = diff.entity
    header = f"<tr><th>{page.escape(kind)} {page.escape(name)}</th><th>before</th><th>model after</th>"
    header += "<th>implementation after</th></tr>" if diff.implementation_known else "</tr>"
    lines = [header]
    absent = {"model": diff.model is None, "implementation": diff.implementation is None}
    if diff.before is None and diff.model is None and diff.implementation is None:
        return ""
    for field in diff.fields():
        b = (diff.before or {}).get(field)
        m = (diff.model or {}).get(field)
        i = (diff.implementation or {}).get(field)
        changed = "changed" if m != b else ""
        cells = [f"<td>{page.escape(field)}</td>", _cell(diff.before, field, ""), _cell(diff.model, field, changed)]
        if diff.implementation_known:
            differs = i != m or absent["model"] != absent["implementation"]
            cells.append(_cell(diff.implementation, field, "differs" if differs else ("changed" if i != b else "")))
        lines.append("<tr" + (' class="differs"' if diff.differs else "") + ">" + "".join(cells) + "</tr>")
    marker = ' data-differs="yes"' if diff.differs else ""
    return f'<table class="rows"{marker}>' + "".join(lines) + "</table>"


def _describe(value: Any) -> str:
    return w.describe(value)


def _step_markup(step: StepRun, open_it: bool, *, lead: bool = False) -> str:
    if step.diverged:
        badge, css = '<span class="badge bad">diverged</span>', "step diverged"
    elif step.sent:
        badge, css = '<span class="badge good">agrees</span>', "step"
    else:
        badge, css = '<span class="badge">model only</span>', "step unsent"
    summary = f"{badge} <b>{step.number}.</b> <code>{page.escape(_describe(step.command))}</code>"
    outcomes = [f"<tr><td>model</td><td><code>{page.escape(_describe(step.model_outcome))}</code></td></tr>"]
    if step.sent:
        said = step.raised or _describe(step.outcome)
        tone = ' class="differs"' if step.raised or step.outcome_differs else ""
        outcomes.append(f"<tr><td>implementation</td><td{tone}><code>{page.escape(said)}</code></td></tr>")
    if step.recorded_outcome != step.model_outcome:
        outcomes.append(
            f'<tr><td>recorded in the trace</td><td class="differs"><code>'
            f"{page.escape(_describe(step.recorded_outcome))}</code></td></tr>"
        )
    body = '<table class="outcomes">' + "".join(outcomes) + "</table>"
    diffs = [row_table(diff) for diff in step.rows()]
    diffs = [table for table in diffs if table]
    if diffs:
        body += "<h3>rows the step touched</h3>" + "".join(diffs)
    else:
        body += "<p>the step touched no row</p>"
    if lead:  # the copy the verdict shows first, not one of the steps
        return f'<div class="failing-step" id="failing-step"><div class="head">{summary}</div>{body}</div>'
    state = "open" if open_it else ""
    inner = f'<summary>{summary}</summary><div class="body">{body}</div>'
    return f'<details class="{css}" id="step-{step.number}" data-step="{step.number}" {state}>{inner}</details>'


def steps_markup(run: TraceRun) -> str:
    """Every step of a run; the first divergence and the two steps before it are open, and the
    steps before those, which agreed with the model, are folded into one line."""
    diverged = run.first_divergence
    at = diverged.number if diverged is not None else None
    shown = [_step_markup(s, at is not None and at - 2 <= s.number <= at) for s in run.steps]
    setup = 0 if at is None else max(0, at - 3)
    items = shown[setup:]
    if setup:
        folded = (
            f'<details class="setup" data-setup="{setup}"><summary>steps 1 to {setup}: the set-up, '
            f"each agreeing with the model</summary>{''.join(shown[:setup])}</details>"
        )
        items = [folded, *items]
    legend = (
        '<div class="legend"><span><i style="background:var(--warn-bg)"></i>changed by the step</span>'
        '<span><i style="background:var(--bad-bg)"></i>the implementation differs from the model</span></div>'
    )
    return legend + f'<div id="steps" data-steps="{len(run.steps)}">' + "".join(items) + "</div>"


def lease_timeline(run: TraceRun) -> str:
    """The delivery machine's steps drawn as the stress pages draw a history: one lane for the
    program, and below it one lane per delivery row with each lease a claim handed out, the
    renewals, the finish, the reap, and the row's generation and status after every step (as
    the implementation had it while it was sent, then the model's). '' for another machine."""
    if run.trace.machine != "delivery" or not run.steps:
        return ""
    operations, barriers = [], []
    for step in run.steps:
        answered = step.outcome if step.sent and not step.raised else step.model_outcome
        tick = 3 * step.number
        operations.append(Operation(step.number, "program", step.command, answered, tick - 2, tick - 1))
        barriers.append(Barrier(tick, step.state if step.sent and step.state is not None else step.model_state))
    history = History("delivery", run.steps[0].before, tuple(operations), tuple(barriers))
    failing = frozenset({run.first_divergence.number}) if run.first_divergence is not None else frozenset()
    marks = Marks(order={step.number: str(step.number) for step in run.steps}, failing=failing)
    return timeline_svg(history, CONCURRENT_SPECS["delivery"], marks, element_id="lease-timeline")


def _divergence_sentence(run: TraceRun, why_not_run: str = "") -> str:
    step = run.first_divergence
    if step is None:
        if not run.implementation:
            why = f" ({why_not_run})" if why_not_run else ""
            return (
                f"the implementation was not run again for this page{why}: the steps show the model's side, "
                "without the implementation's rows"
            )
        return f"{run.implementation} agreed with the model at every step of this trace when it ran again"
    what = _describe(step.command)
    if step.raised:
        return f"step {step.number}, {what}: the implementation raised {step.raised}"
    if step.outcome_differs:
        return (
            f"step {step.number}, {what}: the model answers {_describe(step.model_outcome)}, "
            f"the implementation answered {_describe(step.outcome)}"
        )
    differing = [diff.entity for diff in step.rows() if diff.differs]
    rows = ", ".join(f"{kind} {name}" for kind, name in differing) or "its state"
    return f"step {step.number}, {what}: both answered {_describe(step.model_outcome)}, but {rows} differs"


# -- the pages ------------------------------------------------------------------------------


def counterexample_page(
    verdict: Verdict, run: TraceRun | None, *, machine: str, subject: str, why_not_run: str = ""
) -> str:
    """The markup of a lockstep counterexample's page. `why_not_run`: why the implementation
    was not run again for it, when it was not."""
    sections = []
    if verdict.conforms:
        badge = page.verdict_badge("CONFORMS: no counterexample", "good")
    elif verdict.fault:
        badge = page.verdict_badge("NONE: the adapter failed, so nothing was judged", "warn")
    else:
        badge = page.verdict_badge("DOES NOT CONFORM", "bad")
    figures = [("machine", machine), ("seed", verdict.seed), ("seconds", f"{verdict.seconds:.1f}")]
    coverage = verdict.coverage
    figures.append(("fixed scenarios run", coverage.scenarios))
    if coverage.first_failure == 0:
        figures.append(("programs generated", "none: a fixed scenario failed first"))
    elif coverage.first_failure is not None:
        figures.append(("first failure in program", coverage.failed_in))
        figures.append(("programs run to shrink it", coverage.shrink_attempts))
    else:
        figures.append(("programs generated", coverage.counted))
    if coverage.first_failure != 0:
        figures.append(("programs sent, shrinking included", coverage.examples))
    figures.append(("steps", coverage.steps))
    summary = page.facts(figures)
    if run is not None and not verdict.conforms:
        sentence = _divergence_sentence(run, why_not_run)
        go = ""
        if run.first_divergence is not None:
            number = run.first_divergence.number
            go = f' <a id="to-failing-step" href="#step-{number}">step {number} among the steps</a>'
        summary += f'<p class="explanation" id="explanation">{page.escape(sentence)}{go}</p>'
        if run.first_divergence is not None:  # the page opens on it: its answers and rows, first
            summary += _step_markup(run.first_divergence, True, lead=True)
    if verdict.shrink_stopped:
        summary += (
            f"<p>shrinking stopped early, {page.escape(verdict.shrink_stopped)}: the program may not be minimal</p>"
        )
    sections.append(page.section("verdict", summary, "summary"))
    if run is not None and (drawn := lease_timeline(run)):
        sections.append(page.section("leases, step by step", f'<div class="scroll">{drawn}</div>', "leases"))
    if verdict.fault:
        sections.append(
            page.section("the fault", page.preformatted(verdict.fault + "\n" + "\n".join(verdict.fault_program)))
        )
    if verdict.counterexample:
        sections.append(
            page.section(
                verdict.counterexample_heading(),
                page.preformatted(verdict.counterexample),
                "program",
            )
        )
    if run is not None:
        who = run.implementation or "(the model alone)"
        intro = (
            f"<p>{len(run.steps)} steps of the trace, each sent to {page.escape(who)} until the first divergence"
            " and compared with the model: its answer, and every row the step touched.</p>"
        )
        sections.append(page.section("steps", intro + steps_markup(run), "trace"))
    if verdict.failure:
        sections.append(
            page.section("what went wrong, as verify prints it", page.preformatted(verdict.failure), "failure")
        )
    return page.render(f"leaseproof verify: the {machine} machine", subject, badge, sections, "counterexample")


def write_counterexample_report(
    directory: Path | str,
    verdict: Verdict,
    *,
    machine: str,
    implementation: Any | None = None,
    subject: str = "",
    filename: str | None = None,
    why_not_run: str = "",
) -> Path:
    """Write the page of one `verify` verdict (from `run_conformance`) into `directory`, and
    return its path (`counterexample-MACHINE-SEED.html` unless `filename` is given).

    `implementation`: an adapter of the same implementation, directly callable (not the
    `ForkedAdapter` the lockstep drove; `verify --report` builds a second adapter of the
    same implementation with `adapter_named(args, machine, provisioned, out)`, without
    `lockstep`, on a fresh database), on a database it may reset. The counterexample trace is
    run again on it to show its side of every step; without it the page shows the
    model's side and verify's failure text, and says so (with `why_not_run`, why). The
    caller closes it."""
    run = None
    if (trace := trace_of(verdict.recorded)) is not None:
        run = run_trace(trace, implementation)
    name = subject or (run.implementation if run is not None else "")
    markup = counterexample_page(verdict, run, machine=machine, subject=name, why_not_run=why_not_run)
    return page.write(directory, filename or f"counterexample-{machine}-{verdict.seed}.html", markup)


# -- replay -----------------------------------------------------------------------------------

PASSED, FAILED, XFAIL, XPASS, NOT_APPLICABLE, FAULT = "pass", "FAIL", "xfail", "XPASS", "n/a", "FAULT"
_TONES = {PASSED: "good", XFAIL: "warn", NOT_APPLICABLE: "warn", FAILED: "bad", XPASS: "bad", FAULT: "bad"}


@attrs.frozen
class ReplayResult:
    """One trace file of a `leaseproof replay` batch: how it ended (`PASSED`, `FAILED`, `XFAIL`,
    `XPASS`, `NOT_APPLICABLE`, `FAULT`, the words replay prints), what replay printed of it
    (the divergence's report, the fault, what it needs), and its steps, if run for the page."""

    path: Path
    status: str = attrs.field(validator=attrs.validators.in_(_TONES))
    detail: str = ""
    run: TraceRun | None = None


def replay_page(results: Sequence[ReplayResult], *, subject: str) -> str:
    counts = {status: sum(r.status == status for r in results) for status in _TONES}
    bad = counts[FAILED] + counts[XPASS] + counts[FAULT]
    badge = page.verdict_badge(
        f"{counts[PASSED] + counts[XFAIL]} passed, {bad} failed"
        + (f", {counts[NOT_APPLICABLE]} n/a" if counts[NOT_APPLICABLE] else ""),
        "bad" if bad else "warn" if counts[NOT_APPLICABLE] else "good",
    )
    lines = ["<tr><th>trace</th><th>machine</th><th>steps</th><th>result</th><th>first divergence</th></tr>"]
    for index, result in enumerate(results):
        run = result.run
        steps = str(len(run.steps)) if run is not None else "-"
        machine = run.trace.machine if run is not None else "-"
        first = run.first_divergence if run is not None else None
        where = "-" if first is None else f"step {first.number}: {_describe(first.command)}"
        link = f'<a href="#trace-{index}">{page.escape(result.path.name)}</a>'
        tone = _TONES[result.status]
        lines.append(
            f'<tr data-status="{page.escape(result.status)}"><td>{link}</td>'
            f"<td>{page.escape(machine)}</td><td>{steps}</td>"
            f'<td><span class="badge {tone}">{page.escape(result.status)}</span></td><td>{page.escape(where)}</td></tr>'
        )
    sections = [page.section("the traces", '<table id="results">' + "".join(lines) + "</table>", "summary")]
    for index, result in enumerate(results):
        body = f"<p><code>{page.escape(str(result.path))}</code></p>"
        if result.run is not None:
            body += f'<p class="explanation">{page.escape(_divergence_sentence(result.run))}</p>'
        if result.detail:
            body += page.preformatted(result.detail)
        if result.run is not None and result.status != PASSED:
            body += steps_markup(result.run).replace('id="steps"', f'id="steps-{index}"')
        sections.append(page.section(f"{result.status} {result.path.name}", body, f"trace-{index}"))
    return page.render("leaseproof replay", subject, badge, sections, "replay")


def write_replay_report(
    directory: Path | str, results: Sequence[ReplayResult], *, subject: str = "", filename: str = "replay.html"
) -> Path:
    """Write the page of a `leaseproof replay` batch into `directory`; its path. Give each
    failed (or expected-failed) trace its `run` (`run_trace(trace, adapter)`) to show its
    steps and the rows each touched."""
    return page.write(directory, filename, replay_page(results, subject=subject))
