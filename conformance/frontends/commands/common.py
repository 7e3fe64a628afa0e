"""What the commands share: exit statuses, argument types, the adapter arguments, and
provisioning a server and an adapter for each machine a run names."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import random
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TextIO

from leaseproof.conformance.boundary.protocols import DeliveryAdapter
from leaseproof.conformance.boundary.wire import AdapterFault, SubprocessAdapter
from leaseproof.conformance.concurrent.stress import StressFault
from leaseproof.conformance.frontends.exits import (
    EXIT_CONFORMS,
    EXIT_NONCONFORMING,
    EXIT_SUBSET,
    EXIT_USAGE,
)
from leaseproof.conformance.harness.provision import (
    ProvisioningError,
    Server,
    postgres_server,
    require_test_databases,
    scratch_database,
)
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.conformance.lockstep.verify import MACHINES
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS, Mutant
from leaseproof.impl.mutants.faults import FAULT_MUTANTS
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS, LifecycleMutant
from leaseproof.impl.mutants.race import RACE_MUTANTS

# Of two machines' statuses, the worse is the run's: a failure to judge, then a
# non-conformance, then a verdict on a subset.
_SEVERITY = {EXIT_CONFORMS: 0, EXIT_SUBSET: 1, EXIT_NONCONFORMING: 2, EXIT_USAGE: 3}


def worse(a: int, b: int) -> int:
    return max(a, b, key=_SEVERITY.__getitem__)


# Sequential mutants (verify and stress), race mutants (stress: invisible one step at a time) and
# fault mutants (stress --terminate: invisible until a connection is cut).
SEQUENTIAL_MUTANTS: tuple[Mutant | LifecycleMutant, ...] = (*MUTANTS, *LIFECYCLE_MUTANTS)
ALL_MUTANTS: tuple[Mutant | LifecycleMutant, ...] = (*SEQUENTIAL_MUTANTS, *RACE_MUTANTS, *FAULT_MUTANTS)


def number(
    convert: Callable[[str], Any], noun: str, accepts: Callable[[Any], bool], rule: str
) -> Callable[[str], Any]:
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
        choices=[mutant.name for mutant in SEQUENTIAL_MUTANTS],
        metavar="NAME",
        help="use a known-buggy variant of the bundled implementation: "
        + ", ".join(mu.name for mu in SEQUENTIAL_MUTANTS),
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


def replay_command(path: Path, args: argparse.Namespace) -> str:
    """The `leaseproof replay` command that runs the trace at `path` against the implementation
    `args` named (`add_adapter_arguments`): the same mutant, adapter or adapter command, and
    reply timeout, so that the printed command, run as printed, meets the same failure. The
    server (--dsn) is left out: the failure is the implementation's, on any server."""
    words = ["leaseproof", "replay", str(path)]
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


def load_factory(spec: str) -> Callable[..., DeliveryAdapter]:
    """FACTORY of MODULE, MODULE found as `python -m` finds it: in the current folder first, then
    on sys.path (the installed `leaseproof` script does not put the current folder there itself)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"--adapter {spec!r}: expected MODULE:FACTORY, e.g. mypackage.leaseproof_adapter:make")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        factory: Callable[..., DeliveryAdapter] = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--adapter {spec!r}: cannot load it: {exc}") from None
    if not callable(factory):
        raise UsageError(f"--adapter {spec!r}: {attribute} is not callable")
    return factory


def takes_dsn(factory: Callable[..., DeliveryAdapter]) -> bool:
    try:
        return "dsn" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no introspectable signature: call it bare
        return False


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


class Provisioned:
    """What a run provisions, each on first use and stopped with the stack: the
    PostgreSQL server, and the --adapter-cmd child."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO, stack: contextlib.ExitStack) -> None:
        self.args, self.out, self.err, self.stack = args, out, err, stack
        self.server: Server | None = None
        self._child: SubprocessAdapter | None = None
        self.last_database: str | None = None  # the DSN `database()` handed out last

    def child(self) -> SubprocessAdapter:
        """The one --adapter-cmd child of the run: its hello tells which machines to
        check, and it then serves each of them (`use`), so the run starts it once."""
        if self._child is None:
            self._child = SubprocessAdapter(self.args.adapter_cmd, machine=None, reply_timeout=self.args.reply_timeout)
            self.stack.callback(self._child.close)
        return self._child

    def release(self, adapter: Any) -> None:
        """Close a machine's adapter once it is judged; the child stays for the next machine."""
        if adapter is not self._child:
            adapter.close()

    def database(self) -> str:
        """A fresh scratch database on the server, dropped with the stack."""
        if self.server is None:
            log = lambda line: self.err.write(f"  {line}\n")  # noqa: E731
            self.server = self.stack.enter_context(postgres_server(self.args.dsn, log=log))
            self.out.write(f"server: {self.server.description}\n")
        self.last_database = self.stack.enter_context(scratch_database(self.server))
        return self.last_database


def mutant_named(name: str | None) -> Mutant | LifecycleMutant | None:
    return None if name is None else by_name(ALL_MUTANTS, name)


def machines_named(args: argparse.Namespace, provisioned: Provisioned) -> list[str]:
    """The machines to verify: --machine, else what the mutant or adapter implies, else both."""
    if args.mutant and (args.adapter is not None or args.adapter_cmd is not None):
        raise UsageError("--mutant applies to the bundled implementation, not to --adapter/--adapter-cmd")
    mutant = mutant_named(args.mutant)
    implied = mutant.machine if mutant else None
    if args.adapter is not None:
        implied = "delivery"
    chosen = getattr(args, "machine", None)
    if chosen and implied and chosen != implied:
        why = "the in-process boundary carries the delivery machine" if args.adapter is not None else "that mutant"
        raise UsageError(f"--machine {chosen} does not fit {args.mutant or 'an in-process adapter'} ({why})")
    if chosen:
        return [chosen]
    if args.adapter_cmd is not None:
        return provisioned.child().announced()
    return [implied] if implied else list(MACHINES)


def adapter_named(
    args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO, lockstep: bool = False
) -> Any:
    """The adapter the arguments name for `machine`; the caller releases it (`Provisioned.release`).
    `lockstep`: for `run_conformance` alone (the bundled implementation is then a `ForkedAdapter`)."""
    if args.mutant and (args.adapter is not None or args.adapter_cmd is not None):
        raise UsageError("--mutant applies to the bundled implementation, not to --adapter/--adapter-cmd")
    if args.adapter_cmd is not None:
        return provisioned.child().use(machine)
    if args.adapter is not None:
        factory = load_factory(args.adapter)
        wants_dsn = takes_dsn(factory)
        try:
            adapter = factory(dsn=provisioned.database()) if wants_dsn else factory()
        except ProvisioningError:
            raise
        except Exception as exc:  # a broken factory is the user's adapter failing
            raise AdapterFault(f"--adapter {args.adapter}: the factory failed: {type(exc).__name__}: {exc}") from exc
        lacking = [name for name in ("name", "reset", "execute", "snapshot", "close") if not hasattr(adapter, name)]
        if lacking:
            raise UsageError(f"--adapter {args.adapter}: the factory returned {adapter!r}, which lacks {lacking}")
        return adapter
    mutant = mutant_named(args.mutant)
    if mutant is not None:
        out.write(f"mutant: {mutant.name} — {mutant.stands_for}\n")
    dsn = provisioned.database()
    assert provisioned.server is not None  # database() provisioned it
    require_test_databases(provisioned.server, "the bundled implementation")
    bundled: Callable[[], Any]
    if mutant is not None and mutant.machine == machine:
        bundled = lambda: mutant.adapter(dsn)  # noqa: E731
    elif machine == "lifecycle":
        bundled = lambda: PostgresLifecycleAdapter(dsn)  # noqa: E731
    else:
        bundled = lambda: PostgresDeliveryAdapter(dsn)  # noqa: E731
    # verify's lockstep checks the bundled implementation in a process of its own
    # (conformance/lockstep/forked.py); replay and stress call it directly.
    return ForkedAdapter(bundled, machine) if lockstep else bundled()


def each_machine(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    adapter_for: Callable[[argparse.Namespace, str, Provisioned, TextIO], Any],
    judge: Callable[[Any, str, int], int],
) -> int:
    """For every machine the arguments name: provision, build its adapter, judge
    it (`judge(adapter, machine, seed)` prints and returns an exit status), close it
    (an --adapter-cmd child, started once, serves every machine and is closed last).
    The worst status wins; usage, provisioning and adapter failures exit 2."""
    seed_value = args.seed if args.seed is not None else random.randrange(2**63)
    status = EXIT_CONFORMS
    try:
        with contextlib.ExitStack() as stack:
            provisioned = Provisioned(args, out, err, stack)
            for machine in machines_named(args, provisioned):
                adapter = adapter_for(args, machine, provisioned, out)
                try:
                    status = worse(status, judge(adapter, machine, seed_value))
                finally:
                    provisioned.release(adapter)
                out.flush()
    except (ProvisioningError, UsageError, AdapterFault) as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    except StressFault as exc:
        err.write(f"leaseproof: the implementation failed instead of answering, so nothing was judged: {exc}\n")
        return EXIT_USAGE
    return status


