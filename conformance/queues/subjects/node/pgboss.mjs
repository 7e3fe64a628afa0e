#!/usr/bin/env node
// pg-boss behind leaseproof's queue lines: one JSON request per line on stdin, one JSON reply per
// line on stdout, in any order (each reply carries its request's id; requests run concurrently,
// each on a connection of pg-boss's pool, so the races of `leaseproof guarantees` are real).
//
//     node pgboss.mjs '{"host": ..., "port": ..., "user": ..., "database": ..., "options": ...}'
//
// Only pg-boss's public API: start() (its migrations), createQueue, send, fetch, complete, expire.
// The queue's jobs are sent with no retry delay and many retries, so that an expired job goes back
// to the queue (state `retry`) rather than failing.
import { createRequire } from "node:module";
import { serve } from "./lines.mjs";
import PgBoss from "pg-boss";

const require = createRequire(import.meta.url);
const VERSION = require("pg-boss/package.json").version;
const QUEUE = "leaseproof";
const RETRIES = 1000;

const config = JSON.parse(process.argv[2]);
const boss = new PgBoss({ ...config, supervise: false, schedule: false, max: 6 });
boss.on("error", (error) => process.stderr.write(`pg-boss: ${error.message}\n`));

const operations = {
  version: async () => VERSION,
  enqueue: async ({ lease, start_after }) =>
    boss.send(QUEUE, {}, { expireInSeconds: lease, retryLimit: RETRIES, retryDelay: 0, startAfter: new Date(start_after) }),
  fetch: async () => {
    const jobs = await boss.fetch(QUEUE, { batchSize: 1 });
    return jobs.length ? jobs[0].id : null;
  },
  complete: async ({ job }) => (await boss.complete(QUEUE, job)).affected,
  expire: async () => {
    await boss.expire();
    return null;
  },
};

await boss.start();
await boss.createQueue(QUEUE);
serve(operations, async () => {
  await boss.stop({ graceful: false, wait: true });
});
