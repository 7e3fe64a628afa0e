"""The lifecycle spec page cannot drift from the lifecycle model.

`specs/lifecycle.md` restates `model/lifecycle.py`. These tests parse what
the page states and compare it with the model:

- every command class has its own heading (the tables generated from the
  model are proved current by `tests/conformance/spec/test_specs.py`);
- the stated TTL equals `CACHE_TTL`, and the stated reload rule
  (`now - loaded_at >= CACHE_TTL`) is what the model does at the boundary;
- the stated hash recipe (canonical JSON template and digest), applied to
  `Definition(("a",), None)`, gives the model's hash, and every test vector
  on the page hashes, under the page's digest and under the model, to the
  digest the page states.

Each check is a pure function returning a description of the difference
(empty when there is none). The last tests drift the page, or the model
side, and prove that each check notices.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import pytest
from helpers import SPECS, SpecFormatError, headings, parse_table, replace_once

from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as m

SPEC = SPECS / "lifecycle.md"
VECTOR_HEADER = "| actions | enabled | canonical JSON | SHA-256 |"
TTL_PATTERN = re.compile(r"`CACHE_TTL` = (\d+(?:\.\d+)?) s\b")
RELOAD_PATTERN = re.compile(r"`now - loaded_at (>=|>|<=|<|==) CACHE_TTL`")
TEMPLATE_PATTERN = re.compile(r"\*\*Canonical JSON:\*\* `([^`]+)`")
DIGEST_PATTERN = re.compile(r"\*\*Digest:\*\* `([^`]+)`")
ACTIONS_PLACEHOLDER = "[...]"
ENABLED_PLACEHOLDER = "true|false|null"

ModelHash = Callable[[m.Definition], bytes]
Step = Callable[[m.LifecycleSystem, Any], tuple[m.LifecycleSystem, Any]]


def _model_hash(definition: m.Definition) -> bytes:
    return definition.hash


def spec_text() -> str:
    assert SPEC.is_file(), f"the spec is missing: {SPEC}"
    return SPEC.read_text(encoding="utf-8")


# -- parsing ------------------------------------------------------------------


def _one(pattern: re.Pattern[str], text: str, what: str) -> str:
    """The single value `pattern` captures in `text`; every statement of it must agree."""
    found = pattern.findall(text)
    if not found:
        raise SpecFormatError(f"{SPEC.name} does not state {what} (looked for {pattern.pattern!r})")
    if len(set(found)) != 1:
        raise SpecFormatError(f"{SPEC.name} states {what} inconsistently: {sorted(set(found))}")
    value: str = found[0]
    return value


def _difference(what: str, spec: list[str], model: list[str]) -> str:
    if spec == model:
        return ""
    diff = "\n".join(difflib.unified_diff(spec, model, "spec", "model", lineterm="", n=len(spec) + len(model)))
    return f"{what} in {SPEC.name} differs from the model (- spec, + model):\n{diff}"


def missing_headings(text: str, variants: Mapping[type, tuple[str, ...]] = m.OUTCOME_VARIANTS) -> str:
    present = set(headings(text))
    missing = [command.__name__ for command in variants if command.__name__ not in present]
    if not missing:
        return ""
    return f"{SPEC.name} has no heading for these operations: {', '.join(missing)}"


def ttl_difference(text: str, ttl: dt.timedelta = m.CACHE_TTL) -> str:
    stated = float(_one(TTL_PATTERN, text, "the TTL"))
    if stated == ttl.total_seconds():
        return ""
    return f"{SPEC.name} states `CACHE_TTL` = {stated:g} s; the model's CACHE_TTL is {ttl.total_seconds():g} s"


def model_reload_operator(step: Step = m.step, ttl: dt.timedelta = m.CACHE_TTL) -> str:
    """Which comparison of `now - loaded_at` with the TTL makes the model reload.

    A replica's empty cache is loaded at t0; a definition is saved after it.
    A trigger admits a run only if the replica reloaded first. Probing just
    before, at and just after t0 + ttl tells `>=` from `>`; anything else is
    reported as such.
    """
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    community, workflow, channel, author = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3), b"\x01" * 32
    s = m.initial_state(t0)
    event = m.DefinitionEvent(b"\x02" * 32, community, workflow, author, channel, t0, m.Definition(("act",)))
    for command in (
        d.CreateCommunity(community),
        m.SetAuthority(community, channel, author, True),
        m.SaveDefinition(event),
    ):
        s, outcome = step(s, command)
        assert not isinstance(outcome, d.Rejection), f"probe setup was refused: {outcome!r}"

    def reloads_after(elapsed: dt.timedelta) -> bool:
        later, _ = step(s, d.AdvanceClock(elapsed))
        _, outcome = step(later, m.Fire("r1", "event", community, workflow))
        return isinstance(outcome, m.Admitted)

    tick = dt.timedelta(microseconds=1)
    before, at, after = reloads_after(ttl - tick), reloads_after(ttl), reloads_after(ttl + tick)
    if before or not after:
        return f"neither >= nor > (reloads just before the TTL: {before}, just after it: {after})"
    return ">=" if at else ">"


def _rule(operator: str) -> str:
    return (
        f"`now - loaded_at {operator} CACHE_TTL`"
        if RELOAD_PATTERN.fullmatch(f"`now - loaded_at {operator} CACHE_TTL`")
        else operator
    )


def reload_rule_difference(text: str, step: Step = m.step, ttl: dt.timedelta = m.CACHE_TTL) -> str:
    stated = _one(RELOAD_PATTERN, text, "the reload rule")
    observed = model_reload_operator(step, ttl)
    if stated == observed:
        return ""
    return f"{SPEC.name} says a replica reloads when {_rule(stated)}; the model reloads when {_rule(observed)}"


def _digest(name: str) -> Callable[[bytes], bytes]:
    algorithm = name.lower().replace("-", "")
    if algorithm not in hashlib.algorithms_available:
        raise SpecFormatError(f"{SPEC.name} names an unknown digest {name!r}")
    return lambda data: hashlib.new(algorithm, data).digest()


def canonical_from_recipe(text: str, actions_json: str, enabled_json: str) -> str:
    """The page's canonical JSON template with its two placeholders filled in."""
    template = _one(TEMPLATE_PATTERN, text, "the canonical JSON template")
    for placeholder in (ACTIONS_PLACEHOLDER, ENABLED_PLACEHOLDER):
        if template.count(placeholder) != 1:
            raise SpecFormatError(f"the canonical JSON template {template!r} must contain {placeholder!r} exactly once")
    return template.replace(ACTIONS_PLACEHOLDER, actions_json).replace(ENABLED_PLACEHOLDER, enabled_json)


def hash_recipe_difference(text: str, model_hash: ModelHash = _model_hash) -> str:
    """The page's recipe, applied to Definition(("a",), None), against the model's hash."""
    digest = _digest(_one(DIGEST_PATTERN, text, "the hash digest"))
    canonical = canonical_from_recipe(text, '["a"]', "null")
    by_recipe = digest(canonical.encode("utf-8"))
    by_model = model_hash(m.Definition(("a",), None))
    if by_recipe == by_model:
        return ""
    return (
        f"the hash recipe in {SPEC.name} gives {by_recipe.hex()} for Definition(('a',), None) "
        f"(canonical JSON {canonical!r}); the model's hash is {by_model.hex()}"
    )


_ENABLED_CELLS = {"omitted": None, "true": True, "false": False}


def hash_vectors_difference(text: str, model_hash: ModelHash = _model_hash) -> str:
    """Each test vector: its canonical JSON under the page's digest, and the model, give its stated digest."""
    digest = _digest(_one(DIGEST_PATTERN, text, "the hash digest"))
    rows = parse_table(text, VECTOR_HEADER)
    if not rows:
        raise SpecFormatError(f"the table headed {VECTOR_HEADER!r} has no vectors")
    problems = []
    for actions_cell, enabled_cell, canonical, stated in rows:
        if enabled_cell not in _ENABLED_CELLS:
            raise SpecFormatError(f"enabled must be one of {sorted(_ENABLED_CELLS)}, not {enabled_cell!r}")
        actions = json.loads(actions_cell)
        definition = m.Definition(tuple(actions), _ENABLED_CELLS[enabled_cell])
        by_model = model_hash(definition).hex()
        by_canonical = digest(canonical.encode("utf-8")).hex()
        if not stated == by_model == by_canonical:
            problems.append(
                f"{actions_cell} / {enabled_cell}: the page states {stated}; "
                f"its canonical JSON {canonical!r} hashes to {by_canonical}; the model's hash is {by_model}"
            )
    if not problems:
        return ""
    return f"hash test vectors in {SPEC.name} disagree:\n" + "\n".join(problems)


def _report(check: Callable[[str], str], text: str) -> str:
    """A check's report, counting a page it cannot parse as a difference."""
    try:
        return check(text)
    except SpecFormatError as error:
        return str(error)


# -- the spec agrees with the model -----------------------------------------


def test_every_command_class_has_a_heading() -> None:
    missing = missing_headings(spec_text())
    assert not missing, missing


def test_stated_ttl_is_the_models() -> None:
    difference = ttl_difference(spec_text())
    assert not difference, difference


def test_stated_reload_rule_is_the_models() -> None:
    difference = reload_rule_difference(spec_text())
    assert not difference, difference


def test_stated_hash_recipe_gives_the_models_hash() -> None:
    difference = hash_recipe_difference(spec_text())
    assert not difference, difference


def test_hash_test_vectors_match_the_model() -> None:
    difference = hash_vectors_difference(spec_text())
    assert not difference, difference


# -- each check fails on a drifted spec, or a drifted model ------------------


def _swap_lines(text: str, first: str, second: str) -> str:
    lines = text.splitlines()
    a, b = lines.index(first), lines.index(second)
    lines[a], lines[b] = lines[b], lines[a]
    return "\n".join(lines)


def _spaced_hash(definition: m.Definition) -> bytes:
    content = {"actions": list(definition.actions), "enabled": definition.enabled}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).digest()


def _late_fire(s: m.LifecycleSystem, command: Any) -> tuple[m.LifecycleSystem, Any]:
    """A model that sees a trigger one microsecond early: it reloads only after the TTL."""
    if isinstance(command, m.Fire):
        s = attrs.evolve(s, now=s.now - dt.timedelta(microseconds=1))
    return m.step(s, command)


_TEMPLATE = '**Canonical JSON:** `{"actions":[...],"enabled":true|false|null}`'
_VECTOR_DIGEST = "9d7e93691e170d810f3e86c660819dbb1bc31dd35f5fea5f786db79ed7890249"
_VECTOR_CANONICAL = '`{"actions":["notify","archive"],"enabled":false}`'


SPEC_DRIFTS: dict[str, tuple[Callable[[str], str], Callable[[str], str]]] = {
    "operation heading removed": (
        missing_headings,
        lambda t: replace_once(t, "#### ResumeRun\n", ""),
    ),
    "operation heading only inside a code block": (
        missing_headings,
        lambda t: replace_once(t, "#### AlternateDelete\n", "```\n#### AlternateDelete\n```\n"),
    ),
    "TTL changed": (
        ttl_difference,
        lambda t: replace_once(t, "`CACHE_TTL` = 10 s", "`CACHE_TTL` = 5 s"),
    ),
    "TTL stated twice, inconsistently": (
        ttl_difference,
        lambda t: t + "\nAlso `CACHE_TTL` = 30 s.\n",
    ),
    "TTL not stated": (
        ttl_difference,
        lambda t: replace_once(t, "`CACHE_TTL` = 10 s", "a TTL"),
    ),
    "reload rule made strict": (
        reload_rule_difference,
        lambda t: replace_once(t, "`now - loaded_at >= CACHE_TTL`", "`now - loaded_at > CACHE_TTL`"),
    ),
    "reload rule not stated": (
        reload_rule_difference,
        lambda t: replace_once(t, "`now - loaded_at >= CACHE_TTL`", "the cache is old"),
    ),
    "digest changed": (
        hash_recipe_difference,
        lambda t: replace_once(t, "**Digest:** `SHA-256`", "**Digest:** `SHA-512`"),
    ),
    "digest unknown": (
        hash_recipe_difference,
        lambda t: replace_once(t, "**Digest:** `SHA-256`", "**Digest:** `SHA-257`"),
    ),
    "canonical JSON with spaces": (
        hash_recipe_difference,
        lambda t: replace_once(t, _TEMPLATE, '**Canonical JSON:** `{"actions": [...], "enabled": true|false|null}`'),
    ),
    "canonical JSON keys unsorted": (
        hash_recipe_difference,
        lambda t: replace_once(t, _TEMPLATE, '**Canonical JSON:** `{"enabled":true|false|null,"actions":[...]}`'),
    ),
    "canonical JSON without the enabled key": (
        hash_recipe_difference,
        lambda t: replace_once(t, _TEMPLATE, '**Canonical JSON:** `{"actions":[...]}`'),
    ),
    "vector digest changed": (
        hash_vectors_difference,
        lambda t: replace_once(t, _VECTOR_DIGEST, _VECTOR_DIGEST[:-1] + "0"),
    ),
    "vector canonical JSON changed": (
        hash_vectors_difference,
        lambda t: replace_once(t, _VECTOR_CANONICAL, _VECTOR_CANONICAL.replace("false", "true")),
    ),
    "vector table removed": (
        hash_vectors_difference,
        lambda t: replace_once(t, VECTOR_HEADER, "| vectors |"),
    ),
}


@pytest.mark.parametrize("name", list(SPEC_DRIFTS))
def test_each_check_detects_a_drifted_spec(name: str) -> None:
    check, drift = SPEC_DRIFTS[name]
    text = spec_text()
    assert not check(text), f"the unaltered spec must pass {check.__name__} before drifting it"
    assert _report(check, drift(text)), f"{check.__name__} did not notice the drift {name!r}"


MODEL_DRIFTS: dict[str, Callable[[str], str]] = {
    "command without a heading": lambda t: missing_headings(t, {**m.OUTCOME_VARIANTS, d.GetDelivery: ("Found",)}),
    "model TTL changed": lambda t: ttl_difference(t, dt.timedelta(seconds=11)),
    "model reloads only after the TTL": lambda t: reload_rule_difference(t, step=_late_fire),
    "model reloads at another TTL than the probed one": lambda t: reload_rule_difference(t, ttl=m.CACHE_TTL * 2),
    "model hash with spaces (recipe)": lambda t: hash_recipe_difference(t, _spaced_hash),
    "model hash with spaces (vectors)": lambda t: hash_vectors_difference(t, _spaced_hash),
}


@pytest.mark.parametrize("name", list(MODEL_DRIFTS))
def test_each_check_detects_a_drifted_model(name: str) -> None:
    report = MODEL_DRIFTS[name](spec_text())
    assert report, f"the check did not notice the drift {name!r}"
