"""`leaseproof check-history`: a concurrent history checked for linearizability."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from leaseproof.conformance.frontends.catalogue import CHECKER_BUDGET
from leaseproof.conformance.frontends.commands.common import positive
from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, INTERRUPTED_EXITS

DESCRIPTION = (
    "Check a recorded concurrent history (JSON lines, as `leaseproof stress` writes it, or as another "
    "system records its clients' calls) for linearizability against the model of its machine."
)
EXITS = (
    "exit status: 0 linearizable; 1 not linearizable, or the checker's budget left it unknown; 2 usage error (the "
    "file cannot be read or is not a history); " + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("history", type=Path, metavar="FILE")
    parser.add_argument(
        "--budget", type=positive, default=CHECKER_BUDGET, help="checker configurations per partition before 'unknown'"
    )


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.concurrent.history_file import HistoryFileError, read_history
    from leaseproof.conformance.concurrent.linearizability import check as check_linearizable
    from leaseproof.conformance.concurrent.linearizability import timeline
    from leaseproof.conformance.concurrent.models import SPECS

    try:
        history = read_history(args.history)
    except HistoryFileError as exc:  # it names the file (and the line)
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    spec = SPECS[history.machine]
    result = check_linearizable(history, spec, budget=args.budget)
    out.write(f"{args.history}: {result.summary()}\n")
    if result.violation is not None:
        out.write(timeline(result.violation, spec) + "\n")
    return EXIT_CONFORMS if result.linearizable else EXIT_NONCONFORMING
