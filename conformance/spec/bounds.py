"""The bounds of the exhaustive exploration, each an option of `leaseproof explore`: what
each machine's world holds and how far the search goes. Apart from the explorer, so that
the command's `--help` states them without importing it."""

from __future__ import annotations

from typing import Any

import attrs

from leaseproof.model import delivery as dm
from leaseproof.model import lifecycle as lm


class BoundsError(ValueError):
    """A bound out of its range, or one the machine does not have."""


def _bound(default: int, low: int, high: int, what: str) -> Any:
    def validator(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise BoundsError(f"--{attribute.name.replace('_', '-')} must be from {low} to {high}, got {value!r}")

    return attrs.field(default=default, validator=validator, metadata={"help": what})


def describe_bounds(bounds: Any) -> str:
    return " ".join(f"{f.name.replace('_', '-')}={getattr(bounds, f.name)}" for f in attrs.fields(type(bounds)))


@attrs.frozen
class DeliveryBounds:
    """The delivery machine's world: community A, a full tenant (created, given
    workflow W1, run R1 and message M1, committed to, claimed from, its lineage
    deleted, quiesced, fenced, deleted), and B, its neighbour under the same ids
    (created with its lineage, committed to for T1, claimed from, fenced and
    deleted, but its lineage never deleted); targets T1 and T2."""

    communities: int = _bound(2, 1, 2, "communities: A, then B its neighbour (default: 2)")
    targets: int = _bound(2, 1, 2, "targets A commits to: T1, T2 (default: 2)")
    deliveries: int = _bound(2, 1, 12, "most live delivery rows, across communities (default: 2)")
    clock_steps: int = _bound(2, 0, 20, "most clock moves, of one lease each (default: 2)")
    generation: int = _bound(3, 1, 20, "highest lease generation (default: 3)")
    lease_seconds: int = _bound(30, 1, dm.MAX_LEASE_SECONDS, "the lease claims and renewals ask for (default: 30)")


@attrs.frozen
class LifecycleBounds:
    """The lifecycle's world: community A (and B), workflow W1 (and W2), authors
    alice and bob, channel general (and ops), replicas r1 and r2 (and r9, unknown)."""

    communities: int = _bound(1, 1, 2, "communities: A, B (default: 1)")
    workflows: int = _bound(1, 1, 2, "workflow coordinates per community: W1, W2 (default: 1)")
    channels: int = _bound(1, 1, 2, "channels: general, ops (default: 1)")
    doors: int = _bound(1, 1, len(lm.DOORS), f"doors each replica fires through: {', '.join(lm.DOORS)} (default: 1)")
    runs: int = _bound(2, 1, 9, "most admitted runs (default: 2)")
    resumes: int = _bound(0, 0, 9, "most resumes of each run (default: 0: a resumed state is checked, not expanded)")
    clock_steps: int = _bound(1, 0, 20, "most clock moves (default: 1)")
    clock_seconds: int = _bound(10, 1, 3600, "one clock move, in seconds (default: 10, the cache TTL)")


BOUNDS: dict[str, Any] = {"delivery": DeliveryBounds, "lifecycle": LifecycleBounds}


def bound_options() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every bound, as its option name: (help, the machines that have it)."""
    options: dict[str, tuple[str, tuple[str, ...]]] = {}
    for machine, bounds in BOUNDS.items():
        for f in attrs.fields(bounds):
            help, machines = options.get(f.name, (f"{machine}: {f.metadata['help']}", ()))
            if machines:
                help += f"; {machine}: {f.metadata['help']}"
            options[f.name] = (help, (*machines, machine))
    return options
