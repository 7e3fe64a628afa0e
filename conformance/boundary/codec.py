"""The one canonical JSON encoding of the model's values.

Used by the wire protocol and by trace files, so that an adapter in any language and a trace
on disk speak exactly the model's vocabulary: a UUID is a lowercase hyphenated string; bytes
lowercase hex; an instant RFC 3339 in UTC with exactly six fractional digits and "Z"; a
duration integer microseconds; an enum its string value; a record, command or outcome an
object whose "type" names the model class and whose other members are its fields; a tuple an
array, an absent optional null; a machine's state an object whose "type" names it, with one
array per table, rows in a canonical order (decoding accepts any order but no key twice).
specs/adapter-protocol.md states it in full. Decoding is driven by the model's type
annotations, so it accepts exactly what the model can construct, and a malformed value
raises `DecodeError` naming the path to it.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from leaseproof.model import binding as b
from leaseproof.model import delivery as m
from leaseproof.model import lifecycle as lc
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


def _vocabulary(*modules: types.ModuleType) -> dict[str, type]:
    """Every attrs class of the modules by name; two classes of one name would make "type" ambiguous."""
    vocabulary: dict[str, type] = {}
    for module in modules:
        for name, cls in _classes(module).items():
            if name in vocabulary:
                first = vocabulary[name].__module__
                raise TypeError(f'{first}.{name} and {module.__name__}.{name} share the "type" name {name!r}')
            vocabulary[name] = cls
    return vocabulary


# Every attrs class of the vocabulary, by the name the "type" member carries.
# The lifecycle reuses delivery's community commands, clock, Ok and
# rejections: defined once, in delivery, so listed once.
TYPES: dict[str, type] = _vocabulary(b, m, lc)
# Machine states have their own, table-shaped encoding.
STATES: dict[str, type] = {name: TYPES.pop(name) for name in ("DeliverySystem", "LifecycleSystem")}


def encode(value: Any) -> Any:
    """The canonical JSON value (dicts, lists, str, int, bool, None) of a model value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.datetime):
        u = value.astimezone(dt.UTC)
        return f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}.{u.microsecond:06d}Z"
    if isinstance(value, dt.timedelta):
        return value // dt.timedelta(microseconds=1)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if type(value) in STATES.values():
        return encode_state(value)
    if isinstance(value, lc.Cache):
        return _encode_cache(value)
    if attrs.has(type(value)):
        # A field a later protocol version added ("since" in its metadata) is sent only when it
        # is set: a message that does not use it reads as it did before, to an older adapter too.
        fields = {
            f.name: encode(getattr(value, f.name))
            for f in attrs.fields(type(value))
            if not ("since" in f.metadata and getattr(value, f.name) is None)
        }
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
            instant = dt.datetime.strptime(data, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
        except ValueError:
            raise DecodeError(path, f"{data!r} is not a real instant") from None
        if instant > b.LATEST_INSTANT:  # what the model's instants allow, wherever this one goes
            raise DecodeError(path, f"{data!r} is later than 9999-01-01T00:00:00Z, the latest instant the model knows")
        return instant
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
    if expected in STATES.values():
        return decode_state(data, path, expected)
    if isinstance(expected, type) and attrs.has(expected):
        return _decode_record(data, [expected], path)
    if expected is object or expected is typing.Any:
        if isinstance(data, dict) and data.get("type") in STATES:
            return decode_state(data, path)
        return _decode_record(data, list(TYPES.values()), path)
    raise TypeError(f"no canonical decoding for annotation {expected!r}")


def _decode_record(data: Any, allowed: list[type], path: str) -> Any:
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise DecodeError(path, f'expected an object with a string "type", got {_kind(data)}')
    cls = TYPES.get(data["type"])
    if cls is None or not any(issubclass(cls, a) for a in allowed):
        names = ", ".join(sorted(c.__name__ for c in allowed)) if len(allowed) < 8 else "a model type"
        raise DecodeError(f"{path}.type", f"{data['type']!r} is not {names}")
    if cls is lc.Cache:  # its records map has a table-shaped encoding
        return _decode_cache(data, path)
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

Row = dict[str, Any]


def encode_state(s: Any) -> dict[str, Any]:
    """The table-shaped encoding of a machine's state; its "type" names the machine's state class."""
    if isinstance(s, m.DeliverySystem):
        return _encode_delivery_state(s)
    if isinstance(s, lc.LifecycleSystem):
        return _encode_lifecycle_state(s)
    raise TypeError(f"no canonical encoding for {s!r}: not a machine's state")


def decode_state(data: Any, path: str = "", expected: type | None = None) -> Any:
    """The state `data` encodes, of the machine its "type" names; `expected`, if given, is the one it must be."""
    if expected is not None and expected not in STATES.values():
        raise TypeError(f"{expected!r} is not a machine's state class")
    names = [expected.__name__] if expected is not None else list(STATES)
    if not isinstance(data, dict) or data.get("type") not in names:
        wanted = " or ".join(f'"type": "{name}"' for name in names)
        got = repr(data["type"]) if isinstance(data, dict) and "type" in data else _kind(data)
        raise DecodeError(path, f"expected an object with {wanted}, got {got}")
    decoders: dict[str, Callable[[dict[str, Any], str], Any]] = {
        "DeliverySystem": _decode_delivery_state,
        "LifecycleSystem": _decode_lifecycle_state,
    }
    return decoders[data["type"]](data, path)


def _encode_delivery_state(s: m.DeliverySystem) -> dict[str, Any]:
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
            _keyed_records(s.deliveries, lambda d: d.key, "deliveries"),
            key=lambda d: (d["binding"]["community_id"], d["id"]),
        ),
        "retired": rows({"community_id": encode(c), "id": encode(i)} for c, i in s.retired),
    }


# The delivery machine's tables: each row's members (the deliveries are Delivery records).
_DELIVERY_ROWS: dict[str, dict[str, Any]] = {
    "communities": {"id": uuid.UUID, "state": m.CommunityState},
    "workflows": {"community_id": uuid.UUID, "id": uuid.UUID},
    "runs": {"community_id": uuid.UUID, "id": uuid.UUID, "workflow_id": uuid.UUID},
    "events": {"community_id": uuid.UUID, "id": bytes},
    "retired": {"community_id": uuid.UUID, "id": uuid.UUID},
}


def _decode_delivery_state(data: dict[str, Any], path: str) -> m.DeliverySystem:
    tables = ("communities", "workflows", "runs", "events", "deliveries", "retired")
    _require_members(data, {"type", "now", *tables}, "DeliverySystem", path)

    def table(name: str, width: int = 2) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """Rows keyed by their first `width` members."""
        return _rows(data[name], f"{path}.{name}", _members(_DELIVERY_ROWS[name]), lambda row: row[:width])

    communities = table("communities", width=1)
    runs = table("runs")
    deliveries = _rows(data["deliveries"], f"{path}.deliveries", _record(m.Delivery), lambda d: d.key)
    return m.DeliverySystem(
        now=decode(data["now"], dt.datetime, f"{path}.now"),
        communities=FrozenMap({k[0]: v[1] for k, v in communities.items()}),
        workflows=frozenset(table("workflows")),
        runs=FrozenMap({k: v[2] for k, v in runs.items()}),
        events=frozenset(table("events")),
        deliveries=FrozenMap(deliveries),
        retired=frozenset(table("retired")),
    )


# The lifecycle's tables. A map whose values carry their own key (a Record's
# coordinate, a Run's run_id) is an array of those records; any other map is
# an array of rows of its key members and one value member.
_COORDINATE = {"community_id": uuid.UUID, "workflow_id": uuid.UUID}
_LIFECYCLE_ROWS: dict[str, dict[str, Any]] = {
    "communities": {"id": uuid.UUID, "state": m.CommunityState},
    "authority": {"community_id": uuid.UUID, "channel_id": uuid.UUID, "member": bytes},
    "heads": {**_COORDINATE, "head": lc.Head},
    "cutoffs": {**_COORDINATE, "cutoff": dt.datetime},
    "caches": {"replica": str, "cache": lc.Cache},
    "executed": {"run_id": int, "actions": tuple[str, ...]},
}


def _encode_lifecycle_state(s: lc.LifecycleSystem) -> dict[str, Any]:
    def rows(table: str, items: Iterable[tuple[Any, ...]]) -> list[Row]:
        members = list(_LIFECYCLE_ROWS[table])
        return _sorted_rows(
            ({name: encode(value) for name, value in zip(members, item, strict=True)} for item in items),
            members[:-1] if table != "authority" else members,
        )

    return {
        "type": "LifecycleSystem",
        "now": encode(s.now),
        "communities": rows("communities", s.communities.items()),
        "authority": rows("authority", s.authority),
        "heads": rows("heads", ((c, w, head) for (c, w), head in s.heads.items())),
        "runtime": _sorted_rows(
            _keyed_records(s.runtime, lambda r: r.coordinate, "runtime"), ["community_id", "workflow_id"]
        ),
        "cutoffs": rows("cutoffs", ((c, w, cutoff) for (c, w), cutoff in s.cutoffs.items())),
        "runs": _sorted_rows(_keyed_records(s.runs, lambda r: r.run_id, "runs"), ["run_id"]),
        "caches": rows("caches", s.caches.items()),
        "executed": rows("executed", s.executed.items()),
    }


def _decode_lifecycle_state(data: dict[str, Any], path: str) -> lc.LifecycleSystem:
    tables = ("communities", "authority", "heads", "runtime", "cutoffs", "runs", "caches", "executed")
    _require_members(data, {"type", "now", *tables}, "LifecycleSystem", path)

    def table(name: str) -> dict[Any, Any]:
        """Key (the lone key member, or the tuple of them) to value (the last member); authority is all key."""
        members = _LIFECYCLE_ROWS[name]
        width = len(members) if name == "authority" else len(members) - 1
        rows = _rows(data[name], f"{path}.{name}", _members(members), lambda row: row[:width])
        return {(k[0] if width == 1 else k): row[-1] for k, row in rows.items()}

    runtime = _rows(data["runtime"], f"{path}.runtime", _record(lc.Record), lambda r: r.coordinate)
    runs = _rows(data["runs"], f"{path}.runs", _record(lc.Run), lambda r: (r.run_id,))
    return lc.LifecycleSystem(
        now=decode(data["now"], dt.datetime, f"{path}.now"),
        communities=FrozenMap(table("communities")),
        authority=frozenset(table("authority")),
        heads=FrozenMap(table("heads")),
        runtime=FrozenMap(runtime),
        cutoffs=FrozenMap(table("cutoffs")),
        runs=FrozenMap({key[0]: run for key, run in runs.items()}),
        caches=FrozenMap(table("caches")),
        executed=FrozenMap(table("executed")),
    )


def _encode_cache(cache: lc.Cache) -> dict[str, Any]:
    records = _keyed_records(cache.records, lambda r: r.coordinate, "records")
    return {
        "type": "Cache",
        "loaded_at": encode(cache.loaded_at),
        "records": _sorted_rows(records, ["community_id", "workflow_id"]),
    }


def _decode_cache(data: dict[str, Any], path: str) -> lc.Cache:
    _require_members(data, {"type", "loaded_at", "records"}, "Cache", path)
    records = _rows(data["records"], f"{path}.records", _record(lc.Record), lambda r: r.coordinate)
    return lc.Cache(loaded_at=decode(data["loaded_at"], dt.datetime, f"{path}.loaded_at"), records=FrozenMap(records))


# -- rows -------------------------------------------------------------------------


def _keyed_records(table: Mapping[Any, Any], key_of: Callable[[Any], Any], name: str) -> list[Row]:
    """The encoded records of a map keyed by each record's own key (so the key need not be spelled twice)."""
    for key, record in table.items():
        if key != key_of(record):
            own = key_of(record)
            raise ValueError(f"no canonical encoding for {name}: the record filed under {key!r} has the key {own!r}")
    return [encode(record) for record in table.values()]


def _sorted_rows(rows: Iterable[Row], by: list[str]) -> list[Row]:
    """The canonical row order: by the encoded key members (strings, or integers for run ids)."""
    return sorted(rows, key=lambda row: tuple(row[member] for member in by))


def _rows(
    data: Any, path: str, decode_row: Callable[[Any, str], Any], key_of: Callable[[Any], tuple[Any, ...]]
) -> dict[tuple[Any, ...], Any]:
    """A table's decoded rows by key (a tuple); a key that appears twice is an error, not a merge."""
    if not isinstance(data, list):
        raise DecodeError(path, f"expected an array, got {_kind(data)}")
    rows: dict[Any, Any] = {}
    for i, row in enumerate(data):
        where = f"{path}[{i}]"
        value = decode_row(row, where)
        key = key_of(value)
        if key in rows:
            shown = repr(encode(key[0])) if len(key) == 1 else str([encode(k) for k in key])
            raise DecodeError(where, f"duplicate row for {shown}")
        rows[key] = value
    return rows


def _members(members: dict[str, Any]) -> Callable[[Any, str], tuple[Any, ...]]:
    """Decodes a row of exactly these members, as a tuple in their order."""

    def decode_row(row: Any, where: str) -> tuple[Any, ...]:
        _require_members(row, set(members), "a row", where)
        return tuple(decode(row[name], annotation, f"{where}.{name}") for name, annotation in members.items())

    return decode_row


def _record(cls: type) -> Callable[[Any, str], Any]:
    return lambda row, where: decode(row, cls, where)


def _require_members(data: Any, members: set[str], what: str, path: str) -> None:
    if not isinstance(data, dict):
        raise DecodeError(path, f"expected an object, got {_kind(data)}")
    missing, unknown = members - data.keys(), data.keys() - members
    if missing:
        raise DecodeError(path, f"{what} needs members {sorted(missing)}")
    if unknown:
        raise DecodeError(path, f"unknown members {sorted(unknown)} for {what}")
