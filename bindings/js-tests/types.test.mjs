// The generated TypeScript declarations compile under `strict` and describe the API as
// types-check.ts uses it (including the misuse it must refuse).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

test("types-check.ts compiles against bindings/pkg/meridian_wasm.d.ts", () => {
  const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
  const dir = fileURLToPath(new URL(".", import.meta.url));
  const r = spawnSync(process.execPath, [tsc, "-p", dir], { encoding: "utf8", timeout: 120_000 });
  assert.equal(r.status, 0, `tsc failed:\n${r.stdout}${r.stderr}`);
});
