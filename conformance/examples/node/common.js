"use strict";
// What both machines of the Node example share: the canonical encoding of
// values (specs/adapter-protocol.md, section 7: decode = validate + normalise;
// encode = the wire form) and the operations on communities and the clock
// that the delivery and lifecycle machines both have (`CommunityMachine`,
// which each machine extends).

const MICROS_PER_SECOND = 1000000;

// -- canonical values -------------------------------------------------------------

class BadValue extends Error {}

function fail(path, problem) {
  throw new BadValue(`${path}: ${problem}`);
}

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const KEY_RE = /^[0-9a-f]{64}$/; // 32 bytes as lowercase hex
const INSTANT_RE = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{6})Z$/;
const TRIMMED = " \t\n\r\f\v";

// UUIDs stay lowercase hyphenated strings: their string order is their byte order.
function uuid(value, path) {
  if (typeof value !== "string" || !UUID_RE.test(value)) fail(path, `expected a lowercase UUID, got ${JSON.stringify(value)}`);
  return value;
}

// 32-byte keys stay lowercase hex strings.
function key(value, path) {
  if (typeof value !== "string" || !KEY_RE.test(value)) fail(path, `expected 32 bytes as 64 lowercase hex digits, got ${JSON.stringify(value)}`);
  return value;
}

function integer(value, path) {
  if (typeof value !== "number" || !Number.isSafeInteger(value)) fail(path, `expected an integer, got ${JSON.stringify(value)}`);
  return value;
}

// Instants are kept as integer microseconds since the Unix epoch: a double
// holds those exactly for the years 1685-2255, so clock arithmetic never rounds.
function instant(value, path) {
  const m = typeof value === "string" ? INSTANT_RE.exec(value) : null;
  if (!m) fail(path, `expected an instant like 2026-01-01T00:00:00.000000Z, got ${JSON.stringify(value)}`);
  const [y, mo, d, h, mi, s, micros] = m.slice(1).map(Number);
  const date = new Date(0);
  date.setUTCFullYear(y, mo - 1, d); // not Date.UTC: it maps years 0-99 to 1900-1999
  date.setUTCHours(h, mi, s, 0);
  const result = (date.getTime() / 1000) * MICROS_PER_SECOND + micros;
  if (!Number.isSafeInteger(result)) fail(path, `${JSON.stringify(value)} is outside the years 1685-2255 this adapter keeps exactly`);
  // Date rolls 2026-02-30 over into March; an instant must read back unchanged.
  if (formatInstant(result) !== value) fail(path, `${JSON.stringify(value)} is not a valid instant`);
  return result;
}

function formatInstant(micros) {
  if (micros === null) return null;
  const seconds = Math.floor(micros / MICROS_PER_SECOND);
  const fraction = String(micros - seconds * MICROS_PER_SECOND).padStart(6, "0");
  return new Date(seconds * 1000).toISOString().slice(0, 19) + "." + fraction + "Z";
}

function record(value, type, fields, path) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) fail(path, `expected a ${type} object`);
  if (value.type !== type) fail(`${path}.type`, `expected ${JSON.stringify(type)}, got ${JSON.stringify(value.type)}`);
  for (const name of Object.keys(value)) {
    if (name !== "type" && !fields.includes(name)) fail(path, `unknown member ${JSON.stringify(name)} for ${type}`);
  }
  return value;
}

// -- communities and the clock ------------------------------------------------------

const ACTIVE = "active";
const COMMUNITY_STATES = ["active", "quiescing", "fenced"]; // "deleted" only via the delivery's DeleteCommunity

// A machine with communities and a pinned clock: CreateCommunity,
// SetCommunityState and AdvanceClock, the community check every write makes,
// and the dispatch of a command to its `op<Type>` method. A subclass names its
// machine and operations (static MACHINE, OPERATIONS) and extends `reset`.
class CommunityMachine {
  // `mutant`: the name of a deliberate bug the machine plays, or null.
  constructor({ mutant = null } = {}) {
    this.mutant = mutant;
    this.reset(0);
  }

  reset(start) {
    this.now = start; // the pinned clock, integer microseconds
    this.communities = new Map(); // community -> state
  }

  execute(command) {
    if (command === null || typeof command !== "object" || Array.isArray(command)) fail("command", "expected an object");
    const handler = this[`op${command.type}`];
    if (!this.constructor.OPERATIONS.includes(command.type) || typeof handler !== "function") {
      fail("command.type", `unknown ${this.constructor.MACHINE} command ${JSON.stringify(command.type)}`);
    }
    return handler.call(this, command);
  }

  // Unknown, or not active, refuses every write.
  communityRefusal(community) {
    const state = this.communities.get(community);
    if (state === undefined) return { type: "UnknownCommunity", community_id: community };
    if (state !== ACTIVE) return { type: "CommunityNotWritable", community_id: community, state };
    return null;
  }

  opCreateCommunity(c) {
    record(c, "CreateCommunity", ["community_id"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    if (this.communities.has(cid)) return { type: "AlreadyExists", entity: "community", community_id: cid, key: cid };
    this.communities.set(cid, ACTIVE);
    return { type: "Ok" };
  }

  opSetCommunityState(c) {
    record(c, "SetCommunityState", ["community_id", "state"], "command");
    const cid = uuid(c.community_id, "command.community_id");
    if (!COMMUNITY_STATES.includes(c.state)) fail("command.state", "must be active, quiescing or fenced");
    const current = this.communities.get(cid);
    if (current === undefined) return { type: "UnknownCommunity", community_id: cid };
    if (current === "deleted") return { type: "CommunityNotWritable", community_id: cid, state: current };
    this.communities.set(cid, c.state);
    return { type: "Ok" };
  }

  opAdvanceClock(c) {
    record(c, "AdvanceClock", ["by"], "command");
    const by = integer(c.by, "command.by"); // microseconds
    if (by <= 0) fail("command.by", "must be positive");
    if (!Number.isSafeInteger(this.now + by)) fail("command.by", "moves the clock past what this adapter keeps exactly");
    this.now += by;
    return { type: "Ok" };
  }
}

module.exports = { MICROS_PER_SECOND, BadValue, fail, uuid, key, integer, instant, formatInstant, record, ACTIVE, CommunityMachine };
