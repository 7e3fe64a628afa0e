"use strict";
// The definition lifecycle and run admission machine, in memory, in plain Node.js.
//
// Written from specs/lifecycle.md (the machine) and specs/adapter-protocol.md
// (its values): signed definition saves and canonical deletions with cutoffs,
// member authority per channel, two replicas whose caches of enabled records
// expire after CACHE_TTL, admission of a fired run against the current row,
// and resumes that fail closed. Communities and the clock are common.js's,
// shared with the delivery machine; adapter.js puts both on the wire.

const crypto = require("crypto");
const { MICROS_PER_SECOND, fail, uuid, key, integer, instant, formatInstant, record, CommunityMachine } = require("./common");

const OPERATIONS = [
  "CreateCommunity", "SetCommunityState", "SetAuthority", "SaveDefinition", "DeleteDefinition",
  "AlternateDelete", "RefreshCache", "Fire", "ResumeRun", "AdvanceClock",
];
const REPLICAS = ["r1", "r2"];
const CACHE_TTL_SECONDS = 10;
const MAX_ACTIONS = 8;
const DOORS = ["event", "schedule", "manual", "webhook"];
const ALTERNATE_DELETIONS = ["name", "numeric-alias", "event-id-target", "admin", "report-enforcement", "report-enforcement-retry"];
const coordinate = (cid, wid) => `${cid}/${wid}`;
const member = (cid, channel, who) => `${cid}/${channel}/${who}`;

function actions(value, path) {
  if (!Array.isArray(value) || value.length < 1 || value.length > MAX_ACTIONS) fail(path, `must be 1 to ${MAX_ACTIONS} actions`);
  for (const action of value) {
    if (typeof action !== "string" || action.trim() === "" || [...action].length > 64 || action.includes("\0") || /[\uD800-\uDFFF]/u.test(action)) {
      fail(path, "each action must be non-blank text of at most 64 characters");
    }
  }
  return [...value];
}

function definition(value, path) {
  record(value, "Definition", ["actions", "enabled"], path);
  const enabled = value.enabled === undefined ? null : value.enabled;
  if (enabled !== null && typeof enabled !== "boolean") fail(`${path}.enabled`, "must be true, false or omitted");
  return { type: "Definition", actions: actions(value.actions, `${path}.actions`), enabled };
}

// SHA-256 of the content's canonical JSON (sorted keys, no spaces, every
// character from DEL (0x7f) on escaped as \uXXXX, an astral one as its
// surrogate pair), as specs/lifecycle.md defines the definition hash.
function hash(def) {
  const json = JSON.stringify({ actions: def.actions, enabled: def.enabled }).replace(
    /[\u007f-\uffff]/g,
    (ch) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
  return crypto.createHash("sha256").update(json, "utf8").digest("hex");
}

function choice(value, choices, path) {
  if (!choices.includes(value)) fail(path, `must be one of ${choices.join(", ")}`);
  return value;
}

function text(value, path) {
  if (typeof value !== "string") fail(path, "must be a string");
  return value;
}

class LifecycleMachine extends CommunityMachine {
  static MACHINE = "lifecycle";
  static OPERATIONS = OPERATIONS;

  reset(start) {
    super.reset(start);
    this.authority = new Map(); // community/channel/member -> [community, channel, member]
    this.heads = new Map(); // coordinate -> head
    this.runtime = new Map(); // coordinate -> record
    this.cutoffs = new Map(); // coordinate -> instant
    this.runs = new Map(); // run id -> run
    this.executed = new Map(); // run id -> actions
    this.caches = new Map(REPLICAS.map((r) => [r, { loaded_at: start, records: new Map() }]));
  }

  enabledRecords() {
    return new Map([...this.runtime].filter(([, r]) => r.enabled));
  }

  // -- authority (communities and the clock: CommunityMachine) -----------------

  opSetAuthority(c) {
    record(c, "SetAuthority", ["community_id", "channel_id", "member", "active"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const channel = uuid(c.channel_id, "command.channel_id");
    const who = key(c.member, "command.member");
    if (typeof c.active !== "boolean") fail("command.active", "must be true or false");
    const refused = this.communityRefusal(cid);
    if (refused) return refused;
    if (c.active) this.authority.set(member(cid, channel, who), [cid, channel, who]);
    else this.authority.delete(member(cid, channel, who));
    return { type: "Ok" };
  }

  // -- definitions ------------------------------------------------------------

  opSaveDefinition(c) {
    record(c, "SaveDefinition", ["event"], "command");
    const e = c.event;
    record(e, "DefinitionEvent", ["event_id", "community_id", "workflow_id", "author", "channel_id", "created_at", "definition"], "command.event");
    const event = {
      event_id: key(e.event_id, "command.event.event_id"),
      community_id: uuid(e.community_id, "command.event.community_id"),
      workflow_id: uuid(e.workflow_id, "command.event.workflow_id"),
      author: key(e.author, "command.event.author"),
      channel_id: uuid(e.channel_id, "command.event.channel_id"),
      created_at: instant(e.created_at, "command.event.created_at"),
      definition: definition(e.definition, "command.event.definition"),
    };
    const at = coordinate(event.community_id, event.workflow_id);
    const refused = this.communityRefusal(event.community_id);
    if (refused) return refused;
    if (!this.authority.has(member(event.community_id, event.channel_id, event.author))) {
      return { type: "NoAuthority", channel_id: event.channel_id, member: event.author };
    }
    const head = this.heads.get(at);
    if (head && (head.author !== event.author || head.channel_id !== event.channel_id)) {
      return { type: "NotAuthor", workflow_id: event.workflow_id, author: event.author };
    }
    if (head && event.created_at <= head.created_at) return { type: "Superseded", head_created_at: formatInstant(head.created_at) };
    const cutoff = this.cutoffs.get(at);
    if (!head && cutoff !== undefined && event.created_at <= cutoff) return { type: "BeforeCutoff", cutoff: formatInstant(cutoff) };
    // An update keeps the incarnation; a (re)creation starts a new one.
    const incarnation = head ? this.runtime.get(at).incarnation : event.created_at;
    const def = event.definition;
    this.heads.set(at, { event_id: event.event_id, author: event.author, channel_id: event.channel_id, created_at: event.created_at, definition: def });
    const projected = {
      community_id: event.community_id,
      workflow_id: event.workflow_id,
      owner: event.author,
      channel_id: event.channel_id,
      hash: hash(def),
      enabled: def.enabled !== false,
      incarnation,
      actions: def.actions,
      revision: event.event_id,
    };
    this.runtime.set(at, projected);
    if (!head) return { type: "Created", incarnation: formatInstant(incarnation) };
    return { type: "Updated", enabled: projected.enabled };
  }

  opDeleteDefinition(c) {
    record(c, "DeleteDefinition", ["community_id", "workflow_id", "author", "created_at"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    const wid = uuid(c.workflow_id, "command.workflow_id");
    const author = key(c.author, "command.author");
    const at = instant(c.created_at, "command.created_at");
    const refused = this.communityRefusal(cid);
    if (refused) return refused;
    const head = this.heads.get(coordinate(cid, wid));
    if (!head) return { type: "NotFound", entity: "workflow", community_id: cid, key: wid };
    if (head.author !== author) return { type: "NotAuthor", workflow_id: wid, author };
    if (!this.authority.has(member(cid, head.channel_id, author))) return { type: "NoAuthority", channel_id: head.channel_id, member: author };
    if (at < head.created_at) return { type: "Superseded", head_created_at: formatInstant(head.created_at) };
    // Tombstone, runtime removal and cutoff, together.
    this.heads.delete(coordinate(cid, wid));
    this.runtime.delete(coordinate(cid, wid));
    this.cutoffs.set(coordinate(cid, wid), at);
    return { type: "Deleted", cutoff: formatInstant(at) };
  }

  opAlternateDelete(c) {
    record(c, "AlternateDelete", ["community_id", "workflow_id", "path"], "command");
    uuid(c.community_id, "command.community_id");
    uuid(c.workflow_id, "command.workflow_id");
    return { type: "AlternateDeletionRejected", path: choice(c.path, ALTERNATE_DELETIONS, "command.path") };
  }

  // -- replicas, admission and resumes ----------------------------------------

  opRefreshCache(c) {
    record(c, "RefreshCache", ["replica"], "command");
    const replica = text(c.replica, "command.replica");
    if (!this.caches.has(replica)) return { type: "UnknownReplica", replica };
    this.caches.set(replica, { loaded_at: this.now, records: this.enabledRecords() });
    return { type: "Ok" };
  }

  // The admission guard: the first check that fails, or null.
  admissionRefusal(rec) {
    const current = this.runtime.get(coordinate(rec.community_id, rec.workflow_id));
    if (!current) return "gone";
    if (!current.enabled) return "disabled";
    const fields = (r) => JSON.stringify([r.owner, r.channel_id, r.hash, r.incarnation, r.actions]);
    if (fields(current) !== fields(rec)) return "changed";
    if (!this.authority.has(member(current.community_id, current.channel_id, current.owner))) return "unauthorised";
    return null;
  }

  opFire(c) {
    record(c, "Fire", ["replica", "door", "community_id", "workflow_id"], "command");
    const replica = text(c.replica, "command.replica");
    const door = choice(c.door, DOORS, "command.door");
    const cid = uuid(c.community_id, "command.community_id");
    const wid = uuid(c.workflow_id, "command.workflow_id");
    let cache = this.caches.get(replica);
    if (!cache) return { type: "UnknownReplica", replica };
    const refused = this.communityRefusal(cid);
    if (refused) return refused;
    if (this.now - cache.loaded_at >= CACHE_TTL_SECONDS * MICROS_PER_SECOND) {
      cache = { loaded_at: this.now, records: this.enabledRecords() }; // an expired cache reloads before it serves
      this.caches.set(replica, cache);
    }
    const selected = cache.records.get(coordinate(cid, wid));
    if (!selected) return { type: "NotSelected" };
    const trusting = this.mutant === "admission-trusts-cache";
    if (!trusting && this.admissionRefusal(selected)) return { type: "AdmissionRefused" };
    // The run pins the row it was admitted against: the selected content, at its current revision.
    const admitted = trusting ? selected : this.runtime.get(coordinate(cid, wid));
    const runId = Math.max(0, ...this.runs.keys()) + 1;
    this.runs.set(runId, { run_id: runId, door, record: admitted, admitted_at: this.now });
    this.executed.set(runId, [...admitted.actions]);
    return { type: "Admitted", run_id: runId, record: encodeRecord(admitted) };
  }

  opResumeRun(c) {
    record(c, "ResumeRun", ["run_id"], "command");
    const runId = integer(c.run_id, "command.run_id");
    if (runId < 1) fail("command.run_id", "must be a positive integer");
    const run = this.runs.get(runId);
    if (!run) return { type: "UnknownRun", run_id: runId };
    const state = this.communities.get(run.record.community_id);
    if (state !== "active") return { type: "CommunityNotWritable", community_id: run.record.community_id, state };
    if (this.admissionRefusal(run.record)) return { type: "ResumeRefused" };
    // Any accepted save since admission (even one restoring the same content) is a new revision.
    const current = this.runtime.get(coordinate(run.record.community_id, run.record.workflow_id));
    if (JSON.stringify(encodeRecord(current)) !== JSON.stringify(encodeRecord(run.record))) return { type: "ResumeRefused" };
    this.executed.set(runId, [...this.executed.get(runId), ...run.record.actions]);
    return { type: "Resumed", actions: [...run.record.actions] };
  }

  snapshot() {
    const split = (at) => at.split("/");
    return {
      type: "LifecycleSystem",
      now: formatInstant(this.now),
      communities: [...this.communities].map(([id, state]) => ({ id, state })),
      authority: [...this.authority.values()].map(([community_id, channel_id, who]) => ({ community_id, channel_id, member: who })),
      heads: [...this.heads].map(([at, h]) => {
        const [community_id, workflow_id] = split(at);
        const head = { type: "Head", event_id: h.event_id, author: h.author, channel_id: h.channel_id, created_at: formatInstant(h.created_at), definition: h.definition };
        return { community_id, workflow_id, head };
      }),
      runtime: [...this.runtime.values()].map(encodeRecord),
      cutoffs: [...this.cutoffs].map(([at, cutoff]) => {
        const [community_id, workflow_id] = split(at);
        return { community_id, workflow_id, cutoff: formatInstant(cutoff) };
      }),
      runs: [...this.runs.values()].map((run) => ({
        type: "Run", run_id: run.run_id, door: run.door, record: encodeRecord(run.record), admitted_at: formatInstant(run.admitted_at),
      })),
      caches: [...this.caches].map(([replica, cache]) => ({
        replica,
        cache: { type: "Cache", loaded_at: formatInstant(cache.loaded_at), records: [...cache.records.values()].map(encodeRecord) },
      })),
      executed: [...this.executed].map(([run_id, done]) => ({ run_id, actions: [...done] })),
    };
  }
}

function encodeRecord(r) {
  return {
    type: "Record",
    community_id: r.community_id,
    workflow_id: r.workflow_id,
    owner: r.owner,
    channel_id: r.channel_id,
    hash: r.hash,
    enabled: r.enabled,
    incarnation: formatInstant(r.incarnation),
    actions: [...r.actions],
    revision: r.revision,
  };
}

module.exports = { LifecycleMachine };
