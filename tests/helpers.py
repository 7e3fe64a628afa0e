"""What the tests share, imported as `helpers` (pytest's pythonpath and mypy's mypy_path both hold tests/).

- Where the checkout's own files are: the tests read the specs, the corpus
  and the examples from the repository, not from the installed package.
- Reading the tables and headings of the Markdown specs, for the tests that
  keep them in sync with the models.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"

# -- the spec pages ----------------------------------------------------------------------------------


class SpecFormatError(AssertionError):
    """The page does not contain a table in the expected shape."""


def cell(raw: str) -> str:
    return raw.strip().strip("`").strip()


def parse_table(text: str, header: str) -> list[list[str]]:
    """The body rows of the one table whose header line is exactly `header`."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == header]
    if len(starts) != 1:
        raise SpecFormatError(f"expected exactly one table headed {header!r}, found {len(starts)}")
    start = starts[0]
    width = header.count("|") - 1
    separator = lines[start + 1].strip() if start + 1 < len(lines) else ""
    if not re.fullmatch(rf"\|(\s*:?-{{3,}}:?\s*\|){{{width}}}", separator):
        raise SpecFormatError(f"the table headed {header!r} lacks a {width}-column separator line: {separator!r}")
    rows: list[list[str]] = []
    for number, line in enumerate(lines[start + 2 :], start=start + 3):
        stripped = line.strip()
        if not stripped.startswith("|"):
            break
        if not stripped.endswith("|"):
            raise SpecFormatError(f"line {number}: table row does not end with '|': {line!r}")
        cells = [cell(c) for c in stripped[1:-1].split("|")]
        if len(cells) != width:
            raise SpecFormatError(f"line {number}: expected {width} cells, found {len(cells)}: {line!r}")
        rows.append(cells)
    return rows


def headings(text: str) -> list[str]:
    """The first word of every Markdown heading outside fenced code blocks."""
    found = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"#{1,6}\s+`?([A-Za-z_]\w*)", line)
        if match:
            found.append(match.group(1))
    return found
