#!/usr/bin/env bash
# Builds and tests the JS/wasm bindings (meridian-mqtt-wasm) and the Node WebSocket broker example,
# installing what they need first. Idempotent: tools already present at the right version are
# not reinstalled, npm packages are installed only when their lockfile changed.
#
#   bindings/test.sh
#
# Steps: toolchain (rustup wasm target, wasm-bindgen-cli at Cargo.lock's wasm-bindgen version,
# wasm-pack, npm packages) -> clippy for wasm32 -> wasm-bindgen tests under Node ->
# `wasm-pack build --target nodejs|web|bundler` -> Node tests of the built package (API, no
# traps on random input, the builds in Node, Deno and Bun, TypeScript declarations) -> the
# example broker driven by MQTT.js, its server in Node and then in Bun.
# Every step has a time limit; the first failure stops the script with a non-zero status.
# Fresh-machine installs take long: wasm-bindgen-cli ~5-15 min, wasm-pack ~5-25 min.
set -euo pipefail
cd "$(dirname "$0")"
BINDINGS="$PWD"
ROOT="$(cd .. && pwd)"
EXAMPLE="$ROOT/examples/node-ws-broker"
JS_TESTS="$BINDINGS/js-tests"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/meridian-target-wasm}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export PATH="$HOME/.cargo/bin:$PATH"
export NO_UPDATE_NOTIFIER=1 npm_config_fund=false npm_config_audit=false
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
# wasm-pack runs wasm-opt from PATH; npm `binaryen` provides it (no download from elsewhere).
export PATH="$JS_TESTS/node_modules/.bin:$PATH"

step() { printf '\n=== bindings: %s\n' "$*"; }
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
# One wasm-bindgen for the whole workspace: the CLI must match Cargo.lock's library version.
want="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$ROOT/Cargo.lock")"
[ -n "$want" ] || { echo "wasm-bindgen not found in Cargo.lock" >&2; exit 1; }
have="$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)"
if [ "$have" != "$want" ]; then
    echo "installing wasm-bindgen-cli $want (found: ${have:-none})"
    # Not --locked: its lockfile wants a webpki-roots version the registry lacks.
    start=$SECONDS
    run 45 cargo install wasm-bindgen-cli --version "$want" --force
    echo "wasm-bindgen-cli installed in $((SECONDS - start)) s"
fi
if ! command -v wasm-pack >/dev/null; then
    echo "installing wasm-pack"
    start=$SECONDS
    run 45 cargo install wasm-pack --version '~0.15'
    echo "wasm-pack installed in $((SECONDS - start)) s"
fi
wasm-bindgen --version
wasm-pack --version
node --version

# npm ci when node_modules is missing or older than the lockfile. If the registry lacks some
# other platform's optional package, so that the lockfile cannot list it (deno's, here), npm ci
# refuses the lockfile; npm install --no-save then installs the same versions without it.
npm_install() {
    local dir="$1"
    if [ ! -f "$dir/node_modules/.package-lock.json" ] \
        || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
        (cd "$dir" && { run 10 npm ci || run 10 npm install --no-save; })
    fi
}
npm_install "$JS_TESTS"

step "clippy for wasm32 (the wasm-bindgen tests compile only there)"
(cd "$ROOT" && run 20 cargo clippy -p meridian-mqtt-wasm --target wasm32-unknown-unknown --all-targets --locked -- -D warnings)

step "wasm-bindgen tests under Node"
(cd "$ROOT" && run 20 cargo test -p meridian-mqtt-wasm --target wasm32-unknown-unknown --locked)

step "wasm-pack build --target nodejs | web | bundler"
for target in nodejs web bundler; do
    out=pkg
    [ "$target" = nodejs ] || out="pkg-$target"
    run 20 wasm-pack --log-level warn build "$BINDINGS" --release --mode no-install \
        --target "$target" --out-dir "$out"
done
wasm="$BINDINGS/pkg/meridian_wasm_bg.wasm"
echo "wasm size: $(wc -c <"$wasm") bytes, $(gzip -9 -c "$wasm" | wc -c) bytes gzipped"

step "Node tests of the built package"
(cd "$JS_TESTS" && run 10 npm test)

step "example: MQTT over WebSocket, driven by MQTT.js"
npm_install "$EXAMPLE"
(cd "$EXAMPLE" && run 10 npm test)

step "example again, the server running in Bun (from npm, bindings/js-tests)"
(cd "$EXAMPLE" && export MERIDIAN_SERVER_RUNTIME="$JS_TESTS/node_modules/.bin/bun" && run 10 npm test)

step "all bindings tests passed"
