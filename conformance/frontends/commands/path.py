"""`leaseproof path`: the folder of files installed with leaseproof, for the README's commands.

The spec pages, the regression corpus and the Node.js example adapter are
installed with the package, so their commands can be followed outside a
checkout::

    leaseproof replay "$(leaseproof path corpus)"/*.jsonl
    leaseproof verify --adapter-cmd "node $(leaseproof path node-example)/adapter.js"
"""

from __future__ import annotations

import argparse
from typing import TextIO

from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_USAGE, INTERRUPTED_EXITS
from leaseproof.conformance.frontends.installed import FOLDERS, NotInstalled, installed

DESCRIPTION = (
    "Print the folder of a part of what is installed with leaseproof, so that the README's commands can be "
    'followed outside a checkout, e.g. leaseproof replay "$(leaseproof path corpus)"/*.jsonl. '
    + " ".join(f"{name}: {what}." for name, (_, _, what) in FOLDERS.items())
)
EXITS = (
    "exit status: 0 the folder was printed; 2 it is not installed as a folder (a broken or zipped install); "
    + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=list(FOLDERS), metavar="NAME", help=f"one of {', '.join(FOLDERS)}")


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        folder = installed(args.name)
    except NotInstalled as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    out.write(f"{folder}\n")
    return EXIT_CONFORMS
