"""MkDocs hooks: pages made at build time from their sources, so that they cannot drift.

- `spec/*.md`: the spec pages and the adapter protocol, as `specs/` holds them (the
  files the package ships and `leaseproof spec --check` keeps current), with the
  protocol's JSON schema beside them.
- `cli.md`: every command's `--help`, from the parsers the `leaseproof` command uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent
SPECS = ("delivery.md", "lifecycle.md", "guarantees.md", "adapter-protocol.md", "adapter-protocol.schema.json")


def cli_reference() -> str:
    """The CLI reference page: the top level's help, then each command's, as printed."""
    from leaseproof.conformance.frontends.cli import COMMANDS, build_parser

    own: dict[str, Any] = {}
    parser = build_parser(subparsers=own)
    sections = [
        "# CLI reference\n",
        "Generated from the argument parsers of the `leaseproof` command when the site is built: "
        "each block is what `leaseproof COMMAND --help` prints.\n",
        "## leaseproof\n",
        f"```text\n{parser.format_help().rstrip()}\n```\n",
    ]
    for name in COMMANDS:
        sections += [f"## leaseproof {name}\n", f"```text\n{own[name].format_help().rstrip()}\n```\n"]
    return "\n".join(sections)


def on_files(files: Files, config: Any) -> Files:
    for name in SPECS:
        text = (REPO / "specs" / name).read_text(encoding="utf-8")
        files.append(File.generated(config, f"spec/{name}", content=text))
    files.append(File.generated(config, "cli.md", content=cli_reference()))
    return files
