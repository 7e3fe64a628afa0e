"""What a run provisions for the commands that judge an implementation: the PostgreSQL
server, scratch databases, the --adapter-cmd child, and the adapter the arguments name
for each machine (the bundled implementation, a mutant of it, an in-process adapter or
an adapter command), then each machine judged in turn."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import random
from collections.abc import Callable
from typing import TextIO, TypeVar

import attrs

from leaseproof.conformance.boundary.loading import LoadError, import_target
from leaseproof.conformance.boundary.protocols import NotAnAdapter, SomeAdapter, as_adapter
from leaseproof.conformance.boundary.wire import AdapterFault, SubprocessAdapter
from leaseproof.conformance.concurrent.stress import StressFault
from leaseproof.conformance.frontends.commands.common import UsageError, worse
from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_USAGE
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.provision import ProvisioningError, postgres_server, require_test_databases
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep.core import Lockstepped
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.conformance.lockstep.verify import MACHINES
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS, Mutant
from leaseproof.impl.mutants.faults import FAULT_MUTANTS
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS, LifecycleMutant
from leaseproof.impl.mutants.race import RACE_MUTANTS

# Sequential mutants (verify and stress), race mutants (stress: invisible one step at a time) and
# fault mutants (stress --terminate: invisible until a connection is cut).
SEQUENTIAL_MUTANTS: tuple[Mutant | LifecycleMutant, ...] = (*MUTANTS, *LIFECYCLE_MUTANTS)
ALL_MUTANTS: tuple[Mutant | LifecycleMutant, ...] = (*SEQUENTIAL_MUTANTS, *RACE_MUTANTS, *FAULT_MUTANTS)
A = TypeVar("A", bound=Lockstepped)  # what a command judges: an adapter, or a `ForkedAdapter`


def load_factory(spec: str) -> Callable[..., object]:
    """FACTORY of MODULE (`conformance/boundary/loading.py`: the current folder first)."""
    try:
        factory = import_target(spec, "MODULE:FACTORY, e.g. mypackage.leaseproof_adapter:make")
    except LoadError as exc:
        raise UsageError(f"--adapter {spec!r}: {exc}") from None
    if not callable(factory):
        raise UsageError(f"--adapter {spec!r}: {spec.partition(':')[2]} is not callable")
    return factory


def takes_dsn(factory: Callable[..., object]) -> bool:
    try:
        return "dsn" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no introspectable signature: call it bare
        return False


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
            self._child = SubprocessAdapter(
                self.args.adapter_cmd,
                machine=None,
                reply_timeout=self.args.reply_timeout,
                env=getattr(self.args, "adapter_env", None),  # what a command sets for its child (nemesis)
            )
            self.stack.callback(self._child.close)
        return self._child

    def release(self, adapter: Lockstepped) -> None:
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


def adapter_named(args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO) -> SomeAdapter:
    """The adapter the arguments name for `machine`; the caller releases it (`Provisioned.release`)."""
    chosen = _chosen(args, machine, provisioned, out)
    return chosen.make() if isinstance(chosen, _Bundled) else chosen


def lockstep_adapter_named(
    args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO
) -> SomeAdapter | ForkedAdapter:
    """As `adapter_named`, for `run_conformance` alone: the bundled implementation is then a
    `ForkedAdapter`, checked in a process of its own (conformance/lockstep/forked.py)."""
    chosen = _chosen(args, machine, provisioned, out)
    return ForkedAdapter(chosen.make, machine) if isinstance(chosen, _Bundled) else chosen


@attrs.frozen
class _Bundled:
    """How to build the bundled implementation (or a mutant of it) on its scratch database."""

    make: Callable[[], SomeAdapter]


def _chosen(args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO) -> SomeAdapter | _Bundled:
    """The adapter the arguments name, or for the bundled implementation how to build it."""
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
        try:
            return as_adapter(adapter)
        except NotAnAdapter as exc:
            raise UsageError(f"--adapter {args.adapter}: {exc}") from None
    mutant = mutant_named(args.mutant)
    if mutant is not None:
        out.write(f"mutant: {mutant.name} — {mutant.stands_for}\n")
    dsn = provisioned.database()
    assert provisioned.server is not None  # database() provisioned it
    require_test_databases(provisioned.server, "the bundled implementation")
    bundled: Callable[[], SomeAdapter]
    if mutant is not None and mutant.machine == machine:
        bundled = lambda: mutant.adapter(dsn)  # noqa: E731
    elif machine == "lifecycle":
        bundled = lambda: PostgresLifecycleAdapter(dsn)  # noqa: E731
    else:
        bundled = lambda: PostgresDeliveryAdapter(dsn)  # noqa: E731
    return _Bundled(bundled)


def each_machine(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    adapter_for: Callable[[argparse.Namespace, str, Provisioned, TextIO], A],
    judge: Callable[[A, str, int], int],
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
