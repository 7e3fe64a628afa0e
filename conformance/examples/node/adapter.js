#!/usr/bin/env node
// An in-memory implementation of both of leaseproof's machines, the delivery
// machine (delivery.js) and the lifecycle machine (lifecycle.js), with what
// they share in common.js, put on the wire in plain Node.js.
//
//     node adapter.js [--mutant NAME]
//
// Written from specs/delivery.md and specs/lifecycle.md (the machines) and
// specs/adapter-protocol.md (the wire, protocol version 3): it reads one JSON
// request per line on stdin and writes one JSON reply per line on stdout.
// stdout carries protocol lines only; diagnostics go to stderr. Check it with:
//
//     leaseproof verify --adapter-cmd "node conformance/examples/node/adapter.js"
//     leaseproof stress --adapter-cmd "node conformance/examples/node/adapter.js"
//
// `--mutant NAME` reintroduces a known bug, to show that leaseproof catches a
// bug in a foreign implementation (the list is below).
//
// No npm packages: only Node's own `readline` and `crypto`.

"use strict";

const readline = require("readline");
const { BadValue, fail, instant } = require("./common");
const { DeliveryMachine } = require("./delivery");
const { LifecycleMachine } = require("./lifecycle");

// The protocol versions this adapter speaks. Asked for 1 (a harness of version
// 1), it is a version-1 adapter: the delivery machine alone, without sessions.
// Version 3 adds a claim's request key (a harness of version 2 sends none).
const PROTOCOL = 3;
const IMPLEMENTATION = "node in-memory";
// reconcile-unfenced: the seeds' first review finding (verify catches it).
// claim-read-then-update: a claim picks its row, yields to the event loop, then
// takes the row without looking again, so two sessions' claims can both take
// one row (only concurrency shows it: stress catches it, verify cannot).
// admission-trusts-cache (lifecycle): a fire admits the record its replica's
// cache holds without checking it against the current row, the seeds' stale
// cross-replica admission (verify catches it).
const MUTANTS = ["reconcile-unfenced", "claim-read-then-update", "admission-trusts-cache"];

const USAGE = `usage: node adapter.js [--mutant ${MUTANTS.join("|")}]

Speaks leaseproof's adapter protocol (specs/adapter-protocol.md) on stdin/stdout.
  --mutant NAME   serve a known-buggy variant:
                  reconcile-unfenced      finish's reconciliation ignores the lease generation
                  claim-read-then-update  a claim takes the row it read without looking again
                  admission-trusts-cache  a fire admits what its replica's cache holds
`;

// -- arguments ------------------------------------------------------------------

function parseArgs(argv) {
  let mutant = null;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    let value;
    if (arg === "--mutant") {
      value = argv[++i];
    } else if (arg.startsWith("--mutant=")) {
      value = arg.slice("--mutant=".length);
    } else if (arg === "-h" || arg === "--help") {
      process.stdout.write(USAGE);
      process.exit(0);
    } else {
      usageError(`unknown argument ${JSON.stringify(arg)}`);
    }
    if (mutant !== null) usageError("--mutant given twice");
    if (!MUTANTS.includes(value)) usageError(`--mutant needs one of: ${MUTANTS.join(", ")}`);
    mutant = value;
  }
  return { mutant };
}

function usageError(problem) {
  process.stderr.write(`adapter.js: ${problem}\n${USAGE}`);
  process.exit(2);
}

// -- the wire -------------------------------------------------------------------------

function main() {
  const { mutant } = parseArgs(process.argv.slice(2));
  const machines = { delivery: new DeliveryMachine({ mutant }), lifecycle: new LifecycleMachine({ mutant }) };
  const implementation = mutant ? `${IMPLEMENTATION} [mutant: ${mutant}]` : IMPLEMENTATION;
  // What the handshake agreed: version 3 (request keys), 2 (both machines, sessions), or 1.
  let protocol = PROTOCOL;
  const served = () => (protocol >= 2 ? ["delivery", "lifecycle"] : ["delivery"]);

  function machineParam(params) {
    const names = served();
    if (!names.includes(params.machine)) fail("params.machine", `this adapter serves ${names.map((m) => JSON.stringify(m)).join(" and ")}, not ${JSON.stringify(params.machine)}`);
    return params.machine;
  }

  // Sessions (concurrent clients for `leaseproof stress`): this machine lives in
  // one single-threaded process, so each command runs whole before the next
  // starts, whichever session sent it; a session is only a name.
  const sessions = new Set();
  const sessionParam = (params, open) => {
    if (protocol < 2) fail("method", `protocol ${protocol} has no sessions`);
    const which = machineParam(params);
    const name = params.session;
    if (typeof name !== "string" || name === "") fail("params.session", "expected a non-empty string");
    const session = `${which}/${name}`;
    if (open === sessions.has(session)) fail("params.session", open ? `session ${JSON.stringify(name)} is already open` : `no session ${JSON.stringify(name)} is open`);
    return session;
  };

  const methods = {
    // The newest version both speak: the harness names its newest in params.protocol.
    hello: (params) => {
      const asked = params.protocol === undefined ? PROTOCOL : params.protocol;
      if (!Number.isSafeInteger(asked) || asked < 1) fail("params.protocol", `expected a version, an integer from 1, not ${JSON.stringify(asked)}`);
      protocol = Math.min(asked, PROTOCOL);
      const result = { protocol, implementation, machines: {} };
      for (const name of served()) result.machines[name] = machines[name].constructor.OPERATIONS;
      if (protocol >= 2) result.sessions = true;
      return result;
    },
    open_session: (params) => {
      sessions.add(sessionParam(params, true));
      return null;
    },
    close_session: (params) => {
      sessions.delete(sessionParam(params, false));
      return null;
    },
    reset: (params) => {
      machines[machineParam(params)].reset(instant(params.start, "params.start"));
      return null;
    },
    execute: (params) => {
      const which = machineParam(params);
      if (params.session !== undefined) sessionParam(params, false);
      return machines[which].execute(params.command);
    },
    snapshot: (params) => machines[machineParam(params)].snapshot(),
    close: () => null,
  };

  const send = (reply, then) => process.stdout.write(JSON.stringify(reply) + "\n", then);
  process.stdout.on("error", (err) => {
    // The harness went away (EPIPE): nobody is listening any more.
    process.stderr.write(`adapter.js: stdout: ${err.message}\n`);
    process.exit(1);
  });
  process.stderr.write(`${implementation}: ready (protocol ${PROTOCOL}, or 1 if asked)\n`);

  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  lines.on("line", (line) => {
    if (line.trim() === "") return;
    let request;
    try {
      request = JSON.parse(line);
    } catch (err) {
      send({ id: null, fault: { message: `request is not JSON: ${err.message}` } });
      return;
    }
    const isObject = request !== null && typeof request === "object" && !Array.isArray(request);
    const id = isObject && request.id !== undefined ? request.id : null;
    const method = isObject ? request.method : undefined;
    const faultOf = (err) => {
      // Never crash on a request: report it as a fault and keep serving.
      const kind = err instanceof BadValue ? "invalid request" : `${err.name || "Error"}`;
      process.stderr.write(`adapter.js: ${method}: ${err.stack || err}\n`);
      return { id, fault: { message: `${kind}: ${err.message}` } };
    };
    let result;
    try {
      if (!Object.prototype.hasOwnProperty.call(methods, method)) fail("method", `unknown method ${JSON.stringify(method)}`);
      const params = request.params ?? {};
      if (typeof params !== "object" || Array.isArray(params)) fail("params", "expected an object");
      result = methods[method](params);
    } catch (err) {
      send(faultOf(err));
      return;
    }
    if (method === "close") {
      lines.close();
      send({ id, result }, () => process.exit(0));
    } else if (result instanceof Promise) {
      // Answered when it settles; other requests go on meanwhile (replies are matched by id).
      result.then((value) => send({ id, result: value }), (err) => send(faultOf(err)));
    } else {
      send({ id, result });
    }
  });
  lines.on("close", () => {
    // End of input without "close": the harness is gone; stop quietly.
  });
}

main();
