"""`leaseproof guarantees`: lease queues judged by the lease-queue profile. The options are here; the run is
`conformance/queues/matrix.py`'s, imported when one starts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from leaseproof.conformance.frontends.catalogue import QUEUE_SUBJECTS

DESCRIPTION = (
    "Judge lease queues (the bundled store and, with their extras installed, real libraries through their "
    "public APIs) by the lease-queue profile: fixed scenarios, generated programs and races of two or three clients; "
    "print which guarantees each one holds, breaks (with a replayable trace) or cannot be judged on."
)
EXITS = (
    "exit status: 0 the matrix was made and the bundled store holds every guarantee it is judged on; "
    "1 it does not (or --replay reproduced the violation); 2 usage, or a subject is not installed; "
    "3 --replay of a race could not force its recorded interleaving and the violation did not come back; "
    "130 interrupted"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--subjects",
        help=f"comma-separated: from {', '.join(QUEUE_SUBJECTS)}, a name an installed package registers in the "
        "leaseproof.subjects entry-point group, or leaseproof:MUTANT (default: the built-in ones, or none if "
        "--subject is given)",
    )
    parser.add_argument(
        "--subject",
        action="append",
        metavar="MODULE:CLASS",
        help="a queue adapter of your own (docs/queues.md, 'Judging your own queue'): CLASS(dsn) of MODULE, found in "
        "the current folder first; may be given more than once",
    )
    parser.add_argument("--examples", type=int, default=500, help="generated programs per subject (default: 500)")
    parser.add_argument(
        "--races",
        type=int,
        help="rounds of each race per subject (default: 100); with --replay of a race's trace, the rounds the replay "
        "may take to meet its violation again (default: 200)",
    )
    parser.add_argument(
        "--races-of",
        metavar="GUARANTEES",
        help="comma-separated: run only the races of these guarantees, from completion-racing-rescue, "
        "no-double-claim, rescue-only-expired (for instance more rounds of the race that found a violation); "
        "a guarantee only a race can break is then not checked unless its race runs (default: every race)",
    )
    parser.add_argument(
        "--terminate",
        type=float,
        default=0.5,
        metavar="RATE",
        help="the share of race rounds in which a busy connection of the queue's database is cut "
        "(pg_terminate_backend) while the clients run; 0: none (default: 0.5)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=int,
        metavar="N",
        help="every lease of every run, from a fetch or a heartbeat: N seconds, 3 or more (default: 30); the clock "
        "moves by 1, N/2, N-1, N and N+1 seconds",
    )
    parser.add_argument(
        "--start",
        metavar="INSTANT",
        help="the instant every run's clock starts at, ISO 8601 with its zone (default: 2030-01-01T00:00:00+00:00)",
    )
    parser.add_argument("--seed", type=int, help="the search's seed (default: a fresh one, printed)")
    parser.add_argument(
        "--traces",
        type=Path,
        default=Path("guarantee-traces"),
        help="where violations' traces go (default: ./guarantee-traces)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the matrix as JSON")
    parser.add_argument("--replay", type=Path, metavar="TRACE", help="run a trace file's program again, and only that")
    parser.add_argument("--dsn", help="a PostgreSQL server to use (default: the provisioned one)")


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.queues.matrix import command as run

    return run(args, out, err)
