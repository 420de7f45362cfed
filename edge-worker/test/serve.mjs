// The built worker in Miniflare (workerd) on a loopback port, for measurements by hand:
//
//   node edge-worker/test/serve.mjs [PORT]
//
// prints `ready ws://127.0.0.1:PORT/mqtt workerd-pid=PID` once it serves, and runs until it
// is stopped (SIGINT or SIGTERM). Anonymous clients are let in (ALLOW_ANONYMOUS), as under
// `wrangler dev`. docs/benchmarks.md, "The edge broker", uses it.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { execFileSync } from "node:child_process";
import { Miniflare } from "miniflare";

const BUILD = fileURLToPath(new URL("../build", import.meta.url));
const COMPATIBILITY_DATE = readFileSync(new URL("../wrangler.toml", import.meta.url), "utf8").match(
  /^compatibility_date = "([0-9-]+)"/m,
)[1];

const port = Number(process.argv[2] ?? 0);
const mf = new Miniflare({
  modules: true,
  scriptPath: path.join(BUILD, "index.js"),
  modulesRoot: BUILD,
  modulesRules: [{ type: "CompiledWasm", include: ["**/*.wasm"] }],
  compatibilityDate: COMPATIBILITY_DATE,
  durableObjects: { MQTT_BROKER: { className: "MqttBroker", useSQLite: true } },
  bindings: { ALLOW_ANONYMOUS: "true" },
  host: "127.0.0.1",
  port,
  cf: false,
});
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
