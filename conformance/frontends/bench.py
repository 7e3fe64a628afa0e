"""How long `leaseproof` takes to start, against Python's own start.

`python -m leaseproof.conformance.frontends.bench [--rounds 7]` runs, as separate
processes in rounds whose order rotates, a bare interpreter (`python -c pass`,
the baseline), `leaseproof --help`, `leaseproof --version` and every command's
`--help`, and prints each one's median wall time over the rounds, its median
excess over the baseline measured in the same round, and the ratio of the
medians. `leaseproof --help` imports only the command table
(`conformance/frontends/cli.py`); a command's `--help` imports that command's
modules and no other's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from leaseproof.conformance.frontends.cli import COMMANDS

BASELINE = "python -c pass"
_CLI = [sys.executable, "-m", "leaseproof.conformance.frontends.cli"]


def subjects() -> dict[str, list[str]]:
    """Each subject's command line; the baseline first."""
    lines = {BASELINE: [sys.executable, "-c", "pass"], "leaseproof --help": [*_CLI, "--help"]}
    lines["leaseproof --version"] = [*_CLI, "--version"]
    lines.update({f"leaseproof {name} --help": [*_CLI, name, "--help"] for name in COMMANDS})
    return lines


def _seconds(argv: Sequence[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return elapsed


def measure(rounds: int, names: Sequence[str] | None = None) -> dict[str, list[float]]:
    """Wall seconds of each subject in each round; round r starts at the r-th subject."""
    lines = subjects()
    chosen = [BASELINE, *(n for n in (names or lines) if n != BASELINE)]
    times: dict[str, list[float]] = {name: [] for name in chosen}
    for r in range(rounds):
        order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
        for name in order:
            times[name].append(_seconds(lines[name]))
    return times


def table(times: dict[str, list[float]]) -> str:
    base = times[BASELINE]
    rows = [
        "| command | wall s (median) | over `python -c pass` (median of rounds) | × baseline |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, seconds in times.items():
        excess = statistics.median(s - b for s, b in zip(seconds, base, strict=True))
        ratio = statistics.median(seconds) / statistics.median(base)
        rows.append(f"| `{name}` | {statistics.median(seconds):.3f} | {excess:+.3f} | {ratio:.1f} |")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m leaseproof.conformance.frontends.bench", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="rounds, each running every subject once (default: 7)")
    parser.add_argument("--top-only", action="store_true", help="only the baseline, --help and --version")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    names = [BASELINE, "leaseproof --help", "leaseproof --version"] if args.top_only else None
    times = measure(args.rounds, names)
    sys.stdout.write(f"{args.rounds} rounds, order rotating, {sys.executable}\n" + table(times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
