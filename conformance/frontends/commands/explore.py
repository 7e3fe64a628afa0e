"""`leaseproof explore`: every state of each model within small bounds (no database)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from leaseproof.conformance.frontends.catalogue import MACHINES
from leaseproof.conformance.frontends.commands.common import number
from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, INTERRUPTED_EXITS
from leaseproof.conformance.spec.bounds import BoundsError, bound_options

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
    from leaseproof.conformance.spec import explore as exploration

    bounds = {name: getattr(args, name) for name in bound_options() if getattr(args, name) is not None}
    machines = [args.machine] if args.machine else sorted(exploration.SPECS)
    try:
        holds = exploration.run(machines, bounds, out, err, every_step=args.every_step, trace_out=args.trace_out)
    except BoundsError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    return EXIT_CONFORMS if holds else EXIT_NONCONFORMING
