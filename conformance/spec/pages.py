"""The generated parts of the spec pages: `leaseproof spec` writes them, `--check` proves them current.

A page in `specs/` is prose written by hand around blocks generated from the model, each
delimited by two HTML comments, which Markdown renders as nothing::

    <!-- generated: rules (`leaseproof spec` writes this block from the model; edit the model, not the block) -->
    ...
    <!-- end generated: rules -->

Each page declares which blocks it carries; `render_pages` renders each from the model (the
rule table, the outcome variants, the transitions with their Mermaid diagram, the
invariants), `stale_pages` says which pages differ from what the model generates, and
`write_pages` rewrites them. Every page is checked before any is written, so a malformed page
leaves all of them untouched.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from leaseproof.conformance.boundary import schema
from leaseproof.model import delivery, invariants, lifecycle, lifecycle_invariants
from leaseproof.model.rules import Invariants, Resend, Rule

NOTE = "`leaseproof spec` writes this block from the model; edit the model, not the block"


class SpecPageError(Exception):
    """A page is missing, or its generated blocks are not where and as they should be."""


def _begin(name: str) -> str:
    return f"<!-- generated: {name} ({NOTE}) -->"


def _end(name: str) -> str:
    return f"<!-- end generated: {name} -->"


# -- rendering ------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "—"


def render_outcomes(variants: Mapping[type, tuple[str, ...]]) -> str:
    lines = ["| operation | outcome variants |", "|---|---|"]
    lines += [f"| {op.__name__} | {', '.join(vs)} |" for op, vs in variants.items()]
    return "\n".join(lines)


def render_rules(rules: Mapping[type, tuple[Rule, ...]]) -> str:
    """Every operation's rules in check order: the first whose guard holds decides."""
    lines = []
    for op, listed in rules.items():
        lines += ["", f"**{op.__name__}**", ""]
        lines += ["| # | guard | when | outcome | effect | changes |", "|---:|---|---|---|---|---|"]
        for number, r in enumerate(listed, 1):
            cells = (str(number), f"`{r.guard}`", r.when, ", ".join(r.outcomes), r.effect, _code(r.changes))
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines[1:])


def render_resends(resends: Mapping[type, Resend]) -> str:
    """Each operation's resend rule: whether sending it again is safe, and what it then answers."""
    lines = ["| operation | safe to send again | after a first | a resend answers | why |", "|---|---|---|---|---|"]
    for op, r in resends.items():
        tells = ", ".join(r.tells) if r.tells else ("the same" if r.safe else "-")
        safe = "yes" if r.safe else (f"only with `{r.safe_with}`" if r.safe_with else "**no**")
        cells = (op.__name__, safe, ", ".join(r.took_effect), tells, r.why)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def render_transitions(
    transitions: Mapping[tuple[str, str], tuple[str, ...]], initial: str, final: str | None = None
) -> str:
    """A Mermaid state diagram and a table of the same transitions."""
    node: Callable[[str], str] = lambda name: "[*]" if name in (initial, final) else name  # noqa: E731
    diagram = ["```mermaid", "stateDiagram-v2"]
    diagram += [f"    {node(a)} --> {node(b)}: {', '.join(by)}" for (a, b), by in transitions.items()]
    diagram.append("```")
    table = ["| from | to | by (operation/guard) |", "|---|---|---|"]
    table += [f"| {a} | {b} | {', '.join(by)} |" for (a, b), by in transitions.items()]
    return "\n".join([*diagram, "", *table])


def render_invariants(registry: Invariants) -> str:
    lines = ["State invariants, each of which holds in every reachable state:", ""]
    lines += ["| invariant | statement |", "|---|---|"]
    lines += [f"| `{i.name}` | {_cell(i.statement)} |" for i in registry.of_states]
    lines += ["", "Step invariants, each of which holds for every step `(before, after, outcome)`:", ""]
    lines += ["| invariant | statement |", "|---|---|"]
    lines += [f"| `{i.name}` | {_cell(i.statement)} |" for i in registry.of_steps]
    return "\n".join(lines)


@attrs.frozen
class Page:
    """One spec page and the blocks it carries, each rendered from the model."""

    filename: str
    blocks: Mapping[str, Callable[[], str]]


PAGES: tuple[Page, ...] = (
    Page(
        "delivery.md",
        {
            "row-transitions": lambda: render_transitions(
                {
                    (delivery.status_name(a), delivery.status_name(b)): by
                    for (a, b), by in delivery.TRANSITION_RULES.items()
                },
                initial=delivery.status_name(None),
            ),
            "outcomes": lambda: render_outcomes(delivery.OUTCOME_VARIANTS),
            "rules": lambda: render_rules(delivery.RULES),
            "resends": lambda: render_resends(delivery.RESENDS),
            "invariants": lambda: render_invariants(invariants.INVARIANTS),
        },
    ),
    Page(
        "lifecycle.md",
        {
            "coordinate-transitions": lambda: render_transitions(lifecycle.COORDINATE_TRANSITIONS, lifecycle.ABSENT),
            "outcomes": lambda: render_outcomes(lifecycle.OUTCOME_VARIANTS),
            "rules": lambda: render_rules(lifecycle.RULES),
            "invariants": lambda: render_invariants(lifecycle_invariants.INVARIANTS),
        },
    ),
)


# Files generated whole, beside the pages: the protocol's JSON Schema.
FILES: Mapping[str, Callable[[], str]] = {"adapter-protocol.schema.json": schema.render}


# -- splicing ---------------------------------------------------------------------


def splice(text: str, blocks: Mapping[str, str], where: str = "the page") -> str:
    """`text` with each named block's body replaced; every block must occur exactly once."""
    found = set(re.findall(r"<!-- (?:end )?generated: ([\w-]+)", text))
    unknown = found - blocks.keys()
    if unknown:
        raise SpecPageError(f"{where}: unknown generated blocks {sorted(unknown)}; known: {sorted(blocks)}")
    for name, body in blocks.items():
        begin, end = _begin(name), _end(name)
        if text.count(begin) != 1 or text.count(end) != 1:
            raise SpecPageError(
                f"{where}: the block {name!r} must be opened once by the line\n  {begin}\n"
                f"and closed once by the line\n  {end}\n"
                f"(found {text.count(begin)} and {text.count(end)})"
            )
        start, stop = text.index(begin) + len(begin), text.index(end)
        if stop < start:
            raise SpecPageError(f"{where}: the block {name!r} closes before it opens")
        text = text[:start] + "\n" + body + "\n" + text[stop:]
    return text


def render_pages(spec_dir: Path) -> dict[Path, tuple[str, str]]:
    """For each page: its text now, and the text the model generates."""
    rendered = {}
    for page in PAGES:
        path = spec_dir / page.filename
        if not path.is_file():
            raise SpecPageError(f"{path}: no such spec page (--specs DIR names the folder that holds them)")
        text = path.read_text(encoding="utf-8")
        rendered[path] = (text, splice(text, {name: render() for name, render in page.blocks.items()}, str(path)))
    for filename, render in FILES.items():
        path = spec_dir / filename
        rendered[path] = (path.read_text(encoding="utf-8") if path.is_file() else "", render())
    return rendered


def stale_pages(spec_dir: Path) -> dict[Path, str]:
    """Each page whose generated blocks differ from the model's, with a unified diff."""
    return {
        path: "\n".join(difflib.unified_diff(now.splitlines(), want.splitlines(), str(path), "generated", lineterm=""))
        for path, (now, want) in render_pages(spec_dir).items()
        if now != want
    }


def write_pages(spec_dir: Path) -> list[Path]:
    """Rewrite the generated blocks of every page; the pages that changed."""
    changed = [(path, want) for path, (now, want) in render_pages(spec_dir).items() if now != want]
    for path, want in changed:
        path.write_text(want, encoding="utf-8")
    return [path for path, _ in changed]
