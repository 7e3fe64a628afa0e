"""The spec page cannot drift from the model.

`specs/delivery.md` carries two tables that restate the model: the outcome
variants of every operation (`OUTCOME_VARIANTS`) and the row transitions
(`TRANSITIONS`). These tests parse them and compare them, exactly and in
order, with the model, and check that every command class has its own
heading. Each check is a pure function returning a description of the
difference (empty when there is none); the last tests feed it a deliberately
drifted copy of the page to prove each check can fail.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from spec_tables import SpecFormatError, headings, parse_table, split_list

from leaseproof.model.delivery import OUTCOME_VARIANTS, TRANSITIONS, Status

SPEC = Path(__file__).parent.parent / "specs" / "delivery.md"
OUTCOME_HEADER = "| operation | outcome variants |"
TRANSITION_HEADER = "| from | to | by |"
ABSENT = "absent"
COMMAND_NAMES = [command.__name__ for command in OUTCOME_VARIANTS]


def spec_text() -> str:
    assert SPEC.is_file(), f"the spec is missing: {SPEC}"
    return SPEC.read_text(encoding="utf-8")


def _difference(what: str, spec: list[str], model: list[str]) -> str:
    if spec == model:
        return ""
    diff = "\n".join(difflib.unified_diff(spec, model, "spec", "model", lineterm="", n=len(spec) + len(model)))
    return f"{what} in {SPEC.name} differs from the model (- spec, + model):\n{diff}"


def outcome_table_difference(text: str) -> str:
    """How the `| operation | outcome variants |` table differs from OUTCOME_VARIANTS."""
    spec = [f"{name} | {', '.join(split_list(variants))}" for name, variants in parse_table(text, OUTCOME_HEADER)]
    model = [f"{command.__name__} | {', '.join(variants)}" for command, variants in OUTCOME_VARIANTS.items()]
    return _difference("the outcome table", spec, model)


def _state(status: Status | None) -> str:
    return ABSENT if status is None else status.value


def transition_table_difference(text: str) -> str:
    """How the `| from | to | by |` table's (from, to) pairs differ from TRANSITIONS."""
    spec = [f"{source} -> {target}" for source, target, _ in parse_table(text, TRANSITION_HEADER)]
    model = [f"{_state(source)} -> {_state(target)}" for source, target in TRANSITIONS]
    return _difference("the transition table", spec, model)


def transition_causes_problems(text: str) -> str:
    """Rows of the transition table whose `by` column does not name command classes."""
    problems = []
    for source, target, by in parse_table(text, TRANSITION_HEADER):
        names = split_list(by)
        unknown = [name for name in names if name not in COMMAND_NAMES]
        if not names or unknown:
            problems.append(f"{source} -> {target}: 'by' is {by!r}; not command classes: {unknown or '(empty)'}")
    if not problems:
        return ""
    return "the transition table's 'by' column must name operations of the model:\n" + "\n".join(problems)


def missing_headings(text: str) -> str:
    present = set(headings(text))
    missing = [name for name in COMMAND_NAMES if name not in present]
    if not missing:
        return ""
    return f"{SPEC.name} has no heading for these operations: {', '.join(missing)}"


# -- the spec agrees with the model -----------------------------------------


def test_outcome_table_matches_outcome_variants() -> None:
    difference = outcome_table_difference(spec_text())
    assert not difference, difference


def test_transition_table_matches_transitions() -> None:
    difference = transition_table_difference(spec_text())
    assert not difference, difference


def test_transition_table_names_real_operations() -> None:
    problems = transition_causes_problems(spec_text())
    assert not problems, problems


def test_every_command_class_has_a_heading() -> None:
    missing = missing_headings(spec_text())
    assert not missing, missing


# -- each check fails on a drifted spec --------------------------------------


def _drift(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"drift fragment must occur exactly once in the spec: {old!r}"
    return text.replace(old, new)


def _swap_lines(text: str, first: str, second: str) -> str:
    lines = text.splitlines()
    a, b = lines.index(first), lines.index(second)
    lines[a], lines[b] = lines[b], lines[a]
    return "\n".join(lines)


DRIFTS = {
    "variant dropped": (
        outcome_table_difference,
        lambda t: _drift(t, "| Renew | Renewed, LeaseLost, UnknownCommunity", "| Renew | Renewed, UnknownCommunity"),
    ),
    "variants reordered": (
        outcome_table_difference,
        lambda t: _drift(t, "| Claim | Claimed, ClaimMiss,", "| Claim | ClaimMiss, Claimed,"),
    ),
    "operation rows reordered": (
        outcome_table_difference,
        lambda t: _swap_lines(t, "| Reap | Reaped |", "| AdvanceClock | Ok |"),
    ),
    "operation row missing": (
        outcome_table_difference,
        lambda t: _drift(t, "| GetDelivery | Found, NotFound |\n", ""),
    ),
    "outcome table header changed": (
        outcome_table_difference,
        lambda t: _drift(t, OUTCOME_HEADER, "| operation | outcomes |"),
    ),
    "transition endpoint changed": (
        transition_table_difference,
        lambda t: _drift(t, "| claimed | pending | Reap |", "| claimed | absent | Reap |"),
    ),
    "transition rows reordered": (
        transition_table_difference,
        lambda t: _swap_lines(t, "| claimed | finished | Finish |", "| claimed | failed | Finish |"),
    ),
    "transition 'by' names no operation": (
        transition_causes_problems,
        lambda t: _drift(t, "| claimed | claimed | Renew |", "| claimed | claimed | renewal |"),
    ),
    "operation heading removed": (
        missing_headings,
        lambda t: _drift(t, "#### Reap\n", ""),
    ),
}


@pytest.mark.parametrize("name", list(DRIFTS))
def test_each_check_detects_drift(name: str) -> None:
    check, drift = DRIFTS[name]
    text = spec_text()
    assert not check(text), f"the unaltered spec must pass {check.__name__} before drifting it"
    try:
        report = check(drift(text))
    except SpecFormatError as error:
        report = str(error)
    assert report, f"{check.__name__} did not notice the drift {name!r}"
