"""Fixed programs for the lifecycle machine: the seed's stale-replica
regressions (update, disable, delete→recreate, identical recreate) through
every door, with their positive controls, and the corners a random search
reaches rarely. Each program starts from the machine's set-up: a live
definition "a" of (A, W1) by alice in #general, served by both replicas.
"""

from __future__ import annotations

from collections.abc import Callable

from leaseproof.conformance.lockstep.lifecycle import LifecycleConformance
from leaseproof.model import lifecycle as m

Scenario = Callable[[LifecycleConformance], None]


def _stale_everywhere(s: LifecycleConformance, replica: str = "r2") -> None:
    for door in m.DOORS:
        s.fire(replica, door, "A", "W1")


def stale_replica_after_update(s: LifecycleConformance) -> None:
    """r2 cached revision "a"; after an update it admits nothing through any door; a fresh r2 runs "b"."""
    s.fire("r1", "event", "A", "W1")  # run 1, on the current revision
    s.save("A", "W1", "alice", "general", "b", "newer")
    _stale_everywhere(s)
    s.resume(1)  # the pinned revision is gone: fail closed
    s.refresh("r2")
    s.fire("r2", "manual", "A", "W1")  # positive control: the current revision runs


def stale_replica_after_disable(s: LifecycleConformance) -> None:
    """Disabling refuses every stale fire; a refreshed replica no longer selects it."""
    s.save("A", "W1", "alice", "general", "a-off", "newer")
    _stale_everywhere(s)
    s.refresh("r2")
    s.fire("r2", "schedule", "A", "W1")
    s.save("A", "W1", "alice", "general", "a", "newer")  # re-enabled: a new revision
    s.fire("r2", "webhook", "A", "W1")  # r2's cache is still the refreshed one: not selected
    s.refresh("r1")
    s.fire("r1", "webhook", "A", "W1")


def stale_replica_after_delete_and_recreate(s: LifecycleConformance) -> None:
    """Deleted, then recreated with other content: the stale record admits nothing."""
    s.delete("A", "W1", "alice", "newer")
    _stale_everywhere(s)
    s.save("A", "W1", "alice", "general", "b", "after-cutoff")
    _stale_everywhere(s)
    s.refresh("r2")
    s.fire("r2", "event", "A", "W1")


def stale_replica_after_identical_recreation(s: LifecycleConformance) -> None:
    """Recreated with identical content: same hash, new incarnation, so still refused."""
    s.fire("r1", "event", "A", "W1")
    s.delete("A", "W1", "alice", "newer")
    s.save("A", "W1", "alice", "general", "a", "after-cutoff")
    _stale_everywhere(s)
    s.resume(1)
    s.refresh("r2")
    s.fire("r2", "event", "A", "W1")
    s.resume(2)  # still current: runs again


def delayed_and_replayed_saves(s: LifecycleConformance) -> None:
    """After a deletion, events at or before the cutoff never revive the coordinate."""
    s.save("A", "W1", "alice", "general", "a", "same")  # a replay of the head
    s.save("A", "W1", "alice", "general", "b", "older")
    s.delete("A", "W1", "alice", "older")
    s.delete("A", "W1", "alice", "newer")
    s.delete("A", "W1", "alice", "newer")
    s.save("A", "W1", "alice", "general", "a", "at-cutoff")
    s.save("A", "W1", "alice", "general", "b", "older")
    s.save("A", "W1", "alice", "general", "b", "after-cutoff")


def alternate_deletions_are_rejected(s: LifecycleConformance) -> None:
    """Name, alias, event-id, admin and report-enforcement paths (fresh and retried) change
    nothing; the definition still runs and its author can still delete it."""
    for path in m.ALTERNATE_DELETIONS:
        s.tenant("A", f"delete W1 by {path}")
    s.fire("r1", "event", "A", "W1")
    s.delete("A", "W1", "bob", "newer")
    s.delete("A", "W1", "alice", "newer")


def authority_fences_and_ttl(s: LifecycleConformance) -> None:
    """Revoked authority stops admission and resume; a fenced tenant refuses everything;
    a cache is served until exactly its TTL."""
    s.fire("r1", "event", "A", "W1")
    s.tenant("A", "revoke alice general")
    s.fire("r1", "event", "A", "W1")
    s.resume(1)
    s.save("A", "W1", "alice", "general", "b", "newer")
    s.delete("A", "W1", "alice", "newer")
    s.tenant("A", "grant alice general")
    s.save("A", "W1", "bob", "general", "b", "newer")
    s.save("A", "W1", "alice", "ops", "b", "newer")
    s.tenant("A", "fence")
    s.fire("r1", "event", "A", "W1")
    s.resume(1)
    s.save("A", "W1", "alice", "general", "b", "newer")
    s.delete("A", "W1", "alice", "newer")
    s.tenant("A", "grant bob ops")
    s.tenant("A", "activate")
    s.tenant("A", "create")
    s.tenant("Z", "fence")
    s.tenant("Z", "grant alice ops")
    s.save("Z", "W1", "alice", "general", "a", "newer")
    s.delete("Z", "W1", "alice", "newer")
    s.fire("r1", "event", "Z", "W1")
    s.fire("r9", "event", "A", "W1")
    s.refresh("r9")
    s.resume(4)
    s.save("A", "W2", "alice", "general", "b", "newer")
    s.fire("r1", "event", "A", "W2")  # created after r1 loaded: not selected
    s.save("A", "W1", "alice", "general", "b", "newer")
    s.advance_clock(5)
    s.fire("r2", "event", "A", "W1")  # 5 s old: still stale
    s.advance_clock(5)
    s.fire("r2", "event", "A", "W1")  # exactly the TTL: reloaded, runs "b"


def resumes_pin_the_revision(s: LifecycleConformance) -> None:
    """A resume fails closed on any later revision, even one restoring the same content,
    and on a disabled or deleted row; a stale replica whose record has the current content admits a
    run pinned to the current revision."""
    s.fire("r1", "event", "A", "W1")  # run 1
    s.save("A", "W1", "alice", "general", "a", "newer")  # same content, a new revision
    s.resume(1)  # revised: refused
    s.fire("r2", "manual", "A", "W1")  # r2's record matches in content: run 2, on the new revision
    s.resume(2)
    s.save("A", "W1", "alice", "general", "a-off", "newer")
    s.resume(2)  # disabled: refused
    s.delete("A", "W1", "alice", "newer")
    s.resume(2)  # gone: refused


LIFECYCLE_SCENARIOS: tuple[Scenario, ...] = (
    stale_replica_after_update,
    stale_replica_after_disable,
    stale_replica_after_delete_and_recreate,
    stale_replica_after_identical_recreation,
    delayed_and_replayed_saves,
    alternate_deletions_are_rejected,
    authority_fences_and_ttl,
    resumes_pin_the_revision,
)

__all__ = ["LIFECYCLE_SCENARIOS"]
