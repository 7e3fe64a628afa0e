"""What the commands share before a run starts: exit statuses, argument types, the
adapter arguments, usage errors and the report folder. Light: `COMMAND --help` imports
it. Provisioning a server and an adapter for each machine is `running.py`'s."""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from leaseproof.conformance.frontends.catalogue import SEQUENTIAL_MUTANTS
from leaseproof.conformance.frontends.exits import (
    EXIT_CONFORMS,
    EXIT_NONCONFORMING,
    EXIT_SUBSET,
    EXIT_USAGE,
)

# Of two machines' statuses, the worse is the run's: a failure to judge, then a
# non-conformance, then a verdict on a subset.
_SEVERITY = {EXIT_CONFORMS: 0, EXIT_SUBSET: 1, EXIT_NONCONFORMING: 2, EXIT_USAGE: 3}


def worse(a: int, b: int) -> int:
    return max(a, b, key=_SEVERITY.__getitem__)


def number(convert: Callable[[str], Any], noun: str, accepts: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
    """An argparse type: `convert` the text, then require `accepts` of the value."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    return parse


positive = number(int, "an integer", lambda v: v > 0, "positive")
seed_number = number(int, "an integer", lambda v: 0 <= v < 2**63, "between 0 and 2**63 - 1")
positive_float = number(float, "a number", lambda v: v > 0, "positive")
fraction = number(float, "a number", lambda v: 0 <= v < 1, "at least 0 and below 1")
share = number(float, "a number", lambda v: 0 <= v <= 1, "from 0 to 1")


REPLY_TIMEOUT = 30  # seconds an --adapter-cmd child may take per reply, unless told


def add_adapter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", help="PostgreSQL server to use (default: LEASEPROOF_DSN, else Docker, else embedded)")
    parser.add_argument(
        "--mutant",
        choices=SEQUENTIAL_MUTANTS,
        metavar="NAME",
        help="use a known-buggy variant of the bundled implementation: " + ", ".join(SEQUENTIAL_MUTANTS),
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--adapter",
        metavar="MODULE:FACTORY",
        help="an in-process adapter: FACTORY() returns it (given dsn=... if it takes a dsn parameter); MODULE is "
        "looked up in the current folder first, as python -m does",
    )
    chosen.add_argument(
        "--adapter-cmd",
        metavar="COMMAND",
        help="an adapter in a child process speaking specs/adapter-protocol.md on stdin/stdout",
    )
    parser.add_argument(
        "--reply-timeout",
        type=positive,
        default=REPLY_TIMEOUT,
        help=f"seconds an --adapter-cmd child may take per reply (default: {REPLY_TIMEOUT})",
    )


def replay_command(path: Path, args: argparse.Namespace, command: tuple[str, ...] = ("replay",)) -> str:
    """The `leaseproof replay` command (or `command`, as `stress --replay`) that runs the trace
    at `path` against the implementation `args` named (`add_adapter_arguments`): the same
    mutant, adapter or adapter command, and reply timeout, so that the printed command, run as
    printed, meets the same failure. The server (--dsn) is left out: the failure is the
    implementation's, on any server."""
    words = ["leaseproof", *command, str(path)]
    if getattr(args, "mutant", None):
        words += ["--mutant", args.mutant]
    if getattr(args, "adapter", None):
        words += ["--adapter", args.adapter]
    if getattr(args, "adapter_cmd", None):
        words += ["--adapter-cmd", args.adapter_cmd]
        if args.reply_timeout != REPLY_TIMEOUT:
            words += ["--reply-timeout", str(args.reply_timeout)]
    return shlex.join(words)


# What an adapter option needs, said when argparse finds its value missing: argparse takes a
# value that starts with "-" for an option of its own, and says only "expected one argument".
_ADAPTER_VALUES = {
    "--adapter-cmd": "the command that starts the adapter, e.g. --adapter-cmd './my-adapter --verbose'",
    "--adapter": "MODULE:FACTORY, e.g. --adapter mypackage.leaseproof_adapter:make",
}


def adapter_errors_in_one_line(parser: argparse.ArgumentParser) -> None:
    """Make `parser`'s usage errors about --adapter-cmd and --adapter one line that says why,
    in place of the command's whole usage followed by argparse's words; other errors are
    argparse's own."""
    usage_error = parser.error

    def error(message: str) -> NoReturn:
        named = next((option for option in _ADAPTER_VALUES if f"argument {option}:" in message), None)
        if named is None and "not allowed with argument --adapter" not in message:
            usage_error(message)
        if named is not None and "expected one argument" in message:
            message = (
                f"{named} needs {_ADAPTER_VALUES[named]}; it was given none, or one that starts with '-', "
                f"which is then taken for an option: write that one as {named}=VALUE"
            )
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message}\n")

    setattr(parser, "error", error)  # noqa: B010 - on this parser only (argparse calls parser.error)


class UsageError(Exception):
    """Bad command-line input: exit 2 with this message."""


def report_folder(directory: Path | None) -> Path | None:
    """The folder a `--report DIR` names, made now (with its parents) so that a folder that
    cannot be made is a usage error before the run starts, not a lost page after it."""
    if directory is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"--report {directory}: a file of that name is in the way; name a folder") from None
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
        raise UsageError(f"--report {directory}: cannot make the folder: {why}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--report {directory}: the folder is not writable")
    return directory
