#!/usr/bin/env bash
# A long fuzzing campaign on one target.
#
#   fuzz/run.sh TARGET MINUTES            # all cores (libFuzzer -fork=$(nproc))
#   FUZZ_FORK=1 fuzz/run.sh TARGET 40     # one process (e.g. two campaigns side by side)
#   FUZZ_RUNS=10000000 FUZZ_FORK=1 fuzz/run.sh TARGET 60   # stop after 10M executions
#
# New coverage-increasing inputs go to fuzz/corpus/TARGET (git-ignored; the committed seeds in
# fuzz/seeds/TARGET are read too). A crash stops the run and is left in fuzz/artifacts/TARGET;
# the full libFuzzer log is in fuzz/artifacts/logs/. Prints the number of executions at the end.
set -euo pipefail
source "$(dirname "$0")/common.sh"

if [ $# -ne 2 ]; then
    echo "usage: fuzz/run.sh TARGET MINUTES   (targets: $(ls "$FUZZ_DIR/fuzz_targets" | sed 's/\.rs$//' | tr '\n' ' '))" >&2
    exit 2
fi
target="$1"
minutes="$2"
if [ ! -f "$FUZZ_DIR/fuzz_targets/$target.rs" ]; then
    echo "no such fuzz target: $target" >&2
    exit 2
fi
if ! have_nightly; then
    echo "fuzzing needs a nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
fi
ensure_cargo_fuzz

fork="${FUZZ_FORK:-$(nproc)}"
args=(-max_total_time="$((minutes * 60))")
if [ -n "${FUZZ_RUNS:-}" ]; then
    args+=(-runs="$FUZZ_RUNS")
fi
if [ "$fork" -gt 1 ]; then
    # Fork mode otherwise shrugs off timeouts and out-of-memory inputs.
    args+=(-fork="$fork" -ignore_timeouts=0 -ignore_ooms=0)
fi

mkdir -p "$FUZZ_DIR/artifacts/logs"
log="$FUZZ_DIR/artifacts/logs/$target-$(date +%Y%m%d-%H%M%S).log"
echo "fuzzing $target for $minutes min ($fork process(es)); log: $log"
start=$SECONDS
status=0
fuzz_run "$target" "${args[@]}" >"$log" 2>&1 || status=$?
elapsed=$((SECONDS - start))

tail -n 15 "$log"
echo
echo "$target: $(exec_count "$log") executions in ${elapsed}s, exit status $status"
crashes="$(find "$FUZZ_DIR/artifacts/$target" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \) | wc -l)"
if [ "$crashes" -gt 0 ]; then
    echo "$crashes failing input(s) in fuzz/artifacts/$target/ (replay one with:"
    echo "  cargo run --release --manifest-path fuzz/Cargo.toml --example replay -- $target FILE)"
fi
exit "$status"
