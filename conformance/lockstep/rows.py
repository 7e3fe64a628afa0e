"""A machine's state as rows a reader can compare: each entity (a delivery, a
community, a coordinate's head, a replica's cached record, ...) by its world
name, with its fields as short text.

The lockstep compares whole states; a page shows, for one step, only the rows
that step touched, side by side before it, in the model after it and in the
implementation after it. Flattening both machines' states into the same
shape lets one table do that for either.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import attrs

from leaseproof.conformance.lockstep import world as w
from leaseproof.model import delivery as d
from leaseproof.model import lifecycle as lc

Entity = tuple[str, str]  # (kind, world name): ("delivery", "R1/s1/T2 of community A")
Fields = Mapping[str, str]
Rows = Mapping[Entity, Fields]


def instant(value: dt.datetime | None) -> str:
    """An instant relative to the world's start, as the lockstep's reports write it."""
    return "-" if value is None else w.describe(value)


def _record(record: lc.Record) -> dict[str, str]:
    return {
        "actions": ", ".join(record.actions) or "(none)",
        "enabled": "yes" if record.enabled else "no",
        "owner": w.name_of(record.owner),
        "channel": w.name_of(record.channel_id),
        "hash": record.hash.hex()[:8],
        "incarnation": instant(record.incarnation),
        "revision": record.revision.hex()[:8],
    }


def delivery_row(row: d.Delivery) -> dict[str, str]:
    b = row.binding
    return {
        "status": row.status.value,
        "generation": str(row.lease_generation),
        "lease until": instant(row.lease_until),
        "claimed at": instant(row.claimed_at),
        "claim key": row.claim_key or "-",
        "finished at": instant(row.finished_at),
        "created at": instant(row.created_at),
        "target": w.name_of(b.target_pubkey),
        "run / step": f"{w.name_of(b.run_id)} / {w.name_of(b.step_id)}",
        "workflow": w.name_of(b.workflow_id),
        "definition": w.name_of(b.definition_event_id),
        "message": w.name_of(b.message_event_id),
        "cause": w.describe(b.cause),
        "id": str(row.id),
    }


def delivery_entity(key: d.CommunityKey) -> Entity:
    return ("delivery", f"{w.name_of(key[1])} of community {w.name_of(key[0])}")


def _delivery_rows(s: d.DeliverySystem) -> dict[Entity, dict[str, str]]:
    rows: dict[Entity, dict[str, str]] = {("clock", "now"): {"now": f"{instant(s.now)} ({s.now.isoformat()})"}}
    for community, state in s.communities.items():
        rows[("community", w.name_of(community))] = {"state": state.value}
    for community, workflow in s.workflows:
        rows[("workflow", f"{w.name_of(workflow)} of community {w.name_of(community)}")] = {"present": "yes"}
    for (community, run), workflow in s.runs.items():
        rows[("run", f"{w.name_of(run)} of community {w.name_of(community)}")] = {"workflow": w.name_of(workflow)}
    for community, event in s.events:
        rows[("event", f"{w.name_of(event)} of community {w.name_of(community)}")] = {"present": "yes"}
    for key, row in s.deliveries.items():
        rows[delivery_entity(key)] = delivery_row(row)
    for community, delivery in s.retired:
        rows[("retired id", f"{w.name_of(delivery)} of community {w.name_of(community)}")] = {"retired": "yes"}
    return rows


def _coordinate(coordinate: tuple[Any, Any]) -> str:
    return f"{w.name_of(coordinate[1])} of community {w.name_of(coordinate[0])}"


def _lifecycle_rows(s: lc.LifecycleSystem) -> dict[Entity, dict[str, str]]:
    rows: dict[Entity, dict[str, str]] = {("clock", "now"): {"now": f"{instant(s.now)} ({s.now.isoformat()})"}}
    for community, state in s.communities.items():
        rows[("community", w.name_of(community))] = {"state": state.value}
    for community, channel, member in s.authority:
        name = f"{w.name_of(member)} in {w.name_of(channel)} of community {w.name_of(community)}"
        rows[("authority", name)] = {"active": "yes"}
    for coordinate, head in s.heads.items():
        rows[("head", _coordinate(coordinate))] = {
            "saved at": instant(head.created_at),
            "author": w.name_of(head.author),
            "channel": w.name_of(head.channel_id),
            "actions": ", ".join(head.definition.actions) or "(none)",
            "enabled": {None: "unset", True: "yes", False: "no"}[head.definition.enabled],
            "event": head.event_id.hex()[:8],
        }
    for coordinate, record in s.runtime.items():
        rows[("runtime", _coordinate(coordinate))] = _record(record)
    for coordinate, cutoff in s.cutoffs.items():
        rows[("cutoff", _coordinate(coordinate))] = {"cutoff": instant(cutoff)}
    for replica, cache in s.caches.items():
        rows[("cache", f"replica {replica}")] = {
            "loaded at": instant(cache.loaded_at),
            "records": str(len(cache.records)),
        }
        for coordinate, record in cache.records.items():
            rows[("cached record", f"{_coordinate(coordinate)} on replica {replica}")] = _record(record)
    for run_id, run in s.runs.items():
        rows[("run", f"run {run_id}")] = {
            "door": run.door,
            "admitted at": instant(run.admitted_at),
            "coordinate": _coordinate(run.record.coordinate),
            **_record(run.record),
            "executed": ", ".join(s.executed.get(run_id, ())) or "(none)",
        }
    return rows


def rows_of(state: Any) -> dict[Entity, dict[str, str]]:
    """Every entity of a delivery or lifecycle state, with its fields as text."""
    if isinstance(state, d.DeliverySystem):
        return _delivery_rows(state)
    if isinstance(state, lc.LifecycleSystem):
        return _lifecycle_rows(state)
    raise TypeError(f"no rows for a {type(state).__name__}: a report knows the delivery and lifecycle machines")


def named_entities(command: Any, before: Any) -> set[Entity]:
    """The entities a command names (so a step that changed nothing still shows what it looked at):
    a lease's delivery, a claim's candidates, a lifecycle command's coordinate."""
    named: set[Entity] = set()
    if isinstance(command, d.Renew | d.Finish):
        named.add(delivery_entity((command.lease.community_id, command.lease.delivery_id)))
    elif isinstance(command, d.GetDelivery):
        named.add(delivery_entity((command.community_id, command.delivery_id)))
    elif isinstance(command, d.Claim) and isinstance(before, d.DeliverySystem):
        named |= {delivery_entity(row.key) for row in d.claim_order(before, command)}
        if command.delivery_id is not None:
            named.add(delivery_entity((command.community_id, command.delivery_id)))
    coordinate = _lifecycle_coordinate(command, before)
    if coordinate is not None:
        name = _coordinate(coordinate)
        named |= {("head", name), ("runtime", name), ("cutoff", name)}
        if isinstance(before, lc.LifecycleSystem):
            named |= {("cached record", f"{name} on replica {replica}") for replica in before.caches}
    return named


def _lifecycle_coordinate(command: Any, state: Any) -> tuple[Any, Any] | None:
    if isinstance(command, lc.SaveDefinition):
        return (command.event.community_id, command.event.workflow_id)
    if isinstance(command, lc.DeleteDefinition | lc.AlternateDelete | lc.Fire):
        return (command.community_id, command.workflow_id)
    if isinstance(command, lc.ResumeRun) and isinstance(state, lc.LifecycleSystem) and command.run_id in state.runs:
        coordinate: tuple[Any, Any] = state.runs[command.run_id].record.coordinate
        return coordinate
    return None


@attrs.frozen
class RowDiff:
    """One entity a step touched: its fields before the step, in the model after it,
    and in the implementation after it (None: the entity is absent there; the
    implementation's side is None too when it was not run)."""

    entity: Entity
    before: Fields | None
    model: Fields | None
    implementation: Fields | None
    implementation_known: bool

    @property
    def differs(self) -> bool:
        """The implementation disagrees with the model about this entity."""
        return self.implementation_known and self.model != self.implementation

    def fields(self) -> list[str]:
        """Every field any side has, in the order the first side that has it lists them."""
        seen: dict[str, None] = {}
        for side in (self.before, self.model, self.implementation):
            for name in side or {}:
                seen.setdefault(name, None)
        return list(seen)


def touched(command: Any, before: Any, model: Any, implementation: Any | None) -> list[RowDiff]:
    """The entities a step touched: named by its command, changed by the model or by the
    implementation, or different between the two; the clock only if it moved or differs.
    Deliveries first (in claim order: created at, then id), then the rest by kind and name."""
    b, m = rows_of(before), rows_of(model)
    i = rows_of(implementation) if implementation is not None else None
    keys = {e for e in named_entities(command, before) if e in b or e in m or (i is not None and e in i)}
    keys |= {e for e in b.keys() | m.keys() if b.get(e) != m.get(e)}
    if i is not None:
        keys |= {e for e in b.keys() | i.keys() if b.get(e) != i.get(e)}
        keys |= {e for e in m.keys() | i.keys() if m.get(e) != i.get(e)}

    ages: dict[Entity, tuple[dt.datetime, str]] = {}
    for state in (implementation, model, before):  # the earliest side that has the row wins
        if isinstance(state, d.DeliverySystem):
            ages.update({delivery_entity(k): (row.created_at, str(row.id)) for k, row in state.deliveries.items()})

    def order(entity: Entity) -> tuple[Any, ...]:
        if entity in ages:
            return (0, *ages[entity])
        return (1, entity)

    return [
        RowDiff(e, b.get(e), m.get(e), None if i is None else i.get(e), implementation_known=i is not None)
        for e in sorted(keys, key=order)
    ]
