"""The one canonical JSON encoding of the model's values.

Used by the wire protocol and by trace files, so that an adapter in any
language and a trace on disk speak exactly the model's vocabulary:

- UUID: lowercase hyphenated string, "0b7e…-…";
- bytes: lowercase hex string (a 32-byte key is 64 characters);
- instant: RFC 3339 in UTC with exactly six fractional digits and "Z",
  "2026-01-01T00:00:30.000000Z";
- duration: integer microseconds;
- enum: its string value ("claimed", "fenced");
- a record, command or outcome: an object whose "type" names the model
  class and whose other members are its fields, encoded by these rules;
- a tuple: an array; an absent optional: null.

Decoding is driven by the model's type annotations, so it accepts exactly
what the model can construct, and a malformed value raises `DecodeError`
naming the path to it.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import types
import typing
import uuid
from typing import Any

import attrs

from leaseproof.model import binding as b
from leaseproof.model import delivery as m
from leaseproof.model.errors import InvalidValue
from leaseproof.model.frozenmap import FrozenMap

_INSTANT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")
_HEX = re.compile(r"(?:[0-9a-f]{2})*")


class DecodeError(ValueError):
    """A JSON value does not encode a model value; names where and why."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path or '(top)'}: {problem}")


def _classes(module: types.ModuleType) -> dict[str, type]:
    return {
        name: cls
        for name, cls in vars(module).items()
        if isinstance(cls, type) and attrs.has(cls) and cls.__module__ == module.__name__
    }


# Every attrs class of the vocabulary, by the name the "type" member carries.
TYPES: dict[str, type] = {**_classes(b), **_classes(m)}
del TYPES["DeliverySystem"]  # states have their own, table-shaped encoding


def encode(value: Any) -> Any:
    """The canonical JSON value (dicts, lists, str, int, bool, None) of a model value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.datetime):
        u = value.astimezone(dt.timezone.utc)
        return f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}.{u.microsecond:06d}Z"
    if isinstance(value, dt.timedelta):
        return value // dt.timedelta(microseconds=1)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, m.DeliverySystem):
        return encode_state(value)
    if attrs.has(type(value)):
        fields = {f.name: encode(getattr(value, f.name)) for f in attrs.fields(type(value))}
        return {"type": type(value).__name__, **fields}
    raise TypeError(f"no canonical encoding for {value!r}")


def decode(data: Any, expected: Any = object, path: str = "") -> Any:
    """The model value `data` encodes; `expected` is the annotation it must satisfy."""
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(expected)
        if data is None and type(None) in options:
            return None
        concrete = [o for o in options if o is not type(None)]
        if len(concrete) == 1:
            return decode(data, concrete[0], path)
        if all(attrs.has(o) for o in concrete):
            return _decode_record(data, concrete, path)
        for option in concrete:  # scalar alternatives, e.g. a UUID or a key
            try:
                return decode(data, option, path)
            except DecodeError:
                continue
        names = " or ".join(getattr(o, "__name__", str(o)) for o in concrete)
        raise DecodeError(path, f"expected {names}, got {data!r}")
    if origin is tuple:
        item = typing.get_args(expected)[0]
        if not isinstance(data, list):
            raise DecodeError(path, f"expected an array, got {_kind(data)}")
        return tuple(decode(v, item, f"{path}[{i}]") for i, v in enumerate(data))
    if expected is uuid.UUID:
        if not isinstance(data, str):
            raise DecodeError(path, f"expected a UUID string, got {_kind(data)}")
        try:
            parsed = uuid.UUID(data)
        except ValueError:
            raise DecodeError(path, f"{data!r} is not a UUID") from None
        if str(parsed) != data:
            raise DecodeError(path, f"{data!r} is not in canonical lowercase hyphenated form")
        return parsed
    if expected is bytes:
        if not isinstance(data, str) or not _HEX.fullmatch(data):
            raise DecodeError(path, f"expected lowercase hex, got {data!r}")
        return bytes.fromhex(data)
    if expected is dt.datetime:
        if not isinstance(data, str) or not _INSTANT.fullmatch(data):
            raise DecodeError(path, f"expected an instant like 2026-01-01T00:00:00.000000Z, got {data!r}")
        try:
            return dt.datetime.strptime(data, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
        except ValueError:
            raise DecodeError(path, f"{data!r} is not a real instant") from None
    if expected is dt.timedelta:
        if not isinstance(data, int) or isinstance(data, bool):
            raise DecodeError(path, f"expected integer microseconds, got {_kind(data)}")
        try:
            return dt.timedelta(microseconds=data)
        except OverflowError:
            raise DecodeError(path, f"{data} microseconds is out of range") from None
    if isinstance(expected, type) and issubclass(expected, enum.Enum):
        try:
            return expected(data)
        except ValueError:
            allowed = ", ".join(repr(e.value) for e in expected)
            raise DecodeError(path, f"{data!r} is not one of {allowed}") from None
    if expected is bool or expected is str or expected is int:
        if not isinstance(data, expected) or (expected is int and isinstance(data, bool)):
            raise DecodeError(path, f"expected {expected.__name__}, got {_kind(data)}")
        return data
    if expected is m.DeliverySystem:
        return decode_state(data, path)
    if isinstance(expected, type) and attrs.has(expected):
        return _decode_record(data, [expected], path)
    if expected is object or expected is typing.Any:
        if isinstance(data, dict) and data.get("type") == "DeliverySystem":
            return decode_state(data, path)
        return _decode_record(data, list(TYPES.values()), path)
    raise TypeError(f"no canonical decoding for annotation {expected!r}")


def _decode_record(data: Any, allowed: list[type], path: str) -> Any:
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise DecodeError(path, f"expected an object with a string \"type\", got {_kind(data)}")
    cls = TYPES.get(data["type"])
    if cls is None or not any(issubclass(cls, a) for a in allowed):
        names = ", ".join(sorted(c.__name__ for c in allowed)) if len(allowed) < 8 else "a model type"
        raise DecodeError(f"{path}.type", f"{data['type']!r} is not {names}")
    hints = typing.get_type_hints(cls)
    fields = attrs.fields(cls)
    unknown = set(data) - {"type"} - {f.name for f in fields}
    if unknown:
        raise DecodeError(path, f"unknown members {sorted(unknown)} for {cls.__name__}")
    kwargs = {}
    for field in fields:
        if field.name not in data:
            if field.default is attrs.NOTHING:
                raise DecodeError(path, f"{cls.__name__} needs member {field.name!r}")
            continue
        kwargs[field.name] = decode(data[field.name], hints[field.name], f"{path}.{field.name}")
    try:
        return cls(**kwargs)
    except InvalidValue as invalid:
        raise DecodeError(f"{path}.{invalid.field}", invalid.rule) from None


def _kind(data: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(data), type(data).__name__
    )


# -- states: one array per table, rows in a canonical order --------------------


def encode_state(s: m.DeliverySystem) -> dict[str, Any]:
    def rows(items: Any) -> list[Any]:
        return sorted(items, key=lambda row: [str(v) for v in row.values()])

    return {
        "type": "DeliverySystem",
        "now": encode(s.now),
        "communities": rows({"id": encode(k), "state": v.value} for k, v in s.communities.items()),
        "workflows": rows({"community_id": encode(c), "id": encode(i)} for c, i in s.workflows),
        "runs": rows(
            {"community_id": encode(c), "id": encode(r), "workflow_id": encode(w)} for (c, r), w in s.runs.items()
        ),
        "events": rows({"community_id": encode(c), "id": encode(i)} for c, i in s.events),
        "deliveries": sorted(
            (encode(d) for d in s.deliveries.values()), key=lambda d: (d["binding"]["community_id"], d["id"])
        ),
        "retired": rows({"community_id": encode(c), "id": encode(i)} for c, i in s.retired),
    }


def decode_state(data: Any, path: str = "") -> m.DeliverySystem:
    if not isinstance(data, dict) or data.get("type") != "DeliverySystem":
        raise DecodeError(path, 'expected an object with "type": "DeliverySystem"')
    tables = ("communities", "workflows", "runs", "events", "deliveries", "retired")
    _require_members(data, {"type", "now", *tables}, "DeliverySystem", path)
    for table in tables:
        if not isinstance(data[table], list):
            raise DecodeError(f"{path}.{table}", "expected an array")

    def table(name: str, members: dict[str, Any]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """Rows keyed by their first two members (the second alone for communities); no duplicates."""
        rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for i, row in enumerate(data[name]):
            where = f"{path}.{name}[{i}]"
            _require_members(row, set(members), "a row", where)
            values = tuple(decode(row[k], t, f"{where}.{k}") for k, t in members.items())
            key = values[:1] if name == "communities" else values[:2]
            if key in rows:
                raise DecodeError(where, f"duplicate row for {[encode(v) for v in key]}")
            rows[key] = values
        return rows

    communities = table("communities", {"id": uuid.UUID, "state": m.CommunityState})
    runs = table("runs", {"community_id": uuid.UUID, "id": uuid.UUID, "workflow_id": uuid.UUID})
    key_pair = {"community_id": uuid.UUID, "id": uuid.UUID}
    deliveries: dict[tuple[uuid.UUID, uuid.UUID], m.Delivery] = {}
    for i, row in enumerate(data["deliveries"]):
        delivery = decode(row, m.Delivery, f"{path}.deliveries[{i}]")
        if delivery.key in deliveries:
            raise DecodeError(f"{path}.deliveries[{i}]", "duplicate row for the same (community, id)")
        deliveries[delivery.key] = delivery
    return m.DeliverySystem(
        now=decode(data["now"], dt.datetime, f"{path}.now"),
        communities=FrozenMap({k[0]: v[1] for k, v in communities.items()}),
        workflows=frozenset(table("workflows", key_pair)),
        runs=FrozenMap({k: v[2] for k, v in runs.items()}),
        events=frozenset(table("events", {"community_id": uuid.UUID, "id": bytes})),
        deliveries=FrozenMap(deliveries),
        retired=frozenset(table("retired", key_pair)),
    )


def _require_members(data: Any, members: set[str], what: str, path: str) -> None:
    if not isinstance(data, dict):
        raise DecodeError(path, f"expected an object, got {_kind(data)}")
    missing, unknown = members - data.keys(), data.keys() - members
    if missing:
        raise DecodeError(path, f"{what} needs members {sorted(missing)}")
    if unknown:
        raise DecodeError(path, f"unknown members {sorted(unknown)} for {what}")
