"""`leaseproof check-trace`: a history another system recorded, run through the model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, INTERRUPTED_EXITS

DESCRIPTION = (
    "Run the model over a recorded sequential history (commands with the outcomes, and optionally the "
    "states, another system produced) and report the first step where the model disagrees."
)
EXITS = (
    "exit status: 0 every step agrees with the model; 1 the model disagrees at a step; 2 usage error (the file "
    "cannot be read or is not a trace); " + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, metavar="FILE")


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.traces.trace import TraceError, check
    from leaseproof.conformance.traces.trace import read as read_trace

    try:
        trace = read_trace(args.trace)
    except TraceError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    divergence = check(trace)
    if divergence is None:
        out.write(f"{args.trace}: all {len(trace.steps)} steps agree with the model\n")
        return EXIT_CONFORMS
    out.write(f"{args.trace}: the model disagrees\n{divergence.report()}\n")
    return EXIT_NONCONFORMING
