// The built worker as Miniflare runs it: the options the tests and `serve.mjs` share.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const BUILD = fileURLToPath(new URL("../template/build", import.meta.url));
/** The compatibility date of the template's `wrangler.toml`, so that the worker runs as deployed. */
const COMPATIBILITY_DATE = readFileSync(new URL("../template/wrangler.toml", import.meta.url), "utf8").match(
  /^compatibility_date = "([0-9-]+)"/m,
)[1];

/**
 * Miniflare's options for the worker built by `worker-build --release`, on loopback `port`
 * (0: a free one), with these string `bindings` (secrets and variables) and Durable Object
 * storage kept in `persist` (false: in memory).
 */
export function workerOptions({ bindings = {}, persist = false, port = 0 } = {}) {
  return {
    modules: true,
    scriptPath: path.join(BUILD, "index.js"),
    modulesRoot: BUILD,
    modulesRules: [{ type: "CompiledWasm", include: ["**/*.wasm"] }],
    compatibilityDate: COMPATIBILITY_DATE,
    durableObjects: { MQTT_BROKER: { className: "MqttBroker", useSQLite: true } },
    durableObjectsPersist: persist,
    bindings,
    host: "127.0.0.1",
    port,
    // No Cloudflare request metadata: locally there is none to fetch.
    cf: false,
  };
}
