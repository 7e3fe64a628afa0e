"""`leaseproof stress`: many clients at once, their histories checked for linearizability."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
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
    from leaseproof.conformance.concurrent.contend import Contender, Schedule
    from leaseproof.conformance.concurrent.programs import Program
    from leaseproof.conformance.concurrent.replay_file import ReplayFile
    from leaseproof.conformance.concurrent.stress import Finding, StressReport, Stuck
    from leaseproof.conformance.concurrent.stress import Progress as StressProgress
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
WORKERS, REPEATS, REPLAY_REPEATS, DURATION = 8, 3, 20, 30.0
# Runs of a contended finding's replay forced at once, before the run ends (`_check_replay`).
CHECK_RUNS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--machine", choices=sorted(MACHINES), help="stress one machine (default: both, or the mutant's)"
    )
    parser.add_argument("--workers", type=positive, help=f"concurrent clients (default: {WORKERS})")
    parser.add_argument("--duration", type=positive_float, help=f"seconds per machine (default: {DURATION:g})")
    parser.add_argument(
        "--repeats",
        type=positive,
        help=f"runs of each program (default: {REPEATS}; of the program a --replay runs: {REPLAY_REPEATS})",
    )
    parser.add_argument(
        "--replay",
        type=Path,
        metavar="FILE",
        help="run a finding again: the program of the replay file a failing run wrote (its seed, program and "
        "workers), forcing the locks --contend held in its failing repetition, and let go in the same order; "
        "exit 1 if a history is not linearizable again",
    )
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


def stress_with_progress(
    err: TextIO, adapter: SomeAdapter, run: Callable[..., StressReport] | None = None, **options: Any
) -> StressReport:
    """A stress run (`conformance/concurrent/stress.py`, with `options`; or `run`, as a replay)
    whose progress is shown on `err`."""
    from leaseproof.conformance.concurrent.stress import stress

    progress = _StressProgress(err)
    try:
        return (run or stress)(adapter, on_progress=progress, **options)
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
    replaying = _replay_file(args, err) if args.replay is not None else None
    if args.replay is not None and replaying is None:
        return EXIT_USAGE
    forcing = replaying is not None and replaying.schedule is not None  # holds to take again: a database
    args.workers = args.workers or (replaying.workers if replaying is not None else WORKERS)
    args.repeats = args.repeats or (REPLAY_REPEATS if replaying is not None else REPEATS)
    args.duration = args.duration or DURATION
    if args.database_dsn is not None and not (args.terminate or args.contend or forcing):
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

        if replaying is not None:
            status, report = _judge_replay(replaying, args, adapter, databases.get(machine), out, err)
            if folder is not None and report is not None:
                _write_page(folder, report, adapter.name, out, err, f"stress-{machine}-{seed_value}-replayed.html")
            return status
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
        found, database = report.finding, databases.get(machine)
        if contender is not None and found is not None and database is not None and any(found.schedule or ()):
            _check_replay(adapter, database, found.program, found.schedule, report.seed, report.workers, args, out, err)
        if folder is not None:
            _write_page(folder, report, adapter.name, out, err)
        return status

    def adapter_for(args: argparse.Namespace, machine: str, provisioned: Provisioned, out: TextIO) -> SomeAdapter:
        adapter = _stress_adapter(args, machine, provisioned, out)
        announced = getattr(adapter, "databases", {}).get(machine)  # an adapter's hello may say (wire.py)
        databases[machine] = args.database_dsn or provisioned.last_database or announced
        if (args.terminate or args.contend or forcing) and databases[machine] is None:
            provisioned.release(adapter)
            option = "--terminate" if args.terminate else "--contend" if args.contend else "--replay"
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


def _replay_file(args: argparse.Namespace, err: TextIO) -> ReplayFile | None:
    """The replay file --replay names, with the options it fixes set from it; None (said on
    `err`) if it cannot be read or an option contradicts it."""
    from leaseproof.conformance.concurrent.replay_file import ReplayFileError, read_replay

    try:
        replaying = read_replay(args.replay)
    except ReplayFileError as exc:
        err.write(f"leaseproof: --replay: {exc}\n")
        return None
    fixed = {"--machine": (args.machine, replaying.machine), "--seed": (args.seed, replaying.seed),
             "--workers": (args.workers, replaying.workers)}  # fmt: skip
    clashes = [f"{option} {given} (the file's is {theirs})" for option, (given, theirs) in fixed.items()
               if given is not None and given != theirs]  # fmt: skip
    if args.contend or args.terminate:
        clashes.append("--contend or --terminate (a replay forces what the file holds, and nothing else)")
    if args.duration is not None:
        clashes.append("--duration (a replay runs its one program --repeats times)")
    if clashes:
        err.write(f"leaseproof: --replay {args.replay} fixes the program and how it ran; leave out: ")
        err.write("; ".join(clashes) + "\n")
        return None
    args.machine, args.seed = replaying.machine, replaying.seed
    return replaying


def _judge_replay(
    replaying: ReplayFile,
    args: argparse.Namespace,
    adapter: SomeAdapter,
    database: str | None,
    out: TextIO,
    err: TextIO,
) -> tuple[int, StressReport | None]:
    """Run the replay file's program `--repeats` times, forcing its schedule: the exit status
    and the run (None: it could not be run), the verdict printed as stress prints it."""
    from leaseproof.conformance.concurrent.contend import Contender
    from leaseproof.conformance.concurrent.replay_file import digest
    from leaseproof.conformance.concurrent.stress import program_at, replay

    r = replaying
    program = program_at(r.machine, r.seed, r.index, r.workers, r.rounds, adapter)
    if digest(program) != r.digest:
        err.write(
            f"leaseproof: --replay {args.replay}: program {r.index + 1} of seed {r.seed} is not the one that failed"
            f" (its digest is {digest(program)}, the file's {r.digest}): the file was written by another version of"
            " leaseproof, or for an implementation that takes request keys where this one does not, or the reverse\n"
        )
        return EXIT_USAGE, None
    contender = None
    forced = "nothing forced (the run that found it held no locks: its timing was the machine's)"
    if r.schedule is not None and database is not None:
        held = [holds for holds in r.schedule if holds]
        forced = (
            f"forcing the {sum(map(len, held))} holds of its {len(held)} contended rounds"
            if held
            else "nothing to force (the failing repetition's rounds held no locks)"
        )
        contender = Contender(database, 1.0, r.seed, script=r.schedule)
    out.write(
        f"replaying program {r.index + 1} of seed {r.seed} on the {r.machine} machine against {adapter.name}"
        f" (it failed {r.failed} of {r.repeats} runs against {r.subject}): {r.workers} workers, {args.repeats} runs,"
        f" {forced}\n"
    )
    out.flush()
    report = stress_with_progress(
        err, adapter, program=program, seed=r.seed, workers=r.workers, repeats=args.repeats, lose=r.lose,
        budget=args.budget, faults=contender, run=replay,
    )  # fmt: skip
    if contender is not None and contender.untaken:
        shown = "; ".join(contender.untaken[:3]) + ("; ..." if len(contender.untaken) > 3 else "")
        out.write(f"schedule: {len(contender.untaken)} holds could not be taken again (not there, or held): {shown}\n")
    if report.finding is None:
        out.write(f"replay: not reproduced in {args.repeats} runs\n")
    else:
        out.write(f"replay: reproduced in {report.finding.failed} of {args.repeats} runs\n")
    return _stress_report(report, args, out, err, contender), report


def _check_replay(
    adapter: SomeAdapter,
    database: str,
    program: Program,
    schedule: Schedule,
    seed: int,
    workers: int,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
) -> None:
    """A contended finding's `program` with its `schedule`, forced again CHECK_RUNS times as `--replay`
    forces it (its progress on `err`): whether its replay file fails while the race is there, or the
    race needed timing the holds do not force (then the replay file may pass with the race still
    there, and the history is what shows it)."""
    from leaseproof.conformance.concurrent.contend import Contender
    from leaseproof.conformance.concurrent.stress import replay

    forced = Contender(database, 1.0, seed, script=schedule)  # closed by the run
    again = stress_with_progress(
        err, adapter, program=program, seed=seed, workers=workers, repeats=CHECK_RUNS, lose=args.lose_responses,
        budget=args.budget, faults=forced, run=replay,
    )  # fmt: skip
    failed = again.finding.failed if again.finding is not None else 0
    if failed:
        out.write(f"replay checked: forcing its holds again, the failure came back in {failed} of {CHECK_RUNS} runs\n")
    else:
        out.write(
            f"replay checked: forcing its holds again, the failure did not come back in {CHECK_RUNS} runs: the race"
            " needed timing the holds do not force, so the replay may pass while the race is there; the history"
            " shows it\n"
        )


def _write_page(
    folder: Path, report: StressReport, subject: str, out: TextIO, err: TextIO, filename: str | None = None
) -> None:
    """The --report page of one machine's run, written after its verdict was printed; nothing
    here changes the verdict or the exit status: a failure is said on stderr."""
    from leaseproof.conformance.report import write_stress_report  # the pages' modules, when asked for

    try:
        path = write_stress_report(folder, report, subject=subject, filename=filename)
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
    path = _history_path(args, report)
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
    path = _history_path(args, report)
    piece = path.with_name(path.stem + "-piece" + path.suffix)
    try:
        write_history(path, finding.history)
        write_history(piece, finding.result.violation.piece)
    except (OSError, TypeError, ValueError) as exc:
        err.write(f"leaseproof: could not write the history to {path}: {exc}\n")
    else:
        out.write(f"history: {path} ({len(finding.history):,} operations, the whole failing run)\n")
        out.write(f"piece: {piece} (the piece above, from its partition's state; leaseproof check-history {piece})\n")
    if args.replay is None:
        _write_replay(path, report, finding, args, out, err)
    return EXIT_NONCONFORMING


def _history_path(args: argparse.Namespace, report: StressReport) -> Path:
    """Where a failing history goes: --trace-out, else beside the run (a replay's apart from the run's)."""
    if args.trace_out is not None:
        return Path(args.trace_out)
    return Path(f"leaseproof-history-{report.seed}{'-replayed' if args.replay is not None else ''}.jsonl")


def _write_replay(
    history: Path, report: StressReport, finding: Finding, args: argparse.Namespace, out: TextIO, err: TextIO
) -> None:
    """The replay file of a finding, beside its history, and the command that runs it again."""
    from leaseproof.conformance.concurrent.replay_file import ReplayFile, digest, write_replay
    from leaseproof.conformance.frontends.commands.common import replay_command

    path = history.with_name(history.stem + "-replay.json")
    replaying = ReplayFile(
        report.machine, report.seed, finding.index, digest(finding.program), report.workers, finding.rounds,
        args.lose_responses, finding.schedule, finding.failed, finding.repeats, str(history), report.subject,
    )  # fmt: skip
    try:
        write_replay(path, replaying)
    except OSError as exc:
        err.write(f"leaseproof: could not write the replay file {path}: {exc}\n")
        return
    command = replay_command(path, args, ("stress", "--replay"))
    if args.database_dsn is not None and finding.schedule is not None:
        command += " --database-dsn " + shlex.quote(args.database_dsn)
    held = sum(bool(holds) for holds in finding.schedule or ())
    forced = f", with the locks held in {held} of its rounds" if held else ""
    out.write(f"replay: {path} (program {finding.index + 1} of the seed{forced}); {command}\n")
