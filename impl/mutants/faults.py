"""Fault mutants: an operation of the bundled store spread over two transactions.

One operation at a time, nothing comes between the two commits, so the sequential lockstep
cannot tell a fault mutant from the bundled store (its test proves it). What shows one is
a cut connection between the two (`conformance/concurrent/faults.py`: `stress
--terminate`, and the race rounds of `leaseproof guarantees` that cut a connection),
which leaves the first half committed as a real outage does. Under concurrency without
cuts, `leaseproof stress` meets it too: when a tenant is fenced between the two commits
(the second is then refused after the first committed), or when a claim reads the
placeholder deadline in between (a keyed claim's retry answered with the lease its key
holds: seed 20261204 of the delivery programs meets it at program 9 with neither cuts
nor fences). The lease-queue profile, whose one tenant is never fenced and whose claims
take no keys, sees it only in the rounds with a cut.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import psycopg

from leaseproof.impl.delivery.adapter import Connect, PostgresDeliveryAdapter, PostgresDeliverySession
from leaseproof.impl.delivery.store import PostgresDeliveryStore, refuse_community
from leaseproof.impl.errors import ConnectionLost
from leaseproof.impl.hooks.clock import PinnedClock
from leaseproof.impl.migrate import Addition, Patch
from leaseproof.impl.mutants.delivery import Mutant, edits
from leaseproof.model import delivery as m

Store = PostgresDeliveryStore

# What the patched lp_claim answers for a delivery it has just claimed (with the
# placeholder deadline): the store then sets the real one, in a call of its own.
_PLACEHOLDER = "ClaimedUntilPlaceholder"

# The second transaction: the lease's real deadline, written as every write of a
# community's rows is (the caller's scope, the community's fence and state, the clock
# read once), to the row the claim took, while it is still claimed at that generation.
_SET_DEADLINE = """
CREATE FUNCTION lp_test_set_deadline(p_community uuid, p_delivery uuid, p_generation bigint,
    p_lease_seconds lp_lease_seconds, OUT outcome text, OUT state community_state, OUT lease_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t timestamptz;
BEGIN
    SELECT e.refusal, e.state, e.now INTO outcome, state, t FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    UPDATE workflow_agent_deliveries d SET lease_until = t + make_interval(secs => p_lease_seconds)
    WHERE d.community_id = p_community AND d.id = p_delivery
      AND d.status = 'claimed' AND d.lease_generation = p_generation
    RETURNING d.lease_until INTO lease_until;
    outcome := CASE WHEN FOUND THEN 'Set' ELSE 'Gone' END;
END
$$
"""


class ClaimThenDeadline(Store):
    """A claim commits with a placeholder deadline (the longest lease there is), and a second
    transaction writes the lease's real one. A connection lost between the two leaves a
    job claimed, by a holder that never learned of it, until the placeholder runs out: no
    rescue takes it back in the meantime. (Queues that mark a job running first and
    record its timeout or worker in a later write have this shape.)

    The claim is `lp_claim` with the placeholder (a keyed claim's retry, which returns the
    lease its key holds, is answered as before: its deadline was set); the second call is
    `lp_test_set_deadline`, a function this variant adds."""

    FUNCTIONS = edits(
        Patch(
            "lp_claim",
            "lease_until = e.t + make_interval(secs => p_lease_seconds)",
            f"lease_until = e.t + make_interval(secs => {m.MAX_LEASE_SECONDS})",
        ),
        Patch(
            "lp_claim",
            "CASE WHEN a.id IS NULL THEN 'ClaimMiss' ELSE 'Claimed' END",
            f"CASE WHEN a.id IS NULL THEN 'ClaimMiss' WHEN EXISTS (SELECT FROM retried) THEN 'Claimed'"
            f" ELSE '{_PLACEHOLDER}' END",
        ),
        Addition(_SET_DEADLINE),
    )

    ANSWERS: ClassVar[Mapping[str, frozenset[str]]] = {
        **Store.ANSWERS,
        "lp_claim": Store.ANSWERS["lp_claim"] | {_PLACEHOLDER},
    }

    SQL_SET_DEADLINE = """
        SELECT outcome, state, lease_until FROM lp_test_set_deadline(
            %(community_id)s, %(delivery_id)s, %(lease_generation)s, %(lease_seconds)s)
    """

    def _call(self, sql: str, params: dict[str, Any]) -> dict[str, Any]:
        row = super()._call(sql, params)
        if row.get("outcome") != _PLACEHOLDER:
            return row
        # The claim has committed (each call is its own transaction); now its deadline.
        lease = {
            "community_id": row["community_id"],
            "delivery_id": row["id"],
            "lease_generation": row["lease_generation"],
            "lease_seconds": params["lease_seconds"],
        }
        deadline = super()._call(self.SQL_SET_DEADLINE, lease)
        refuse_community(deadline, row["community_id"])  # fenced in between: refused, the claim kept
        until = row["lease_until"] if deadline["lease_until"] is None else deadline["lease_until"]
        return {**row, "outcome": "Claimed", "lease_until": until}


FAULT_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "claim-then-deadline",
        "a claim and its lease's deadline in two transactions: a cut between leaves a job no rescue takes",
        ClaimThenDeadline,
    ),
)


# The request-key lookup of a keyed claim, made only when the calling process says it
# has sent the key before (a transaction-local setting its claim statement sets first).
_LOOKUP = "WHERE p_request_key IS NOT NULL AND (SELECT e.state = 'active' FROM env e)"
_LOOKUP_IF_SEEN = (
    "WHERE p_request_key IS NOT NULL AND current_setting('lp.test_key_seen', true) = 'on'"
    " AND (SELECT e.state = 'active' FROM env e)"
)


class KeysRememberedInProcess(Store):
    """A service that keeps the request keys it has used in its process's memory, and asks
    the database for a key's lease only when it has sent that key before: a key it never
    sent cannot hold one, it reasons. True while the process lives, with any number of
    sessions (they share the memory, and one key's claims take turns in the database).
    After a crash and a restart the memory is empty: a claim sent again under a key whose
    lease still holds takes a second delivery. Only a restart shows it: no sequential
    run, no race and no cut connection does (a cut leaves the process and its memory)."""

    FUNCTIONS = edits(Patch("lp_claim", _LOOKUP, _LOOKUP_IF_SEEN))
    SQL_CLAIM = Store.SQL_CLAIM.replace(
        "%(request_key)s)",
        "CASE WHEN set_config('lp.test_key_seen', %(seen)s, true) IS NOT NULL"
        " THEN %(request_key)s::lp_request_key END)",
    )
    SEEN: ClassVar[set[str]] = set()  # the process's memory of the keys it sent
    _SEEN_LOCK: ClassVar[threading.Lock] = threading.Lock()

    def claim(self, c: m.Claim) -> m.Claimed | m.ClaimMiss:
        with self._SEEN_LOCK:
            self._seen = "on" if c.request_key in self.SEEN else "off"
            if c.request_key is not None:
                self.SEEN.add(c.request_key)
        return super().claim(c)

    def _call(self, sql: str, params: dict[str, Any]) -> dict[str, Any]:
        if sql is self.SQL_CLAIM:
            params = {**params, "seen": self._seen}
        return super()._call(sql, params)


# Mutants only a restart of the implementation's process shows (`leaseproof nemesis
# --adapter-cmd` with its `kill` fault): state that lived in the process alone.
RESTART_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "keys-remembered-in-process",
        "request keys remembered in the process: after a restart, a claim sent again takes a second delivery",
        KeysRememberedInProcess,
    ),
)


class _ResendingSession(PostgresDeliverySession):
    """A client that, when its connection is lost while a command runs, connects again and
    sends the same command again, as a naive retry does: right when the first attempt did
    not take effect, wrong when the server had committed it and only the answer was lost
    (a claim sent again takes a second delivery, a finish sent again finds the row settled,
    a commit sent again finds its ids taken)."""

    def __init__(self, dsn: str, store_class: type[PostgresDeliveryStore], connect: Connect) -> None:
        super().__init__(dsn, store_class, connect)
        self._dsn, self._store_class, self._connect = dsn, store_class, connect

    def execute(self, command: m.Command) -> m.Outcome:
        try:
            return super().execute(command)
        except (ConnectionLost, psycopg.OperationalError):
            self.conn.close()
            self.conn = self._connect(self._dsn)
            self.store, self.clock = self._store_class(self.conn), PinnedClock(self.conn)
            return super().execute(command)  # sent again, whatever became of the first


class _ResendingAdapter(PostgresDeliveryAdapter):
    def session(self) -> PostgresDeliverySession:
        return _ResendingSession(self.dsn, self.store_class, self.connect)


class _ResendingMutant(Mutant):
    def adapter(self, dsn: str) -> PostgresDeliveryAdapter:
        return _ResendingAdapter(dsn, self.store)


# Mutants only a fault between the implementation and its server shows: an answer lost after
# the server committed (`leaseproof nemesis --adapter-cmd` with the proxy's faults).
NETWORK_MUTANTS: tuple[Mutant, ...] = (
    _ResendingMutant(
        "resends-after-a-lost-answer",
        "a session sends a command again after its connection was lost: a claim whose answer was lost takes another",
        Store,
    ),
)
