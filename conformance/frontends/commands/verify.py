"""`leaseproof verify`: each model and its implementation in lockstep, and the verdict."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from leaseproof.conformance.frontends.catalogue import MACHINES, SHRINK_ATTEMPTS, SHRINK_SECONDS
from leaseproof.conformance.frontends.commands.common import (
    adapter_errors_in_one_line,
    add_adapter_arguments,
    positive,
    positive_float,
    replay_command,
    report_folder,
    seed_number,
)
from leaseproof.conformance.frontends.exits import (
    EXIT_CONFORMS,
    EXIT_NONCONFORMING,
    EXIT_SUBSET,
    EXIT_USAGE,
    INTERRUPTED_EXITS,
)
from leaseproof.conformance.frontends.progress import ProgressLine

if TYPE_CHECKING:  # what a run imports when it starts (`--help` does not)
    from leaseproof.conformance.boundary.protocols import SomeAdapter
    from leaseproof.conformance.frontends.commands.running import Provisioned
    from leaseproof.conformance.lockstep.core import Lockstepped
    from leaseproof.conformance.lockstep.delivery import Coverage
    from leaseproof.conformance.lockstep.verify import Verdict

DESCRIPTION = (
    "Drive each machine's model (delivery, lifecycle) and its implementation (the bundled PostgreSQL one "
    "unless --adapter/--adapter-cmd names another) in lockstep through fixed scenarios and randomized "
    "programs; compare every outcome and the full persisted state after every step."
)
EXITS = (
    "exit status: 0 conforms; 1 does not conform; 2 usage error, or the adapter failed (nothing judged); "
    "3 conforms on a subset: the adapter leaves operations out and --accept-subset was not given; " + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--machine",
        choices=sorted(MACHINES),
        help="verify one machine (default: both, or the one a --mutant or external adapter implies)",
    )
    parser.add_argument(
        "--max-examples",
        type=positive,
        default=300,
        help="programs generated per machine (default: 300); one that repeats a program already sent is not sent again",
    )
    parser.add_argument("--steps", type=positive, default=50, help="most steps per program (default: 50)")
    parser.add_argument(
        "--seed", type=seed_number, help="random seed, to reproduce a run (default: a fresh one, printed)"
    )
    parser.add_argument("--no-shrink", action="store_true", help="report the first failing program unshrunk")
    parser.add_argument(
        "--no-scenarios",
        action="store_true",
        help="skip the fixed scenarios: the generated programs alone (how the search's power is measured)",
    )
    parser.add_argument(
        "--accept-subset",
        action="store_true",
        help="accept a verdict on the operations an adapter offers when it leaves some out "
        "(without it, such a run exits 3: CONFORMS ON A SUBSET)",
    )
    parser.add_argument(
        "--shrink-attempts",
        type=positive,
        default=SHRINK_ATTEMPTS,
        metavar="N",
        help=f"programs the shrinking of a failure may try (default: {SHRINK_ATTEMPTS:,}); "
        "the same seed and budget print the same counterexample",
    )
    parser.add_argument(
        "--shrink-seconds",
        type=positive_float,
        default=SHRINK_SECONDS,
        metavar="S",
        help=f"and at most this long (default: {SHRINK_SECONDS:g}); the report says when this bound ended it",
    )
    parser.add_argument(
        "--trace-out",
        type=Path,
        metavar="FILE",
        help="where to write the counterexample as a trace (default: leaseproof-MACHINE-counterexample-SEED.jsonl; "
        "with two machines failing, the second's name gets -MACHINE)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write an HTML page of each machine that does not conform into DIR (made if missing) and print its "
        "path: counterexample-MACHINE-SEED.html, every step of the counterexample run again on the implementation "
        "(the bundled one or a mutant on a fresh database of its own) with the rows each step touched; a machine "
        "that conforms gets no page, and a line says so; the verdict and the exit status are the same with or "
        "without it",
    )
    add_adapter_arguments(parser)
    adapter_errors_in_one_line(parser)


class _Progress(ProgressLine):
    """Verify's progress on stderr: in place on a terminal, every 10% otherwise.

    Each number says what it counts: the fixed scenario running; then the program
    Hypothesis is generating, numbered among those that count toward --max-examples
    (so never past it), with the programs it abandoned part-way and generated again
    said apart; after a failure, the programs run to shrink it (Hypothesis's replays of
    the failing program included), which have no total but their budget."""

    def __init__(self, total: int, stream: TextIO) -> None:
        super().__init__(stream, every=max(1, min(total, 500) // 10), first=0, width=60)
        self.total = total
        self.phase = ""  # "scenarios", "generating" or "shrinking": each shows its first line

    def __call__(self, coverage: Coverage) -> None:
        at = coverage.generated
        if coverage.scenario:
            phase, at = "scenarios", coverage.scenarios
            line = f"  fixed scenario {coverage.scenarios + 1}: {coverage.scenario}"
        elif coverage.first_failure is None:
            phase = "generating"
            line = f"  example {coverage.counted:,}/{self.total:,}"
            if coverage.discarded:
                line += f" (+{coverage.discarded:,} abandoned by Hypothesis, not counted)"
        else:
            phase = "shrinking"
            line = f"  failed in example {coverage.failed_in:,}; shrinking, attempt {coverage.shrink_attempts:,}"
        if phase != self.phase:
            self.phase, self.next_report = phase, 0
        self.show(line + f" · {coverage.steps:,} steps", at)


def _examples(coverage: Coverage, asked: int | None, fault: bool = False) -> str:
    """What the summary's `examples:` says: the programs generated, and of them those sent
    and those that repeated a program already sent; after a failure, where it came and the
    shrinking apart; the programs Hypothesis abandoned part-way, apart."""
    of = f" of {asked:,}" if asked is not None else ""
    abandoned = ""
    if coverage.discarded:
        abandoned = (
            f"; and {coverage.discarded:,} abandoned by Hypothesis part-way (out of choices, or a rejected draw),"
            " not counted, generated again"
        )
    failed = "the adapter failed" if fault else "the first failure"
    if coverage.first_failure == 0:
        return "none (the adapter failed in a fixed scenario)" if fault else "none (a fixed scenario failed first)"
    counted, repeats = coverage.counted, coverage.repeats
    noun = "repeat" if repeats == 1 else "repeats"
    sent = f"{counted - repeats:,} sent, {repeats:,} {noun} of a program already sent"
    if coverage.first_failure is None:
        return f"{counted:,}{of} generated ({sent}, not sent again){abandoned}"
    text = f"{failed} in example {counted:,}{of} ({sent}){abandoned}"
    if coverage.shrink_attempts:
        shrunk_sent = coverage.examples - coverage.first_failure
        text += f"; then {coverage.shrink_attempts:,} programs run to shrink and report it ({shrunk_sent:,} sent)"
    return text


def _summary(verdict: Verdict, out: TextIO, asked: int | None = None) -> None:
    """`asked`: the --max-examples of the run, which the count of programs generated is given against."""
    coverage = verdict.coverage
    examples = _examples(coverage, asked, bool(verdict.fault))
    out.write(
        f"scenarios: {coverage.scenarios}   examples: {examples}   steps: {coverage.steps:,}"
        f"   time: {verdict.seconds:.1f}s   seed: {verdict.seed}\n"
    )
    if verdict.fault:
        return  # nothing was judged: coverage would only mislead
    out.write("outcomes reached (operation: variant ×count):\n")
    by_operation: dict[str, list[str]] = defaultdict(list)
    for (operation, variant), count in sorted(coverage.outcomes.items()):
        by_operation[operation].append(f"{variant} ×{count:,}")
    assert coverage.spec is not None
    for operation in (op.__name__ for op in coverage.spec.variants):
        out.write(f"  {operation:<18} {', '.join(by_operation.get(operation, ['-']))}\n")
    if coverage.spec.transitions:
        transitions = ", ".join(f"{a}→{b} ×{n:,}" for (a, b), n in sorted(coverage.transitions.items()))
        out.write(f"{coverage.spec.subject} transitions reached: {transitions or '-'}\n")
    if coverage.skipped:
        skipped = ", ".join(f"{op} ×{n:,}" for op, n in sorted(coverage.skipped.items()))
        out.write(f"not offered by the adapter, so never sent: {skipped}\n")
    behaviours = verdict.behaviours  # the count the subset verdict gives, too
    out.write(
        f"behaviours exercised: {behaviours.exercised} of the {len(behaviours.checkable)} the rules declare"
        " (operation/guard→outcome; `leaseproof explore` reaches every one)\n"
    )
    if not verdict.conforms:
        return  # a failed run stops early: what it never reached says nothing
    missing = [f"{op}: {v}" for op, v in coverage.missing_outcomes()]
    missing += [f"{a}→{b}" for a, b in coverage.missing_transitions()]
    missing += [f"{op}/{guard}→{v}" for op, guard, v in behaviours.never]
    out.write(f"never reached: {', '.join(missing) if missing else 'none'}\n")


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.frontends.commands.running import each_machine, lockstep_adapter_named
    from leaseproof.conformance.lockstep.core import ShrinkBound
    from leaseproof.conformance.lockstep.verify import Run, run_conformance

    folder = report_folder(args.report)  # a folder that cannot be made: UsageError, exit 2 (cli)
    written: set[Path] = set()  # the trace files written, one a machine
    runs: list[Provisioned] = []  # the run's provisioning, for the page's second adapter

    def adapter_for(args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO) -> Lockstepped:
        runs[:] = [provisioned]
        return lockstep_adapter_named(args, machine, provisioned, out)

    def judge(adapter: Lockstepped, machine: str, seed_value: int) -> int:
        out.write(f"verifying the {machine} machine against {adapter.name}\n")
        out.flush()
        progress = _Progress(args.max_examples, err)
        try:
            verdict = run_conformance(
                adapter,
                Run(
                    machine=machine,
                    max_examples=args.max_examples,
                    seed=seed_value,
                    steps=args.steps,
                    shrink=not args.no_shrink,
                    scenarios=not args.no_scenarios,
                    shrink_bound=ShrinkBound(args.shrink_attempts, args.shrink_seconds),
                    on_example=progress,
                ),
            )
        finally:
            progress.close()
        status = _report(verdict, args, out, err, written)
        if folder is not None:
            _write_page(folder, verdict, machine, adapter, runs[0], args, out, err)
        return status

    return each_machine(args, out, err, adapter_for, judge)


def _write_page(
    folder: Path,
    verdict: Verdict,
    machine: str,
    adapter: Lockstepped,
    provisioned: Provisioned,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
) -> None:
    """The --report page of one machine's verdict, written after the verdict was printed;
    nothing here changes the verdict or the exit status: a failure is said on stderr."""
    if verdict.conforms:
        out.write(f"report: no page for the {machine} machine: it conforms, so there is no counterexample to show\n")
        return
    from leaseproof.conformance.report import write_counterexample_report  # the pages' modules, when asked for

    try:
        with contextlib.ExitStack() as stack:
            implementation, why = _page_adapter(verdict, machine, adapter, provisioned, args, stack)
            try:
                path = write_counterexample_report(
                    folder, verdict, machine=machine, implementation=implementation, subject=adapter.name,
                    why_not_run=why,
                )  # fmt: skip
            except Exception as exc:  # the implementation failed the page's re-run, at its reset
                if implementation is None:
                    raise
                why = f"it could not be run again for this page: {type(exc).__name__}: {exc}"
                path = write_counterexample_report(
                    folder, verdict, machine=machine, subject=adapter.name, why_not_run=why
                )
    except Exception as exc:  # noqa: BLE001 - a page that cannot be written leaves the verdict as it is
        err.write(f"leaseproof: could not write the report page into {folder}: {type(exc).__name__}: {exc}\n")
        return
    out.write(f"report: {path}\n")


def _page_adapter(
    verdict: Verdict,
    machine: str,
    adapter: Lockstepped,
    provisioned: Provisioned,
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
) -> tuple[SomeAdapter | None, str]:
    """The implementation the page runs the counterexample again on, directly (step by step,
    reading its rows), or None and why not. The lockstep checks the bundled implementation
    (or a mutant) in a process of its own (`ForkedAdapter`), which cannot be driven so: the
    page gets a second adapter of it, on a fresh database. An --adapter or --adapter-cmd
    implementation is called directly already: the page runs it again itself, reset."""
    from leaseproof.conformance.frontends.commands.running import adapter_named
    from leaseproof.conformance.lockstep.core import ChecksItself

    if verdict.recorded is None:
        return None, "the verdict has no counterexample trace"
    if not isinstance(adapter, ChecksItself):
        return adapter, ""
    try:
        second = adapter_named(args, machine, provisioned, io.StringIO())  # its "mutant:" line said already
    except Exception as exc:  # noqa: BLE001 - the page then shows the model's side, and says why
        return None, f"a second adapter of it could not be built: {type(exc).__name__}: {exc}"
    stack.callback(second.close)
    return second, ""


def _report(verdict: Verdict, args: argparse.Namespace, out: TextIO, err: TextIO, written: set[Path]) -> int:
    _summary(verdict, out, getattr(args, "max_examples", None))
    if verdict.fault:
        out.write("verdict: NONE — the adapter failed, so nothing was judged\n")
        out.write(f"fault: {verdict.fault}\n")
        if verdict.fault_program:
            out.write("where, and the program's commands up to the fault:\n")
            out.write("".join(f"  {line}\n" for line in verdict.fault_program))
        return EXIT_USAGE  # no counterexample file: a fault is not a counterexample
    if verdict.conforms and verdict.subset():
        accepted = getattr(args, "accept_subset", False)
        out.write(f"verdict: CONFORMS ON A SUBSET — {verdict.subset()}\n")
        if accepted:
            out.write("the subset is accepted (--accept-subset): what the adapter offers matched the model\n")
            return EXIT_CONFORMS
        out.write(
            "exit status 3: the operations left out were never checked; implement them, or pass"
            " --accept-subset to accept a verdict on these alone\n"
        )
        return EXIT_SUBSET
    if verdict.conforms:
        out.write("verdict: CONFORMS — every outcome and every persisted field matched the model\n")
        return EXIT_CONFORMS
    out.write("verdict: DOES NOT CONFORM\n")
    if verdict.shrink_stopped:
        out.write(f"shrinking stopped early, {verdict.shrink_stopped}: the program below may not be minimal\n")
    out.write(verdict.counterexample_heading(getattr(args, "no_scenarios", False)) + ":\n")
    out.write("".join(f"  {line}\n" for line in verdict.counterexample.splitlines()))
    out.write(f"what went wrong:\n{verdict.failure}\n")
    _write_trace(verdict, args, out, err, written)
    return EXIT_NONCONFORMING


def _write_trace(verdict: Verdict, args: argparse.Namespace, out: TextIO, err: TextIO, written: set[Path]) -> None:
    """Write the counterexample's trace; `written`: the files this run wrote already, so that a
    second machine's trace never replaces the first's."""
    from leaseproof.conformance.traces.trace import trace_of
    from leaseproof.conformance.traces.trace import write as write_trace

    trace = trace_of(verdict.recorded)
    if trace is None:
        return
    machine = trace.machine
    path = args.trace_out or Path(f"leaseproof-{machine}-counterexample-{verdict.seed}.jsonl")
    if path in written:  # --trace-out named one file, and the other machine's trace is in it
        path = path.with_name(f"{path.stem}-{machine}{path.suffix}")
    written.add(path)
    try:
        write_trace(trace, path)
    except OSError as exc:
        err.write(f"leaseproof: could not write the trace to {path}: {exc.strerror}\n")
        return
    steps = len(trace.steps)
    out.write(f"trace: {path} (the counterexample, {steps} steps; replay it with: {replay_command(path, args)})\n")
