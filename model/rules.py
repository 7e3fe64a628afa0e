"""Rules: the guarded cases of an operation, declared as data.

Each operation of a machine is a short, ordered list of rules. A rule names
its guard (the condition that selects it, given that no earlier rule of the
operation applied), the outcome variants it may answer, what it changes in
words, and the state fields it may change. The step functions say which
rule decided each step, and `decide` refuses any answer a rule does not
declare, so the table is the machine, not a description of it: the
generated spec prints it, the explorer proves every rule reachable and
every declared effect honest, and the conformance runs count which rules
they exercised against an implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import attrs

State = TypeVar("State")


@attrs.frozen
class Rule:
    """One guarded case of one operation."""

    guard: str  # a short name, unique within its operation
    when: str  # the condition, in words
    outcomes: tuple[str, ...]  # the outcome variants it may answer
    effect: str = "nothing changes"
    changes: tuple[str, ...] = ()  # the state fields it may change; none for a refusal or a read


@attrs.frozen
class Resend:
    """What sending a command again answers, right after it took effect (its answer
    was lost with the connection: `ConnectionLost(applied=None)`).

    A *safe* command's resend changes nothing more, whatever the first did, so a
    client may send it again when it does not know whether the first took effect;
    after a first answer in `took_effect`, the resend answers one of `tells` (or, if
    `tells` is empty, the same variant), which says so. An unsafe command's resend
    may act again."""

    safe: bool
    took_effect: tuple[str, ...]
    tells: tuple[str, ...]
    why: str
    safe_with: str = ""  # a field of the command that, when set (not None), makes an unsafe command safe

    def safe_for(self, command: Any) -> bool:
        """Whether this command, as sent, may be sent again."""
        return self.safe or bool(self.safe_with and getattr(command, self.safe_with) is not None)


@attrs.frozen
class Decision(Generic[State]):
    """One step, and the rule that decided it."""

    state: State
    outcome: Any
    rule: Rule


class RuleError(AssertionError):
    """The model answered outside its own rule table: a bug in the model."""


def behaviours(rules: Mapping[type, tuple[Rule, ...]]) -> list[tuple[str, str, str]]:
    """Every (operation, guard, outcome variant) the rules declare, in table order."""
    return [(op.__name__, r.guard, v) for op, listed in rules.items() for r in listed for v in r.outcomes]


def rule_table(rules: Mapping[type, tuple[Rule, ...]]) -> dict[type, dict[str, Rule]]:
    """The rules of each operation by guard, refusing a guard declared twice."""
    table: dict[type, dict[str, Rule]] = {}
    for operation, listed in rules.items():
        by_guard = {r.guard: r for r in listed}
        if len(by_guard) != len(listed):
            raise RuleError(f"{operation.__name__}: a guard is declared twice")
        table[operation] = by_guard
    return table


def decider(
    rules: Mapping[type, tuple[Rule, ...]],
    handlers: Mapping[type, Callable[[State, Any], tuple[State, Any, str]]],
    variant: Callable[[Any], str],
    variants: Mapping[type, tuple[str, ...]],
    machine: str,
) -> Callable[[State, Any], Decision[State]]:
    """`decide(state, command)` for one machine: run the command's handler and
    check its answer against the rule it names. The rules, the handlers and the
    catalogue of outcome variants must cover the same operations, and each
    operation's rules exactly its variants."""
    table = rule_table(rules)
    if not table.keys() == handlers.keys() == variants.keys():
        raise RuleError(f"{machine}: rules, handlers and outcome variants cover different operations")
    for operation, listed in rules.items():
        if {v for r in listed for v in r.outcomes} != set(variants[operation]):
            raise RuleError(f"{machine}: the rules of {operation.__name__} do not answer exactly its outcome variants")

    def decide(state: State, command: Any) -> Decision[State]:
        handler = handlers.get(type(command))
        if handler is None:
            raise TypeError(f"not a {machine} command: {command!r}")
        after, outcome, guard = handler(state, command)
        rule = table[type(command)].get(guard)
        if rule is None:
            raise RuleError(f"{type(command).__name__} answered by the undeclared guard {guard!r}")
        if variant(outcome) not in rule.outcomes:
            raise RuleError(f"{type(command).__name__}/{guard} answered {variant(outcome)}, not {rule.outcomes}")
        if not rule.changes and after is not state:
            raise RuleError(f"{type(command).__name__}/{guard} declares no change but changed the state")
        return Decision(after, outcome, rule)

    return decide


def changed_fields(before: Any, after: Any) -> tuple[str, ...]:
    """The names of the attrs fields whose values differ between two states."""
    return tuple(f.name for f in attrs.fields(type(before)) if getattr(before, f.name) != getattr(after, f.name))


@attrs.frozen
class Invariant:
    """One named property: of every reachable state, or of every step."""

    name: str
    statement: str  # what must hold, in words (the checking function's docstring)
    check: Callable[..., Any]  # yields a readable sentence per violation


class Invariants:
    """A machine's invariants, registered one function each, in reading order."""

    def __init__(self) -> None:
        self.of_states: list[Invariant] = []
        self.of_steps: list[Invariant] = []

    @staticmethod
    def _invariant(check: Callable[..., Any]) -> Invariant:
        statement = " ".join((check.__doc__ or "").split())
        if not statement:
            raise RuleError(f"the invariant {check.__name__} states nothing: give it a docstring")
        return Invariant(check.__name__.replace("_", "-"), statement, check)

    def state(self, check: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """Register an invariant of every reachable state: `check(state)`."""
        self.of_states.append(self._invariant(check))
        return check

    def step(self, check: Callable[[Any, Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
        """Register an invariant of every step: `check(before, after, outcome)`."""
        self.of_steps.append(self._invariant(check))
        return check

    def state_violations(self, state: Any) -> list[str]:
        return [message for invariant in self.of_states for message in invariant.check(state)]

    def step_violations(self, before: Any, after: Any, outcome: Any) -> list[str]:
        return [message for invariant in self.of_steps for message in invariant.check(before, after, outcome)]
