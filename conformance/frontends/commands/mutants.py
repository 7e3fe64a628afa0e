"""`leaseproof mutants`: the kill matrix, and the mutation score of the generated mutants."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from leaseproof.conformance.frontends.catalogue import (
    KILL_MATRIX_SEED,
    MACHINES,
    MIN_SCORE,
    MUTANT_KINDS,
    SCORE_EXAMPLES,
    SCORE_SEEDS,
)
from leaseproof.conformance.frontends.commands.common import number, positive, report_folder, seed_number
from leaseproof.conformance.frontends.exits import EXIT_CONFORMS, EXIT_NONCONFORMING, EXIT_USAGE, INTERRUPTED_EXITS
from leaseproof.conformance.frontends.progress import ProgressLine

if TYPE_CHECKING:  # what a run imports when it starts (`--help` does not)
    from leaseproof.conformance.evidence import killmatrix

DESCRIPTION = (
    "Run each known-buggy variant of the bundled implementation against its checks (sequential mutants: "
    "lockstep with the fixed scenarios, and the search alone; race mutants: stress, and forced "
    "interleavings) and print, per mutant and check, whether it was killed, after how many examples and "
    "seconds, and how short the counterexample was. Exit 1 if a mutant survives every check that ran."
)
EXITS = (
    "exit status: 0 every mutant killed by a check that ran (with --generated: the score reached "
    "--min-score and every equivalence claim held); 1 a mutant survived (with --generated: the score is "
    "below --min-score, or a mutant listed as equivalent was killed); 2 usage or provisioning error; "
    + INTERRUPTED_EXITS
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--machine", choices=sorted(MACHINES), help="only this machine's mutants (default: both)")
    parser.add_argument(
        "--generated",
        action="store_true",
        help="the mutation score instead: every mechanically generated mutant (one site of one named statement "
        "changed) through the search alone on each --seed, the scenarios, and stress for the lock mutants",
    )
    parser.add_argument("--fast", action="store_true", help="only the checks that take seconds (the CI subset)")
    parser.add_argument(
        "--kind",
        choices=(*MUTANT_KINDS, "scope"),
        help="only the mutants of this kind (default: all); scope (who may call) with --generated only",
    )
    parser.add_argument("--json", action="store_true", help="print the matrix as a JSON document instead of a table")
    parser.add_argument(
        "--seed",
        type=seed_number,
        nargs="+",
        metavar="N",
        help=f"seed(s) of every seeded check (default: {KILL_MATRIX_SEED}; with --generated: "
        f"{' '.join(map(str, SCORE_SEEDS))})",
    )
    parser.add_argument(
        "--mutant",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="only these mutants (default: every shipped one, sequential and race; with --generated, every "
        "generated one)",
    )
    parser.add_argument(
        "--jobs",
        type=positive,
        help="with --generated: worker processes, each on its own database (default: one per core)",
    )
    parser.add_argument(
        "--max-examples",
        type=positive,
        help=f"with --generated: programs of the search alone (default: {SCORE_EXAMPLES}, verify's default)",
    )
    parser.add_argument(
        "--min-score",
        type=number(float, "a number", lambda v: 0 <= v <= 1, "between 0 and 1"),
        default=MIN_SCORE,
        metavar="S",
        help=f"with --generated: exit 1 when fewer than this share of the non-equivalent mutants dies "
        f"(default: {MIN_SCORE}); a killed equivalence claim always fails the run",
    )
    parser.add_argument("--dsn", help="PostgreSQL server to use (default: LEASEPROOF_DSN, else Docker, else embedded)")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write the kill matrix as an HTML page into DIR (made if missing) and print its path: kill-matrix.html, "
        "the table with a survivor's rows red, each row linked to its counterexample (the shrunk program, or the "
        "minimal piece's reason), its path printed after the table (on stderr with --json); not with --generated; "
        "the exit status is the same with or without it",
    )


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.generated and args.report is not None:
        err.write("leaseproof: --report writes the kill matrix's page; --generated's mutation score has none\n")
        return EXIT_USAGE
    if args.generated:
        return _generated_mutants(args, out, err)
    from leaseproof.conformance.evidence import killmatrix
    from leaseproof.conformance.harness.provision import ProvisioningError, postgres_server

    folder = report_folder(args.report)  # a folder that cannot be made: UsageError, exit 2 (cli)
    if args.jobs is not None or args.max_examples is not None:
        err.write("leaseproof: --jobs and --max-examples apply to --generated\n")
        return EXIT_USAGE
    if args.kind == "scope":
        err.write("leaseproof: --kind scope applies to --generated (the shipped mutants have no scope kind)\n")
        return EXIT_USAGE
    seeds = tuple(args.seed or (killmatrix.SEED,))
    try:
        subjects = killmatrix.select(args.mutant, args.machine, args.kind)
    except ValueError as exc:
        err.write(f"leaseproof: {exc}\n")
        return EXIT_USAGE
    if not any(subject.checks(args.fast) for subject in subjects):
        err.write(
            "leaseproof: the fast subset runs no check on a service, restart or network mutant (the nemesis):"
            " leave out --fast\n"
        )
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
    if folder is not None:
        _write_page(folder, matrix, err if args.json else out, err)
    if matrix.survivors:
        err.write(f"leaseproof: survived every check that ran: {', '.join(matrix.survivors)}\n")
        return EXIT_NONCONFORMING
    return EXIT_CONFORMS


def _write_page(folder: Path, matrix: killmatrix.KillMatrix, say: TextIO, err: TextIO) -> None:
    """The --report page of the matrix; its path is said on `say` (stdout after the table;
    stderr with --json, whose stdout is the JSON document alone). Nothing here changes the
    exit status: a failure is said on stderr."""
    from leaseproof.conformance.report import write_matrix_report, write_stress_report  # when asked for

    try:
        # Each history stress convicted a mutant by gets its own page, which its rows link to.
        pages = {
            row.mutant: write_stress_report(
                folder, row.stress, subject=row.mutant, filename=f"stress-{row.mutant}-{row.seed}.html"
            )
            for row in matrix.rows
            if row.stress is not None and row.stress.finding is not None
        }
        path = write_matrix_report(folder, matrix, pages=pages)
    except Exception as exc:  # noqa: BLE001 - a page that cannot be written leaves the matrix as it is
        err.write(f"leaseproof: could not write the report page into {folder}: {type(exc).__name__}: {exc}\n")
        return
    say.write(f"report: {path}\n")


def _generated_mutants(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from leaseproof.conformance.evidence import score as mutation_score
    from leaseproof.conformance.harness.provision import ProvisioningError, postgres_server

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
