// The built worker in Miniflare (workerd) on a loopback port, for measurements by hand:
//
//   node edge-worker/test/serve.mjs [PORT]
//
// prints `ready ws://127.0.0.1:PORT/mqtt workerd-pid=PID` once it serves, and runs until it
// is stopped (SIGINT or SIGTERM). Anonymous clients are let in (ALLOW_ANONYMOUS), as under
// `wrangler dev`; MERIDIAN_UPSTREAM and MERIDIAN_LINK_TOKEN in the environment link it to a
// region, EDGE_HUB makes it an edge-only deployment, PLACEMENT is honoured too.
// docs/benchmarks.md, "The edge broker", uses it.
import { execFileSync } from "node:child_process";
import { Miniflare } from "miniflare";
import { workerOptions } from "./worker.mjs";

const port = Number(process.argv[2] ?? 0);
// The variables of edge-worker/README.md's "Link to a region", "Edge-only deployments" and
// "Placement", from the environment where set.
const bindings = { ALLOW_ANONYMOUS: "true" };
for (const name of ["MERIDIAN_UPSTREAM", "MERIDIAN_LINK_TOKEN", "PLACEMENT", "EDGE_HUB"]) {
  if (process.env[name]) bindings[name] = process.env[name];
}
const mf = new Miniflare(workerOptions({ bindings, port }));
const url = await mf.ready;
// The workerd process serving it: the youngest child of this process named workerd.
let workerd = "";
try {
  workerd = execFileSync("pgrep", ["-n", "-P", String(process.pid), "workerd"], { encoding: "utf8" }).trim();
} catch {}
console.log(`ready ${new URL("/mqtt", url).href.replace(/^http/, "ws")} workerd-pid=${workerd}`);
const stop = async () => {
  await mf.dispose();
  process.exit(0);
};
process.on("SIGINT", stop);
process.on("SIGTERM", stop);
