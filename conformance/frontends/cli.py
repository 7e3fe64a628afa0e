"""`leaseproof`: run the conformance verdict from the command line.

Exit status: 0 the implementation conforms; 1 it does not (the minimal
counterexample is printed); 2 usage or provisioning error, or an adapter
fault (the adapter broke; nothing was judged).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import importlib
import inspect
import json
import random
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from leaseproof.conformance.boundary.protocols import DeliveryAdapter
from leaseproof.conformance.boundary.wire import AdapterFault, SubprocessAdapter
from leaseproof.conformance.concurrent import nemesis
from leaseproof.conformance.concurrent.faults import FaultError
from leaseproof.conformance.concurrent.linearizability import DEFAULT_BUDGET, read_history, timeline, write_history
from leaseproof.conformance.concurrent.linearizability import check as check_linearizable
from leaseproof.conformance.concurrent.models import SPECS
from leaseproof.conformance.concurrent.stress import Progress as StressProgress
from leaseproof.conformance.concurrent.stress import StressFault, StressReport
from leaseproof.conformance.concurrent.stress import stress as run_stress
from leaseproof.conformance.evidence import killmatrix, throughput
from leaseproof.conformance.evidence import score as mutation_score
from leaseproof.conformance.frontends.progress import ProgressLine
from leaseproof.conformance.harness.interrupts import interruptible
from leaseproof.conformance.harness.provision import ProvisioningError, Server, postgres_server, scratch_database
from leaseproof.conformance.lockstep.core import SHRINK_ATTEMPTS, SHRINK_SECONDS, ShrinkBound
from leaseproof.conformance.lockstep.delivery import Coverage
from leaseproof.conformance.lockstep.forked import ForkedAdapter
from leaseproof.conformance.lockstep.verify import MACHINES, Verdict, run_conformance
from leaseproof.conformance.queues import matrix as guarantee_matrix
from leaseproof.conformance.spec import explore as exploration
from leaseproof.conformance.spec.pages import FILES, PAGES, SpecPageError, stale_pages, write_pages
from leaseproof.conformance.traces.trace import SPECS as LOCKSTEP_SPECS
from leaseproof.conformance.traces.trace import TraceError, check, replay
from leaseproof.conformance.traces.trace import read as read_trace
from leaseproof.conformance.traces.trace import write as write_trace
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.lifecycle.adapter import PostgresLifecycleAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS, Mutant
from leaseproof.impl.mutants.faults import FAULT_MUTANTS
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS, LifecycleMutant
from leaseproof.impl.mutants.race import RACE_MUTANTS

EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, EXIT_SUBSET = 0, 1, 2, 3
# Exit status of a run ended by Ctrl-C (SIGINT), SIGTERM or SIGHUP, after cleaning up.
EXIT_INTERRUPTED = 130
INTERRUPTED_EXITS = (
    f"{EXIT_INTERRUPTED} interrupted (Ctrl-C, SIGTERM or SIGHUP): scratch databases dropped, "
    "an embedded server stopped and its folder removed"
)
VERIFY_EXITS = (
    "exit status: 0 conforms; 1 does not conform; 2 usage error, or the adapter failed (nothing judged); "
    "3 conforms on a subset: the adapter leaves operations out and --accept-subset was not given; " + INTERRUPTED_EXITS
)
# Of two machines' statuses, the worse is the run's: a failure to judge, then a
# non-conformance, then a verdict on a subset.
_SEVERITY = {EXIT_CONFORMS: 0, EXIT_SUBSET: 1, EXIT_NONCONFORMING: 2, EXIT_USAGE: 3}


def _worse(a: int, b: int) -> int:
    return max(a, b, key=_SEVERITY.__getitem__)


# Sequential mutants (verify and stress), race mutants (stress: invisible one step at a time) and
# fault mutants (stress --terminate: invisible until a connection is cut).
_SEQUENTIAL_MUTANTS: tuple[Mutant | LifecycleMutant, ...] = (*MUTANTS, *LIFECYCLE_MUTANTS)
ALL_MUTANTS: tuple[Mutant | LifecycleMutant, ...] = (*_SEQUENTIAL_MUTANTS, *RACE_MUTANTS, *FAULT_MUTANTS)


def _number(
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


_positive = _number(int, "an integer", lambda v: v > 0, "positive")
_seed = _number(int, "an integer", lambda v: 0 <= v < 2**63, "between 0 and 2**63 - 1")
_positive_float = _number(float, "a number", lambda v: v > 0, "positive")
_fraction = _number(float, "a number", lambda v: 0 <= v < 1, "at least 0 and below 1")
_share = _number(float, "a number", lambda v: 0 <= v <= 1, "from 0 to 1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leaseproof",
        description="Verify lease-fenced, multi-tenant state machines on PostgreSQL against their executable model.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    verify = commands.add_parser(
        "verify",
        help="drive each model and its implementation in lockstep and give the verdict",
        description=(
            "Drive each machine's model (delivery, lifecycle) and its implementation (the bundled PostgreSQL one "
            "unless --adapter/--adapter-cmd names another) in lockstep through fixed scenarios and randomized "
            "programs; compare every outcome and the full persisted state after every step."
        ),
        epilog=VERIFY_EXITS,
    )
    verify.add_argument(
        "--machine",
        choices=sorted(MACHINES),
        help="verify one machine (default: both, or the one a --mutant or external adapter implies)",
    )
    verify.add_argument(
        "--max-examples",
        type=_positive,
        default=300,
        help="programs generated per machine (default: 300); one that repeats a program already sent is not sent again",
    )
    verify.add_argument("--steps", type=_positive, default=50, help="most steps per program (default: 50)")
    verify.add_argument("--seed", type=_seed, help="random seed, to reproduce a run (default: a fresh one, printed)")
    verify.add_argument("--no-shrink", action="store_true", help="report the first failing program unshrunk")
    verify.add_argument(
        "--no-scenarios",
        action="store_true",
        help="skip the fixed scenarios: the generated programs alone (how the search's power is measured)",
    )
    verify.add_argument(
        "--accept-subset",
        action="store_true",
        help="accept a verdict on the operations an adapter offers when it leaves some out "
        "(without it, such a run exits 3: CONFORMS ON A SUBSET)",
    )
    verify.add_argument(
        "--shrink-attempts",
        type=_positive,
        default=SHRINK_ATTEMPTS,
        metavar="N",
        help=f"programs the shrinking of a failure may try (default: {SHRINK_ATTEMPTS:,}); "
        "the same seed and budget print the same counterexample",
    )
    verify.add_argument(
        "--shrink-seconds",
        type=_positive_float,
        default=SHRINK_SECONDS,
        metavar="S",
        help=f"and at most this long (default: {SHRINK_SECONDS:g}); the report says when this bound ended it",
    )
    verify.add_argument(
        "--trace-out",
        type=Path,
        metavar="FILE",
        help="where to write the counterexample as a trace (default: leaseproof-counterexample-SEED.jsonl)",
    )
    _add_adapter_arguments(verify)

    replay = commands.add_parser(
        "replay",
        help="replay trace files against an implementation and report the first divergence of each",
        description=(
            "Replay each trace step by step against an implementation and the model, and check what the trace "
            "recorded against the model too; report each trace's first divergence. A trace that needs an operation "
            "the adapter does not offer is not sent (n/a); an adapter fault is that trace's, and the batch goes on."
        ),
        epilog=(
            "exit status: 0 every trace as expected; 1 a trace diverged (or passed though listed by --expect-fail); "
            "2 usage error, or the adapter failed on a trace; 3 a trace needs operations the adapter does not "
            "offer and --accept-subset was not given; " + INTERRUPTED_EXITS
        ),
    )
    replay.add_argument("traces", nargs="+", type=Path, metavar="TRACE", help="trace files (.jsonl)")
    replay.add_argument(
        "--expect-fail",
        type=Path,
        metavar="FILE",
        help="names of traces this implementation knowingly fails, one per line; an unexpected pass is an error too",
    )
    replay.add_argument(
        "--accept-subset",
        action="store_true",
        help="traces that need operations the adapter does not offer are reported n/a without failing the run",
    )
    _add_adapter_arguments(replay)

    check = commands.add_parser(
        "check-trace",
        help="check a history recorded by another system against the model",
        description=(
            "Run the model over a recorded sequential history (commands with the outcomes, and optionally the "
            "states, another system produced) and report the first step where the model disagrees."
        ),
    )
    check.add_argument("trace", type=Path, metavar="FILE")

    history = commands.add_parser(
        "check-history",
        help="check a concurrent history (as stress writes it) for linearizability against the model",
        description=(
            "Check a recorded concurrent history (JSON lines, as `leaseproof stress` writes it, or as another "
            "system records its clients' calls) for linearizability against the model of its machine."
        ),
    )
    history.add_argument("history", type=Path, metavar="FILE")
    history.add_argument(
        "--budget", type=_positive, default=DEFAULT_BUDGET, help="checker configurations per partition before 'unknown'"
    )

    spec = commands.add_parser(
        "spec",
        help="write the spec pages' generated blocks from the model, or check that they are current",
        description=(
            "Rewrite the blocks of specs/*.md that are generated from the model (rule tables, outcome variants, "
            "transitions with their Mermaid diagram, invariants); with --check, change nothing and exit 1 with a "
            "diff when any page differs from what the model generates."
        ),
    )
    spec.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is not current")
    spec.add_argument(
        "--specs", type=Path, default=Path("specs"), metavar="DIR", help="the spec pages (default: specs)"
    )

    nemesis_parser = commands.add_parser(
        "nemesis",
        help="run the bundled delivery store under faults (kills, ended backends, pauses, a stalled tenant) and audit",
        description=nemesis.DESCRIPTION,
        epilog=nemesis.EXITS,
    )
    nemesis.add_arguments(nemesis_parser)

    guarantees_parser = commands.add_parser(
        "guarantees",
        help="judge lease queues (the bundled store, real libraries) by the lease-queue profile; print the matrix",
        description=guarantee_matrix.DESCRIPTION,
        epilog=guarantee_matrix.EXITS,
    )
    guarantee_matrix.add_arguments(guarantees_parser)

    throughput_parser = commands.add_parser(
        "throughput",
        help="measure jobs per second of the bundled store against the bare floor and procrastinate and PgQueuer",
        description=throughput.DESCRIPTION,
        epilog="exit status: 0 measured, 1 a subject's jobs were not all done, 2 usage, 130 interrupted",
    )
    throughput.add_arguments(throughput_parser)

    stress = commands.add_parser(
        "stress",
        help="run many clients at once against an implementation and check the histories for linearizability",
        description=(
            "Run small concurrent programs (a prefix, then short branches on WORKERS connections at once, the "
            "clock moving between rounds) against each machine's implementation, each program several times; "
            "check every recorded history for linearizability against the model."
        ),
        epilog=(
            "exit status: 0 every history linearizable; 1 a history is not (or the checker's budget left one "
            "unknown); 2 usage error, the implementation failed instead of answering, or --terminate ended no "
            "backend; " + INTERRUPTED_EXITS
        ),
    )
    stress.add_argument(
        "--machine", choices=sorted(MACHINES), help="stress one machine (default: both, or the mutant's)"
    )
    stress.add_argument("--workers", type=_positive, default=8, help="concurrent clients (default: 8)")
    stress.add_argument("--duration", type=_positive_float, default=30.0, help="seconds per machine (default: 30)")
    stress.add_argument("--repeats", type=_positive, default=3, help="runs of each program (default: 3)")
    stress.add_argument("--seed", type=_seed, help="random seed, to reproduce a run (default: a fresh one, printed)")
    stress.add_argument(
        "--lose-responses",
        type=_fraction,
        default=0.0,
        metavar="P",
        help="drop this fraction of responses after the operation ran, so they are indeterminate (default: 0)",
    )
    stress.add_argument(
        "--terminate",
        type=_share,
        default=0.0,
        metavar="P",
        help="in this fraction of rounds, end one busy backend of the implementation's database while the round "
        "runs (pg_terminate_backend: a connection cut mid-operation; the delivery machine; default: 0)",
    )
    stress.add_argument(
        "--terminate-dsn",
        metavar="DSN",
        help="the database whose backends --terminate ends (default: the one leaseproof gave the implementation; "
        "needed for --adapter-cmd, which picks its own)",
    )
    stress.add_argument(
        "--budget", type=_positive, default=DEFAULT_BUDGET, help="checker configurations per partition before 'unknown'"
    )
    stress.add_argument(
        "--trace-out",
        type=Path,
        metavar="FILE",
        help="where to write a violating history (default: leaseproof-history-SEED.jsonl)",
    )
    stress.add_argument("--dsn", help="PostgreSQL server to use (default: LEASEPROOF_DSN, else Docker, else embedded)")
    stress.add_argument(
        "--mutant",
        choices=[mu.name for mu in ALL_MUTANTS],
        metavar="NAME",
        help="stress a known-buggy variant of the bundled implementation: " + ", ".join(mu.name for mu in ALL_MUTANTS),
    )
    chosen = stress.add_mutually_exclusive_group()
    chosen.add_argument("--adapter", metavar="MODULE:FACTORY", help="an in-process adapter that offers session()")
    chosen.add_argument(
        "--adapter-cmd",
        metavar="COMMAND",
        help="an adapter in a child process whose hello announces sessions (specs/adapter-protocol.md)",
    )
    stress.add_argument(
        "--reply-timeout",
        type=_positive,
        default=30,
        help="seconds an --adapter-cmd child may take per reply (default: 30)",
    )

    mutants = commands.add_parser(
        "mutants",
        help="run every shipped mutant against the checks that apply to it and print the kill matrix",
        description=(
            "Run each known-buggy variant of the bundled implementation against its checks (sequential mutants: "
            "lockstep with the fixed scenarios, and the search alone; race mutants: stress, and forced "
            "interleavings) and print, per mutant and check, whether it was killed, after how many examples and "
            "seconds, and how short the counterexample was. Exit 1 if a mutant survives every check that ran."
        ),
        epilog=(
            "exit status: 0 every mutant killed by a check that ran (with --generated: the score reached "
            "--min-score and every equivalence claim held); 1 a mutant survived (with --generated: the score is "
            "below --min-score, or a mutant listed as equivalent was killed); 2 usage or provisioning error; "
            + INTERRUPTED_EXITS
        ),
    )
    mutants.add_argument("--machine", choices=sorted(MACHINES), help="only this machine's mutants (default: both)")
    mutants.add_argument(
        "--generated",
        action="store_true",
        help="the mutation score instead: every mechanically generated mutant (one site of one named statement "
        "changed) through the search alone on each --seed, the scenarios, and stress for the lock mutants",
    )
    mutants.add_argument("--fast", action="store_true", help="only the checks that take seconds (the CI subset)")
    mutants.add_argument(
        "--kind",
        choices=killmatrix.KINDS,
        help="only the sequential or only the race mutants (default: both)",
    )
    mutants.add_argument("--json", action="store_true", help="print the matrix as a JSON document instead of a table")
    mutants.add_argument(
        "--seed",
        type=_seed,
        nargs="+",
        metavar="N",
        help=f"seed(s) of every seeded check (default: {killmatrix.SEED}; with --generated: "
        f"{' '.join(map(str, mutation_score.SEEDS))})",
    )
    mutants.add_argument(
        "--mutant",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="only these mutants (default: every shipped one, sequential and race; with --generated, every "
        "generated one)",
    )
    mutants.add_argument(
        "--jobs",
        type=_positive,
        help="with --generated: worker processes, each on its own database (default: one per core)",
    )
    mutants.add_argument(
        "--max-examples",
        type=_positive,
        help=f"with --generated: programs of the search alone (default: {mutation_score.Budget().examples}, "
        "verify's default)",
    )
    mutants.add_argument(
        "--min-score",
        type=_number(float, "a number", lambda v: 0 <= v <= 1, "between 0 and 1"),
        default=mutation_score.MIN_SCORE,
        metavar="S",
        help=f"with --generated: exit 1 when fewer than this share of the non-equivalent mutants dies "
        f"(default: {mutation_score.MIN_SCORE}); a killed equivalence claim always fails the run",
    )
    mutants.add_argument("--dsn", help="PostgreSQL server to use (default: LEASEPROOF_DSN, else Docker, else embedded)")

    explore = commands.add_parser(
        "explore",
        help="explore every state of each model within small bounds and check its invariants and rules (no database)",
        description=(
            "Breadth-first, exhaustive search of each model's states within the bounds (TLC-style: a state outside "
            "them is checked but not expanded). Checks every state invariant, every step invariant, that each step "
            "changes only what its rule declares and moves rows only along declared transitions; prints the rules "
            "reached and the shortest path to each kind of violation. Exit 1 if an invariant fails."
        ),
    )
    explore.add_argument("--machine", choices=sorted(exploration.SPECS), help="explore one machine (default: both)")
    count = _number(int, "an integer", lambda v: v >= 0, "zero or more")
    for name, (text, _) in exploration.bound_options().items():
        explore.add_argument(f"--{name.replace('_', '-')}", dest=name, type=count, metavar="N", help=text)
    explore.add_argument(
        "--every-step", action="store_true", help="check the step invariants on the stutters of refusals and reads too"
    )
    explore.add_argument(
        "--trace-out",
        type=Path,
        metavar="FILE",
        help="where to write the shortest violation as a trace (default: leaseproof-explore-MACHINE.jsonl)",
    )
    return parser


def _add_adapter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", help="PostgreSQL server to use (default: LEASEPROOF_DSN, else Docker, else embedded)")
    parser.add_argument(
        "--mutant",
        choices=[mutant.name for mutant in _SEQUENTIAL_MUTANTS],
        metavar="NAME",
        help="use a known-buggy variant of the bundled implementation: "
        + ", ".join(mu.name for mu in _SEQUENTIAL_MUTANTS),
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--adapter",
        metavar="MODULE:FACTORY",
        help="an in-process adapter: FACTORY() returns it (given dsn=... if it takes a dsn parameter)",
    )
    chosen.add_argument(
        "--adapter-cmd",
        metavar="COMMAND",
        help="an adapter in a child process speaking specs/adapter-protocol.md on stdin/stdout",
    )
    parser.add_argument(
        "--reply-timeout",
        type=_positive,
        default=30,
        help="seconds an --adapter-cmd child may take per reply (default: 30)",
    )


class _Progress(ProgressLine):
    """Verify's progress on stderr: in place on a terminal, every 10% otherwise."""

    def __init__(self, total: int, stream: TextIO) -> None:
        super().__init__(stream, every=max(1, min(total, 500) // 10), first=0, width=60)
        self.total = total

    def __call__(self, coverage: Coverage) -> None:
        done = coverage.generated
        if coverage.first_failure is None:
            line = f"  example {done}/{self.total}"
        else:
            line = f"  failed in example {coverage.first_failure}; shrinking, try {done - coverage.failed_at}"
        self.show(line + f" · {coverage.steps:,} steps", done)


def _summary(verdict: Verdict, out: TextIO) -> None:
    coverage = verdict.coverage
    examples = f"{coverage.examples:,}"
    if coverage.generated > coverage.examples and coverage.first_failure is None:
        repeats = coverage.generated - coverage.examples
        examples += f" (and {repeats:,} repeats of a program already sent, not sent again)"
    if coverage.first_failure == 0:
        examples = "none (a fixed scenario failed first)"
    elif coverage.first_failure is not None:
        examples = f"{coverage.first_failure:,} until the first failure, {coverage.examples:,} with shrinking"
    out.write(
        f"scenarios: {coverage.scenarios}   examples: {examples}   steps: {coverage.steps:,}"
        f"   time: {verdict.seconds:.1f}s   seed: {verdict.seed}\n"
    )
    if verdict.fault:
        return  # nothing was judged: coverage would only mislead
    out.write("outcomes reached (operation: variant ×count):\n")
    by_operation: dict[str, list[str]] = defaultdict(list)
    for (operation, variant), count in sorted(coverage.outcomes.items()):
        by_operation[operation].append(f"{variant} ×{count:,}")
    assert coverage.spec is not None
    for operation in (op.__name__ for op in coverage.spec.variants):
        out.write(f"  {operation:<18} {', '.join(by_operation.get(operation, ['-']))}\n")
    if coverage.spec.transitions:
        transitions = ", ".join(f"{a}→{b} ×{n:,}" for (a, b), n in sorted(coverage.transitions.items()))
        out.write(f"{coverage.spec.subject} transitions reached: {transitions or '-'}\n")
    if coverage.skipped:
        skipped = ", ".join(f"{op} ×{n:,}" for op, n in sorted(coverage.skipped.items()))
        out.write(f"not offered by the adapter, so never sent: {skipped}\n")
    behaviours = verdict.behaviours  # the count the subset verdict gives, too
    out.write(
        f"behaviours exercised: {behaviours.exercised} of the {len(behaviours.checkable)} the rules declare"
        " (operation/guard→outcome; `leaseproof explore` reaches every one)\n"
    )
    if not verdict.conforms:
        return  # a failed run stops early: what it never reached says nothing
    missing = [f"{op}: {v}" for op, v in coverage.missing_outcomes()]
    missing += [f"{a}→{b}" for a, b in coverage.missing_transitions()]
    missing += [f"{op}/{guard}→{v}" for op, guard, v in behaviours.never]
    out.write(f"never reached: {', '.join(missing) if missing else 'none'}\n")


def _load_factory(spec: str) -> Callable[..., DeliveryAdapter]:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"--adapter {spec!r}: expected MODULE:FACTORY, e.g. mypackage.leaseproof_adapter:make")
    try:
        factory: Callable[..., DeliveryAdapter] = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--adapter {spec!r}: cannot load it: {exc}") from None
    if not callable(factory):
        raise UsageError(f"--adapter {spec!r}: {attribute} is not callable")
    return factory


def _takes_dsn(factory: Callable[..., DeliveryAdapter]) -> bool:
    try:
        return "dsn" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no introspectable signature: call it bare
        return False


class UsageError(Exception):
    """Bad command-line input: exit 2 with this message."""


class _Provisioned:
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


def _mutant(name: str | None) -> Mutant | LifecycleMutant | None:
    return None if name is None else by_name(ALL_MUTANTS, name)


def _machines(args: argparse.Namespace, provisioned: _Provisioned) -> list[str]:
    """The machines to verify: --machine, else what the mutant or adapter implies, else both."""
    if args.mutant and (args.adapter is not None or args.adapter_cmd is not None):
        raise UsageError("--mutant applies to the bundled implementation, not to --adapter/--adapter-cmd")
    mutant = _mutant(args.mutant)
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


def _adapter(
    args: argparse.Namespace, machine: str, provisioned: _Provisioned, out: TextIO, lockstep: bool = False
) -> Any:
    """The adapter the arguments name for `machine`; the caller releases it (`_Provisioned.release`).
    `lockstep`: for `run_conformance` alone (the bundled implementation is then a `ForkedAdapter`)."""
    if args.mutant and (args.adapter is not None or args.adapter_cmd is not None):
        raise UsageError("--mutant applies to the bundled implementation, not to --adapter/--adapter-cmd")
    if args.adapter_cmd is not None:
        return provisioned.child().use(machine)
    if args.adapter is not None:
        factory = _load_factory(args.adapter)
        wants_dsn = _takes_dsn(factory)
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
    mutant = _mutant(args.mutant)
    if mutant is not None:
        out.write(f"mutant: {mutant.name} — {mutant.stands_for}\n")
    dsn = provisioned.database()
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


def _each_machine(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    adapter_for: Callable[[argparse.Namespace, str, _Provisioned, TextIO], Any],
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
            provisioned = _Provisioned(args, out, err, stack)
            for machine in _machines(args, provisioned):
                adapter = adapter_for(args, machine, provisioned, out)
                try:
                    status = _worse(status, judge(adapter, machine, seed_value))
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


def verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    def judge(adapter: Any, machine: str, seed_value: int) -> int:
        out.write(f"verifying the {machine} machine against {adapter.name}\n")
        out.flush()
        progress = _Progress(args.max_examples, err)
        try:
            verdict = run_conformance(
                adapter,
                machine=machine,
                max_examples=args.max_examples,
                seed_value=seed_value,
                steps=args.steps,
                shrink=not args.no_shrink,
                scenarios=not args.no_scenarios,
                shrink_bound=ShrinkBound(args.shrink_attempts, args.shrink_seconds),
                on_example=progress,
            )
        finally:
            progress.close()
        return _report(verdict, args, out, err)

    return _each_machine(args, out, err, functools.partial(_adapter, lockstep=True), judge)


def _report(verdict: Verdict, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    _summary(verdict, out)
    if verdict.fault:
        out.write("verdict: NONE — the adapter failed, so nothing was judged\n")
        out.write(f"fault: {verdict.fault}\n")
        if verdict.fault_program:
            out.write("where, and the program's commands up to the fault:\n")
            out.write("".join(f"  {line}\n" for line in verdict.fault_program))
        return EXIT_USAGE  # no counterexample file: a fault is not a counterexample
    if verdict.conforms and verdict.subset():
        accepted = getattr(args, "accept_subset", False)
        out.write(f"verdict: CONFORMS ON A SUBSET — {verdict.subset()}\n")
        if accepted:
            out.write("the subset is accepted (--accept-subset): what the adapter offers matched the model\n")
            return EXIT_CONFORMS
        out.write(
            "exit status 3: the operations left out were never checked; implement them, or pass"
            " --accept-subset to accept a verdict on these alone\n"
        )
        return EXIT_SUBSET
    if verdict.conforms:
        out.write("verdict: CONFORMS — every outcome and every persisted field matched the model\n")
        return EXIT_CONFORMS
    out.write("verdict: DOES NOT CONFORM\n")
    if verdict.shrink_stopped:
        out.write(f"shrinking stopped early, {verdict.shrink_stopped}: the program below may not be minimal\n")
    replay = f"--seed {verdict.seed}" + (" --no-scenarios" if getattr(args, "no_scenarios", False) else "")
    out.write(f"minimal counterexample (replay with {replay}):\n")
    out.write("".join(f"  {line}\n" for line in verdict.counterexample.splitlines()))
    out.write(f"what went wrong:\n{verdict.failure}\n")
    _write_trace(verdict, args, out, err)
    return EXIT_NONCONFORMING


def _write_trace(verdict: Verdict, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if verdict.trace is None:
        return
    path = args.trace_out or Path(f"leaseproof-counterexample-{verdict.seed}.jsonl")
    try:
        write_trace(verdict.trace, path)
    except OSError as exc:
        err.write(f"leaseproof: could not write the trace to {path}: {exc.strerror}\n")
        return
    steps = len(verdict.trace.steps)
    out.write(f"trace: {path} (the counterexample, {steps} steps; replay it with: leaseproof replay {path})\n")


def _expected_failures(path: Path | None) -> set[str]:
    if path is None:
        return set()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"--expect-fail {path}: {exc.strerror}") from None
    return {line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")}


def replay_traces(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        traces = [(path, read_trace(path)) for path in args.traces]
        expected = _expected_failures(args.expect_fail)
        machines = sorted({trace.machine for _, trace in traces})
        if len(machines) > 1:
            raise UsageError(f"the traces are of the {' and '.join(machines)} machines; replay one machine's at a time")
        machine = machines[0]
        mutant = _mutant(args.mutant)
        if mutant is not None and mutant.machine != machine:
            raise UsageError(
                f"the traces are of the {machine} machine; --mutant {mutant.name} is not one of its mutants"
            )
        with contextlib.ExitStack() as stack:
            adapter = _adapter(args, machine, _Provisioned(args, out, err, stack), out)
            stack.callback(adapter.close)
            out.write(f"replaying {len(traces)} trace(s) against {adapter.name}\n")
            status, tally = EXIT_CONFORMS, collections.Counter[str]()
            for path, trace in traces:
                listed = path.name in expected or path.stem in expected
                one, kind = _replay_one(path, trace, adapter, listed, args, out)
                status, tally[kind] = _worse(status, one), tally[kind] + 1
                out.flush()
    except (ProvisioningError, UsageError, AdapterFault, TraceError) as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    unknown = expected - {p.name for p, _ in traces} - {p.stem for p, _ in traces}
    for name in sorted(unknown):
        out.write(f"note: {name} is listed in {args.expect_fail} but was not replayed\n")
    extra = "".join(f", {tally[kind]} {kind}" for kind in ("not applicable", "faulted") if tally[kind])
    out.write(f"{tally['passed']} passed, {tally['failed']} failed{extra}\n")
    return status


def _replay_one(
    path: Path, trace: Any, adapter: Any, listed: bool, args: argparse.Namespace, out: TextIO
) -> tuple[int, str]:
    """Replay one trace and print its line; its exit status, and how it ended."""
    offered = getattr(adapter, "operations", None)  # None: every operation of its machine
    needed = {type(step.command).__name__ for step in trace.steps}
    if offered is not None and needed - offered:
        left_out = ", ".join(sorted(needed - offered))
        out.write(f"n/a   {path}: needs {left_out}, which the adapter does not offer; not sent\n")
        return (EXIT_CONFORMS if args.accept_subset else EXIT_SUBSET), "not applicable"
    try:
        divergence = replay(trace, adapter)
    except (TraceError, ProvisioningError):
        raise
    except Exception as exc:  # noqa: BLE001 - the adapter raised: this trace's fault, not a divergence
        out.write(f"FAULT {path}: the adapter failed, so nothing was judged: {type(exc).__name__}: {exc}\n")
        return EXIT_USAGE, "faulted"
    if divergence is None and not listed:
        out.write(f"pass  {path}\n")
        return EXIT_CONFORMS, "passed"
    if divergence is not None and listed:
        out.write(f"xfail {path} (listed in {args.expect_fail})\n")
        return EXIT_CONFORMS, "passed"
    if divergence is None:
        out.write(f"XPASS {path}: listed as an expected failure but it passes; remove it from {args.expect_fail}\n")
        return EXIT_NONCONFORMING, "failed"
    out.write(f"FAIL  {path}\n" + "".join(f"      {line}\n" for line in divergence.report().splitlines()))
    return EXIT_NONCONFORMING, "failed"


def check_trace(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        trace = read_trace(args.trace)
    except TraceError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    divergence = check(trace)
    if divergence is None:
        out.write(f"{args.trace}: all {len(trace.steps)} steps agree with the model\n")
        return EXIT_CONFORMS
    out.write(f"{args.trace}: the model disagrees\n{divergence.report()}\n")
    return EXIT_NONCONFORMING


class _StressProgress(ProgressLine):
    """A stress run's progress on stderr: in place on a terminal, every 5 s otherwise."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream, every=5.0)

    def __call__(self, p: StressProgress) -> None:
        line = f"  {p.seconds:5.1f}s  programs {p.programs:,}  histories {p.histories:,}"
        self.show(line + f"  operations {p.operations:,} ({p.rate:,.0f}/s)", p.seconds)


# Why `--terminate` leaves the lifecycle alone: a fire's admission is a run id the
# implementation picks; a fire cut mid-way leaves unknown which id it took, and the
# checker leaves such a history unjudged ("unknown") rather than guess.
TERMINATE_MACHINES = ("delivery",)


def stress_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    databases: dict[str, str | None] = {}  # machine -> the DSN whose backends --terminate ends
    if args.terminate_dsn is not None and not args.terminate:
        err.write("leaseproof: --terminate-dsn names where --terminate ends backends; give --terminate P too\n")
        return EXIT_USAGE
    if args.terminate:
        mutant = _mutant(args.mutant)
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

    def judge(adapter: Any, machine: str, seed_value: int) -> int:
        faults = f", ending a busy backend in {args.terminate:g} of rounds" if args.terminate else ""
        out.write(
            f"stressing the {machine} machine against {adapter.name}: {args.workers} workers, "
            f"{args.duration:g}s, each program {args.repeats} times, seed {seed_value}{faults}\n"
        )
        out.flush()
        progress = _StressProgress(err)
        try:
            report = run_stress(
                adapter,
                machine=machine,
                workers=args.workers,
                duration=args.duration,
                seed=seed_value,
                repeats=args.repeats,
                lose=args.lose_responses,
                budget=args.budget,
                on_progress=progress,
                terminate=args.terminate,
                database=databases.get(machine),
            )
        finally:
            progress.close()
        return _stress_report(report, args, out, err)

    def adapter_for(args: argparse.Namespace, machine: str, provisioned: _Provisioned, out: TextIO) -> Any:
        adapter = _stress_adapter(args, machine, provisioned, out)
        databases[machine] = args.terminate_dsn or provisioned.last_database
        if args.terminate and databases[machine] is None:
            provisioned.release(adapter)
            raise UsageError(
                "--terminate: leaseproof did not give this implementation its database, so it cannot tell whose "
                "backends to end; name the database it uses with --terminate-dsn DSN"
            )
        return adapter

    try:
        return _each_machine(args, out, err, adapter_for, judge)
    except FaultError as exc:
        err.write(f"leaseproof: the fault injector failed, so the run was not judged: {exc}\n")
        return EXIT_USAGE


def _stress_adapter(args: argparse.Namespace, machine: str, provisioned: _Provisioned, out: TextIO) -> Any:
    provisioned.last_database = None  # set again only if this adapter is given a database
    adapter = _adapter(args, machine, provisioned, out)
    if args.adapter_cmd is not None and not adapter.sessions:
        raise UsageError(
            f"--adapter-cmd {args.adapter_cmd!r}: {adapter.name} cannot be run concurrently:"
            f" {adapter.why_no_sessions()}"
        )
    if args.adapter is not None and not hasattr(adapter, "session"):
        adapter.close()
        raise UsageError(f"--adapter {args.adapter}: {adapter.name} has no session(), so it cannot be run concurrently")
    return adapter


def _stress_report(report: StressReport, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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
                "ran, so the implementation's sessions use another database; name theirs with --terminate-dsn\n"
            )
            return EXIT_USAGE
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


def check_history_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        history = read_history(args.history)
    except (OSError, ValueError) as exc:
        err.write(f"leaseproof: {args.history}: {exc}\n")
        return EXIT_USAGE
    spec = SPECS[history.machine]
    result = check_linearizable(history, spec, budget=args.budget)
    out.write(f"{args.history}: {result.summary()}\n")
    if result.violation is not None:
        out.write(timeline(result.violation, spec) + "\n")
    return EXIT_CONFORMS if result.linearizable else EXIT_NONCONFORMING


def spec_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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


def mutants_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.generated:
        return _generated_mutants(args, out, err)
    if args.jobs is not None or args.max_examples is not None:
        err.write("leaseproof: --jobs and --max-examples apply to --generated\n")
        return EXIT_USAGE
    seeds = tuple(args.seed or (killmatrix.SEED,))
    try:
        subjects = killmatrix.select(args.mutant, args.machine, args.kind)
    except ValueError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE

    def on_row(row: killmatrix.Row) -> None:
        err.write(killmatrix.progress_line(row) + "\n")
        err.flush()

    try:
        with postgres_server(args.dsn, log=lambda line: err.write(f"  {line}\n")) as server:
            what = "the fast subset" if args.fast else "every check"
            err.write(
                f"server: {server.description}\nkill matrix: {len(subjects)} mutants, {what}, "
                f"seed{'s' if len(seeds) > 1 else ''} {' '.join(map(str, seeds))}\n"
            )
            matrix = killmatrix.run_matrix(server, subjects, fast=args.fast, seeds=seeds, on_row=on_row)
    except ProvisioningError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    out.write(json.dumps(matrix.to_json(), indent=2) + "\n" if args.json else killmatrix.table(matrix))
    if matrix.survivors:
        err.write(f"leaseproof: survived every check that ran: {', '.join(matrix.survivors)}\n")
        return EXIT_NONCONFORMING
    return EXIT_CONFORMS


def _generated_mutants(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        plan = mutation_score.plan(
            names=args.mutant,
            machine=args.machine,
            fast=args.fast,
            seeds=args.seed,
            examples=args.max_examples,
            kind=args.kind,
        )
    except ValueError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    jobs = args.jobs or mutation_score.default_jobs()
    progress = ProgressLine(err, every=max(1, len(plan.tasks) // 20), first=0, width=100)

    def on_result(result: mutation_score.Result, done: int, total: int) -> None:
        seed = "" if result.seed is None else f" seed {result.seed}"
        verdict = "killed" if result.killed else "SURVIVED"
        progress.show(f"  {done}/{total} {result.mutant} · {result.check}{seed}: {verdict}", done)

    try:
        with postgres_server(args.dsn, log=lambda line: err.write(f"  {line}\n")) as server:
            err.write(
                f"server: {server.description}\nmutation score: {len(plan.mutants)} generated mutants"
                f"{' (the fast subset)' if args.fast else ''}, {len(plan.tasks)} checks on {jobs} workers, "
                f"seeds {' '.join(map(str, plan.seeds))}\n"
            )
            score = mutation_score.run_score(
                server,
                plan.mutants,
                seeds=plan.seeds,
                budget=plan.budget,
                jobs=jobs,
                on_result=on_result,
                work=plan.tasks,
            )
    except ProvisioningError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    finally:
        progress.close()
    out.write(json.dumps(score.to_json(), indent=2) + "\n" if args.json else mutation_score.report(score))
    if score.disproved:
        killed = [r for r in score.results if r.killed and r.mutant in {m.name for m in score.disproved}]
        err.write(
            "leaseproof: claimed equivalent, but killed: "
            + "; ".join(f"{r.mutant} by {r.check} (seed {r.seed}): {r.how} {r.detail}".rstrip() for r in killed)
            + "\n"
        )
        return EXIT_NONCONFORMING
    if score.score < args.min_score:
        err.write(f"leaseproof: the score {score.score:.1%} is below --min-score {args.min_score:.0%}\n")
        return EXIT_NONCONFORMING
    return EXIT_CONFORMS


def explore_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    bounds = {name: getattr(args, name) for name in exploration.bound_options() if getattr(args, name) is not None}
    machines = [args.machine] if args.machine else sorted(exploration.SPECS)
    try:
        holds = exploration.run(machines, bounds, out, err, every_step=args.every_step, trace_out=args.trace_out)
    except exploration.BoundsError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    return EXIT_CONFORMS if holds else EXIT_NONCONFORMING


COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO, TextIO], int]] = {
    "verify": verify,
    "nemesis": nemesis.command,
    "throughput": throughput.command,
    "guarantees": guarantee_matrix.command,
    "replay": replay_traces,
    "check-trace": check_trace,
    "check-history": check_history_command,
    "stress": stress_command,
    "spec": spec_command,
    "mutants": mutants_command,
    "explore": explore_command,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM and SIGHUP end a run as Ctrl-C does: through every `with`, so scratch
    # databases are dropped, worker processes stopped and an embedded server shut down.
    try:
        with interruptible():
            return COMMANDS[args.command](args, sys.stdout, sys.stderr)  # argparse only allows known commands
    except KeyboardInterrupt:
        sys.stderr.write("leaseproof: interrupted; cleaned up\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
