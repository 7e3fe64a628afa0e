"""Pages for concurrent evidence: a `leaseproof stress` run, and any one history
(`leaseproof check-history`, or a history a test recorded).

A failing run's page leads with one sentence on the violation in the model's
words, then the checker's minimal piece drawn as a timeline with the longest
partial order of it and the operations that could not follow, then the whole
failing history, its violating epoch shaded, every other epoch numbered in
the order that explains it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from leaseproof.conformance.concurrent.explain import (
    EpochOrder,
    explain,
    history_orders,
    partition_orders,
    violation_order,
)
from leaseproof.conformance.concurrent.history import History, Indeterminate
from leaseproof.conformance.concurrent.linearizability import (
    LINEARIZABLE,
    NOT_LINEARIZABLE,
    CheckResult,
    Spec,
    Violation,
    timeline,
)
from leaseproof.conformance.concurrent.models import SPECS
from leaseproof.conformance.concurrent.stress import StressReport
from leaseproof.conformance.report import page
from leaseproof.conformance.report.timeline import Marks, timeline_svg

LEGEND = (
    '<div class="legend">'
    '<span><i style="background:var(--claim)"></i>claim</span><span><i style="background:var(--renew)"></i>renew</span>'
    '<span><i style="background:var(--finish)"></i>finish</span><span><i style="background:var(--reap)"></i>reap</span>'
    '<span><i style="background:var(--clock)"></i>clock move</span>'
    '<span><i style="background:var(--other)"></i>other</span>'
    '<span><i style="background:#e4e7ec;border:1px dashed #98a2b3"></i>indeterminate (?)</span>'
    "<span>pale: refused · #n: place in the order found · thick outline: outcome needed · red outline: no order"
    " gets past it · solid lease: held · dashed: its lease_until passed</span></div>"
)

# Whole histories past this many operations are not drawn (a page stays light enough to open).
DRAWN_OPERATIONS = 3_000


def _where(violation: Violation, spec: Spec) -> str:
    if violation.keys is None:
        return "the whole state"
    return ", ".join(sorted(spec.describe_key(k) for k in violation.keys)) or "no keys"


def _violation_sections(violation: Violation, spec: Spec, history: History | None) -> tuple[str, list[page.Section]]:
    order = violation_order(violation, spec)
    also = partition_orders(violation, spec, history)
    sentence = explain(order, spec, violation.operations, violation.reason, also)
    blocked_ids = frozenset(b.op.id for b in order.blocked if not b.op.indeterminate)
    recorded = {op.id: op for op in violation.operations}
    # The piece as recorded (forgotten outcomes shown as they were answered), its needed ones outlined.
    piece = History(violation.piece.machine, violation.piece.initial, violation.operations, violation.piece.barriers)
    marks = Marks(
        order={p.op.id: str(n) for n, p in enumerate(order.placed, 1)},
        needed=frozenset(
            op.id for op in violation.operations if op.id not in violation.forgotten and not op.indeterminate
        ),
        failing=blocked_ids,
        detail=dict.fromkeys(violation.forgotten, "its outcome is not needed: the piece records it as indeterminate"),
    )
    svg = timeline_svg(piece, spec, marks, element_id="piece-timeline")
    figures = page.facts(
        [
            ("epoch", violation.epoch),
            ("partition", _where(violation, spec)),
            ("operations in the partition", violation.partition_size),
            ("in the minimal piece", len(violation.operations)),
            ("outcomes needed", len(marks.needed)),
        ]
    )
    body = figures + f"<p>{page.escape(violation.reason)}</p>" + LEGEND + f'<div class="scroll">{svg}</div>'
    items = []
    for placed in order.placed:
        op = recorded.get(placed.op.id, placed.op)
        said = "left out: its outcome is free" if placed.op.indeterminate else spec.describe_outcome(placed.outcome)
        items.append(
            f'<li data-op="{op.id}"><b>{page.escape(op.client)}</b> '
            f"<code>{page.escape(spec.describe_command(op.command))}</code>"
            f" → <code>{page.escape(said)}</code></li>"
        )
    for b in sorted(order.blocked, key=lambda b: b.op.invoked):
        if b.op.indeterminate:
            continue
        answer = "no answer it could settle on" if b.answer is None else spec.describe_outcome(b.answer)
        items.append(
            f'<li class="failing" data-op="{b.op.id}">cannot go next: <b>{page.escape(b.op.client)}</b> '
            f"<code>{page.escape(spec.describe_command(b.op.command))}</code> was answered "
            f"<code>{page.escape(spec.describe_outcome(b.op.outcome))}</code>; the model answers "
            f"<code>{page.escape(answer)}</code> here</li>"
        )
    if order.end is not None:
        items.append(
            '<li class="failing">every outcome fits, but the order ends in another state than the one recorded</li>'
        )
    heading = "the order the checker could build, and where it stops"
    if order.exhausted:
        heading += " (the page's search ran out of budget: a longer partial order may exist)"
    listing = f'<ol class="order" id="partial-order" data-placed="{len(order.placed)}">' + "".join(items) + "</ol>"
    if not order.placed:
        listing = "<p>no operation of the piece can go first: the very first step disagrees.</p>" + listing
    sections = [
        page.section(f"the violation: epoch {violation.epoch}, partition {_where(violation, spec)}", body, "violation"),
        page.section(heading, listing, "order"),
        page.section(
            "the piece as the checker prints it", page.preformatted(timeline(violation, spec)), "text-timeline"
        ),
    ]
    return sentence, sections


def _orders_markup(orders: Sequence[EpochOrder], spec: Spec) -> tuple[dict[int, str], str]:
    """Each epoch's order as '#e·n' labels for the timeline, and as a list."""
    labels: dict[int, str] = {}
    blocks = []
    for epoch in orders:
        items = []
        count = 0
        for _, order in epoch.partitions:
            if not order.complete:
                continue
            for placed in order.placed:
                count += 1
                labels[placed.op.id] = f"{epoch.number}·{count}"
                said = "left out" if placed.op.indeterminate else spec.describe_outcome(placed.outcome)
                items.append(
                    f"<li><b>{page.escape(placed.op.client)}</b> "
                    f"<code>{page.escape(spec.describe_command(placed.op.command))}"
                    f"</code> → <code>{page.escape(said)}</code></li>"
                )
        if not items:
            continue
        blocks.append(
            f'<h3>epoch {epoch.number}</h3><ol class="order" data-epoch="{epoch.number}">' + "".join(items) + "</ol>"
        )
    return labels, "".join(blocks)


def _history_sections(history: History, result: CheckResult, spec: Spec, title: str) -> tuple[str, list[page.Section]]:
    """The explanation (if it failed) and the sections: the violation, then the whole history."""
    sentence, sections = "", list[page.Section]()
    failed_epoch = None
    needed: frozenset[int] = frozenset()
    if result.violation is not None:
        sentence, sections = _violation_sections(result.violation, spec, history)
        failed_epoch = result.violation.epoch
        needed = frozenset(
            op.id
            for op in result.violation.operations
            if op.id not in result.violation.forgotten and not op.indeterminate
        )
    if len(history.operations) > DRAWN_OPERATIONS:
        sections.append(
            page.section(title, f"<p>{len(history.operations):,} operations: too many to draw.</p>", "history")
        )
        return sentence, sections
    orders = [o for o in history_orders(history, spec) if o.number != failed_epoch]
    labels, listing = _orders_markup(orders, spec)
    marks = Marks(order=labels, needed=needed, failed_epoch=failed_epoch)
    svg = timeline_svg(history, spec, marks, element_id="history-timeline")
    indeterminate = sum(isinstance(op.outcome, Indeterminate) for op in history.operations)
    figures = page.facts(
        [
            ("operations", len(history.operations)),
            ("sessions", len({op.client for op in history.operations})),
            ("barriers", len(history.barriers)),
            ("indeterminate", indeterminate),
            ("epochs", result.epochs),
            ("partitions", result.partitions),
        ]
    )
    note = ""
    if failed_epoch is not None:
        note = (
            f"<p>epoch {failed_epoch} (shaded) is the one no order explains;"
            " the operations its piece needs are outlined.</p>"
        )
    sections.append(page.section(title, figures + note + LEGEND + f'<div class="scroll">{svg}</div>', "history"))
    if listing:
        sections.append(page.section("the order that explains each epoch", listing, "orders"))
    return sentence, sections


def _badge(verdict: str) -> str:
    if verdict in (LINEARIZABLE, "LINEARIZABLE"):
        return page.verdict_badge("LINEARIZABLE", "good")
    if verdict in (NOT_LINEARIZABLE, "NOT LINEARIZABLE"):
        return page.verdict_badge("NOT LINEARIZABLE", "bad")
    return page.verdict_badge(verdict.upper(), "warn")


def stress_page(report: StressReport, *, subject: str = "") -> str:
    spec = SPECS[report.machine]
    p = report.progress
    figures = [
        ("workers", report.workers),
        ("seed", report.seed),
        ("programs", p.programs),
        ("histories", p.histories),
        ("operations", f"{p.operations:,}"),
        ("largest history", p.largest),
        ("indeterminate", p.indeterminate),
        ("unknown", p.unknown),
        ("seconds", f"{p.seconds:.1f}"),
        ("checker seconds", f"{p.check_seconds:.2f}"),
    ]
    if p.faults.ended:
        figures.append(("backends ended", p.faults.ended))
    summary = page.facts(figures)
    sections: list[page.Section] = []
    finding = report.finding
    if finding is None:
        summary += "<p>every history was explained by some order of the model's steps.</p>"
        sections.append(page.section("the run", summary, "summary"))
    else:
        summary += f"<p>{page.escape(finding.kind)}: {finding.failed} of {finding.repeats} repetitions failed.</p>"
        sentence, more = _history_sections(finding.history, finding.result, spec, "the whole failing history")
        if sentence:
            summary = f'<p class="explanation" id="explanation">{page.escape(sentence)}</p>' + summary
        sections.append(page.section("the run", summary, "summary"))
        sections += more
    title = f"leaseproof stress: the {report.machine} machine"
    return page.render(title, subject, _badge(report.verdict), sections, "stress")


def write_stress_report(
    directory: Path | str, report: StressReport, *, subject: str = "", filename: str | None = None
) -> Path:
    """Write the page of a `leaseproof stress` run (what `stress()` returns) into `directory`;
    its path (`stress-MACHINE-SEED.html` unless `filename`). A failing run's page draws
    the failing history; a passing run's page has no history to draw (`StressReport`
    keeps none: draw one with `write_history_report`)."""
    return page.write(
        directory, filename or f"stress-{report.machine}-{report.seed}.html", stress_page(report, subject=subject)
    )


def history_page(history: History, result: CheckResult, *, subject: str = "") -> str:
    spec = SPECS[history.machine]
    sentence, sections = _history_sections(history, result, spec, "the history")
    summary = page.facts([("verdict", result.verdict), ("checker", result.summary())])
    if sentence:
        summary = f'<p class="explanation" id="explanation">{page.escape(sentence)}</p>' + summary
    return page.render(
        f"leaseproof: a {history.machine} history", subject, _badge(result.verdict),
        [page.section("the check", summary, "summary"), *sections], "history",
    )  # fmt: skip


def write_history_report(
    directory: Path | str, history: History, result: CheckResult, *, subject: str = "", filename: str = "history.html"
) -> Path:
    """Write the page of one history and its check (`check(history, SPECS[history.machine])`)
    into `directory`; its path."""
    return page.write(directory, filename, history_page(history, result, subject=subject))
