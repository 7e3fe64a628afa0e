"""`leaseproof`: the command line.

This module is all that `leaseproof --help` and `leaseproof --version` import:
the command names and their one-line help live here, and each command's module
(`conformance/frontends/commands/`, or the module named below) is imported only
when a run names that command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Iterable
from types import ModuleType

from leaseproof.conformance.frontends.exits import EXIT_INTERRUPTED, EXIT_USAGE, INTERRUPTED_EXITS
from leaseproof.conformance.harness.interrupts import interruptible

_COMMANDS_PACKAGE = "leaseproof.conformance.frontends.commands"
# Each command: the module that implements it (DESCRIPTION, EXITS, add_arguments, command)
# and its line in the top-level help.
COMMANDS: dict[str, tuple[str, str]] = {
    "verify": (
        f"{_COMMANDS_PACKAGE}.verify",
        "drive each model and its implementation in lockstep and give the verdict",
    ),
    "replay": (
        f"{_COMMANDS_PACKAGE}.replay",
        "replay trace files against an implementation and report the first divergence of each",
    ),
    "check-trace": (f"{_COMMANDS_PACKAGE}.check_trace", "check a history recorded by another system against the model"),
    "check-history": (
        f"{_COMMANDS_PACKAGE}.check_history",
        "check a concurrent history (as stress writes it) for linearizability against the model",
    ),
    "spec": (
        f"{_COMMANDS_PACKAGE}.spec",
        "write the spec pages' generated blocks from the model, or check that they are current",
    ),
    "nemesis": (
        f"{_COMMANDS_PACKAGE}.nemesis",
        "run the bundled delivery store, or any implementation with sessions, under faults and judge it",
    ),
    "guarantees": (
        f"{_COMMANDS_PACKAGE}.guarantees",
        "judge lease queues (the bundled store, real libraries) by the lease-queue profile; print the matrix",
    ),
    "throughput": (
        f"{_COMMANDS_PACKAGE}.throughput",
        "measure jobs per second of the bundled store against the bare floor and procrastinate and PgQueuer",
    ),
    "stress": (
        f"{_COMMANDS_PACKAGE}.stress",
        "run many clients at once against an implementation and check the histories for linearizability",
    ),
    "mutants": (
        f"{_COMMANDS_PACKAGE}.mutants",
        "run every shipped mutant against the checks that apply to it and print the kill matrix",
    ),
    "explore": (
        f"{_COMMANDS_PACKAGE}.explore",
        "explore every state of each model within small bounds and check its invariants and rules (no database)",
    ),
    "path": (f"{_COMMANDS_PACKAGE}.path", "print the installed folder of the spec pages, the corpus, the Node example"),
}

EXITS = (
    "exit status, for every command: 0 the check passed; 1 it failed (does not conform, not linearizable, a "
    "mutant survived ...); 2 usage or provisioning error, or the implementation failed so nothing was judged; "
    "3 (verify, replay) conforms on a subset of the operations; " + INTERRUPTED_EXITS + ". "
    "`leaseproof COMMAND --help` says what each status means for that command."
)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's own, except that it never breaks a line inside a word: textwrap
    breaks at hyphens by default, which cut mutant names such as reconcile-unfenced."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
            break_long_words=False,
        )


def load(name: str) -> ModuleType:
    """The module of command `name` (imported now, if it was not)."""
    return importlib.import_module(COMMANDS[name][0])


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("leaseproof")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser(
    full: Iterable[str] | None = None, subparsers: dict[str, argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    """The parser of every command; only the commands in `full` (default: all) get
    their arguments, which imports their modules. The others carry their help line
    alone, which is all the top-level `--help` shows. Each command's own parser is
    put in `subparsers`, when given, under its name."""
    loaded = set(COMMANDS if full is None else full)
    parser = argparse.ArgumentParser(
        prog="leaseproof",
        description="Verify lease-fenced, multi-tenant state machines on PostgreSQL against their executable model.",
        epilog=EXITS,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_line) in COMMANDS.items():
        if name not in loaded:
            commands.add_parser(name, help=help_line, formatter_class=HelpFormatter)
            continue
        module = load(name)
        sub = commands.add_parser(
            name, help=help_line, description=module.DESCRIPTION, epilog=module.EXITS, formatter_class=HelpFormatter
        )
        module.add_arguments(sub)
        if subparsers is not None:
            subparsers[name] = sub
    return parser


def _named_command(argv: list[str]) -> str | None:
    """The command a command line names: its first word that is not an option (the
    top level has no option that takes a value)."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in COMMANDS else None


def _run(args: argparse.Namespace) -> int:
    """Run the command; bad input it finds (`UsageError`) and a server that cannot be had
    (`ProvisioningError`) are usage errors for every command alike: one line, exit 2."""
    module = load(args.command)
    try:
        return int(module.command(args, sys.stdout, sys.stderr))
    except Exception as exc:
        # Imported here, not at the top: they import psycopg.
        from leaseproof.conformance.frontends.commands.common import UsageError
        from leaseproof.conformance.harness.provision import ProvisioningError

        if not isinstance(exc, ProvisioningError | UsageError):
            raise
        sys.stderr.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # SIGTERM and SIGHUP end a run as Ctrl-C does: through every `with`, so scratch
    # databases are dropped, worker processes stopped and an embedded server shut down.
    try:
        with interruptible():
            name = _named_command(words)
            own: dict[str, argparse.ArgumentParser] = {}
            parser = build_parser(full=() if name is None else (name,), subparsers=own)
            args, unknown = parser.parse_known_args(words)
            if unknown:
                # Said by the command's own parser, with its usage: the top level's would
                # show the list of commands, not the options the command takes.
                (own.get(args.command) or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
            return _run(args)
    except KeyboardInterrupt:
        sys.stderr.write("leaseproof: interrupted; cleaned up\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
