"""A small, named universe for the delivery conformance machine.

Generated programs speak in short names ("A", "R1", "T2", "d3") so a
counterexample reads like a scenario; this module maps each name to the
concrete value the model and the implementation see. Two communities share
the same run, workflow, event and delivery names, so the same delivery id
exists in both as independent rows.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import uuid
from collections.abc import Collection

import attrs

from leaseproof.model.binding import Binding, Cause, EventCause, ScheduleCause, WebhookCause

_NS = uuid.UUID("6c656173-6570-4f6f-8000-000000000000")  # "leaseproof"-ish

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _uuid(name: str) -> uuid.UUID:
    return uuid.uuid5(_NS, name)


def _key(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


# Created by the machine's set-up in both A and B; "Z" exists only if a
# generated program creates it.
COMMUNITIES = {name: _uuid(f"community {name}") for name in ("A", "B", "Z")}
LIVE_COMMUNITIES = ("A", "B")
REQUEST_KEY = "claim-1"  # a claim's request key: the same one sent again is a retry
TARGETS = {name: _key(f"target {name}") for name in ("T1", "T2")}
WORKFLOWS = {name: _uuid(f"workflow {name}") for name in ("W1", "W2")}
# A workflow no community has: a commit's target may name it (never committed: a mismatch).
FOREIGN_WORKFLOW = _uuid("workflow W9")
# Each run belongs to one workflow; R4 starts absent.
RUN_WORKFLOW = {"R1": "W1", "R2": "W1", "R3": "W2", "R4": "W2"}
RUNS = {name: _uuid(f"run {name}") for name in RUN_WORKFLOW}
INITIAL_RUNS = ("R1", "R2", "R3")
# Message events; M3 starts unpublished.
MESSAGES = {name: _key(f"message {name}") for name in ("M1", "M2", "M3")}
INITIAL_MESSAGES = ("M1", "M2")
DEFINITIONS = {name: _key(f"definition {name}") for name in ("D1", "D2")}
STEPS = {
    "s1": "s1",
    "s2": "s2",
    "long": "x" * 64,
    "padded": "  s1  ",
    "tabbed": "\ts1\n",
    "nbsp": "\u00a0",  # a no-break space: not whitespace that the step id's trimming removes
    "wide": "é" * 64,  # 64 characters, 128 bytes in UTF-8
    "astral": "\U0001f642" * 64,  # 64 characters, 256 bytes, 128 UTF-16 units
}
# Producers normally derive a fresh id per (run, step, target): the same
# id in both communities. Named ids are reused on purpose, to collide.
DELIVERIES = {name: _uuid(f"delivery {name}") for name in ("d1", "d2")}
FRESH = "fresh"


def delivery_id(name: str, run: str, step: str, target: str) -> uuid.UUID:
    if name != FRESH:
        return DELIVERIES[name]
    return _uuid(f"delivery {run}/{step}/{target}")


def delivery_named(name: str) -> uuid.UUID:
    """`d1`, or a fresh id by its identity, `R1/s1/T2`."""
    if name in DELIVERIES:
        return DELIVERIES[name]
    run, step, target = name.split("/")
    return delivery_id(FRESH, run, step, target)


_FRESH_NAMES: dict[object, str] = {
    delivery_id(FRESH, run, step, target): f"{run}/{step}/{target}"
    for run in RUN_WORKFLOW
    for step in STEPS
    for target in TARGETS
}
CAUSES: dict[str, Cause] = {
    "event:E1": EventCause(_key("cause E1")),
    "event:E2": EventCause(_key("cause E2")),
    "schedule:S1": ScheduleCause(START.replace(hour=6)),
    "schedule:S2": ScheduleCause(START.replace(hour=6, second=1)),
    "webhook:H1": WebhookCause(_uuid("invocation H1")),
    "webhook:H2": WebhookCause(_uuid("invocation H2")),
}


# The lifecycle machine's world: the same communities and workflow ids.
AUTHORS = {name: _key(f"author {name}") for name in ("alice", "bob")}
CHANNELS = {name: _uuid(f"channel {name}") for name in ("general", "ops")}
REPLICAS = ("r1", "r2")


def other(name: str, names: Collection[str]) -> str:
    """The next name of the same kind: a foreign but well-formed value."""
    ordered = sorted(names)
    return ordered[(ordered.index(name) + 1) % len(ordered)]


def binding(
    community: str,
    workflow: str,
    run: str,
    step: str,
    target: str,
    definition: str,
    message: str,
    cause: str,
) -> Binding:
    return Binding(
        community_id=COMMUNITIES[community],
        workflow_id=WORKFLOWS[workflow],
        run_id=RUNS[run],
        step_id=STEPS[step],
        target_pubkey=TARGETS[target],
        definition_event_id=DEFINITIONS[definition],
        message_event_id=MESSAGES[message],
        cause=CAUSES[cause],
    )


def name_of(value: object) -> str:
    """The world name of a concrete value, for readable reports."""
    for table in (COMMUNITIES, TARGETS, WORKFLOWS, RUNS, MESSAGES, DEFINITIONS, DELIVERIES, CAUSES, AUTHORS, CHANNELS):
        for name, known in table.items():
            if known == value:
                return name
    for name, cause in CAUSES.items():
        if isinstance(cause, EventCause) and cause.event_id == value:
            return name.removeprefix("event:")
    if isinstance(value, str) and value in STEPS.values():
        return next(name for name, step in STEPS.items() if step == value)
    if isinstance(value, bytes):
        return _FRESH_NAMES.get(value, f"{value.hex()[:8]}…")
    return _FRESH_NAMES.get(value, repr(value))


def describe(value: object) -> str:
    """A value in world names: ids by name, instants relative to START."""
    cls = type(value)
    if isinstance(value, Binding):  # on one line: where it points, then what it carries
        where = "/".join(name_of(v) for v in (value.community_id, value.workflow_id, value.run_id, value.step_id))
        return (
            f"Binding({where} to {name_of(value.target_pubkey)}, definition {name_of(value.definition_event_id)},"
            f" message {name_of(value.message_event_id)}, {describe(value.cause)})"
        )
    if attrs.has(cls):
        fields = ", ".join(f"{f.name}={describe(getattr(value, f.name))}" for f in attrs.fields(cls))
        return f"{cls.__name__}({fields})"
    if isinstance(value, uuid.UUID | bytes):
        return name_of(value)
    if isinstance(value, dt.datetime):
        return f"T+{(value - START).total_seconds():g}s"
    if isinstance(value, dt.timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple | list):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    return repr(value)
