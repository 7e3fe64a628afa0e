"""`leaseproof guarantees`: which lease guarantees each queue gives, as a matrix.

Each subject (a queue, `subjects/`) is judged on a scratch database of its own
by the lease-queue profile (`leaseproof.model.queue`): the fixed scenario of
each guarantee, `--examples` generated programs (seeded, shrunk when they break
something), and `--races` rounds of each race of two or three clients (or only of
the races `--races-of` names), each
followed by a drain every job must survive; in a `--terminate` share of the
race rounds a busy backend of the queue's database is ended. A cell is
`violated` (the shortest program found goes to a trace file that `--replay`
runs again), `holds`, `inconclusive` (a run the profile could not follow, or
nothing judged it) or `n/a` (the queue's API lacks what the guarantee needs,
never counted as a pass). docs/queues.md says more.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import re
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TextIO

import attrs

from leaseproof.conformance.concurrent.faults import FaultCounts, Terminator
from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.interleave import Event, Interleaver, in_finishing_order
from leaseproof.conformance.harness.provision import postgres_server, require_test_databases
from leaseproof.conformance.harness.proxy import FaultProxy
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.queues import library_log
from leaseproof.conformance.queues import run as runs
from leaseproof.conformance.queues.protocol import QueueAdapter
from leaseproof.conformance.queues.subjects import (
    SUBJECTS,
    SubjectUnavailable,
    UnknownSubject,
    clock,
    load,
    make,
    source,
)
from leaseproof.model.queue import MEANING, Capability, Guarantee, Violation, applicable, needs

EXIT_HOLDS, EXIT_BROKEN, EXIT_USAGE, EXIT_UNFORCED = 0, 1, 2, 3
# How a replay forces a race's recorded interleaving, run after run until the violation comes back:
# as recorded (statements that overlapped overlap again), then one statement at a time in the order
# they finished (interleave.in_finishing_order), twice each.
FORCINGS = ("as recorded", "one at a time, in the order they finished") * 2
MUST_HOLD = ("leaseproof",)
# Guarantees no scenario or program can break, only a race. A cell holds only where a scenario,
# a program or a race round judged it: with no programs and no race rounds, these and the
# guarantees without a scenario the queue can run are not checked.
RACE_ONLY = frozenset(
    {Guarantee.COMPLETION_RACING_RESCUE}
)  # the subjects whose every applicable guarantee must hold (exit 1 otherwise)


@attrs.frozen
class Cell:
    guarantee: Guarantee
    verdict: str  # "holds", "violated", "inconclusive", "n/a"
    detail: str = ""
    trace: str | None = None  # the trace file of a violation
    found_by: str = ""  # "scenario", "search", "race"


@attrs.frozen
class Row:
    subject: str
    version: str
    capabilities: frozenset[Capability]
    cells: tuple[Cell, ...]
    programs: int
    races: int
    seconds: float
    terminate: float = 0.0  # the share of race rounds due a cut connection
    cuts: FaultCounts = attrs.Factory(FaultCounts)

    def verdict(self, guarantee: Guarantee) -> Cell:
        return next(cell for cell in self.cells if cell.guarantee is guarantee)

    @property
    def holds(self) -> bool:
        return all(cell.verdict in ("holds", "n/a") for cell in self.cells)

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "version": self.version,
            "capabilities": sorted(c.value for c in self.capabilities),
            "programs": self.programs,
            "races": self.races,
            "terminate": self.terminate,
            "cuts": attrs.asdict(self.cuts),
            "seconds": round(self.seconds, 1),
            "guarantees": {
                cell.guarantee.value: {
                    "verdict": cell.verdict,
                    "detail": cell.detail,
                    "trace": cell.trace,
                    "found_by": cell.found_by,
                }
                for cell in self.cells
            },
        }


@attrs.frozen
class _Evidence:
    program: runs.Program | None  # None: a race
    violation: Violation
    trace: tuple[dict[str, Any], ...]
    found_by: str
    race: str | None = None  # the race (`runs.RACES`) that found it
    cut: bool = False  # in a round whose connection was cut


def judge_subject(
    queue: QueueAdapter,
    *,
    seed: int,
    examples: int,
    races: int,
    traces: Path,
    terminate: float = 0.0,
    database: str | None = None,
    races_of: frozenset[Guarantee] | None = None,
    say: Callable[[str], None] = lambda line: None,
    reference: str | None = None,
    timing: runs.Timing = runs.TIMING,
    racing: Opened | None = None,
) -> Row:
    """Every guarantee of one queue: scenarios, then generated programs, then races (only the
    races of the guarantees `races_of` names, if given; `runs.RACES`); in a `terminate` share
    of the race rounds a busy backend of `database` (the queue's, a DSN) is ended
    (`conformance/concurrent/faults.py`). `reference`: how the subject was named (a name,
    `leaseproof:MUTANT` or `MODULE:CLASS`; its name, unless told), written into its traces so that
    `--replay` opens it again. `timing`: the lease and the clock's start of every run.
    `racing`: where the races run instead, if given: the same queue opened again, its clients
    connecting through a proxy whose observer records each race's interleaving into its trace
    (its database's backends are the ones cut). The scenarios and the search run on `queue`,
    straight to the server: through the proxy each statement would take twice as long."""
    if terminate and database is None:
        raise ValueError("cutting connections needs the queue's database (a DSN)")
    started = time.monotonic()
    caps = queue.capabilities
    findings = _Findings()
    _run_scenarios(queue, caps, findings, timing)
    say(f"  {queue.name}: scenarios run; searching {examples} programs (seed {seed})")
    programs = _search(queue, seed, examples, findings, say, timing)
    raced_on, database = (queue, database) if racing is None else (racing.queue, racing.dsn)
    terminator = Terminator(database, terminate, seed) if terminate and database is not None else None
    with _closed(terminator):
        wire = runs.Wire(racing.interleaver) if racing is not None and racing.interleaver is not None else None
        raced = _race(raced_on, caps, races, terminator, findings, races_of, timing, wire)
    cells = _cells(queue, caps, findings, traces, seed, races=races, reference=reference or queue.name, timing=timing)
    cuts = terminator.counts if terminator is not None else FaultCounts()
    return Row(queue.name, queue.version, caps, tuple(cells), programs, raced, time.monotonic() - started,
               terminate, cuts)  # fmt: skip


@attrs.define
class _Findings:
    """What judging one queue found: the first evidence against each guarantee, why runs
    diverged from the profile, and what a scenario, a program or a race round judged."""

    evidence: dict[Guarantee, _Evidence] = attrs.Factory(dict)
    divergences: list[str] = attrs.Factory(list)
    checked: set[Guarantee] = attrs.Factory(set)

    def record(self, ran: runs.Ran, program: runs.Program | None, found_by: str) -> None:
        for violation in ran.violations:
            if violation.guarantee not in self.evidence:
                self.evidence[violation.guarantee] = _Evidence(program, violation, ran.trace, found_by)
        if ran.divergence is not None:
            self.divergences.append(ran.divergence.why)


def _closed(terminator: Terminator | None) -> AbstractContextManager[Terminator | None]:
    """`terminator`, closed on the way out (None: no connection is cut)."""
    return contextlib.nullcontext() if terminator is None else contextlib.closing(terminator)


def _run_scenarios(queue: QueueAdapter, caps: frozenset[Capability], findings: _Findings, timing: runs.Timing) -> None:
    """The fixed scenario of each guarantee that applies, where the queue can run it."""
    for guarantee in Guarantee:
        program = runs.scenario_steps(guarantee, caps, timing.lease)
        if program is not None and applicable(guarantee, caps):
            findings.record(runs.run(queue, program, timing=timing), program, "scenario")
            findings.checked.add(guarantee)


def _search(
    queue: QueueAdapter,
    seed: int,
    examples: int,
    findings: _Findings,
    say: Callable[[str], None],
    timing: runs.Timing,
) -> int:
    """`examples` generated programs, each guarantee's first violation shrunk; how many ran."""
    found, diverged, programs = runs.search(
        queue,
        seed=seed,
        examples=examples,
        progress=lambda done: say(f"  {queue.name}: {done}/{examples} programs") if done % 100 == 0 else None,
        timing=timing,
    )
    for guarantee, one in found.items():
        violation = next(v for v in one.ran.violations if v.guarantee is guarantee)  # shrunk to keep it
        how = "search" if one.shrunk else "search; not shrunk: run again, the program did not break it"
        findings.evidence.setdefault(guarantee, _Evidence(one.program, violation, one.ran.trace, how))
    findings.divergences += [divergence.why for _, divergence in diverged]
    if programs:
        findings.checked |= set(Guarantee) - RACE_ONLY
    return programs


def _race(
    queue: QueueAdapter,
    caps: frozenset[Capability],
    races: int,
    terminator: Terminator | None,
    findings: _Findings,
    races_of: frozenset[Guarantee] | None = None,
    timing: runs.Timing = runs.TIMING,
    wire: runs.Wire | None = None,
) -> int:
    """`races` rounds of each race whose guarantee applies (and `races_of` names, if given),
    until one raises or breaks a guarantee; how many rounds ran."""
    raced = 0
    for guarantee, race in runs.RACES.items():
        if not applicable(guarantee, caps) or (races_of is not None and guarantee not in races_of):
            continue
        for _ in range(races):
            raced += 1
            findings.checked.add(guarantee)
            findings.checked.update(g for g in runs.SETTLED if applicable(g, caps))
            try:
                result = race(queue, terminator, timing, wire)
            except Exception as exc:  # noqa: BLE001 - a queue that raises is reported, not a crash of the matrix
                findings.divergences.append(f"a race ({race.__name__}) raised {runs.raised(exc)}")
                break
            if result.violation is not None:
                interleaving = [event.to_json() for event in result.wired.events]
                trace = ({"race": result.description, "cut": result.cut, "lost": list(result.lost),
                          "interleaving": interleaving},)  # fmt: skip
                found_by = "race, connection cut" if result.cut else "race"
                ev = _Evidence(None, result.violation, trace, found_by, race.__name__, result.cut)
                findings.evidence.setdefault(result.violation.guarantee, ev)
                break
    return raced


def _cells(
    queue: QueueAdapter,
    caps: frozenset[Capability],
    findings: _Findings,
    traces: Path,
    seed: int,
    *,
    races: int,
    reference: str,
    timing: runs.Timing,
) -> list[Cell]:
    """Each guarantee's verdict (`races`: the rounds of each race asked for); a violation's trace is
    written to `traces`, naming the subject by `reference`."""
    cells = []
    for guarantee in Guarantee:
        if not applicable(guarantee, caps):
            cells.append(Cell(guarantee, "n/a", f"needs {needs(guarantee)}"))
        elif guarantee in findings.evidence:
            ev = findings.evidence[guarantee]
            path = _write_trace(traces, queue, guarantee, ev, seed, reference, timing)
            cells.append(Cell(guarantee, "violated", ev.violation.why, str(path), ev.found_by))
        elif guarantee not in findings.checked:
            why = (
                f"only a race can break it, and {'--races-of left its race out' if races else '--races was 0'}"
                if guarantee in RACE_ONLY
                else "no fixed scenario this queue can run, and --examples was 0"
            )
            cells.append(Cell(guarantee, "inconclusive", f"not checked: {why}"))
        elif findings.divergences:
            divergences = findings.divergences
            cells.append(Cell(guarantee, "inconclusive", f"{len(divergences)} run(s) diverged: {divergences[0]}"))
        else:
            cells.append(Cell(guarantee, "holds"))
    return cells


def _write_trace(
    traces: Path,
    queue: QueueAdapter,
    guarantee: Guarantee,
    ev: _Evidence,
    seed: int,
    reference: str,
    timing: runs.Timing,
) -> Path:
    traces.mkdir(parents=True, exist_ok=True)
    path = traces / f"{re.sub(r'[^A-Za-z0-9._-]', '-', queue.name)}--{guarantee.value}.json"
    body = {
        "subject": queue.name,
        "source": reference,
        "version": queue.version,
        "guarantee": guarantee.value,
        "meaning": MEANING[guarantee],
        "violation": ev.violation.why,
        "found_by": ev.found_by,
        "seed": seed,
        **timing.to_json(),
        "program": ev.program,
        "race": ev.race,
        "cut": ev.cut,
        "trace": list(ev.trace),
        "replay": f"leaseproof guarantees --replay {path}",
    }
    path.write_text(json.dumps(body, indent=1, default=str) + "\n")
    return path


@attrs.frozen
class Opened:
    """A subject on a scratch database of its own: the queue, the database's DSN, and, if its
    clients connect through a proxy, the proxy's observer (conformance/harness/interleave.py)."""

    queue: QueueAdapter
    dsn: str
    interleaver: Interleaver | None = None


@contextlib.contextmanager
def subject(server: Server, name: str, *, watched: bool = False) -> Iterator[Opened]:
    """The subject `name` on a scratch database of its own; `watched`: its clients connect through a
    proxy that watches, and can force, the order of their statements. An adapter that asks for
    the time keywords to read the pinned clock (`clock_keywords = True`) has its clients connect
    through a proxy that makes them over (`clock.keywords`), watched or not."""
    opened: list[tuple[str, Interleaver | None]] = []
    found = source(name)
    rewrite = found is not None and bool(getattr(load(found), "clock_keywords", False))

    @contextlib.contextmanager
    def new_database() -> Iterator[str]:
        with scratch_database(server, prefix="lp_queue") as dsn:
            if not (watched or rewrite):
                opened.append((dsn, None))
                yield dsn
                return
            with FaultProxy(dsn) as proxy:
                proxy.rewrite = clock.keywords if rewrite else None
                opened.append((dsn, Interleaver(proxy) if watched else None))
                yield proxy.dsn_through(dsn)

    with make(name, new_database) as queue:
        yield Opened(queue, *opened[0])


LIBRARY_LOG = "library.log"  # the libraries' log records, in the traces' folder (library_log.py)
REPLAY_LOG = "library-replay.log"  # a replay's (its trace may be where nothing is written: a packaged one)
REPLAY_RACES = 200  # rounds a race's replay may take to meet its violation again
MATRIX_RACES = 100  # rounds of each race per subject, unless told


def replay(
    path: Path,
    queue_for: Callable[[str, bool], AbstractContextManager[Opened]],
    out: TextIO,
    rounds: int = REPLAY_RACES,
) -> int:
    """Run a trace file's program again: exit 1 if the same guarantee breaks again, 0 if not. A
    race's trace with its interleaving is forced to it (`_forced`), and if the clients left the
    forced order without the violation coming back, runs as luck has it too; one found in a round
    whose connection was cut, or from before traces recorded interleavings, runs up to `rounds`
    rounds of its race (each with a cut if it had one), as luck has it (`_by_luck`)."""
    body = json.loads(path.read_text())
    guarantee = Guarantee(body["guarantee"])
    timing = runs.Timing.from_json(body)
    if body.get("program") is None:
        race = {r.__name__: r for r in runs.RACES.values()}[body["race"]]
        recorded = (body.get("trace") or [{}])[0].get("interleaving")
        with queue_for(body.get("source") or body["subject"], True) as opened:
            forceable = bool(recorded) and not body.get("cut")
            if forceable:
                events = tuple(Event.from_json(item) for item in recorded)
                forced = _forced(body, race, events, opened, timing, out)
                if forced != EXIT_UNFORCED:
                    return forced
                out.write(f"then up to {rounds} rounds as luck has it:\n")
            return _by_luck(body, race, opened, timing, rounds, out, forceable)
    with queue_for(body.get("source") or body["subject"], False) as opened:
        queue = opened.queue
        ran = runs.run(queue, body["program"], timing=timing)
    for entry in ran.trace:
        out.write(f"  {entry['act']}" + (f" -> {entry['answer']}" if "answer" in entry else "") + "\n")
    again = [v for v in ran.violations if v.guarantee is guarantee]
    if again:
        out.write(f"reproduced: {body['subject']} ({queue.version}) breaks {guarantee.value}: {again[0].why}\n")
        return EXIT_BROKEN
    out.write(f"not reproduced: {body['subject']} ({queue.version}) held {guarantee.value} on this program\n")
    return EXIT_HOLDS


def _forced(
    body: dict[str, Any], race: runs.Race, events: tuple[Event, ...], opened: Opened, timing: runs.Timing, out: TextIO
) -> int:
    """A run of `race` forced to the recorded interleaving in each way `FORCINGS` names: exit 1 at
    the first that breaks the guarantee again; 3 if none did and a run could not be forced (saying
    why); 0 if every run went as forced and the guarantee held."""
    guarantee = Guarantee(body["guarantee"])
    subject, queue = body["subject"], opened.queue
    sends = sum(event.kind == "send" for event in events)
    roles = len({event.role for event in events})
    out.write(f"forcing {body['race']} to its recorded interleaving: {sends} requests of {roles} connections\n")
    assert opened.interleaver is not None  # a race's replay opens its subject watched
    orders = {FORCINGS[0]: events, FORCINGS[1]: tuple(in_finishing_order(events))}
    why: list[str] = []
    for attempt, how in enumerate(FORCINGS, 1):
        result = race(queue, None, timing, runs.Wire(opened.interleaver, orders[how]))
        forced = result.wired.forced
        went = how if forced is None or forced.followed else f"{how}, until {forced.divergences[0]}"
        if result.violation is not None and result.violation.guarantee is guarantee:
            out.write(
                f"reproduced in forced run {attempt} ({went}): {subject} ({queue.version}) breaks "
                f"{guarantee.value}: {result.violation.why}\n"
            )
            return EXIT_BROKEN
        out.write(f"  forced run {attempt} ({went}): {guarantee.value} held\n")
        if forced is not None and not forced.followed:
            why.append(forced.divergences[0])
    if why:
        out.write(f"could not be forced: in {len(why)} of {len(FORCINGS)} runs the clients left the order they "
                  f"were held to ({why[0]}), and {guarantee.value} held\n")  # fmt: skip
        return EXIT_UNFORCED
    out.write(
        f"not reproduced: {len(FORCINGS)} runs went as forced, statement by statement, and {subject} "
        f"({queue.version}) held {guarantee.value}\n"
    )
    return EXIT_HOLDS


def _by_luck(
    body: dict[str, Any],
    race: runs.Race,
    opened: Opened,
    timing: runs.Timing,
    rounds: int,
    out: TextIO,
    forced_first: bool,
) -> int:
    """Up to `rounds` rounds of `race`, each with a connection cut if the trace had one: exit 1 at
    the first that breaks the guarantee again; 3 if none did and the trace could not be forced (a
    cut lands when the real clock says), or was and its forced runs left the recorded order
    (`forced_first`); 0 if none did, for a trace from before interleavings were recorded."""
    guarantee = Guarantee(body["guarantee"])
    queue = opened.queue
    how = f"{body['race']}, each with a connection cut" if body.get("cut") else body["race"]
    terminator = Terminator(opened.dsn, 1.0, int(body.get("seed") or 0)) if body.get("cut") else None
    with _closed(terminator):
        for attempt in range(1, rounds + 1):
            result = race(queue, terminator, timing, None)
            if result.violation is not None and result.violation.guarantee is guarantee:
                out.write(
                    f"reproduced in round {attempt} of {how}: {body['subject']} ({queue.version}) "
                    f"breaks {guarantee.value}: {result.violation.why}\n"
                )
                return EXIT_BROKEN
    out.write(f"not reproduced in {rounds} rounds of {how}: {body['subject']} held {guarantee.value}\n")
    if body.get("cut"):
        out.write("could not be forced: where a cut lands is the real clock's, and nothing orders it\n")
        return EXIT_UNFORCED
    return EXIT_UNFORCED if forced_first else EXIT_HOLDS


def table(rows: Sequence[Row]) -> list[str]:
    """The matrix, one column per subject."""
    lines = ["| guarantee | " + " | ".join(f"{r.subject} ({r.version})" for r in rows) + " |"]
    lines.append("| --- |" + " --- |" * len(rows))
    lines += [f"| {g.value} | " + " | ".join(row.verdict(g).verdict for row in rows) + " |" for g in Guarantee]
    return lines


def _cuts(row: Row) -> str:
    c = row.cuts
    if not row.terminate:
        return " (no connection cut)"
    return f" ({c.rounds_faulted} due a cut: {c.ended} connections cut, {c.missed} rounds over before one was busy)"


def details(rows: Sequence[Row]) -> list[str]:
    lines = []
    for row in rows:
        capabilities = ", ".join(sorted(c.value for c in row.capabilities)) or "none"
        lines.append(
            f"{row.subject} ({row.version}): capabilities {capabilities}; "
            f"{row.programs} programs, {row.races} races{_cuts(row)}, {row.seconds:.1f}s"
        )
        for cell in row.cells:
            if cell.verdict in ("violated", "inconclusive"):
                where = f" [{cell.found_by}; trace {cell.trace}]" if cell.trace else ""
                lines.append(f"  {cell.guarantee.value}: {cell.verdict}: {cell.detail}{where}")
    return lines


def _usage_problem(args: argparse.Namespace, subjects: list[str]) -> str | None:
    """What is wrong with the arguments, said before anything starts (each subject found and its
    class loaded: a subject that cannot be is a usage error); None if nothing is."""
    if not subjects or args.examples < 0 or (args.races or 0) < 0 or not 0 <= args.terminate <= 1:
        return "name a subject; --examples and --races >= 0; --terminate between 0 and 1"
    for reference in dict.fromkeys(subjects):
        problem = _unloadable(reference)
        if problem is not None:
            return problem
    raced = {guarantee.value for guarantee in runs.RACES}
    unknown_races = sorted(set(_races_of(args)) - raced)
    if unknown_races or (args.races_of is not None and not _races_of(args)):
        return f"--races-of takes races by their guarantee, from {', '.join(sorted(raced))}"
    if args.replay is not None and (args.lease_seconds is not None or args.start is not None):
        return "--replay runs with the lease and the start its trace records: give neither --lease-seconds nor --start"
    try:
        _timing(args)
    except ValueError as exc:
        return f"--lease-seconds, --start: {exc}"
    if args.json is not None and not args.json.parent.is_dir():
        return f"no folder {args.json.parent} for --json"
    if args.replay is not None and not args.replay.is_file():
        return f"no trace file {args.replay}"
    if args.replay is not None:
        try:
            trace = json.loads(args.replay.read_text())
            if not isinstance(trace.get("program", []), list | None):
                raise ValueError("its program is not a list of steps")
            problem = _unloadable(trace.get("source") or trace["subject"])
            if problem is not None:
                raise ValueError(problem)
            if trace.get("program") is None and trace.get("race") not in {r.__name__ for r in runs.RACES.values()}:
                raise ValueError(f"neither a program nor a known race ({trace.get('race')!r})")
            Guarantee(trace["guarantee"])
            runs.Timing.from_json(trace)
        except (ValueError, KeyError, TypeError) as exc:
            return f"{args.replay} is not a guarantees trace ({exc})"
    return None


def _timing(args: argparse.Namespace) -> runs.Timing:
    """The lease and start instant `--lease-seconds` and `--start` give (ValueError if they are wrong)."""
    default = runs.TIMING
    lease = default.lease if args.lease_seconds is None else args.lease_seconds
    return runs.Timing(lease, default.start if args.start is None else dt.datetime.fromisoformat(args.start))


def _unloadable(reference: str) -> str | None:
    """Why the subject `reference` names cannot be judged here (unknown, or its class cannot be
    loaded); None if it can be."""
    try:
        found = source(reference)
        if found is not None:
            load(found)
    except (UnknownSubject, SubjectUnavailable) as exc:
        return str(exc)
    return None


def _subjects(args: argparse.Namespace) -> list[str]:
    """The subjects to judge: `--subjects`, then each `--subject`; without `--subjects`, the
    `--subject`s alone, or every built-in subject if none is given."""
    named = args.subjects if args.subjects is not None else "" if args.subject else ",".join(SUBJECTS)
    return [s for s in named.split(",") if s] + list(args.subject or ())


def _races_of(args: argparse.Namespace) -> list[str]:
    """The guarantees whose races `--races-of` names (empty if it is not given)."""
    return [name for name in (args.races_of or "").split(",") if name]


def _matrix(
    args: argparse.Namespace,
    subjects: list[str],
    seed: int,
    queue_for: Callable[[str, bool], AbstractContextManager[Opened]],
    say: Callable[[str], None],
) -> list[Row]:
    """Each subject judged, in turn."""
    races = MATRIX_RACES if args.races is None else args.races
    races_of = frozenset(map(Guarantee, _races_of(args))) if args.races_of is not None else None
    timing = _timing(args)
    which = "each race" if races_of is None else "the races of " + ", ".join(sorted(g.value for g in races_of))
    say(
        f"guarantees: {', '.join(subjects)}; seed {seed}, {args.examples} programs, {races} rounds of {which}, "
        f"{args.terminate:g} of them with a connection cut; leases of {timing.lease}s, the clock from "
        f"{timing.start.isoformat()}"
    )
    rows = []
    for name in subjects:
        with queue_for(name, False) as opened, _watched_if(races > 0, queue_for, name) as racing:
            rows.append(judge_subject(opened.queue, seed=seed, examples=args.examples, races=races,
                                      traces=args.traces, terminate=args.terminate, database=opened.dsn,
                                      races_of=races_of, say=say, reference=name, timing=timing,
                                      racing=racing))  # fmt: skip
    return rows


def _watched_if(
    races: bool, queue_for: Callable[[str, bool], AbstractContextManager[Opened]], name: str
) -> AbstractContextManager[Opened | None]:
    """The subject opened again, watched, for its races (none if no race runs)."""
    return queue_for(name, True) if races else contextlib.nullcontext()


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    subjects = _subjects(args)
    problem = _usage_problem(args, subjects)
    if problem is not None:
        err.write(f"leaseproof: {problem}\n")
        return EXIT_USAGE
    seed = args.seed if args.seed is not None else secrets.randbelow(2**32)

    def say(line: str) -> None:
        err.write(line + "\n")
        err.flush()

    log_path = args.traces / (LIBRARY_LOG if args.replay is None else REPLAY_LOG)
    with postgres_server(args.dsn, log=say) as server, library_log.captured(log_path) as logged:
        if any(name.split(":")[0] == "leaseproof" for name in subjects):
            require_test_databases(server, "the bundled store's row")

        def queue_for(name: str, watched: bool) -> AbstractContextManager[Opened]:
            return subject(server, name, watched=watched)

        rows: list[Row] = []
        replayed = EXIT_HOLDS
        try:
            if args.replay is not None:
                replayed = replay(args.replay, queue_for, out, REPLAY_RACES if args.races is None else args.races)
            else:
                rows = _matrix(args, subjects, seed, queue_for, say)
        except SubjectUnavailable as exc:
            err.write(f"leaseproof: {exc}\n")
            return EXIT_USAGE
    say(logged.summary())
    if args.replay is not None:
        return replayed
    out.write("\n".join([*table(rows), "", *details(rows)]) + "\n")
    out.write(f"seed: {seed}\n")
    if args.json is not None:
        args.json.write_text(json.dumps({"seed": seed, "rows": [r.to_json() for r in rows]}, indent=1) + "\n")
    broken = [r.subject for r in rows if r.subject in MUST_HOLD and not r.holds]
    if broken:
        err.write(f"leaseproof: {', '.join(broken)} does not hold every guarantee\n")
        return EXIT_BROKEN
    return EXIT_HOLDS
