"""The spec pages cannot drift from the models.

The rule tables, outcome variants, transitions (with their Mermaid diagram)
and invariants on `specs/*.md` are generated from the models by `leaseproof
spec`. These tests prove the checked-in pages current, and that the check
notices a hand edit inside a generated block, a change to a model, and a
malformed page, which is refused with every page left untouched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from helpers import SPECS, headings, replace_once

from leaseproof.conformance.spec import pages as spec_pages
from leaseproof.model import delivery, invariants, lifecycle
from leaseproof.model.rules import Invariants


@pytest.fixture
def pages(tmp_path: Path) -> Path:
    """A copy of the spec pages (and the files generated whole) to drift."""
    for filename in (*(page.filename for page in spec_pages.PAGES), *spec_pages.FILES):
        shutil.copy(SPECS / filename, tmp_path / filename)
    return tmp_path


def test_a_missing_or_edited_schema_file_is_stale(pages: Path) -> None:
    schema_file = pages / "adapter-protocol.schema.json"
    assert spec_pages.stale_pages(pages) == {}
    schema_file.write_text(schema_file.read_text().replace('"minLength": 1', '"minLength": 0', 1))
    assert list(spec_pages.stale_pages(pages)) == [schema_file]
    schema_file.unlink()
    assert list(spec_pages.stale_pages(pages)) == [schema_file]
    assert spec_pages.write_pages(pages) == [schema_file] and spec_pages.stale_pages(pages) == {}


def _edit(path: Path, old: str, new: str) -> None:
    path.write_text(replace_once(path.read_text(encoding="utf-8"), old, new), encoding="utf-8")


def test_the_checked_in_pages_are_generated_from_the_current_models() -> None:
    stale = spec_pages.stale_pages(SPECS)
    assert not stale, "run `leaseproof spec`:\n" + "\n".join(stale.values())


def test_every_operation_has_its_rules_and_a_prose_heading_on_its_page() -> None:
    for filename, model in (("delivery.md", delivery), ("lifecycle.md", lifecycle)):
        text = (SPECS / filename).read_text(encoding="utf-8")
        present = set(headings(text))
        for operation, rules in model.RULES.items():
            assert f"**{operation.__name__}**" in text, f"{filename}: no rule table for {operation.__name__}"
            assert operation.__name__ in present, f"{filename}: no prose heading for {operation.__name__}"
            for rule in rules:
                assert f"| `{rule.guard}` | {rule.when} |" in text.replace("\\|", "|")


def test_a_hand_edit_inside_a_block_is_stale_and_rewriting_keeps_the_prose(pages: Path) -> None:
    page = pages / "delivery.md"
    _edit(page, "| `oldest-pending` | otherwise | Claimed |", "| `oldest-pending` | otherwise | ClaimMiss |")
    _edit(page, "A terminal row never changes again.", "A terminal row never changes again, as edited by hand.")
    stale = spec_pages.stale_pages(pages)
    assert list(stale) == [page]
    assert "-| 6 | `oldest-pending` | otherwise | ClaimMiss |" in stale[page]
    assert "+| 6 | `oldest-pending` | otherwise | Claimed |" in stale[page]
    assert "edited by hand" not in stale[page]  # prose is the author's, outside every block
    assert spec_pages.write_pages(pages) == [page]
    assert spec_pages.stale_pages(pages) == {}
    assert "as edited by hand" in page.read_text(encoding="utf-8")
    assert spec_pages.write_pages(pages) == []  # idempotent


def test_a_changed_rule_makes_its_page_stale(pages: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = dict(lifecycle.RULES)
    first = rules[lifecycle.Fire][0]
    rules[lifecycle.Fire] = (attrs.evolve(first, when="no replica answers to this name"), *rules[lifecycle.Fire][1:])
    monkeypatch.setattr(lifecycle, "RULES", rules)
    stale = spec_pages.stale_pages(pages)
    assert list(stale) == [pages / "lifecycle.md"]
    assert "no replica answers to this name" in stale[pages / "lifecycle.md"]


def test_a_new_invariant_makes_its_page_stale(pages: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Invariants()
    registry.of_states[:] = invariants.INVARIANTS.of_states
    registry.of_steps[:] = invariants.INVARIANTS.of_steps

    @registry.state
    def nothing_is_ever_pending(s: delivery.DeliverySystem) -> list[str]:
        """No row is pending."""
        return []

    monkeypatch.setattr(invariants, "INVARIANTS", registry)
    stale = spec_pages.stale_pages(pages)
    assert list(stale) == [pages / "delivery.md"]
    assert "+| `nothing-is-ever-pending` | No row is pending. |" in stale[pages / "delivery.md"]


def test_a_changed_transition_makes_its_page_stale(pages: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transitions = dict(delivery.TRANSITION_RULES)
    transitions[(delivery.Status.CLAIMED, delivery.Status.PENDING)] = ("Reap/sweep", "Renew/held")
    monkeypatch.setattr(delivery, "TRANSITION_RULES", transitions)
    stale = spec_pages.stale_pages(pages)
    assert "+    claimed --> pending: Reap/sweep, Renew/held" in stale[pages / "delivery.md"]


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("<!-- end generated: rules -->\n", "", "'rules' must be opened once"),
        ("<!-- end generated: outcomes -->\n", "<!-- end generated: outcomes -->\n<!-- generated: typo -->\n", "typo"),
    ],
)
def test_a_malformed_page_is_refused_and_no_page_is_written(pages: Path, old: str, new: str, complaint: str) -> None:
    _edit(pages / "delivery.md", "| Reap | Reaped |", "| Reap | Reaped, Ok |")  # stale, and first in order
    _edit(pages / "lifecycle.md", old, new)
    before = {page: page.read_text(encoding="utf-8") for page in pages.iterdir()}
    with pytest.raises(spec_pages.SpecPageError, match=complaint):
        spec_pages.write_pages(pages)
    assert {page: page.read_text(encoding="utf-8") for page in pages.iterdir()} == before


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leaseproof.conformance.frontends.cli", "spec", *args], capture_output=True, text=True
    )


def test_the_command_checks_and_rewrites(pages: Path) -> None:
    current = _cli("--check", "--specs", str(pages))
    assert current.returncode == 0, current.stderr
    assert "spec pages current: delivery.md, lifecycle.md, adapter-protocol.schema.json" in current.stdout
    _edit(pages / "lifecycle.md", "| AdvanceClock | Ok |", "| AdvanceClock | Ok, Rewound |")
    stale = _cli("--check", "--specs", str(pages))
    assert stale.returncode == 1
    assert "-| AdvanceClock | Ok, Rewound |" in stale.stdout and "run `leaseproof spec`" in stale.stderr
    rewrite = _cli("--specs", str(pages))
    assert rewrite.returncode == 0 and "rewrote" in rewrite.stdout and "lifecycle.md" in rewrite.stdout
    assert _cli("--check", "--specs", str(pages)).returncode == 0
    missing = _cli("--check", "--specs", str(pages / "nowhere"))
    assert missing.returncode == 2 and "no such spec page" in missing.stderr
