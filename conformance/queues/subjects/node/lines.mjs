// What pgboss.mjs and graphile.mjs share: leaseproof's queue lines. One JSON request per line on
// stdin ({"id": n, "op": name, ...}), one JSON reply per line on stdout ({"id": n, "ok": value} or
// {"id": n, "error": text}), in any order: each request runs as soon as it arrives. "ready" (id 0)
// says the library has started; stdin's end stops it (`stop`) and the process.
import readline from "node:readline";

export function serve(operations, stop) {
  process.stdout.write(JSON.stringify({ id: 0, ok: "ready" }) + "\n");
  const lines = readline.createInterface({ input: process.stdin });
  lines.on("line", async (line) => {
    let request = { id: null };
    let reply;
    try {
      request = JSON.parse(line);
      const operation = operations[request.op];
      if (!operation) throw new Error(`unknown operation ${JSON.stringify(request.op)}`);
      reply = { id: request.id, ok: await operation(request) };
    } catch (error) {
      reply = { id: request.id, error: String(error?.stack || error) };
    }
    process.stdout.write(JSON.stringify(reply) + "\n");
  });
  lines.on("close", async () => {
    await stop();
    process.exit(0);
  });
}
