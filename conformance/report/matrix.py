"""The kill matrix (`leaseproof mutants`) as a page: one table row per (mutant,
check), as the terminal table has them, each linked to its counterexample.

A `Row` keeps its counterexample as text (the shrunk program, or the minimal
piece's reason); the page shows it under the table, one anchor per row. Where
the caller wrote a page of its own for a mutant's counterexample (a
counterexample page from its corpus trace, a stress page), `pages` maps the
mutant to that file and the row links there instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from leaseproof.conformance.evidence.killmatrix import COLUMNS, KillMatrix, cells
from leaseproof.conformance.report import page


def matrix_page(matrix: KillMatrix, *, pages: Mapping[str, str] | None = None, subject: str = "") -> str:
    """`pages`: mutant name -> a link (relative to the matrix page) to its counterexample's own page."""
    pages = pages or {}
    header = "<tr>" + "".join(f"<th>{page.escape(c)}</th>" for c in COLUMNS) + "<th>counterexample</th></tr>"
    lines = [header]
    for index, row in enumerate(matrix.rows):
        values = cells(row)
        css = "" if row.killed else ' class="killed-no"'
        tds = []
        for column, value in zip(COLUMNS, values, strict=True):
            if column == "killed":
                tone = "good" if row.killed else "bad"
                tds.append(f'<td><span class="badge {tone}">{page.escape(value)}</span></td>')
            else:
                tds.append(f"<td>{page.escape(value)}</td>")
        if row.mutant in pages:
            link = f'<a class="counterexample" href="{page.escape(pages[row.mutant])}">its page</a>'
        elif row.counterexample or row.detail:
            link = f'<a class="counterexample" href="#row-{index}">below</a>'
        else:
            link = "-"
        tds.append(f"<td>{link}</td>")
        lines.append(
            f'<tr{css} data-mutant="{page.escape(row.mutant)}" data-check="{page.escape(row.check)}" '
            f'data-killed="{"yes" if row.killed else "no"}">' + "".join(tds) + "</tr>"
        )
    table = '<div class="scroll"><table id="kill-matrix">' + "".join(lines) + "</table></div>"
    counts = matrix.counts()
    figures = page.facts(
        [(f"{kind} mutants killed", f"{k} of {n}") for kind, (k, n) in counts.items() if n]
        + [("subset", "fast" if matrix.fast else "full"), ("seeds", ", ".join(map(str, matrix.seeds))),
           ("seconds", f"{matrix.seconds:.0f}")]
    )  # fmt: skip
    sections = [page.section("the matrix", figures + table, "summary")]
    evidence = []
    for index, row in enumerate(matrix.rows):
        if not (row.counterexample or row.detail):
            continue
        seed = "" if row.seed is None else f", seed {row.seed}"
        body = f"<p>{page.escape(row.detail)}</p>" if row.detail else ""
        if row.counterexample:
            body += page.preformatted(row.counterexample)
        evidence.append(
            f'<div class="evidence" id="row-{index}"><h3>{page.escape(row.mutant)} · {page.escape(row.check)}'
            f"{page.escape(seed)}</h3>{body}</div>"
        )
    if evidence:
        sections.append(page.section("each counterexample", "".join(evidence), "counterexamples"))
    survivors = matrix.survivors
    badge = page.verdict_badge(
        f"SURVIVED: {', '.join(survivors)}" if survivors else "every mutant was killed", "bad" if survivors else "good"
    )
    return page.render("leaseproof mutants: the kill matrix", subject, badge, sections, "kill-matrix")


def write_matrix_report(
    directory: Path | str,
    matrix: KillMatrix,
    *,
    pages: Mapping[str, Path] | None = None,
    subject: str = "",
    filename: str = "kill-matrix.html",
) -> Path:
    """Write the kill matrix's page into `directory`; its path. `pages`: mutant name -> the
    page of its counterexample (e.g. one `write_counterexample_report` wrote into the same
    directory), linked relative to the matrix page."""
    folder = Path(directory)
    links = {name: Path(os.path.relpath(path, folder)).as_posix() for name, path in (pages or {}).items()}
    return page.write(folder, filename, matrix_page(matrix, pages=links, subject=subject))
