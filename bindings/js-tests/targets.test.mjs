// The `web` and `bundler` builds load and work too (built by test.sh with
// `wasm-pack build bindings --target web --out-dir pkg-web` and `--target bundler --out-dir
// pkg-bundler`). Node stands in for a browser (initSync with the module's bytes) and for a
// bundler (Node's own ESM integration of .wasm imports).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const pkg = (dir) => fileURLToPath(new URL(`../${dir}/`, import.meta.url));

/** A smoke test run against one build's exports (also sent as source to a child process). */
function smoke(m) {
  const t = 1700000000000;
  const b = new m.Broker({}, t);
  const c = b.accept(t);
  b.handleBytes(c, m.encodePacket({ type: "connect", clientId: "t" }, 5), t);
  const send = b.drain().find((o) => o.type === "send");
  const connack = m.decodePacket(send.data, 5);
  const matcher = new m.TopicMatcher();
  matcher.add("a/+");
  return { type: connack.type, reasonCode: connack.reasonCode, match: matcher.match("a/b") };
}
const EXPECTED = { type: "connack", reasonCode: 0, match: ["a/+"] };

test("--target web: initSync with the module bytes", async () => {
  assert.ok(existsSync(pkg("pkg-web")), "bindings/pkg-web is missing: build it first");
  const m = await import(new URL("meridian_wasm.js", `file://${pkg("pkg-web")}`));
  m.initSync({ module: readFileSync(`${pkg("pkg-web")}meridian_wasm_bg.wasm`) });
  assert.deepEqual(smoke(m), EXPECTED);
});

test("--target bundler: ESM with a .wasm import", () => {
  assert.ok(existsSync(pkg("pkg-bundler")), "bindings/pkg-bundler is missing: build it first");
  const script = `import * as m from ${JSON.stringify(`${pkg("pkg-bundler")}meridian_wasm.js`)};
    ${smoke.toString()}
    console.log(JSON.stringify(smoke(m)));`;
  const r = spawnSync(
    process.execPath,
    ["--experimental-wasm-modules", "--no-warnings", "--input-type=module", "-e", script],
    { encoding: "utf8", timeout: 60_000 },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout), EXPECTED);
});
