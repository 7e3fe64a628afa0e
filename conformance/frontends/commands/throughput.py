"""`leaseproof throughput`: jobs per second of the bundled store, the bare floor and two peers.
The options are here; the run is `conformance/evidence/throughput.py`'s, imported when one starts."""

from __future__ import annotations

import argparse
from typing import TextIO

from leaseproof.conformance.frontends.catalogue import THROUGHPUT_SUBJECTS

DESCRIPTION = (
    "Measure jobs per second (enqueue, claim, finish) of the bundled delivery store against the bare floor "
    "(three bare statements a job) and, with the bench extra, procrastinate and PgQueuer: worker processes, "
    "fresh databases, interleaved rounds, medians."
)
EXITS = "exit status: 0 measured, 1 a subject's jobs were not all done, 2 usage, 130 interrupted"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=8, help="worker processes (default: 8)")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per subject per round (default: 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    parser.add_argument(
        "--subjects",
        default=None,
        help=f"comma-separated, from {', '.join(THROUGHPUT_SUBJECTS)} (default: all; the peers need the bench "
        "extra, and without it the default leaves them out and says so)",
    )
    parser.add_argument("--dsn", help="a PostgreSQL server to use (default: the provisioned one)")


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.evidence.throughput import command as run

    return run(args, out, err)
