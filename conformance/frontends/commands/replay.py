"""`leaseproof replay`: trace files replayed against an implementation."""

from __future__ import annotations

import argparse
import collections
import contextlib
from pathlib import Path
from typing import Any, TextIO

from leaseproof.conformance.boundary.wire import AdapterFault
from leaseproof.conformance.frontends.commands.common import (
    Provisioned,
    UsageError,
    adapter_named,
    add_adapter_arguments,
    mutant_named,
    worse,
)
from leaseproof.conformance.frontends.exits import (
    EXIT_CONFORMS,
    EXIT_NONCONFORMING,
    EXIT_SUBSET,
    EXIT_USAGE,
    INTERRUPTED_EXITS,
)
from leaseproof.conformance.harness.provision import ProvisioningError
from leaseproof.conformance.traces.trace import TraceError, replay
from leaseproof.conformance.traces.trace import read as read_trace

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
    add_adapter_arguments(parser)


def _expected_failures(path: Path | None) -> set[str]:
    if path is None:
        return set()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"--expect-fail {path}: {exc.strerror}") from None
    return {line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")}


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        traces = [(path, read_trace(path)) for path in args.traces]
        expected = _expected_failures(args.expect_fail)
        machines = sorted({trace.machine for _, trace in traces})
        if len(machines) > 1:
            raise UsageError(f"the traces are of the {' and '.join(machines)} machines; replay one machine's at a time")
        machine = machines[0]
        mutant = mutant_named(args.mutant)
        if mutant is not None and mutant.machine != machine:
            raise UsageError(
                f"the traces are of the {machine} machine; --mutant {mutant.name} is not one of its mutants"
            )
        with contextlib.ExitStack() as stack:
            adapter = adapter_named(args, machine, Provisioned(args, out, err, stack), out)
            stack.callback(adapter.close)
            out.write(f"replaying {len(traces)} trace(s) against {adapter.name}\n")
            status, tally = EXIT_CONFORMS, collections.Counter[str]()
            for path, trace in traces:
                listed = path.name in expected or path.stem in expected
                one, kind = _replay_one(path, trace, adapter, listed, args, out)
                status, tally[kind] = worse(status, one), tally[kind] + 1
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


