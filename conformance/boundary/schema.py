"""A JSON Schema (draft 2020-12) of every message of the wire protocol, derived from the codec.

`specs/adapter-protocol.schema.json` is this module's output: `leaseproof spec` writes it and
`leaseproof spec --check` fails when it differs from what the model and the codec make today.
It describes, for any language, each request method with exactly its params, each reply (a
result or a fault; under `$defs`, each method's result) and every value the codec encodes:
one definition per model class (its `type` member, every field, nothing else), the scalar
encodings and both machines' snapshots. A schema cannot state every rule the model checks (a
32-byte key, a step id of at most 64 characters after trimming): those stay the model's, and
the codec refuses what breaks them. What it states, it states exactly; the tests validate
every example on the spec page and every message of full verify and stress runs against it.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import re
import types
import typing
import uuid
from typing import Any

import attrs

from leaseproof.conformance.boundary import codec
from leaseproof.conformance.boundary.serving import _PARAMS
from leaseproof.conformance.boundary.wire import (
    DATABASES_SINCE,
    MACHINES,
    PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    SESSIONS_SINCE,
)
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc

SCALARS: dict[str, dict[str, Any]] = {
    "uuid": {
        "type": "string",
        "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
        "description": "a UUID, lowercase and hyphenated",
    },
    "hex": {"type": "string", "pattern": "^(?:[0-9a-f]{2})*$", "description": "bytes, as lowercase hex"},
    "instant": {
        "type": "string",
        "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6}Z$",
        "description": "an instant: RFC 3339 in UTC, exactly six fractional digits, and Z",
    },
    "duration": {"type": "integer", "description": "a duration, in integer microseconds"},
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def _annotation(hint: Any) -> dict[str, Any]:
    """The schema of a value of the annotation `hint`, as the codec encodes it."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_annotation(option) for option in typing.get_args(hint)]
        return {"anyOf": options}
    if origin is tuple:
        return {"type": "array", "items": _annotation(typing.get_args(hint)[0])}
    if hint is type(None):
        return {"type": "null"}
    scalars: dict[Any, dict[str, Any]] = {
        uuid.UUID: _ref("uuid"),
        bytes: _ref("hex"),
        dt.datetime: _ref("instant"),
        dt.timedelta: _ref("duration"),
        bool: {"type": "boolean"},
        int: {"type": "integer"},
        str: {"type": "string"},
    }
    if hint in scalars:
        return scalars[hint]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [member.value for member in hint]}
    if isinstance(hint, type) and attrs.has(hint):
        return _ref(hint.__name__)
    raise TypeError(f"no schema for the annotation {hint!r}: teach schema.py the codec's encoding of it")


def _record(cls: type) -> dict[str, Any]:
    """A model class: an object of its "type" and exactly its fields."""
    hints = typing.get_type_hints(cls)
    fields = attrs.fields(cls)
    properties: dict[str, Any] = {"type": {"const": cls.__name__}}
    if cls is lc.Cache:  # its records map is a table of Records
        properties |= {"loaded_at": _ref("instant"), "records": {"type": "array", "items": _ref("Record")}}
        required = ["type", "loaded_at", "records"]
    else:
        properties |= {field.name: _annotation(hints[field.name]) for field in fields}
        required = ["type"] + [field.name for field in fields if field.default is attrs.NOTHING]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _rows(members: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {name: _annotation(hint) for name, hint in members.items()},
            "required": list(members),
            "additionalProperties": False,
        },
    }


def _state(name: str, tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    properties = {"type": {"const": name}, "now": _ref("instant"), **tables}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _request(method: str) -> dict[str, Any]:
    required, optional = _PARAMS[method]
    members: dict[str, Any] = {
        "machine": {"enum": sorted(MACHINES)},
        "session": {"type": "string", "minLength": 1},
        "start": _ref("instant"),
        "command": _ref("command"),
        "protocol": {"type": "integer", "minimum": PROTOCOL_VERSIONS[0]},
        "database": {"type": "string", "minLength": 1},
    }
    params = {
        "type": "object",
        "properties": {name: members[name] for name in sorted(required | optional)},
        "required": sorted(required),
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"id": _ref("id"), "method": {"const": method}, "params": params},
        "required": ["id", "method"] + (["params"] if required else []),
        "additionalProperties": False,
    }


def schema() -> dict[str, Any]:
    """The whole schema, as a JSON-ready object."""
    commands = sorted({cls.__name__ for machine in MACHINES.values() for cls in machine.variants})
    # Variants name classes, some with a status ("Settled(finished)"): the class is the name before it.
    variants = {name for machine in MACHINES.values() for names in machine.variants.values() for name in names}
    outcomes = sorted({name.partition("(")[0] for name in variants})
    defs: dict[str, Any] = dict(SCALARS)
    defs["id"] = {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}
    defs |= {name: _record(cls) for name, cls in sorted(codec.TYPES.items())}
    defs["command"] = {"anyOf": [_ref(name) for name in commands]}
    defs["outcome"] = {"anyOf": [_ref(name) for name in outcomes]}
    delivery_tables = {name: _rows(members) for name, members in codec._DELIVERY_ROWS.items()}
    delivery_tables["deliveries"] = {"type": "array", "items": _ref("Delivery")}
    lifecycle_tables = {name: _rows(members) for name, members in codec._LIFECYCLE_ROWS.items()}
    lifecycle_tables |= {
        "runtime": {"type": "array", "items": _ref("Record")},
        "runs": {"type": "array", "items": _ref("Run")},
    }
    defs["DeliverySystem"] = _state("DeliverySystem", delivery_tables)
    defs["LifecycleSystem"] = _state("LifecycleSystem", lifecycle_tables)
    defs["snapshot"] = {"anyOf": [_ref("DeliverySystem"), _ref("LifecycleSystem")]}
    # A version's hello announces only what that version has (section 6).
    carried = {v: sorted(name for name, spec in MACHINES.items() if spec.since <= v) for v in PROTOCOL_VERSIONS}
    older = [
        {
            "if": {"properties": {"protocol": {"const": version}}},
            "then": {
                "properties": {
                    "machines": {"propertyNames": {"enum": carried[version]}},
                    **({"sessions": {"const": False}} if version < SESSIONS_SINCE else {}),
                    **({"databases": False, "attach": False} if version < DATABASES_SINCE else {}),
                }
            },
        }
        for version in PROTOCOL_VERSIONS[:-1]
    ]
    defs["hello-result"] = {
        "type": "object",
        "allOf": older,
        "properties": {
            "protocol": {"enum": list(PROTOCOL_VERSIONS)},
            "implementation": {"type": "string"},
            "machines": {
                "type": "object",
                "properties": {
                    name: {"type": "array", "items": {"enum": sorted(machine.operations)}, "uniqueItems": True}
                    for name, machine in sorted(MACHINES.items())
                },
                "additionalProperties": False,
                "minProperties": 1,
            },
            "sessions": {"type": "boolean"},
            "databases": {
                "type": "object",
                "propertyNames": {"enum": sorted(MACHINES)},
                "additionalProperties": {"type": "string", "minLength": 1},
            },
            "attach": {"type": "array", "items": {"enum": sorted(MACHINES)}, "uniqueItems": True},
        },
        "required": ["protocol", "implementation", "machines"],
    }
    defs |= {f"request-{method}": _request(method) for method in _PARAMS}
    defs["fault"] = {
        "type": "object",
        "properties": {"message": {"type": "string"}, "code": {"type": "string"}},
        "required": ["message"],
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://leaseproof.dev/schemas/adapter-protocol-{PROTOCOL_VERSION}.json",
        "title": (
            f"leaseproof adapter protocol {PROTOCOL_VERSION}, and the older versions its handshake keeps"
            f" ({', '.join(map(str, PROTOCOL_VERSIONS[:-1]))}): every request and reply (specs/adapter-protocol.md)"
        ),
        "description": (
            "Validate a request against #/$defs/request, a reply against #/$defs/reply, and a reply's result against "
            "the definition of its method's result: hello-result, null (reset, open_session, close_session, close, "
            "attach), outcome (execute), snapshot (snapshot)."
        ),
        "$defs": defs
        | {
            "request": {"oneOf": [_ref(f"request-{method}") for method in _PARAMS]},
            "reply": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"id": _ref("id"), "result": {}},
                        "required": ["id", "result"],
                        "not": {"required": ["fault"]},
                    },
                    {
                        "type": "object",
                        "properties": {"id": _ref("id"), "fault": _ref("fault")},
                        "required": ["id", "fault"],
                    },
                ]
            },
        },
    }


def render() -> str:
    """The schema file's text; every reference in it resolves."""
    whole = schema()
    refs = set(re.findall(r'"\$ref": "#/\$defs/([^"]+)"', json.dumps(whole)))
    missing = refs - whole["$defs"].keys()
    if missing:
        raise TypeError(f"the schema refers to definitions it lacks: {sorted(missing)}")
    return json.dumps(whole, indent=2) + "\n"


# The result each method answers, by definition name (None: null).
RESULTS: dict[str, str | None] = {
    "hello": "hello-result",
    "reset": None,
    "execute": "outcome",
    "snapshot": "snapshot",
    "open_session": None,
    "close_session": None,
    "close": None,
    "attach": None,
}
assert RESULTS.keys() == _PARAMS.keys()
assert m.DeliverySystem.__name__ in codec.STATES and lc.LifecycleSystem.__name__ in codec.STATES
