"use strict";
// leaseproof's delivery machine, in memory, in plain Node.js: the durable
// delivery inbox with its leases, fencing and reaping, written from
// specs/delivery.md. Communities and the clock are common.js's, shared with
// the lifecycle machine; adapter.js puts both on the wire.

const { MICROS_PER_SECOND, fail, uuid, key, integer, instant, formatInstant, record, ACTIVE, CommunityMachine } = require("./common");

const OPERATIONS = [
  "CreateCommunity", "SetCommunityState", "DeleteCommunity",
  "CreateWorkflow", "DeleteWorkflow", "CreateRun", "DeleteRun",
  "PublishEvent", "DeleteEvent",
  "CommitDeliveries", "Claim", "Renew", "Finish", "Reap",
  "AdvanceClock", "GetDelivery",
];
const MAX_LEASE_SECONDS = 86400;
const TRIMMED = " \t\n\r\f\v";

function leaseSeconds(value, path) {
  integer(value, path);
  if (value < 1 || value > MAX_LEASE_SECONDS) fail(path, `must be between 1 and ${MAX_LEASE_SECONDS}`);
  return value;
}

function stepId(value, path) {
  if (typeof value !== "string") fail(path, "must be a string");
  let start = 0;
  let end = value.length;
  while (start < end && TRIMMED.includes(value[start])) start++;
  while (end > start && TRIMMED.includes(value[end - 1])) end--;
  if (start === end) fail(path, "must be non-empty after trimming whitespace");
  if ([...value].length > 64) fail(path, "must be at most 64 characters");
  if (value.includes("\0")) fail(path, "must not contain NUL");
  if (/[\uD800-\uDFFF]/u.test(value)) fail(path, "must be valid Unicode text (no lone surrogates)");
  return value; // stored untrimmed
}

// A cause is kept in its canonical wire form, so equal causes encode equally.
function cause(value, path) {
  const type = value && value.type;
  if (type === "EventCause") {
    record(value, type, ["event_id"], path);
    return { type, event_id: key(value.event_id, `${path}.event_id`) };
  }
  if (type === "ScheduleCause") {
    record(value, type, ["scheduled_for"], path);
    const at = instant(value.scheduled_for, `${path}.scheduled_for`);
    if (at % MICROS_PER_SECOND !== 0) fail(`${path}.scheduled_for`, "must be a whole-second instant");
    return { type, scheduled_for: formatInstant(at) };
  }
  if (type === "WebhookCause") {
    record(value, type, ["invocation_id"], path);
    return { type, invocation_id: uuid(value.invocation_id, `${path}.invocation_id`) };
  }
  return fail(path, `expected an EventCause, ScheduleCause or WebhookCause, got ${JSON.stringify(type)}`);
}

const BINDING_FIELDS = [
  "community_id", "workflow_id", "run_id", "step_id", "target_pubkey",
  "definition_event_id", "message_event_id", "cause",
];

function binding(value, path) {
  record(value, "Binding", BINDING_FIELDS, path);
  return {
    type: "Binding",
    community_id: uuid(value.community_id, `${path}.community_id`),
    workflow_id: uuid(value.workflow_id, `${path}.workflow_id`),
    run_id: uuid(value.run_id, `${path}.run_id`),
    step_id: stepId(value.step_id, `${path}.step_id`),
    target_pubkey: key(value.target_pubkey, `${path}.target_pubkey`),
    definition_event_id: key(value.definition_event_id, `${path}.definition_event_id`),
    message_event_id: key(value.message_event_id, `${path}.message_event_id`),
    cause: cause(value.cause, `${path}.cause`),
  };
}

// Every field, the cause's kind and identity included.
function sameBinding(a, b) {
  return BINDING_FIELDS.every((f) => (f === "cause" ? JSON.stringify(a.cause) === JSON.stringify(b.cause) : a[f] === b[f]));
}

function lease(value, path) {
  record(value, "Lease", ["community_id", "delivery_id", "target_pubkey", "lease_generation", "lease_until"], path);
  const generation = integer(value.lease_generation, `${path}.lease_generation`);
  if (generation < 0) fail(`${path}.lease_generation`, "must be non-negative");
  return {
    community_id: uuid(value.community_id, `${path}.community_id`),
    delivery_id: uuid(value.delivery_id, `${path}.delivery_id`),
    target_pubkey: key(value.target_pubkey, `${path}.target_pubkey`),
    lease_generation: generation,
    lease_until: instant(value.lease_until, `${path}.lease_until`), // informational: never used to decide
  };
}

function encodeDelivery(row) {
  return {
    type: "Delivery",
    id: row.id,
    binding: row.binding,
    status: row.status,
    lease_generation: row.lease_generation,
    lease_until: formatInstant(row.lease_until),
    claimed_at: formatInstant(row.claimed_at),
    finished_at: formatInstant(row.finished_at),
    created_at: formatInstant(row.created_at),
    // Protocol 3's field, sent only when set (as every field a version added).
    ...(row.claim_key === null ? {} : { claim_key: row.claim_key }),
  };
}

// A claim's request key: none, or 1 to 64 characters without surrounding whitespace.
function requestKey(value, path) {
  if (value == null) return null;
  if (typeof value !== "string" || value.length === 0 || [...value].length > 64 || value.trim() !== value) {
    fail(path, "must be null or 1 to 64 characters without surrounding whitespace");
  }
  return value;
}

// -- the machine ----------------------------------------------------------------

const PENDING = "pending";
const CLAIMED = "claimed";
const TERMINAL = ["finished", "failed"];

// Composite keys of the in-memory tables.
const k = (...parts) => parts.join("|");

class DeliveryMachine extends CommunityMachine {
  static MACHINE = "delivery";
  static OPERATIONS = OPERATIONS;

  reset(start) {
    super.reset(start);
    this.workflows = new Map(); // k(community, workflow) -> {community_id, id}
    this.runs = new Map(); // k(community, run) -> {community_id, id, workflow_id}
    this.events = new Map(); // k(community, event) -> {community_id, id}
    this.deliveries = new Map(); // k(community, id) -> row
    this.retired = new Map(); // k(community, id) -> {community_id, id}: deleted ids, never reused
  }

  // Remove every delivery `doomed` selects, retiring its id.
  dropDeliveries(doomed) {
    for (const [at, row] of this.deliveries) {
      if (doomed(row)) {
        this.deliveries.delete(at);
        this.retired.set(at, { community_id: row.binding.community_id, id: row.id });
      }
    }
  }

  // -- communities (creation, states and the clock: CommunityMachine) ---------------

  opDeleteCommunity(c) {
    record(c, "DeleteCommunity", ["community_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    if (!this.communities.has(cid)) return { type: "UnknownCommunity", community_id: cid };
    // The tombstone stays, so the id is never created again; it refuses every
    // write, so the community's retired ids can be forgotten with its rows.
    this.communities.set(cid, "deleted");
    for (const table of [this.workflows, this.runs, this.events, this.deliveries, this.retired]) {
      for (const at of [...table.keys()]) if (at.startsWith(cid + "|")) table.delete(at);
    }
    return { type: "Ok" };
  }

  // -- parents ----------------------------------------------------------------------

  opCreateWorkflow(c) {
    record(c, "CreateWorkflow", ["community_id", "workflow_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const wid = uuid(c.workflow_id, "command.workflow_id");
    const refusal = this.communityRefusal(cid);
    if (refusal) return refusal;
    if (this.workflows.has(k(cid, wid))) return { type: "AlreadyExists", entity: "workflow", community_id: cid, key: wid };
    this.workflows.set(k(cid, wid), { community_id: cid, id: wid });
    return { type: "Ok" };
  }

  opDeleteWorkflow(c) {
    record(c, "DeleteWorkflow", ["community_id", "workflow_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const wid = uuid(c.workflow_id, "command.workflow_id");
    const refusal = this.communityRefusal(cid);
    if (refusal) return refusal;
    if (!this.workflows.has(k(cid, wid))) return { type: "NotFound", entity: "workflow", community_id: cid, key: wid };
    this.workflows.delete(k(cid, wid));
    for (const [at, run] of [...this.runs]) if (run.community_id === cid && run.workflow_id === wid) this.runs.delete(at);
    this.dropDeliveries((row) => row.binding.community_id === cid && row.binding.workflow_id === wid);
    return { type: "Ok" };
  }

  opCreateRun(c) {
    record(c, "CreateRun", ["community_id", "workflow_id", "run_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const wid = uuid(c.workflow_id, "command.workflow_id");
    const rid = uuid(c.run_id, "command.run_id");
    const refusal = this.communityRefusal(cid);
    if (refusal) return refusal;
    if (!this.workflows.has(k(cid, wid))) return { type: "NotFound", entity: "workflow", community_id: cid, key: wid };
    if (this.runs.has(k(cid, rid))) return { type: "AlreadyExists", entity: "run", community_id: cid, key: rid };
    this.runs.set(k(cid, rid), { community_id: cid, id: rid, workflow_id: wid });
    return { type: "Ok" };
  }

  opDeleteRun(c) {
    record(c, "DeleteRun", ["community_id", "run_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const rid = uuid(c.run_id, "command.run_id");
    const refusal = this.communityRefusal(cid);
    if (refusal) return refusal;
    if (!this.runs.has(k(cid, rid))) return { type: "NotFound", entity: "run", community_id: cid, key: rid };
    this.runs.delete(k(cid, rid));
    this.dropDeliveries((row) => row.binding.community_id === cid && row.binding.run_id === rid);
    return { type: "Ok" };
  }

  opPublishEvent(c) {
    record(c, "PublishEvent", ["community_id", "event_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const eid = key(c.event_id, "command.event_id");
    const refusal = this.communityRefusal(cid);
    if (refusal) return refusal;
    if (this.events.has(k(cid, eid))) return { type: "AlreadyExists", entity: "event", community_id: cid, key: eid };
    this.events.set(k(cid, eid), { community_id: cid, id: eid });
    return { type: "Ok" };
  }

  opDeleteEvent(c) {
    record(c, "DeleteEvent", ["community_id", "event_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const eid = key(c.event_id, "command.event_id");
    const refusal = this.communityRefusal(cid);
    if (refusal) return refusal;
    if (!this.events.has(k(cid, eid))) return { type: "NotFound", entity: "event", community_id: cid, key: eid };
    this.events.delete(k(cid, eid));
    // Only the message event is a reference; definition ids and event causes are opaque.
    this.dropDeliveries((row) => row.binding.community_id === cid && row.binding.message_event_id === eid);
    return { type: "Ok" };
  }

  // -- deliveries -------------------------------------------------------------------

  opCommitDeliveries(c) {
    record(c, "CommitDeliveries", ["community_id", "run_id", "step_id", "deliveries"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const rid = uuid(c.run_id, "command.run_id");
    const step = stepId(c.step_id, "command.step_id");
    if (!Array.isArray(c.deliveries) || c.deliveries.length === 0) fail("command.deliveries", "must name at least one delivery");
    const news = c.deliveries.map((d, i) => {
      const path = `command.deliveries[${i}]`;
      record(d, "NewDelivery", ["id", "binding"], path);
      const b = binding(d.binding, `${path}.binding`);
      if (b.community_id !== cid || b.run_id !== rid || b.step_id !== step) {
        fail(`${path}.binding`, "community_id, run_id and step_id must equal the commit's");
      }
      return { id: uuid(d.id, `${path}.id`), binding: b };
    });

    const refusal = this.communityRefusal(cid);
    if (refusal) return refusal;
    const run = this.runs.get(k(cid, rid));
    if (run === undefined) return { type: "NotFound", entity: "run", community_id: cid, key: rid };
    for (const n of news) {
      if (n.binding.workflow_id !== run.workflow_id) {
        return { type: "WorkflowMismatch", run_id: rid, run_workflow_id: run.workflow_id, binding_workflow_id: n.binding.workflow_id };
      }
    }
    for (const n of news) {
      if (!this.events.has(k(cid, n.binding.message_event_id))) {
        return { type: "NotFound", entity: "event", community_id: cid, key: n.binding.message_event_id };
      }
    }

    const identity = (b) => k(b.community_id, b.run_id, b.step_id, b.target_pubkey);
    const rows = [...this.deliveries.values()];
    const identityExisted = rows.some((row) => row.binding.run_id === rid && row.binding.community_id === cid && row.binding.step_id === step);
    const taken = new Set(rows.map((row) => identity(row.binding)));
    const staged = new Map(); // k(community, id) -> new row; written only if every target passes
    for (const n of news) {
      if (taken.has(identity(n.binding))) continue; // a producer retry: this target is a no-op
      const at = k(cid, n.id);
      if (this.deliveries.has(at) || staged.has(at) || this.retired.has(at)) {
        return { type: "DeliveryIdTaken", community_id: cid, delivery_id: n.id }; // nothing is written
      }
      staged.set(at, {
        id: n.id,
        binding: n.binding,
        status: PENDING,
        lease_generation: 0,
        lease_until: null,
        claimed_at: null,
        finished_at: null,
        created_at: this.now,
        claim_key: null,
      });
      taken.add(identity(n.binding));
    }
    for (const [at, row] of staged) this.deliveries.set(at, row);
    return { type: "Committed", created: [...staged.values()].map((row) => row.id), identity_existed: identityExisted };
  }

  opClaim(c) {
    record(c, "Claim", ["community_id", "target_pubkey", "lease_seconds", "delivery_id", "expected", "request_key"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const target = key(c.target_pubkey, "command.target_pubkey");
    const seconds = leaseSeconds(c.lease_seconds, "command.lease_seconds");
    const wanted = c.delivery_id == null ? null : uuid(c.delivery_id, "command.delivery_id");
    const expected = c.expected == null ? null : binding(c.expected, "command.expected");
    const requested = requestKey(c.request_key, "command.request_key");

    // Check 2: an expected binding outside the request's scope is a miss, before anything else.
    if (expected !== null && (expected.community_id !== cid || expected.target_pubkey !== target)) {
      return { type: "ClaimMiss" };
    }
    const refusal = this.communityRefusal(cid);
    if (refusal) return refusal;
    // A retried claim: the lease its request key still holds, again, unchanged.
    if (requested !== null) {
      for (const row of this.deliveries.values()) {
        if (
          row.binding.community_id === cid &&
          row.binding.target_pubkey === target &&
          row.status === CLAIMED &&
          row.claim_key === requested &&
          row.lease_until >= this.now
        ) {
          return this.claimed(row, cid, target);
        }
      }
    }
    let oldest = null;
    for (const row of this.deliveries.values()) {
      if (
        row.binding.community_id === cid &&
        row.binding.target_pubkey === target &&
        row.status === PENDING &&
        (wanted === null || row.id === wanted) &&
        (expected === null || sameBinding(row.binding, expected))
      ) {
        // Oldest first: created_at, then id (lowercase UUID string order = byte order).
        if (oldest === null || row.created_at < oldest.created_at || (row.created_at === oldest.created_at && row.id < oldest.id)) {
          oldest = row;
        }
      }
    }
    if (oldest === null) return { type: "ClaimMiss" };
    if (this.mutant === "claim-read-then-update") {
      const row = oldest;
      return new Promise((resolve) => setImmediate(() => resolve(this.take(row, cid, target, seconds, requested))));
    }
    return this.take(oldest, cid, target, seconds, requested);
  }

  take(oldest, cid, target, seconds, requested) {
    oldest.status = CLAIMED;
    oldest.lease_generation += 1;
    oldest.lease_until = this.now + seconds * MICROS_PER_SECOND;
    oldest.claimed_at = this.now;
    oldest.claim_key = requested;
    return this.claimed(oldest, cid, target);
  }

  claimed(oldest, cid, target) {
    return {
      type: "Claimed",
      lease: {
        type: "Lease",
        community_id: cid,
        delivery_id: oldest.id,
        target_pubkey: target,
        lease_generation: oldest.lease_generation,
        lease_until: formatInstant(oldest.lease_until),
      },
      delivery: encodeDelivery(oldest),
    };
  }

  // The row a lease still governs: claimed, at the lease's generation, for the
  // lease's target, and unexpired on this machine's clock (the boundary is
  // inclusive for the holder). The lease's own lease_until is not consulted.
  held(l) {
    const row = this.deliveries.get(k(l.community_id, l.delivery_id));
    if (
      row !== undefined &&
      row.status === CLAIMED &&
      row.lease_generation === l.lease_generation &&
      row.binding.target_pubkey === l.target_pubkey &&
      row.lease_until >= this.now
    ) {
      return row;
    }
    return null;
  }

  opRenew(c) {
    record(c, "Renew", ["lease", "lease_seconds"], "command");
    const l = lease(c.lease, "command.lease");
    const seconds = leaseSeconds(c.lease_seconds, "command.lease_seconds");
    const refusal = this.communityRefusal(l.community_id);
    if (refusal) return refusal;
    const row = this.held(l);
    if (row === null) return { type: "LeaseLost" };
    row.lease_until = this.now + seconds * MICROS_PER_SECOND; // may shorten the lease
    return { type: "Renewed", lease_until: formatInstant(row.lease_until) };
  }

  opFinish(c) {
    record(c, "Finish", ["lease", "outcome"], "command");
    const l = lease(c.lease, "command.lease");
    if (!TERMINAL.includes(c.outcome)) fail("command.outcome", "must be finished or failed");
    const refusal = this.communityRefusal(l.community_id);
    if (refusal) return refusal; // a retry that would only reconcile is refused too
    const row = this.held(l);
    if (row !== null) {
      row.status = c.outcome;
      row.finished_at = this.now;
      row.lease_until = null;
      row.claimed_at = null;
      row.claim_key = null;
      return { type: "Settled", status: c.outcome };
    }
    // Reconciliation of an uncertain completion: only the holder that settled
    // the row (same generation and target; finish never bumps the generation)
    // is told the recorded terminal. Everyone else lost the lease.
    const recorded = this.deliveries.get(k(l.community_id, l.delivery_id));
    if (
      recorded !== undefined &&
      TERMINAL.includes(recorded.status) &&
      (this.mutant === "reconcile-unfenced" || recorded.lease_generation === l.lease_generation) &&
      recorded.binding.target_pubkey === l.target_pubkey
    ) {
      return { type: "AlreadyTerminal", status: recorded.status };
    }
    return { type: "LeaseLost" };
  }

  opReap(c) {
    record(c, "Reap", [], "command");
    let count = 0;
    for (const row of this.deliveries.values()) {
      if (row.status === CLAIMED && row.lease_until < this.now && this.communities.get(row.binding.community_id) === ACTIVE) {
        row.status = PENDING;
        row.lease_generation += 1;
        row.lease_until = null;
        row.claimed_at = null;
        row.claim_key = null;
        count++;
      }
    }
    return { type: "Reaped", count };
  }

  opGetDelivery(c) {
    record(c, "GetDelivery", ["community_id", "delivery_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const id = uuid(c.delivery_id, "command.delivery_id");
    const row = this.deliveries.get(k(cid, id)); // a read: no community check
    if (row === undefined) return { type: "NotFound", entity: "delivery", community_id: cid, key: id };
    return { type: "Found", delivery: encodeDelivery(row) };
  }

  // -- the whole persisted state ----------------------------------------------------

  snapshot() {
    const sorted = (rows, by) => rows.sort((a, b) => (by(a) < by(b) ? -1 : by(a) > by(b) ? 1 : 0));
    const byKey = (row) => k(row.community_id, row.id);
    return {
      type: "DeliverySystem",
      now: formatInstant(this.now),
      communities: sorted([...this.communities].map(([id, state]) => ({ id, state })), (row) => row.id),
      workflows: sorted([...this.workflows.values()].map((row) => ({ ...row })), byKey),
      runs: sorted([...this.runs.values()].map((row) => ({ ...row })), byKey),
      events: sorted([...this.events.values()].map((row) => ({ ...row })), byKey),
      deliveries: sorted([...this.deliveries.values()].map(encodeDelivery), (row) => k(row.binding.community_id, row.id)),
      retired: sorted([...this.retired.values()].map((row) => ({ ...row })), byKey),
    };
  }
}

module.exports = { DeliveryMachine };
