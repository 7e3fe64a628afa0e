"""`leaseproof nemesis`: an implementation under faults, then a judgement.

Two runs share the command. Without an adapter, the bundled delivery store is used as a
service uses it, on the database's real clock, and audited afterwards
(`conformance/concurrent/nemesis.py`). With `--adapter-cmd` or `--adapter`, any
implementation with sessions is run as `leaseproof stress` runs it, while faults strike
inside its rounds (`conformance/concurrent/faults.py`: its process killed and started
again, its process paused, its database backends ended, a tenant's rows held by a stalled
client, its network traffic lost, delayed or cut), and every history is judged by the
model; an operation that waited for a stalled tenant it had no business waiting for is a
finding too. The options are here; what a run needs is imported when one starts."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, TextIO

from leaseproof.conformance.frontends.catalogue import FAULT_MUTANTS, NEMESIS_FAULTS, SERVICE_MUTANTS
from leaseproof.conformance.frontends.commands.common import (
    UsageError,
    adapter_errors_in_one_line,
    positive,
    share,
)
from leaseproof.conformance.frontends.exits import EXIT_USAGE

if TYPE_CHECKING:
    from collections.abc import Callable

    from leaseproof.conformance.boundary.protocols import SomeAdapter
    from leaseproof.conformance.concurrent.faults import RoundFault
    from leaseproof.conformance.frontends.commands.running import Provisioned
    from leaseproof.conformance.harness.proxy import FaultProxy

DESCRIPTION = (
    "Without an adapter: worker processes claim, renew and finish deliveries of three tenants with the bundled "
    "store on the database's real clock, a reaper sweeps, and a seeded schedule kills workers, ends their "
    "backends, pauses them past their leases, stalls a client on one tenant's rows, loses, delays and resets "
    "their network traffic and restarts the server; then an audit: nothing lost, nothing settled twice, no stale "
    "holder's finish accepted, no generation claimed twice, nothing left claimed once every lease ran out, and "
    "the healthy tenants' worst reap delay against its bound. With --adapter-cmd or --adapter: any "
    "implementation with sessions runs stress's concurrent programs while, in a share of the rounds, its process "
    "is killed and started again (its state must survive, in the database its hello announces), paused, "
    "one of its database backends ended, one tenant's rows held by a stalled client, or its traffic with its "
    "server lost, delayed or cut; every history is judged by the model, and a sweep or another tenant's "
    "operation that waited for the stalled tenant is a finding."
)
EXITS = (
    "exit status: 0 safe and live (with an adapter: every history linearizable), 1 a safety check or the "
    "liveness bound failed (with an adapter: a history is not linearizable, or an operation waited for a "
    "stall), 2 usage, no fault applies to the adapter, or the implementation failed instead of answering, "
    "130 interrupted"
)
# The faults for an implementation leaseproof knows only through its adapter
# (conformance/concurrent/faults.py), in the order they are listed; the last four are the
# proxy's, between the implementation and its server (NETWORK_FAULTS there).
ADAPTER_FAULTS = ("kill", "pause", "terminate", "stall", "lose-answer", "reset", "delay", "blackhole")
_NETWORK = ADAPTER_FAULTS[4:]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The nemesis's options, for its own command line and for `leaseproof nemesis`."""
    parser.add_argument("--dsn", help="server (default: LEASEPROOF_DSN, else Docker, else embedded)")
    parser.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (default: fresh, printed)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of faults (default 20)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes, or sessions (default 4)")
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
        f"starts, not one named by --dsn or LEASEPROOF_DSN); with an adapter, of {', '.join(ADAPTER_FAULTS)} "
        "(default: every one that applies to it)",
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--adapter-cmd",
        metavar="COMMAND",
        help="run this implementation instead: an adapter in a child process whose hello announces sessions "
        "(specs/adapter-protocol.md); to be killed and started again, its state must live in a database its "
        "hello announces",
    )
    chosen.add_argument(
        "--adapter", metavar="MODULE:FACTORY", help="run this in-process adapter, which offers session(), instead"
    )
    parser.add_argument("--machine", choices=("delivery", "lifecycle"), help="with an adapter: one machine")
    parser.add_argument(
        "--rate",
        type=share,
        default=0.5,
        metavar="P",
        help="with an adapter: the share of rounds a fault strikes in (default: 0.5)",
    )
    parser.add_argument("--repeats", type=positive, default=2, help="with an adapter: runs of each program (default 2)")
    parser.add_argument(
        "--rounds",
        type=positive,
        default=4,
        help="with an adapter: rounds of each program (default 4, stress's 2: a fault is seen by what comes after it)",
    )
    parser.add_argument(
        "--reply-timeout", type=positive, default=30, help="seconds an --adapter-cmd child may take per reply"
    )
    adapter_errors_in_one_line(parser)


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.adapter is None and args.adapter_cmd is None:
        if args.machine is not None:
            err.write("leaseproof: --machine applies with an adapter; the bundled store's nemesis is the delivery's\n")
            return EXIT_USAGE
        from leaseproof.conformance.concurrent.nemesis import command as run

        return run(args, out, err)
    return _of_adapter(args, out, err)


def _of_adapter(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The nemesis of an implementation behind an adapter: stress with faults in its rounds."""
    from leaseproof.conformance.boundary.protocols import announced_database
    from leaseproof.conformance.concurrent.faults import FaultError
    from leaseproof.conformance.frontends.commands.running import each_machine
    from leaseproof.conformance.frontends.commands.stress import _stress_adapter

    asked = None if args.faults is None else tuple(kind for kind in args.faults.split(",") if kind)
    if problem := _misused(args, asked):
        err.write(f"leaseproof: {problem}\n")
        return EXIT_USAGE
    databases: dict[str, str | None] = {}
    args.terminate, args.trace_out = 0.0, None  # what the stress report reads
    proxy, problem = _adapter_environment(args, asked)
    if problem:
        err.write(f"leaseproof: {problem}\n")
        return EXIT_USAGE

    def adapter_for(args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO) -> SomeAdapter:
        adapter = _stress_adapter(args, machine, provisioned, out)
        databases[machine] = provisioned.last_database or announced_database(adapter, machine)
        return adapter

    def judge(adapter: SomeAdapter, machine: str, seed: int) -> int:
        injectors, left_out = _injectors(args, adapter, machine, databases.get(machine), seed, proxy)
        for kind, why in left_out:
            (err if asked else out).write(f"{'leaseproof: ' if asked else ''}no {kind} fault: {why}\n")
        if (asked and left_out) or not injectors:
            for injector in injectors:
                injector.close()
            raise UsageError(f"no fault of {', '.join(asked or ADAPTER_FAULTS)} applies to {adapter.name} as asked")
        return _run_with_faults(args, adapter, machine, seed, injectors, asked, out, err)

    try:
        return each_machine(args, out, err, adapter_for, judge)
    except FaultError as exc:
        err.write(f"leaseproof: the fault injector failed, so the run was not judged: {exc}\n")
        return EXIT_USAGE
    finally:
        if proxy is not None:
            proxy.close()


def _misused(args: argparse.Namespace, asked: tuple[str, ...] | None) -> str:
    """What is wrong with the arguments of a nemesis of an adapter ("" if nothing)."""
    unknown = sorted(set(asked or ()) - set(ADAPTER_FAULTS))
    if unknown or asked == ():
        return f"with an adapter, --faults takes {', '.join(ADAPTER_FAULTS)}, not {unknown or '--'}"
    if args.mutant is not None:
        return "--mutant applies to the bundled store's nemesis, not to --adapter/--adapter-cmd"
    if args.duration <= 0 or args.workers < 1:
        return "--duration and --workers must be positive"
    return ""


def _adapter_environment(args: argparse.Namespace, asked: tuple[str, ...] | None) -> tuple[FaultProxy | None, str]:
    """Start the adapter's command with LEASEPROOF_DSN naming the server named here (--dsn,
    LEASEPROOF_DSN), which outlives its process; for the network faults, through a proxy in
    front of it, which is returned (the caller closes it). Or why no proxy could be started."""
    from leaseproof.conformance.harness.proxy import FaultProxy

    named = args.dsn or os.environ.get("LEASEPROOF_DSN")
    if args.adapter_cmd is None or not named:
        return None, ""
    proxy = None
    if any(asked is None or kind in asked for kind in _NETWORK):
        try:
            proxy = FaultProxy(named).start()
        except (ValueError, OSError) as exc:
            return None, f"cannot put a proxy in front of the server {named!r}: {exc}"
    args.adapter_env = {"LEASEPROOF_DSN": named if proxy is None else proxy.dsn_through(named)}
    return proxy, ""


def _run_with_faults(
    args: argparse.Namespace,
    adapter: SomeAdapter,
    machine: str,
    seed: int,
    injectors: list[RoundFault],
    asked: tuple[str, ...] | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """Stress `adapter` with `injectors` in a share of its rounds; print what landed, then the verdict."""
    from leaseproof.conformance.concurrent.faults import Mix, Staller
    from leaseproof.conformance.frontends.commands.stress import _stress_report, stress_with_progress

    kinds = ", ".join(injector.kind for injector in injectors)
    out.write(
        f"nemesis of the {machine} machine against {adapter.name}: {args.workers} sessions, {args.duration:g}s,"
        f" {args.rounds} rounds a program, each {args.repeats} times, seed {seed}; faults {kinds},"
        f" in {args.rate:g} of rounds\n"
    )
    out.flush()
    mix = Mix(injectors, args.rate, seed)
    report = stress_with_progress(
        err,
        adapter,
        machine=machine,
        workers=args.workers,
        duration=args.duration,
        seed=seed,
        repeats=args.repeats,
        faults=mix,
        rounds=args.rounds,
    )
    landed = ", ".join(
        f"{kind} {counts.ended:,} (of {counts.rounds_faulted:,} due)" for kind, counts in mix.each.items()
    )
    out.write(f"faults: {landed}\n")
    staller = mix.injectors.get("stall")
    if isinstance(staller, Staller) and staller.counts.ended:
        out.write(f"stalls: {staller.rows:,} rows held in all\n")
        if not staller.rows:  # stalls that held nothing checked nothing
            held_none = (
                "the stalls held no row: no uuid column of its database names the tenants the programs use,"
                " so nothing was stalled"
            )
            if asked and "stall" in asked:
                err.write(f"leaseproof: {held_none}\n")
                return EXIT_USAGE
            out.write(f"note: {held_none}\n")
    return _stress_report(report, args, out, err)


# Why the faults that cut an operation mid-way leave the lifecycle alone: a fire's admission
# is a run id the implementation picks, and a fire cut mid-way leaves unknown which it took;
# the checker leaves such a history unjudged (as `stress --terminate` does).
_CUTS = ("kill", "terminate", "lose-answer", "reset")  # the faults that cut an operation mid-way
_CUT_MID_WAY = (
    "a fire cut mid-way leaves unknown which run id it took, and the checker would leave the history unjudged"
)


def _injectors(
    args: argparse.Namespace,
    adapter: SomeAdapter,
    machine: str,
    database: str | None,
    seed: int,
    proxy: FaultProxy | None,
) -> tuple[list[RoundFault], list[tuple[str, str]]]:
    """The injectors asked for (or every one) that apply to `adapter`, and why each other
    is left out. `proxy`: in front of the server the adapter was told to use, if any; the
    injectors' own connections go around it."""
    from leaseproof.conformance.concurrent.faults import Network, Staller, Terminator

    def direct(dsn: str) -> str:
        return dsn if proxy is None else proxy.direct(dsn)

    asked = ADAPTER_FAULTS if args.faults is None else tuple(k for k in args.faults.split(",") if k)
    chosen: list[RoundFault] = []
    left_out: list[tuple[str, str]] = []
    for kind in (kind for kind in ADAPTER_FAULTS if kind in asked):
        if kind in _CUTS and machine != "delivery":
            left_out.append((kind, f"the {machine} machine: {_CUT_MID_WAY}"))
        elif kind in _NETWORK:
            if proxy is not None and not (why := _no_network(args, proxy)):
                chosen.append(Network(proxy, kind, 1.0, seed))
            else:
                left_out.append((kind, _no_network(args, proxy)))
        elif kind in ("kill", "pause"):
            fault, why = _of_its_process(kind, adapter, machine, direct, seed)
            if fault is not None:
                chosen.append(fault)
            else:
                left_out.append((kind, why))
        elif database is None:
            left_out.append((kind, "leaseproof did not give it its database, and its hello announces none"))
        elif kind == "stall":
            staller = Staller(direct(database), 1.0, seed)
            if staller.columns:
                chosen.append(staller)
            else:
                staller.close()
                left_out.append((kind, "no table of its database has a uuid column that could name a tenant"))
        else:
            chosen.append(Terminator(direct(database), 1.0, seed))
    return chosen, left_out


def _of_its_process(
    kind: str, adapter: SomeAdapter, machine: str, direct: Callable[[str], str], seed: int
) -> tuple[RoundFault | None, str]:
    """The kill or the pause of the adapter's process, or None and why it has none."""
    from leaseproof.conformance.boundary.wire import SubprocessAdapter
    from leaseproof.conformance.concurrent.faults import Killer, Pauser

    if not isinstance(adapter, SubprocessAdapter):
        what = "kill and start again" if kind == "kill" else "stop"
        return None, f"an in-process adapter has no process of its own to {what}"
    child = adapter
    if kind == "pause":
        return Pauser(lambda: int(child.process.pid), 1.0, seed), ""
    if why := child.why_no_restart():
        return None, why
    return Killer(child, direct(child.databases[machine]), 1.0, seed), ""


def _no_network(args: argparse.Namespace, proxy: FaultProxy | None) -> str:
    """Why the network faults do not apply ("" if they do)."""
    if args.adapter_cmd is None:
        return "an in-process adapter is not started with LEASEPROOF_DSN, which the proxy's faults need"
    if proxy is None:
        return (
            "no server is named (--dsn or LEASEPROOF_DSN) to put a proxy in front of, for its command to take"
            " from LEASEPROOF_DSN"
        )
    if not proxy.connections:
        return "its command made no connection through the proxy: it does not take its server from LEASEPROOF_DSN"
    return ""
