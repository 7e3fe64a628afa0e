"""`leaseproof stress`: many clients at once, their histories checked for linearizability."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from leaseproof.conformance.frontends.catalogue import ALL_MUTANTS, CHECKER_BUDGET, MACHINES
from leaseproof.conformance.frontends.commands.common import (
    UsageError,
    adapter_errors_in_one_line,
    fraction,
    positive,
    positive_float,
    report_folder,
    seed_number,
    share,
)
from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, INTERRUPTED_EXITS
from leaseproof.conformance.frontends.progress import ProgressLine

if TYPE_CHECKING:  # what a run imports when it starts (`--help` does not)
    from leaseproof.conformance.boundary.protocols import SomeAdapter
    from leaseproof.conformance.concurrent.contend import Contender
    from leaseproof.conformance.concurrent.stress import Progress as StressProgress
    from leaseproof.conformance.concurrent.stress import StressReport, Stuck
    from leaseproof.conformance.frontends.commands.running import Provisioned

DESCRIPTION = (
    "Run small concurrent programs (a prefix, then short branches on WORKERS connections at once, the "
    "clock moving between rounds) against each machine's implementation, each program several times; "
    "check every recorded history for linearizability against the model."
)
EXITS = (
    "exit status: 0 every history linearizable; 1 a history is not (or the checker's budget left one "
    "unknown); 2 usage error, the implementation failed instead of answering, or --terminate ended no "
    "backend; " + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--machine", choices=sorted(MACHINES), help="stress one machine (default: both, or the mutant's)"
    )
    parser.add_argument("--workers", type=positive, default=8, help="concurrent clients (default: 8)")
    parser.add_argument("--duration", type=positive_float, default=30.0, help="seconds per machine (default: 30)")
    parser.add_argument("--repeats", type=positive, default=3, help="runs of each program (default: 3)")
    parser.add_argument(
        "--seed", type=seed_number, help="random seed, to reproduce a run (default: a fresh one, printed)"
    )
    parser.add_argument(
        "--lose-responses",
        type=fraction,
        default=0.0,
        metavar="P",
        help="drop this fraction of responses after the operation ran, so they are indeterminate (default: 0)",
    )
    parser.add_argument(
        "--terminate",
        type=share,
        default=0.0,
        metavar="P",
        help="in this fraction of rounds, end one busy backend of the implementation's database while the round "
        "runs (pg_terminate_backend: a connection cut mid-operation; the delivery machine; default: 0)",
    )
    parser.add_argument(
        "--contend",
        type=share,
        default=0.0,
        metavar="P",
        help="in this fraction of rounds, hold locks the implementation's statements take (learned from pg_locks "
        "while rounds run: rows, tables, advisory keys) from leaseproof's own connections, and let them go one at a "
        "time, in a seeded order, once its statements wait: races forced at the database, for any implementation "
        "(default: 0)",
    )
    parser.add_argument(
        "--database-dsn",
        "--terminate-dsn",
        dest="database_dsn",
        metavar="DSN",
        help="the implementation's database, where --terminate ends backends and --contend holds locks (default: "
        "the one leaseproof gave the implementation, else the one its hello announces)",
    )
    parser.add_argument(
        "--budget", type=positive, default=CHECKER_BUDGET, help="checker configurations per partition before 'unknown'"
    )
    parser.add_argument(
        "--trace-out",
        type=Path,
        metavar="FILE",
        help="where to write a violating history (default: leaseproof-history-SEED.jsonl)",
    )
    parser.add_argument("--dsn", help="PostgreSQL server to use (default: LEASEPROOF_DSN, else Docker, else embedded)")
    parser.add_argument(
        "--mutant",
        choices=ALL_MUTANTS,
        metavar="NAME",
        help="stress a known-buggy variant of the bundled implementation: " + ", ".join(ALL_MUTANTS),
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--adapter", metavar="MODULE:FACTORY", help="an in-process adapter that offers session()")
    chosen.add_argument(
        "--adapter-cmd",
        metavar="COMMAND",
        help="an adapter in a child process whose hello announces sessions (specs/adapter-protocol.md)",
    )
    parser.add_argument(
        "--reply-timeout",
        type=positive,
        default=30,
        help="seconds an --adapter-cmd child may take per reply (default: 30)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write an HTML page of each machine's run into DIR (made if missing) and print its path: "
        "stress-MACHINE-SEED.html, the verdict and the run's figures, and for a history that is not linearizable "
        "one sentence on why, the checker's minimal piece and the whole failing history as timelines (sessions, "
        "leases, generations, reaps, clock moves); the verdict and the exit status are the same with or without it",
    )
    adapter_errors_in_one_line(parser)


class _StressProgress(ProgressLine):
    """A stress run's progress on stderr: in place on a terminal, every 5 s otherwise."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream, every=5.0)

    def __call__(self, p: StressProgress) -> None:
        line = f"  {p.seconds:5.1f}s  programs {p.programs:,}  histories {p.histories:,}"
        self.show(line + f"  operations {p.operations:,} ({p.rate:,.0f}/s)", p.seconds)


def stress_with_progress(err: TextIO, adapter: SomeAdapter, **options: Any) -> StressReport:
    """A stress run (`conformance/concurrent/stress.py`, with `options`) whose progress is shown on `err`."""
    from leaseproof.conformance.concurrent.stress import stress

    progress = _StressProgress(err)
    try:
        return stress(adapter, on_progress=progress, **options)
    finally:
        progress.close()


# Why `--terminate` leaves the lifecycle alone: a fire's admission is a run id the
# implementation picks; a fire cut mid-way leaves unknown which id it took, and the
# checker leaves such a history unjudged ("unknown") rather than guess.
TERMINATE_MACHINES = ("delivery",)


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.concurrent.faults import FaultError
    from leaseproof.conformance.frontends.commands.running import each_machine, mutant_named

    databases: dict[str, str | None] = {}  # machine -> the DSN where --terminate or --contend works
    folder = report_folder(args.report)  # a folder that cannot be made: UsageError, exit 2 (cli)
    if args.database_dsn is not None and not (args.terminate or args.contend):
        err.write(
            "leaseproof: --database-dsn names where --terminate ends backends or --contend holds locks;"
            " give one of them too\n"
        )
        return EXIT_USAGE
    if args.terminate and args.contend:
        err.write("leaseproof: give --terminate or --contend, not both: one fault a round\n")
        return EXIT_USAGE
    if args.terminate:
        mutant = mutant_named(args.mutant)
        machine = args.machine or (mutant.machine if mutant is not None else None)
        if machine is not None and machine not in TERMINATE_MACHINES:
            err.write(
                f"leaseproof: --terminate applies to the delivery machine, not the {machine}: a fire cut mid-way "
                "leaves unknown which run id it took, and the checker would leave its histories unjudged\n"
            )
            return EXIT_USAGE
        if args.machine is None:
            args.machine = "delivery"
            err.write(
                "leaseproof: --terminate: stressing the delivery machine only (the lifecycle's fires pick run ids)\n"
            )

    def judge(adapter: SomeAdapter, machine: str, seed_value: int) -> int:
        from leaseproof.conformance.concurrent.contend import Contender

        faults = f", ending a busy backend in {args.terminate:g} of rounds" if args.terminate else ""
        contender = None
        if args.contend and (database := databases.get(machine)) is not None:
            faults = f", holding locks its statements take in {args.contend:g} of rounds"
            contender = Contender(database, args.contend, seed_value)
        out.write(
            f"stressing the {machine} machine against {adapter.name}: {args.workers} workers, "
            f"{args.duration:g}s, each program {args.repeats} times, seed {seed_value}{faults}\n"
        )
        out.flush()
        report = stress_with_progress(
            err,
            adapter,
            machine=machine,
            workers=args.workers,
            duration=args.duration,
            seed=seed_value,
            repeats=args.repeats,
            lose=args.lose_responses,
            budget=args.budget,
            terminate=args.terminate,
            database=databases.get(machine),
            faults=contender,
        )
        status = _stress_report(report, args, out, err, contender)
        if folder is not None:
            _write_page(folder, report, adapter.name, out, err)
        return status

    def adapter_for(args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO) -> SomeAdapter:
        adapter = _stress_adapter(args, machine, provisioned, out)
        announced = getattr(adapter, "databases", {}).get(machine)  # an adapter's hello may say (wire.py)
        databases[machine] = args.database_dsn or provisioned.last_database or announced
        if (args.terminate or args.contend) and databases[machine] is None:
            provisioned.release(adapter)
            option = "--terminate" if args.terminate else "--contend"
            raise UsageError(
                f"{option}: leaseproof did not give this implementation its database, and its hello announces "
                "none, so it cannot tell where to work; name the database it uses with --database-dsn DSN"
            )
        return adapter

    try:
        return each_machine(args, out, err, adapter_for, judge)
    except FaultError as exc:
        err.write(f"leaseproof: the fault injector failed, so the run was not judged: {exc}\n")
        return EXIT_USAGE


def _write_page(folder: Path, report: StressReport, subject: str, out: TextIO, err: TextIO) -> None:
    """The --report page of one machine's run, written after its verdict was printed; nothing
    here changes the verdict or the exit status: a failure is said on stderr."""
    from leaseproof.conformance.report import write_stress_report  # the pages' modules, when asked for

    try:
        path = write_stress_report(folder, report, subject=subject)
    except Exception as exc:  # noqa: BLE001 - a page that cannot be written leaves the verdict as it is
        err.write(f"leaseproof: could not write the report page into {folder}: {type(exc).__name__}: {exc}\n")
        return
    out.write(f"report: {path}\n")


def _stress_adapter(args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO) -> SomeAdapter:
    from leaseproof.conformance.boundary.protocols import Concurrent
    from leaseproof.conformance.boundary.wire import SubprocessAdapter
    from leaseproof.conformance.frontends.commands.running import adapter_named

    provisioned.last_database = None  # set again only if this adapter is given a database
    adapter = adapter_named(args, machine, provisioned, out)
    if isinstance(adapter, SubprocessAdapter) and not adapter.sessions:
        raise UsageError(
            f"--adapter-cmd {args.adapter_cmd!r}: {adapter.name} cannot be run concurrently:"
            f" {adapter.why_no_sessions()}"
        )
    if args.adapter is not None and not isinstance(adapter, Concurrent):
        adapter.close()
        raise UsageError(f"--adapter {args.adapter}: {adapter.name} has no session(), so it cannot be run concurrently")
    return adapter


def _not_live(report: StressReport, stuck: Stuck, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The verdict on a run in which an operation waited for a stalled tenant it must not wait for."""
    from leaseproof.conformance.concurrent.history_file import write_history
    from leaseproof.conformance.concurrent.models import SPECS
    from leaseproof.conformance.concurrent.stalls import WAIT_BOUND

    spec = SPECS[report.machine]
    out.write(
        f"verdict: NOT LIVE — {len(stuck.waited)} operation(s) waited for a stalled tenant, which a sweep or another"
        " tenant's operation must not: every outcome may be right, but one stuck client held them up\n"
    )
    for late in stuck.waited[:5]:
        op, stall = late.operation, late.stall
        out.write(
            f"  {op.client}: {spec.describe_command(op.command)} was in flight from at least {WAIT_BOUND:g}s before"
            f" the stall of tenant {spec.describe_key(stall.key)} ended until after it\n"
        )
    path = args.trace_out or Path(f"leaseproof-history-{report.seed}.jsonl")
    try:
        write_history(path, stuck.history)
    except (OSError, TypeError, ValueError) as exc:
        err.write(f"leaseproof: could not write the history to {path}: {exc}\n")
    else:
        out.write(f"history: {path} ({len(stuck.history):,} operations, the stalls among them)\n")
    return EXIT_NONCONFORMING


def _contention_line(contender: Contender, out: TextIO) -> None:
    c, learned = contender.counts, contender.map
    out.write(
        f"contention: locks held in {c.ended:,} rounds ({c.missed:,} more found nothing to hold), statements seen"
        f" waiting at a release {contender.waiting:,}; learned {len(learned.tables):,} tables and"
        f" {len(learned.advisory):,} advisory keys\n"
    )


def _stress_report(
    report: StressReport, args: argparse.Namespace, out: TextIO, err: TextIO, contender: Contender | None = None
) -> int:
    from leaseproof.conformance.concurrent.history_file import write_history
    from leaseproof.conformance.concurrent.linearizability import timeline
    from leaseproof.conformance.concurrent.models import SPECS
    from leaseproof.conformance.traces.trace import SPECS as LOCKSTEP_SPECS

    p = report.progress
    out.write(
        f"programs: {p.programs:,}   histories: {p.histories:,}   operations: {p.operations:,} ({p.rate:,.0f}/s)"
        f"   largest history: {p.largest:,}   indeterminate: {p.indeterminate:,}   time: {p.seconds:.1f}s\n"
    )
    if args.terminate:
        f = p.faults
        out.write(
            f"faults: backends ended {f.ended:,} (in {f.rounds_faulted:,} rounds due a cut; {f.missed:,} of them"
            " ended before a backend was busy)\n"
        )
        if f.rounds_faulted and not f.ended and report.finding is None:
            # Asked for cuts, and none landed: what was asked was not checked.
            err.write(
                "leaseproof: --terminate ended no backend: none of the database's backends was busy while the rounds "
                "ran, so the implementation's sessions use another database; name theirs with --database-dsn\n"
            )
            return EXIT_USAGE
    if contender is not None:
        _contention_line(contender, out)
    each = p.check_seconds / p.histories * 1000 if p.histories else 0.0
    out.write(f"checker: {p.check_seconds:.2f}s for {p.histories:,} histories ({each:.1f} ms each)\n")
    sent = {operation for operation, _, _ in p.behaviours}
    declared = [b for b in LOCKSTEP_SPECS[report.machine].behaviours() if b[0] in sent]
    never = [f"{op}/{guard}→{v}" for op, guard, v in declared if (op, guard, v) not in p.behaviours]
    out.write(
        f"behaviours exercised concurrently: {len(declared) - len(never)} of the {len(declared)} the rules declare"
        f" for the {len(sent)} operations sent; never: {', '.join(never) or 'none'}\n"
    )
    finding = report.finding
    if finding is None and report.stuck is not None:
        return _not_live(report, report.stuck, args, out, err)
    if finding is None:
        if p.unknown:
            out.write(
                f"verdict: UNKNOWN — the checker ran out of budget on {p.unknown:,} histories; "
                "raise --budget or shorten the programs\n"
            )
            return EXIT_NONCONFORMING
        out.write("verdict: LINEARIZABLE — every history is explained by some order of the model's steps\n")
        return EXIT_CONFORMS
    out.write(
        f"verdict: NOT LINEARIZABLE — a {finding.kind}: {finding.failed} of {finding.repeats} repetitions failed\n"
    )
    spec = SPECS[report.machine]
    assert finding.result.violation is not None
    # The sentence the page leads with, so that a CI log says what went wrong without the page.
    from leaseproof.conformance.concurrent.explain import violation_sentence

    out.write(f"why: {violation_sentence(finding.result.violation, spec, finding.history)}\n")
    out.write(timeline(finding.result.violation, spec) + "\n")
    path = args.trace_out or Path(f"leaseproof-history-{report.seed}.jsonl")
    piece = path.with_name(path.stem + "-piece" + path.suffix)
    try:
        write_history(path, finding.history)
        write_history(piece, finding.result.violation.piece)
    except (OSError, TypeError, ValueError) as exc:
        err.write(f"leaseproof: could not write the history to {path}: {exc}\n")
    else:
        out.write(f"history: {path} ({len(finding.history):,} operations, the whole failing run)\n")
        out.write(f"piece: {piece} (the piece above, from its partition's state; leaseproof check-history {piece})\n")
    return EXIT_NONCONFORMING
