"""`leaseproof spec`: the spec pages' generated blocks, written or checked."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, INTERRUPTED_EXITS
from leaseproof.conformance.spec.pages import FILES, PAGES, SpecPageError, stale_pages, write_pages

DESCRIPTION = (
    "Rewrite the blocks of specs/*.md that are generated from the model (rule tables, outcome variants, "
    "transitions with their Mermaid diagram, invariants); with --check, change nothing and exit 1 with a "
    "diff when any page differs from what the model generates."
)
EXITS = (
    "exit status: 0 the pages are current (or were rewritten); 1 with --check, a page is not current (the diff "
    "is printed); 2 a page cannot be read or written, or lacks its generated blocks; " + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is not current")
    parser.add_argument(
        "--specs", type=Path, default=Path("specs"), metavar="DIR", help="the spec pages (default: specs)"
    )


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        if args.check:
            stale = stale_pages(args.specs)
            for diff in stale.values():
                out.write(diff + "\n")
            if stale:
                names = ", ".join(str(path) for path in stale)
                err.write(f"leaseproof: not generated from the current model: {names}; run `leaseproof spec`\n")
                return EXIT_NONCONFORMING
            out.write(f"spec pages current: {', '.join([*(page.filename for page in PAGES), *FILES])}\n")
            return EXIT_CONFORMS
        changed = write_pages(args.specs)
    except (SpecPageError, OSError) as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    out.write(f"rewrote {', '.join(map(str, changed))}\n" if changed else "spec pages already current\n")
    return EXIT_CONFORMS


