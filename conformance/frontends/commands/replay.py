"""`leaseproof replay`: trace files replayed against an implementation."""

from __future__ import annotations

import argparse
import collections
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from leaseproof.conformance.frontends.commands.common import (
    UsageError,
    adapter_errors_in_one_line,
    add_adapter_arguments,
    report_folder,
    worse,
)
from leaseproof.conformance.frontends.exits import (
    EXIT_CONFORMS,
    EXIT_NONCONFORMING,
    EXIT_SUBSET,
    EXIT_USAGE,
    INTERRUPTED_EXITS,
)

if TYPE_CHECKING:  # what a run imports when it starts (`--help` does not)
    from leaseproof.conformance.boundary.protocols import SomeAdapter
    from leaseproof.conformance.traces.trace import Trace

DESCRIPTION = (
    "Replay each trace step by step against an implementation and the model, and check what the trace "
    "recorded against the model too; report each trace's first divergence. A trace that needs an operation "
    "the adapter does not offer is not sent (n/a); an adapter fault is that trace's, and the batch goes on."
)
EXITS = (
    "exit status: 0 every trace as expected; 1 a trace diverged (or passed though listed by --expect-fail); "
    "2 usage error, or the adapter failed on a trace; 3 a trace needs operations the adapter does not "
    "offer and --accept-subset was not given; " + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", nargs="+", type=Path, metavar="TRACE", help="trace files (.jsonl)")
    parser.add_argument(
        "--expect-fail",
        type=Path,
        metavar="FILE",
        help="names of traces this implementation knowingly fails, one per line; an unexpected pass is an error too",
    )
    parser.add_argument(
        "--accept-subset",
        action="store_true",
        help="traces that need operations the adapter does not offer are reported n/a without failing the run",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write an HTML page of the batch into DIR (made if missing) and print its path: replay.html, a table "
        "of the traces and how each ended, and each trace's steps, run again on the implementation for the page, "
        "with the rows each step touched (so a trace is sent twice); the results and the exit status are the same "
        "with or without it",
    )
    add_adapter_arguments(parser)
    adapter_errors_in_one_line(parser)


def _expected_failures(path: Path | None) -> set[str]:
    from leaseproof.conformance.traces.trace import text_lines

    if path is None:
        return set()
    lines = text_lines(path, "it lists trace names, one a line", lambda why: UsageError(f"--expect-fail {why}"))
    return {line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")}


def _model_takes(path: Path, trace: Trace) -> None:
    """Step the model through `trace` alone: a step the model cannot take (a clock moved past
    the last instant it knows, say) is the trace's fault, found before any implementation is
    sent it, and a usage error naming the file, not an adapter's fault."""
    from leaseproof.conformance.lockstep import world as w
    from leaseproof.conformance.traces.trace import SPECS

    spec = SPECS[trace.machine]
    try:
        state = spec.initial_state(trace.start)
    except Exception as exc:  # noqa: BLE001 - whatever the model refuses is the trace's fault
        why = f"{type(exc).__name__}: {exc}"
        raise UsageError(f"{path}: the model cannot start where this trace starts: {why}") from None
    for number, recorded in enumerate(trace.steps, 1):
        try:
            state, _ = spec.step(state, recorded.command)
        except Exception as exc:  # noqa: BLE001 - as above
            raise UsageError(
                f"{path}: step {number}, {w.describe(recorded.command)}: the model cannot take it "
                f"({type(exc).__name__}: {exc}), so the trace is not a run of the {trace.machine} machine"
            ) from None


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.boundary.wire import AdapterFault
    from leaseproof.conformance.frontends.commands.running import Provisioned, adapter_named, mutant_named
    from leaseproof.conformance.harness.provision import ProvisioningError
    from leaseproof.conformance.traces.trace import TraceError
    from leaseproof.conformance.traces.trace import read as read_trace

    results: list[tuple[Path, Trace, str, str]] = []  # each trace: its path, itself, how it ended, what was said
    try:
        folder = report_folder(args.report)
        traces = [(path, read_trace(path)) for path in args.traces]
        for path, trace in traces:
            _model_takes(path, trace)
        expected = _expected_failures(args.expect_fail)
        machines = sorted({trace.machine for _, trace in traces})
        mutant = mutant_named(args.mutant)
        if mutant is not None and machines != [mutant.machine]:
            raise UsageError(
                f"the traces are of the {' and '.join(machines)} machine{'s' if len(machines) > 1 else ''}; "
                f"--mutant {mutant.name} is a mutant of the {mutant.machine} machine: replay its traces alone"
            )
        with contextlib.ExitStack() as stack:
            provisioned = Provisioned(args, out, err, stack)
            adapters: dict[str, SomeAdapter] = {}  # each machine's implementation, for its traces
            for machine in machines:
                adapters[machine] = adapter_named(args, machine, provisioned, out)
                stack.callback(adapters[machine].close)
            out.write(f"replaying {len(traces)} trace(s) against {', '.join(a.name for a in adapters.values())}\n")
            status, tally = EXIT_CONFORMS, collections.Counter[str]()
            for path, trace in traces:
                listed = path.name in expected or path.stem in expected
                one, kind, word, detail = _replay_one(path, trace, adapters[trace.machine], listed, args, out)
                status, tally[kind] = worse(status, one), tally[kind] + 1
                results.append((path, trace, word, detail))
                out.flush()
            page = _write_page(folder, results, adapters, err) if folder is not None else None
    except (ProvisioningError, UsageError, AdapterFault, TraceError) as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    unknown = expected - {p.name for p, _ in traces} - {p.stem for p, _ in traces}
    for name in sorted(unknown):
        out.write(f"note: {name} is listed in {args.expect_fail} but was not replayed\n")
    extra = "".join(f", {tally[kind]} {kind}" for kind in ("not applicable", "faulted") if tally[kind])
    out.write(f"{tally['passed']} passed, {tally['failed']} failed{extra}\n")
    if page is not None:
        out.write(f"report: {page}\n")
    return status


def _write_page(
    folder: Path, results: list[tuple[Path, Trace, str, str]], adapters: dict[str, SomeAdapter], err: TextIO
) -> Path | None:
    """The --report page of the batch, written once every trace was replayed: each trace
    that was sent is run again on its machine's adapter (reset) for its steps and the rows
    each touched; one not sent (n/a) shows the model's side. Nothing here changes the batch's
    results or the exit status: a failure is said on stderr (and None returned)."""
    from leaseproof.conformance.report import ReplayResult, run_trace, write_replay_report

    try:
        pages = []
        for path, trace, word, detail in results:
            run = None
            if word != NOT_APPLICABLE:
                try:
                    run = run_trace(trace, adapters[trace.machine])
                except Exception:  # noqa: BLE001 - it could not even be reset: the model's side, then
                    run = None
            if run is None:
                run = run_trace(trace)
            pages.append(ReplayResult(path, word, detail, run))
        subject = ", ".join(adapter.name for adapter in adapters.values())
        path = write_replay_report(folder, pages, subject=subject)
    except Exception as exc:  # noqa: BLE001 - a page that cannot be written leaves the results as they are
        err.write(f"leaseproof: could not write the report page into {folder}: {type(exc).__name__}: {exc}\n")
        return None
    return path


# How a trace ended, in the words replay prints (and the --report page shows).
PASSED, FAILED, XFAIL, XPASS, NOT_APPLICABLE, FAULT = "pass", "FAIL", "xfail", "XPASS", "n/a", "FAULT"


def _replay_one(
    path: Path, trace: Trace, adapter: SomeAdapter, listed: bool, args: argparse.Namespace, out: TextIO
) -> tuple[int, str, str, str]:
    """Replay one trace and print its line; its exit status, how it ended for the tally and
    in replay's words, and what was printed of it besides."""
    from leaseproof.conformance.boundary.protocols import Offering
    from leaseproof.conformance.harness.provision import ProvisioningError
    from leaseproof.conformance.traces.trace import TraceError, replay

    offered = adapter.operations if isinstance(adapter, Offering) else None  # None: every operation of its machine
    needed = {type(step.command).__name__ for step in trace.steps}
    if offered is not None and needed - offered:
        left_out = ", ".join(sorted(needed - offered))
        detail = f"needs {left_out}, which the adapter does not offer; not sent"
        out.write(f"n/a   {path}: {detail}\n")
        return (EXIT_CONFORMS if args.accept_subset else EXIT_SUBSET), "not applicable", NOT_APPLICABLE, detail
    try:
        divergence = replay(trace, adapter)
    except (TraceError, ProvisioningError):
        raise
    except Exception as exc:  # noqa: BLE001 - the adapter raised: this trace's fault, not a divergence
        detail = f"the adapter failed, so nothing was judged: {type(exc).__name__}: {exc}"
        out.write(f"FAULT {path}: {detail}\n")
        return EXIT_USAGE, "faulted", FAULT, detail
    if divergence is None and not listed:
        out.write(f"pass  {path}\n")
        return EXIT_CONFORMS, "passed", PASSED, ""
    if divergence is not None and listed:
        out.write(f"xfail {path} (listed in {args.expect_fail})\n")
        return EXIT_CONFORMS, "passed", XFAIL, f"listed in {args.expect_fail}\n{divergence.report()}"
    if divergence is None:
        detail = f"listed as an expected failure but it passes; remove it from {args.expect_fail}"
        out.write(f"XPASS {path}: {detail}\n")
        return EXIT_NONCONFORMING, "failed", XPASS, detail
    out.write(f"FAIL  {path}\n" + "".join(f"      {line}\n" for line in divergence.report().splitlines()))
    return EXIT_NONCONFORMING, "failed", FAILED, divergence.report()
