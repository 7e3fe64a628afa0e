"""The two ways an operation can fail.

`InvalidValue` is bad input: a value that breaks a rule on its own, whatever
the state. It is raised while constructing the value, so nothing is ever
attempted with it.

`Refused` carries a `Rejection` (defined with the outcomes): a well-formed
request that the current state refuses. Implementations raise it; the model
returns the rejection itself as the step's outcome.
"""

from __future__ import annotations

from typing import Any


class InvalidValue(ValueError):
    """A value breaks a rule: names the field, the value and the rule."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}={value!r}: {rule}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InvalidValue):
            return NotImplemented
        return (self.field, self.rule) == (other.field, other.rule)

    def __hash__(self) -> int:
        return hash((self.field, self.rule))


class Refused(Exception):
    """The state refuses a well-formed request; `.rejection` says how."""

    def __init__(self, rejection: Any) -> None:
        self.rejection = rejection
        super().__init__(repr(rejection))
