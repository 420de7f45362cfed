// The package in the other JavaScript runtimes, from their npm packages (devDependencies):
// Deno loads the `web` build with `init()` (fetching the .wasm beside the module), Bun loads
// both the `nodejs` build (require) and the `web` build. Node's own runs are in the other files.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const BIN = (name) => here(`node_modules/.bin/${name}`);
const WEB = here("../pkg-web/meridian_wasm.js");
const NODE = here("../pkg/meridian_wasm.js");

/** Source of a script that uses the module `m` and prints what it saw as JSON. */
const SMOKE = `
  const t = 1700000000000;
  const b = new m.Broker({}, t);
  const c = b.accept(t);
  b.handleBytes(c, m.encodePacket({ type: "connect", clientId: "t" }, 5), t);
  const send = b.drain().find((o) => o.type === "send");
  const matcher = new m.TopicMatcher();
  matcher.add("a/+");
  let error;
  try { m.encodePacket({ type: "nope" }); } catch (e) { error = e.constructor.name; }
  console.log(JSON.stringify({ connack: m.decodePacket(send.data, 5).type, match: matcher.match("a/b"), error }));
`;
const EXPECTED = { connack: "connack", match: ["a/+"], error: "TypeError" };

function run(cmd, args, script) {
  const r = spawnSync(cmd, [...args, script], {
    encoding: "utf8",
    timeout: 60_000,
    env: { ...process.env, NO_COLOR: "1", DENO_NO_UPDATE_CHECK: "1" },
  });
  assert.equal(r.status, 0, `${cmd} failed: ${r.error ?? ""}\n${r.stdout}\n${r.stderr}`);
  return JSON.parse(r.stdout.trim().split("\n").at(-1));
}

test("Deno: the web build with init()", () => {
  const script = `const m = await import(${JSON.stringify(`file://${WEB}`)}); await m.default(); ${SMOKE}`;
  assert.deepEqual(run(BIN("deno"), ["eval", "--quiet"], script), EXPECTED);
});

test("Bun: the nodejs build with require()", () => {
  const script = `const m = require(${JSON.stringify(NODE)}); ${SMOKE}`;
  assert.deepEqual(run(BIN("bun"), ["-e"], script), EXPECTED);
});

test("Bun: the web build with init()", () => {
  const script = `const m = await import(${JSON.stringify(WEB)}); await m.default(); ${SMOKE}`;
  assert.deepEqual(run(BIN("bun"), ["-e"], script), EXPECTED);
});
