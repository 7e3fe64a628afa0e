"""The documentation site builds strictly: every page, link and anchor resolves, the spec
pages and the CLI reference are made from their sources, and the README points at pages
that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO

from leaseproof.conformance.frontends.cli import COMMANDS


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(root / "mkdocs.yml")]
    return subprocess.run([*command, "--site-dir", str(site)], capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly_with_the_spec_pages_and_the_cli_reference(tmp_path: Path) -> None:
    run = build(REPO, tmp_path / "site")
    assert run.returncode == 0, run.stderr
    cli = (tmp_path / "site" / "cli.html").read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"usage: leaseproof {name}" in cli, name
    spec = (tmp_path / "site" / "spec" / "delivery.html").read_text(encoding="utf-8")
    assert "delivery" in spec.lower() and (tmp_path / "site" / "spec" / "adapter-protocol.schema.json").is_file()


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "mkdocs.yml", copy)
    shutil.copytree(REPO / "specs", copy / "specs", ignore=shutil.ignore_patterns("__pycache__"))
    page = copy / "docs" / "reports.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the stress page](stress.md#no-such-section).\n")
    run = build(copy, tmp_path / "site")
    assert run.returncode != 0
    assert "does not contain an anchor '#no-such-section'" in run.stderr


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links no page"
    missing = [target for target in targets if not (REPO / target).exists()]
    assert missing == []
