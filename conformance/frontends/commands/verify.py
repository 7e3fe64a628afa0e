"""`leaseproof verify`: each model and its implementation in lockstep, and the verdict."""

from __future__ import annotations

import argparse
import functools
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

from leaseproof.conformance.frontends.commands.common import (
    adapter_named,
    add_adapter_arguments,
    each_machine,
    positive,
    positive_float,
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
from leaseproof.conformance.lockstep.core import SHRINK_ATTEMPTS, SHRINK_SECONDS, ShrinkBound
from leaseproof.conformance.lockstep.delivery import Coverage
from leaseproof.conformance.lockstep.verify import MACHINES, Verdict, run_conformance
from leaseproof.conformance.traces.trace import write as write_trace

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
        help="where to write the counterexample as a trace (default: leaseproof-counterexample-SEED.jsonl)",
    )
    add_adapter_arguments(parser)


class _Progress(ProgressLine):
    """Verify's progress on stderr: in place on a terminal, every 10% otherwise."""

    def __init__(self, total: int, stream: TextIO) -> None:
        super().__init__(stream, every=max(1, min(total, 500) // 10), first=0, width=60)
        self.total = total

    def __call__(self, coverage: Coverage) -> None:
        done = coverage.generated
        if coverage.first_failure is None:
            line = f"  example {done}/{self.total}"
        else:
            line = f"  failed in example {coverage.first_failure}; shrinking, try {done - coverage.failed_at}"
        self.show(line + f" · {coverage.steps:,} steps", done)


def _summary(verdict: Verdict, out: TextIO) -> None:
    coverage = verdict.coverage
    examples = f"{coverage.examples:,}"
    if coverage.generated > coverage.examples and coverage.first_failure is None:
        repeats = coverage.generated - coverage.examples
        examples += f" (and {repeats:,} repeats of a program already sent, not sent again)"
    if coverage.first_failure == 0:
        examples = "none (a fixed scenario failed first)"
    elif coverage.first_failure is not None:
        examples = f"{coverage.first_failure:,} until the first failure, {coverage.examples:,} with shrinking"
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
    def judge(adapter: Any, machine: str, seed_value: int) -> int:
        out.write(f"verifying the {machine} machine against {adapter.name}\n")
        out.flush()
        progress = _Progress(args.max_examples, err)
        try:
            verdict = run_conformance(
                adapter,
                machine=machine,
                max_examples=args.max_examples,
                seed_value=seed_value,
                steps=args.steps,
                shrink=not args.no_shrink,
                scenarios=not args.no_scenarios,
                shrink_bound=ShrinkBound(args.shrink_attempts, args.shrink_seconds),
                on_example=progress,
            )
        finally:
            progress.close()
        return _report(verdict, args, out, err)

    return each_machine(args, out, err, functools.partial(adapter_named, lockstep=True), judge)


def _report(verdict: Verdict, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    _summary(verdict, out)
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
    replay = f"--seed {verdict.seed}" + (" --no-scenarios" if getattr(args, "no_scenarios", False) else "")
    out.write(f"minimal counterexample (replay with {replay}):\n")
    out.write("".join(f"  {line}\n" for line in verdict.counterexample.splitlines()))
    out.write(f"what went wrong:\n{verdict.failure}\n")
    _write_trace(verdict, args, out, err)
    return EXIT_NONCONFORMING


def _write_trace(verdict: Verdict, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if verdict.trace is None:
        return
    path = args.trace_out or Path(f"leaseproof-counterexample-{verdict.seed}.jsonl")
    try:
        write_trace(verdict.trace, path)
    except OSError as exc:
        err.write(f"leaseproof: could not write the trace to {path}: {exc.strerror}\n")
        return
    steps = len(verdict.trace.steps)
    out.write(f"trace: {path} (the counterexample, {steps} steps; replay it with: leaseproof replay {path})\n")


