# Shared by run.sh and ci.sh: toolchain checks and the cargo-fuzz command line.
# shellcheck shell=bash

FUZZ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$FUZZ_DIR")"
# Fuzz builds (nightly, coverage instrumentation) are cached apart from the workspace's.
FUZZ_TARGET_DIR="${MERIDIAN_FUZZ_TARGET_DIR:-$HOME/.cache/meridian-fuzz-target}"
# Safe Rust under `forbid(unsafe_code)`: AddressSanitizer finds little and halves the speed.
# Debug assertions and overflow checks stay on (cargo-fuzz's default).
FUZZ_BUILD_FLAGS=(--sanitizer none --target-dir "$FUZZ_TARGET_DIR")

# True when a nightly toolchain is installed.
have_nightly() {
    cargo +nightly --version >/dev/null 2>&1
}

# Installs cargo-fuzz from crates.io unless it is already there.
ensure_cargo_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "installing cargo-fuzz (once)"
        cargo install cargo-fuzz --locked
    fi
}

# libFuzzer's maximum input size per target. Small enough that an input runs in well under a
# millisecond (the checks are linear or worse in the input's length), large enough for many
# frames or operations: a route_merge op takes 2-5 bytes, a topic_match op 3-10, a
# broker_sequence op 2-300 (a whole packet).
max_len_for() {
    case "$1" in
        broker_sequence) echo 2048 ;;
        route_merge) echo 384 ;;
        *) echo 1024 ;;
    esac
}

# cargo fuzz run TARGET with a working corpus (new inputs go there; FUZZ_CORPUS, by default
# fuzz/corpus/TARGET) and the committed seeds.
fuzz_run() {
    local target="$1"
    shift
    local corpus="${FUZZ_CORPUS:-$FUZZ_DIR/corpus/$target}"
    mkdir -p "$corpus" "$FUZZ_DIR/artifacts/$target"
    (cd "$REPO_DIR" && cargo +nightly fuzz run "${FUZZ_BUILD_FLAGS[@]}" "$target" \
        "$corpus" "fuzz/seeds/$target" -- \
        -max_len="$(max_len_for "$target")" -timeout=10 -print_final_stats=1 "$@")
}

# Total executions reported in a libFuzzer log: its final `stat::number_of_executed_units`
# (printed at the end of a run, also when interrupted), else "Done N runs", else the last "#N"
# status line (a run killed outright, or fork mode).
exec_count() {
    local log="$1" n
    n="$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | tail -n1 | grep -oE '[0-9]+$')"
    if [ -z "$n" ]; then
        n="$(grep -oE '^Done [0-9]+ runs' "$log" | tail -n1 | grep -oE '[0-9]+')"
    fi
    if [ -z "$n" ]; then
        n="$(grep -oE '^#[0-9]+' "$log" | tail -n1 | tr -d '#')"
    fi
    echo "${n:-0}"
}
