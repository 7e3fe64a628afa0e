"""`leaseproof nemesis`: the bundled delivery store under faults, then an audit.
The options are here; the run is `conformance/concurrent/nemesis.py`'s, imported when one starts."""

from __future__ import annotations

import argparse
from typing import TextIO

from leaseproof.conformance.frontends.catalogue import FAULT_MUTANTS, NEMESIS_FAULTS, SERVICE_MUTANTS

DESCRIPTION = (
    "Worker processes claim, renew and finish deliveries of three tenants with the bundled store on the "
    "database's real clock, a reaper sweeps, and a seeded schedule kills workers, ends their backends, pauses "
    "them past their leases, stalls a client on one tenant's rows and restarts the server; then an audit: "
    "nothing lost, nothing settled twice, no stale holder's finish accepted, no generation claimed twice, "
    "nothing left claimed once every lease ran out, and the healthy tenants' worst reap delay against its bound."
)
EXITS = "exit status: 0 safe and live, 1 a safety check or the liveness bound failed, 2 usage, 130 interrupted"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The nemesis's options, for its own command line and for `leaseproof nemesis`."""
    parser.add_argument("--dsn", help="server (default: LEASEPROOF_DSN, else Docker, else embedded)")
    parser.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (default: fresh, printed)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of faults (default 20)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--deliveries", type=int, default=400, help="committed per tenant before the run (default 400)")
    parser.add_argument(
        "--mutant",
        choices=(*SERVICE_MUTANTS, *FAULT_MUTANTS),
        metavar="NAME",
        help="run a known-buggy variant of the bundled store instead, one the audit must catch: "
        + ", ".join((*SERVICE_MUTANTS, *FAULT_MUTANTS)),
    )
    parser.add_argument(
        "--faults",
        default=None,
        help=f"comma-separated, of {', '.join(NEMESIS_FAULTS)} (default: all; restart only on a server leaseproof "
        "starts, not one named by --dsn or LEASEPROOF_DSN)",
    )


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.concurrent.nemesis import command as run

    return run(args, out, err)
