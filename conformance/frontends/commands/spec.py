"""`leaseproof spec`: the spec pages' generated blocks, written or checked.

Which pages, without --specs: ./specs when the current folder has one (a
checkout's root, where CI runs it: a stale page of the repository fails there
even though the installed package carries pages of its own), else the pages
installed with leaseproof (`leaseproof path specs`), which --check reads and
the writing form never rewrites.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, INTERRUPTED_EXITS
from leaseproof.conformance.frontends.installed import NotInstalled, installed

CHECKOUT_SPECS = Path("specs")

DESCRIPTION = (
    "Rewrite the blocks of specs/*.md that are generated from the model (rule tables, outcome variants, "
    "transitions with their Mermaid diagram, invariants); with --check, change nothing and exit 1 with a "
    "diff when any page differs from what the model generates. Without --specs the pages are ./specs when "
    "the current folder has one (a checkout's root), else the pages installed with leaseproof: --check "
    "checks those against the installed model, and the writing form refuses to rewrite them."
)
EXITS = (
    "exit status: 0 the pages are current (or were rewritten); 1 with --check, a page is not current (the diff "
    "is printed); 2 a page cannot be read or written, or lacks its generated blocks, or there is no ./specs to "
    "rewrite; " + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is not current")
    parser.add_argument(
        "--specs",
        type=Path,
        metavar="DIR",
        help="the folder of the spec pages (default: ./specs if there is one, else the pages installed with "
        "leaseproof, which `leaseproof path specs` prints)",
    )


def _folder(args: argparse.Namespace) -> tuple[Path, bool]:
    """The folder of the pages, and whether it is the installed one (the default outside a checkout)."""
    if args.specs is not None:
        return args.specs, False
    if CHECKOUT_SPECS.is_dir():
        return CHECKOUT_SPECS, False
    return installed("specs"), True


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.spec.pages import FILES, PAGES, SpecPageError, stale_pages, write_pages

    try:
        folder, is_installed = _folder(args)
        where = f"installed with leaseproof, in {folder}" if is_installed else f"in {folder}"
        if args.check:
            stale = stale_pages(folder)
            for diff in stale.values():
                out.write(diff + "\n")
            if stale:
                names = ", ".join(str(path) for path in stale)
                fix = "reinstall leaseproof" if is_installed else "run `leaseproof spec`"
                err.write(f"leaseproof: not generated from the current model: {names}; {fix}\n")
                return EXIT_NONCONFORMING
            out.write(f"spec pages current: {', '.join([*(page.filename for page in PAGES), *FILES])} ({where})\n")
            return EXIT_CONFORMS
        if is_installed:
            err.write(
                f"leaseproof: no ./specs here to rewrite, and the pages installed with leaseproof ({folder}) are "
                "never rewritten: run `leaseproof spec` from the root of a checkout, or name the pages with "
                "--specs DIR (`leaseproof spec --check` checks the installed ones)\n"
            )
            return EXIT_USAGE
        changed = write_pages(folder)
    except (SpecPageError, NotInstalled, OSError) as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    out.write(f"rewrote {', '.join(map(str, changed))}\n" if changed else f"spec pages already current ({where})\n")
    return EXIT_CONFORMS
