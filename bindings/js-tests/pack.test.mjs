// The npm package as a user gets it: `npm pack` of the nodejs build (bindings/pkg), installed
// from the tarball into a fresh project, then used from JavaScript (ES module and CommonJS)
// and from TypeScript (compiled under `strict` against the installed declarations, then run).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const PKG = fileURLToPath(new URL("../pkg/", import.meta.url));
const NAME = JSON.parse(readFileSync(join(PKG, "package.json"), "utf8")).name;
const TSC = createRequire(import.meta.url).resolve("typescript/bin/tsc");

function run(cmd, args, cwd) {
  const r = spawnSync(cmd, args, { cwd, encoding: "utf8", timeout: 120_000 });
  assert.equal(r.status, 0, `${cmd} ${args.join(" ")} failed:\n${r.stdout}${r.stderr}`);
  return r.stdout;
}

// The same program in each language: a broker takes an MQTT 3.1.1 CONNECT and answers CONNACK.
const CONNECT = "[0x10, 14, 0, 4, 77, 81, 84, 84, 4, 2, 0, 60, 0, 2, 99, 49]";
const PROGRAM = (importLine) => `${importLine}
const now = 1_700_000_000_000;
const broker = new Broker({}, now);
const conn = broker.accept(now, {});
broker.handleBytes(conn, new Uint8Array(${CONNECT}), now);
const sent = [];
for (const out of broker.drain()) if (out.type === "send") sent.push(...out.data);
if (sent.join(",") !== "32,2,0,0") throw new Error("no CONNACK: " + sent.join(","));
console.log("connack");
`;

test("the packed npm package installs into a fresh project and works from JS and TypeScript", (t) => {
  const dir = mkdtempSync(join(tmpdir(), "meridian-npm-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));

  const tarball = join(dir, run("npm", ["pack", "--silent", "--pack-destination", dir], PKG).trim().split("\n").pop());
  t.diagnostic(`${NAME} tarball: ${statSync(tarball).size} bytes`);
  const listed = run("tar", ["tzf", tarball], dir);
  for (const file of ["package.json", "README.md", "LICENSE", "meridian_wasm.js", "meridian_wasm.d.ts", "meridian_wasm_bg.wasm"]) {
    assert.match(listed, new RegExp(`^package/${file.replaceAll(".", "\\.")}$`, "m"), `${file} not in the tarball`);
  }

  const app = join(dir, "app");
  run("mkdir", [app], dir);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  run("npm", ["install", "--no-audit", "--no-fund", "--silent", tarball], app);
  const installed = JSON.parse(readFileSync(join(app, "package.json"), "utf8"));
  assert.ok(installed.dependencies?.[NAME], `${NAME} not among the app's dependencies`);

  writeFileSync(join(app, "esm.mjs"), PROGRAM(`import { Broker } from "${NAME}";`));
  assert.equal(run(process.execPath, ["esm.mjs"], app).trim(), "connack");
  writeFileSync(join(app, "cjs.cjs"), PROGRAM(`const { Broker } = require("${NAME}");`));
  assert.equal(run(process.execPath, ["cjs.cjs"], app).trim(), "connack");

  // TypeScript: the declarations come from the installed package, the output runs in Node.
  writeFileSync(join(app, "main.ts"), PROGRAM(`import { Broker } from "${NAME}";`)
    .replace("const sent = [];", "const sent: number[] = [];")
    + `const typed: number = broker.accept(now, { remoteAddr: "10.0.0.7:51234" });\nvoid typed;\n`);
  // The project's configuration is what `tsc --init` writes (strict, target esnext), and the
  // package's own declarations are checked too (no skipLibCheck).
  run(process.execPath, [TSC, "--init"], app);
  run(process.execPath, [TSC, "-p", app, "--skipLibCheck", "false", "--outDir", "out"], app);
  assert.equal(run(process.execPath, [join(app, "out", "main.js")], app).trim(), "connack");
});
