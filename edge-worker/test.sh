#!/usr/bin/env bash
# Builds the edge worker and runs its end-to-end tests, installing what they need first.
# Idempotent: tools already present at the right version are not reinstalled, npm packages are
# installed only when their lockfile changed.
#
#   edge-worker/test.sh
#
# Steps: toolchain (rustup wasm target, wasm-bindgen-cli at Cargo.lock's wasm-bindgen version,
# worker-build, npm packages: Miniflare, MQTT.js, esbuild, binaryen) -> clippy for wasm32 ->
# `worker-build --release` -> the meridian daemon (a region to link to) -> the built worker in
# Miniflare (workerd), driven by MQTT.js and raw WebSockets. Every step has a time limit; the first failure stops the script.
# A fresh machine's installs take long: wasm-bindgen-cli ~5-15 min, worker-build ~6 min.
set -euo pipefail
cd "$(dirname "$0")"
EDGE="$PWD"
ROOT="$(cd .. && pwd)"
TESTS="$EDGE/test"
WORKER_BUILD_VERSION=0.8.7

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/meridian-target-edge}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export PATH="$HOME/.cargo/bin:$PATH"
export NO_UPDATE_NOTIFIER=1 npm_config_fund=false npm_config_audit=false

step() { printf '\n=== edge worker: %s\n' "$*"; }
# run MINUTES COMMAND...: the command, killed if it runs longer.
run() {
    local minutes="$1"
    shift
    timeout --kill-after=30 "${minutes}m" "$@"
}

step "toolchain"
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    run 10 rustup target add wasm32-unknown-unknown
fi
# The wasm-bindgen CLI must match Cargo.lock's library version (shared with the bindings).
want="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$ROOT/Cargo.lock")"
[ -n "$want" ] || { echo "wasm-bindgen not found in Cargo.lock" >&2; exit 1; }
have="$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)"
if [ "$have" != "$want" ]; then
    echo "installing wasm-bindgen-cli $want (found: ${have:-none})"
    # Not --locked: its lockfile wants a webpki-roots version the registry lacks.
    run 45 cargo install wasm-bindgen-cli --version "$want" --force
fi
have="$(worker-build --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1 || true)"
if [ "$have" != "$WORKER_BUILD_VERSION" ]; then
    echo "installing worker-build $WORKER_BUILD_VERSION (found: ${have:-none})"
    run 45 cargo install worker-build --version "$WORKER_BUILD_VERSION" --locked --force
fi
wasm-bindgen --version
worker-build --version
node --version
# The tests' packages (wrangler, pinned in template/package.json, is installed where the
# `npx wrangler dev` test copies the template).
if [ ! -f "$TESTS/node_modules/.package-lock.json" ] \
    || [ "$TESTS/package-lock.json" -nt "$TESTS/node_modules/.package-lock.json" ]; then
    (cd "$TESTS" && run 10 npm ci)
fi

step "clippy for wasm32 (the crate is empty on other targets)"
(cd "$ROOT" && run 20 cargo clippy -p meridian-mqtt-edge -p meridian-edge-worker --target wasm32-unknown-unknown --locked -- -D warnings)

step "worker-build --release"
# worker-build looks for its tools here, not on PATH; without them it downloads them.
export WASM_BINDGEN_BIN="$(command -v wasm-bindgen)"
export ESBUILD_BIN="$TESTS/node_modules/.bin/esbuild"
export WASM_OPT_BIN="$TESTS/node_modules/.bin/wasm-opt"
# The worker a user builds: the template, linking this checkout's meridian-mqtt-edge.
(cd "$EDGE/template" && run 30 worker-build --release)
wasm="$EDGE/template/build/index_bg.wasm"
echo "wasm size: $(wc -c <"$wasm") bytes, $(gzip -9 -c "$wasm" | wc -c) bytes gzipped"

step "the meridian daemon (the region the edge link tests link to)"
# Built where the workspace's own tests build it (scripts/test-all has, so this is quick there).
MERIDIAN_TARGET="${MERIDIAN_TARGET_DIR:-$HOME/.cache/meridian/target}"
(cd "$ROOT" && CARGO_TARGET_DIR="$MERIDIAN_TARGET" run 30 cargo build -p meridian-mqtt --bin meridian --locked)
export MERIDIAN_BIN="$MERIDIAN_TARGET/debug/meridian"

step "the worker in Miniflare, and a copy of the template under npx wrangler dev, driven by MQTT.js"
# wrangler dev runs wrangler.toml's build command (worker-build) with the tools above.
export WRANGLER_SEND_METRICS=false
(cd "$TESTS" && run 10 npm test)

step "all edge worker tests passed"
