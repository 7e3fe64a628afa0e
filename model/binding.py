"""The delivery binding: the immutable identity a delivery carries.

Every value here validates itself at construction, so an invalid binding,
cause or id cannot exist. A violation raises `InvalidValue`, which names the
field, the offending value and the rule it breaks.
"""

from __future__ import annotations

import datetime as dt
import uuid
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


def require_instant(field: str, value: Any) -> None:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise InvalidValue(field, value, "must be a timezone-aware datetime")


def to_utc(value: Any) -> Any:
    """Normalise aware datetimes to UTC so equal instants have one spelling."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    return value


def _check(rule: Any) -> Any:
    def validator(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        rule(attribute.name, value)

    return validator


def uuid_field() -> Any:
    return attrs.field(validator=_check(require_uuid))


def key_field() -> Any:
    return attrs.field(validator=_check(require_key), repr=lambda b: f"{b.hex()[:8]}…")


def instant_field() -> Any:
    return attrs.field(converter=to_utc, validator=_check(require_instant))


# -- cause: exactly one of three kinds -------------------------------------


@attrs.frozen
class EventCause:
    """The delivery was caused by a relay event."""

    event_id: bytes = key_field()
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

    invocation_id: uuid.UUID = uuid_field()
    kind = "webhook"


Cause: TypeAlias = EventCause | ScheduleCause | WebhookCause
CAUSE_TYPES = (EventCause, ScheduleCause, WebhookCause)


def _require_cause(field: str, value: Any) -> None:
    if not isinstance(value, CAUSE_TYPES):
        raise InvalidValue(field, value, "must be exactly one of event, schedule or webhook cause")


@attrs.frozen
class Binding:
    """Who a delivery is for and why: immutable once committed."""

    community_id: uuid.UUID = uuid_field()
    workflow_id: uuid.UUID = uuid_field()
    run_id: uuid.UUID = uuid_field()
    step_id: str = attrs.field(validator=_check(require_step_id))
    target_pubkey: bytes = key_field()
    definition_event_id: bytes = key_field()
    message_event_id: bytes = key_field()
    cause: Cause = attrs.field(validator=_check(_require_cause))
