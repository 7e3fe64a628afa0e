#!/usr/bin/env node
// graphile-worker behind leaseproof's queue lines, as pgboss.mjs: one JSON request per line on
// stdin, one JSON reply per line on stdout (each with its request's id; requests run at once).
//
//     node graphile.mjs '{"host": ..., "port": ..., "user": ..., "database": ..., "options": ...}'
//
// Only graphile-worker's public API: runMigrations, makeWorkerUtils (addJob), runTaskList, a
// pool's id and gracefulShutdown(), and the events it emits. graphile-worker has no call that
// takes one job: worker pools take jobs and run task handlers. So a fetch starts a pool of one
// worker whose handler holds the job on a promise, and shuts the pool down at once, from inside
// the event that says what its one getJob found, so that it takes no other job. The holder is
// that pool (its id is the job's locked_by). A completion settles the promise and waits for the
// pool's shutdown, which (with the batch delays at 0) waits for graphile's write of the outcome.
// A rescue is graphile's own stale-lock reset (locked_at older than 4 hours), run by a pool
// whose reset timer fires at once and whose one task is never enqueued.
import { EventEmitter } from "node:events";
import { createRequire } from "node:module";
import { serve } from "./lines.mjs";
import pg from "pg";
import gw from "graphile-worker";

const require = createRequire(import.meta.url);
const VERSION = require("graphile-worker/package.json").version;
const TASK = "leaseproof";
const NEVER = "leaseproof_rescue_only"; // a task nobody enqueues: the rescue pool's worker takes nothing
const ATTEMPTS = 1000; // a failure or a rescue returns the job to the queue
const quiet = new gw.Logger(() => () => {});

const config = JSON.parse(process.argv[2]);
const pgPool = new pg.Pool({ ...config, max: 60 });
pgPool.on("error", (error) => process.stderr.write(`pg: ${error.message}\n`));

function deferred() {
  let resolve, reject;
  const promise = new Promise((a, b) => { resolve = a; reject = b; });
  return { promise, resolve, reject };
}

function options(events, extra = {}) {
  return {
    pgPool, events, logger: quiet, concurrency: 1, noHandleSignals: true,
    pollInterval: 2147483647, // never poll on a timer: the pool stops after its first getJob
    gracefulShutdownAbortTimeout: 2147483647, // a held job is never aborted
    preset: { worker: { completeJobBatchDelay: 0, failJobBatchDelay: 0 } }, // shutdown waits for the write
    ...extra,
  };
}

const holders = new Map(); // pool id -> { job, release: deferred, stopped: promise }
const succeeded = new Set(); // jobs a success was reported for (graphile deletes their rows)
let utils;

async function fetch() {
  const events = new EventEmitter();
  const found = deferred();
  let pool;
  let stopped;
  const stop = () => {
    stopped ??= Promise.resolve(pool.gracefulShutdown("leaseproof: one job per pool"));
    return stopped;
  };
  const taskList = {
    [TASK]: (payload, helpers) => {
      const release = deferred();
      stop();
      found.resolve({ job: String(helpers.job.id), release });
      return release.promise;
    },
  };
  events.once("worker:getJob:empty", () => { stop(); found.resolve(null); });
  events.once("worker:getJob:error", ({ error }) => { stop(); found.reject(error); });
  events.on("job:success", ({ job }) => succeeded.add(String(job.id)));
  pool = gw.runTaskList(options(events), taskList, pgPool);
  const got = await found.promise;
  if (got === null) {
    await stopped;
    return null;
  }
  holders.set(pool.id, { job: got.job, release: got.release, stopped: stop() });
  return { job: got.job, holder: pool.id };
}

async function complete({ holder, outcome }) {
  const held = holders.get(holder);
  if (!held) return "refused"; // this holder completed already: graphile has no second completion
  holders.delete(holder);
  if (outcome === "finished") held.release.resolve();
  else held.release.reject(new Error("leaseproof: the holder failed the job"));
  await held.stopped;
  return null; // graphile-worker says nothing; the rows decide
}

async function rescue() {
  const events = new EventEmitter();
  const done = deferred();
  events.once("resetLocked:success", () => done.resolve());
  events.once("resetLocked:failure", ({ error }) => done.reject(error));
  const pool = gw.runTaskList(options(events, { minResetLockedInterval: 1, maxResetLockedInterval: 1 }),
    { [NEVER]: async () => {} }, pgPool);
  try {
    await done.promise;
  } finally {
    await pool.gracefulShutdown("leaseproof: rescue done");
  }
  return null;
}

async function forget() {
  for (const held of holders.values()) {
    held.release.reject(new Error("leaseproof: reset"));
    await held.stopped;
  }
  holders.clear();
  succeeded.clear();
  return null;
}

async function rows() {
  const { rows: found } = await pgPool.query(
    "SELECT id::text AS job, locked_by, attempts, max_attempts FROM graphile_worker._private_jobs");
  const result = {};
  for (const job of succeeded) result[job] = "finished";
  for (const row of found) {
    result[row.job] = row.locked_by !== null ? "claimed" : row.attempts >= row.max_attempts ? "failed" : "pending";
  }
  return result;
}

const operations = {
  version: async () => VERSION,
  enqueue: async () => String((await utils.addJob(TASK, {}, { maxAttempts: ATTEMPTS })).id),
  fetch, complete, rescue, forget, rows,
};

await gw.runMigrations({ pgPool, logger: quiet });
utils = await gw.makeWorkerUtils({ pgPool, logger: quiet });
serve(operations, async () => {
  await forget();
  await utils.release();
  await pgPool.end();
});
