"""The delivery binding: the immutable identity a delivery carries.

Every value here validates itself at construction, so an invalid binding,
cause or id cannot exist. A violation raises `InvalidValue`, which names the
field, the offending value and the rule it breaks.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

import attrs

from leaseproof.model.errors import InvalidValue

STEP_ID_MAX_CHARS = 64
# What "non-empty after trimming" trims: the ASCII whitespace PostgreSQL's
# btrim() is told to strip as well, so model and schema agree on every input.
STEP_ID_TRIMMED = " \t\n\r\f\v"
KEY_BYTES = 32


def require_uuid(field: str, value: Any) -> None:
    if not isinstance(value, uuid.UUID):
        raise InvalidValue(field, value, "must be a UUID")


def require_key(field: str, value: Any) -> None:
    if not isinstance(value, bytes) or len(value) != KEY_BYTES:
        raise InvalidValue(field, value, f"must be exactly {KEY_BYTES} bytes")


def require_step_id(field: str, value: Any) -> None:
    if not isinstance(value, str):
        raise InvalidValue(field, value, "must be a string")
    if not value.strip(STEP_ID_TRIMMED):
        raise InvalidValue(field, value, "must be non-empty after trimming whitespace")
    if len(value) > STEP_ID_MAX_CHARS:
        raise InvalidValue(field, value, f"must be at most {STEP_ID_MAX_CHARS} characters")
    if "\x00" in value:
        raise InvalidValue(field, value, "must not contain NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidValue(field, value, "must be valid Unicode text") from None


# The latest instant the machines know. Later ones do not fit every
# implementation's types (Python's datetime ends within the year 9999), and a
# day's lease or a clock move from here must still be an instant.
LATEST_INSTANT = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)


def require_instant(field: str, value: Any) -> None:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise InvalidValue(field, value, "must be a timezone-aware datetime")
    if value > LATEST_INSTANT:
        raise InvalidValue(field, value, "must be no later than 9999-01-01T00:00:00Z")


def to_utc(value: Any) -> Any:
    """Normalise aware datetimes to UTC so equal instants have one spelling."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    return value


Validator: TypeAlias = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def _check(rule: Callable[[str, Any], None]) -> Validator:
    def validator(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        rule(attribute.name, value)

    return validator


# The three kinds of field every record uses, spelled out in each record as
# `attrs.field(validator=is_uuid)`, `attrs.field(validator=is_key, repr=short_key)`
# and `attrs.field(converter=to_utc, validator=is_instant)`: mypy's attrs plugin
# recognises only a literal `attrs.field` call, and reads a helper returning one
# as a default value (every such field would look optional, the classes ill-ordered).
is_uuid = _check(require_uuid)
is_key = _check(require_key)
is_instant = _check(require_instant)


def short_key(value: bytes) -> str:
    """How a key appears in a record's repr: its first four bytes, in hex."""
    return f"{value.hex()[:8]}…"


# -- cause: exactly one of three kinds -------------------------------------


@attrs.frozen
class EventCause:
    """The delivery was caused by a relay event."""

    event_id: bytes = attrs.field(validator=is_key, repr=short_key)
    kind = "event"


def _require_whole_second(field: str, value: Any) -> None:
    require_instant(field, value)
    if value.microsecond:
        raise InvalidValue(field, value, "must be a whole-second instant")


@attrs.frozen
class ScheduleCause:
    """The delivery was caused by a schedule firing at a whole second."""

    scheduled_for: dt.datetime = attrs.field(converter=to_utc, validator=_check(_require_whole_second))
    kind = "schedule"


@attrs.frozen
class WebhookCause:
    """The delivery was caused by one webhook invocation."""

    invocation_id: uuid.UUID = attrs.field(validator=is_uuid)
    kind = "webhook"


Cause: TypeAlias = EventCause | ScheduleCause | WebhookCause
CAUSE_TYPES = (EventCause, ScheduleCause, WebhookCause)


def _require_cause(field: str, value: Any) -> None:
    if not isinstance(value, CAUSE_TYPES):
        raise InvalidValue(field, value, "must be exactly one of event, schedule or webhook cause")


@attrs.frozen
class Binding:
    """Who a delivery is for and why: immutable once committed."""

    community_id: uuid.UUID = attrs.field(validator=is_uuid)
    workflow_id: uuid.UUID = attrs.field(validator=is_uuid)
    run_id: uuid.UUID = attrs.field(validator=is_uuid)
    step_id: str = attrs.field(validator=_check(require_step_id))
    target_pubkey: bytes = attrs.field(validator=is_key, repr=short_key)
    definition_event_id: bytes = attrs.field(validator=is_key, repr=short_key)
    message_event_id: bytes = attrs.field(validator=is_key, repr=short_key)
    cause: Cause = attrs.field(validator=_check(_require_cause))
