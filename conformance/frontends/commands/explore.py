"""`leaseproof explore`: every state of each model within small bounds (no database)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from leaseproof.conformance.frontends.catalogue import MACHINES
from leaseproof.conformance.frontends.commands.common import number
from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, INTERRUPTED_EXITS
from leaseproof.conformance.frontends.progress import ProgressLine
from leaseproof.conformance.spec.bounds import BoundsError, bound_options

if TYPE_CHECKING:  # what a run imports when it starts (`--help` does not)
    from leaseproof.conformance.spec.explore import Exploration, ExplorationSpec, Progress

DESCRIPTION = (
    "Breadth-first, exhaustive search of each model's states within the bounds (TLC-style: a state outside "
    "them is checked but not expanded). Checks every state invariant, every step invariant, that each step "
    "changes only what its rule declares and moves rows only along declared transitions; prints the rules "
    "reached and the shortest path to each kind of violation. Exit 1 if an invariant fails."
)
EXITS = (
    "exit status: 0 every invariant and rule holds within the bounds; 1 one fails (the shortest path to it is "
    "printed); 2 usage error (bounds out of range); " + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--machine", choices=sorted(MACHINES), help="explore one machine (default: both)")
    count = number(int, "an integer", lambda v: v >= 0, "zero or more")
    for name, (text, _) in bound_options().items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=count, metavar="N", help=text)
    parser.add_argument(
        "--every-step", action="store_true", help="check the step invariants on the stutters of refusals and reads too"
    )
    parser.add_argument(
        "--trace-out",
        type=Path,
        metavar="FILE",
        help="where to write the shortest violation as a trace (default: leaseproof-explore-MACHINE.jsonl)",
    )


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.spec.explore import SPECS

    bounds = {name: getattr(args, name) for name in bound_options() if getattr(args, name) is not None}
    machines = [args.machine] if args.machine else sorted(SPECS)
    try:
        holds = run(machines, bounds, out, err, every_step=args.every_step, trace_out=args.trace_out)
    except BoundsError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    return EXIT_CONFORMS if holds else EXIT_NONCONFORMING


class ExploreProgress(ProgressLine):
    """The search's progress on stderr: in place on a terminal, every 5 s otherwise."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream, every=5.0)

    def __call__(self, p: Progress) -> None:
        line = f"  {p.seconds:5.1f}s  depth {p.depth}  states {p.states:,}  frontier {p.frontier:,}  ({p.rate:,.0f}/s)"
        self.show(line, p.seconds)


def summary(result: Exploration, spec: ExplorationSpec, out: TextIO) -> None:
    """The counts, the rule coverage table, what was never reached, and the verdict on the invariants."""
    from leaseproof.model.rules import behaviours

    out.write(
        f"states: {result.states:,} distinct ({result.unexpanded:,} outside the bounds, not expanded)"
        f"   transitions: {result.transitions:,}   depth: {result.depth}   time: {result.seconds:.1f}s\n"
    )
    out.write("rules reached (operation, guard, outcome: steps):\n")
    for operation, guard, outcome in behaviours(spec.rules):
        count = result.coverage.get((operation, guard, outcome), 0)
        out.write(f"  {operation:<18} {guard:<22} {outcome:<26} {count:>10,}\n")
    if spec.transitions:
        taken = ", ".join(f"{a}→{b} ×{result.moves.get((a, b), 0):,}" for a, b in spec.transitions)
        out.write(f"transitions taken: {taken}\n")
    missing = [f"{op}/{guard} → {outcome}" for op, guard, outcome in result.never_reached]
    missing += [f"transition {a}→{b}" for a, b in result.never_moved]
    out.write(f"never reached: {', '.join(missing) if missing else 'none'}\n")
    if result.holds:
        out.write("invariants: hold in every explored state\n")
        return
    out.write(f"invariants: VIOLATED, {len(result.violations)} kind(s); the shortest path to each:\n")
    for nth, violation in enumerate(result.violations, 1):
        out.write(f"{nth}. {violation.message}\n")
        out.write(f"   seen {violation.count:,} time(s); the shortest path, {len(violation.path)} step(s):\n")
        for index, command in enumerate(violation.path, 1):
            out.write(f"     {index}. {spec.describe(command)}\n")


def run(
    machines: Iterable[str],
    overrides: Mapping[str, int],
    out: TextIO,
    err: TextIO,
    every_step: bool = False,
    trace_out: Path | None = None,
) -> bool:
    """`leaseproof explore`: explore each machine, print its summary, and write the
    shortest violation of each as a trace. True if every invariant held.

    Raises `BoundsError` for an override out of range or one no machine has."""
    import attrs

    from leaseproof.conformance.spec.bounds import describe_bounds
    from leaseproof.conformance.spec.explore import SPECS, bounds_for, explore, write_counterexample

    machines = list(machines)
    unknown = sorted(set(overrides) - {f.name for m in machines for f in attrs.fields(SPECS[m].bounds)})
    if unknown:
        names = ", ".join(f"--{name.replace('_', '-')}" for name in unknown)
        raise BoundsError(f"{names} is not a bound of the {' or '.join(machines)} machine")
    plans = [(machine, bounds_for(machine, overrides)) for machine in machines]
    holds = True
    for machine, bounds in plans:
        spec = SPECS[machine]
        out.write(f"exploring the {machine} machine within {describe_bounds(bounds)}\n")
        out.flush()
        progress = ExploreProgress(err)
        try:
            result = explore(spec, bounds, on_progress=progress, every_step=every_step)
        finally:
            progress.close()
        summary(result, spec, out)
        if not result.holds:
            holds = False
            path = trace_out or Path(f"leaseproof-explore-{machine}.jsonl")
            if trace_out is not None and len(plans) > 1:
                path = path.with_name(f"{path.stem}-{machine}{path.suffix}")
            try:
                recorded = write_counterexample(spec, result.violations[0], path)
            except OSError as exc:
                err.write(f"leaseproof: could not write the trace to {path}: {exc.strerror}\n")
            else:
                out.write(
                    f"trace: {path} (the first path above, {len(recorded.steps)} steps; run it on an "
                    f"implementation with: leaseproof replay {shlex.quote(str(path))})\n"
                )
            # The exploration is exhaustive within its bounds, so the same bounds meet the same violation.
            flags = " ".join(
                f"--{f.name.replace('_', '-')} {getattr(bounds, f.name)}" for f in attrs.fields(type(bounds))
            )
            again = f"leaseproof explore --machine {machine} {flags}" + (" --every-step" if every_step else "")
            out.write(f"explore again with: {again}\n")
        out.flush()
    return holds
