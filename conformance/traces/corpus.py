"""The regression corpus: the minimal counterexample of every shipped mutant of both machines, as traces.

    python -m leaseproof.conformance.traces.corpus DIR [--mutants NAME,...] [--dsn DSN]

rewrites DIR/<mutant>.jsonl (of every shipped mutant, or of those named) from a seeded, shrunk search against each
mutant (fixed scenarios off, so each trace is what the search itself found). A mutant the search kills by a fault
(it raised: no trace) is searched again on the next seed, up to SEEDS of them.
Each trace must replay cleanly against the real store and diverge against
its mutant; the test suite checks both. The corpus is installed with the
package (`leaseproof.conformance.traces`, package data): `leaseproof path
corpus` prints its folder, e.g. for `leaseproof replay`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from leaseproof.conformance.harness.databases import scratch_database
from leaseproof.conformance.harness.provision import postgres_server
from leaseproof.conformance.lockstep.verify import Run, run_conformance
from leaseproof.conformance.traces.trace import trace_of, write
from leaseproof.impl.mutants.delivery import MUTANTS, Mutant
from leaseproof.impl.mutants.lifecycle import LIFECYCLE_MUTANTS, LifecycleMutant

SEED = 20261129
BUDGET = 1000
SEEDS = 5  # seeds tried, from SEED on, for a kill that leaves a trace (a divergence, not a fault)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leaseproof.conformance.traces.corpus", description=__doc__.splitlines()[0]
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--mutants", default="", help="comma-separated names (default: every shipped mutant)")
    parser.add_argument("--dsn")
    args = parser.parse_args(argv)
    names = [name for name in args.mutants.split(",") if name]
    shipped: tuple[Mutant | LifecycleMutant, ...] = (*MUTANTS, *LIFECYCLE_MUTANTS)
    unknown = sorted(set(names) - {mutant.name for mutant in shipped})
    if unknown:
        parser.error(f"no shipped mutant named {', '.join(unknown)}")
    args.directory.mkdir(parents=True, exist_ok=True)
    with postgres_server(args.dsn) as server:
        for mutant in shipped:
            if names and mutant.name not in names:
                continue
            verdict = None
            for seed in range(SEED, SEED + SEEDS):
                with scratch_database(server) as dsn:
                    adapter = mutant.adapter(dsn)
                    try:
                        verdict = run_conformance(
                            adapter, Run(machine=mutant.machine, max_examples=BUDGET, seed=seed, scenarios=False)
                        )
                    finally:
                        adapter.close()
                if verdict.conforms:
                    print(f"{mutant.name}: not killed within {BUDGET} programs (seed {seed})", file=sys.stderr)
                    return 1
                if verdict.recorded is not None:
                    break
                # It raised (the database refused what it did), which leaves no trace: the next seed.
                fault = (verdict.fault or "").splitlines()[0]
                said = f"{mutant.name}: seed {seed} killed it by a fault, which leaves no trace ({fault})"
                print(said, file=sys.stderr)
            assert verdict is not None
            trace = trace_of(verdict.recorded)
            if trace is None:
                print(f"{mutant.name}: every seed killed it by a fault; its trace, if any, is kept", file=sys.stderr)
                continue
            path = args.directory / f"{mutant.name}.jsonl"
            write(trace, path)
            print(f"{mutant.name}: {len(trace.steps)} steps, {verdict.seconds:.1f}s -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
