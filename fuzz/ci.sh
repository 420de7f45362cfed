#!/usr/bin/env bash
# Short fuzzing pass for CI: builds every target once, runs each for SECONDS (default 20), two
# at a time, and fails on any crash, hang or out-of-memory input. Prints how many executions
# each target did. Skips (exit 0) when no nightly toolchain is installed; installs cargo-fuzz
# only if `cargo fuzz --version` fails.
#
#   fuzz/ci.sh          # 20 s per target
#   fuzz/ci.sh 60
#
# Each run starts from the committed seeds (fuzz/seeds/TARGET) with a throw-away working corpus,
# as on a fresh clone; long campaigns with a kept corpus are fuzz/run.sh's job. A failing input
# is left in fuzz/artifacts/TARGET/ and printed as base64, so that the CI log alone is enough to
# reproduce it (docs/testing.md: "Turning a crash into a regression test").
set -euo pipefail
source "$(dirname "$0")/common.sh"

seconds="${1:-20}"
parallel="${FUZZ_CI_PARALLEL:-2}"

if ! have_nightly; then
    echo "fuzz/ci.sh: SKIPPED: no nightly toolchain (rustup toolchain install nightly)"
    exit 0
fi
ensure_cargo_fuzz
cd "$REPO_DIR"
start=$SECONDS

echo "=== building fuzz targets ($(cargo +nightly --version))"
cargo +nightly fuzz build "${FUZZ_BUILD_FLAGS[@]}"
echo "built in $((SECONDS - start))s"

mapfile -t targets < <(cargo fuzz list)
logdir="$(mktemp -d "${TMPDIR:-/tmp}/meridian-fuzz-ci.XXXXXX")"
trap 'rm -rf "$logdir"' EXIT

run_one() {
    local target="$1"
    local status=0 started=$SECONDS
    # From the committed seeds only, like a fresh clone: a large local working corpus would
    # make the start-up pass over it, which -max_total_time does not bound, take minutes.
    FUZZ_CORPUS="$logdir/corpus-$target" \
        fuzz_run "$target" -max_total_time="$seconds" >"$logdir/$target.log" 2>&1 || status=$?
    echo "$status" >"$logdir/$target.status"
    echo "$((SECONDS - started))" >"$logdir/$target.seconds"
}

# Two at a time: one process per core.
pids=()
for target in "${targets[@]}"; do
    run_one "$target" &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$parallel" ]; then
        wait "${pids[0]}"
        pids=("${pids[@]:1}")
    fi
done
wait

passed=0
failed=0
echo
echo "=== fuzzing results (${seconds}s per target)"
for target in "${targets[@]}"; do
    status="$(cat "$logdir/$target.status")"
    execs="$(exec_count "$logdir/$target.log")"
    took="$(cat "$logdir/$target.seconds")s"
    if [ "$status" = 0 ]; then
        printf '%-16s %10s execs %6s  ok\n' "$target" "$execs" "$took"
        passed=$((passed + 1))
    else
        printf '%-16s %10s execs %6s  FAILED (exit %s)\n' "$target" "$execs" "$took" "$status"
        failed=$((failed + 1))
        echo "--- last lines of the $target log:"
        tail -n 40 "$logdir/$target.log"
        artifact="$(grep -oE "Test unit written to [^ ]+" "$logdir/$target.log" | tail -n1 | sed 's/Test unit written to //')"
        if [ -n "$artifact" ] && [ -f "$artifact" ]; then
            echo "--- failing input ($artifact), base64:"
            base64 -w 76 "$artifact"
            echo "--- replay it: cargo run --release --manifest-path fuzz/Cargo.toml --example replay -- $target $artifact"
        fi
    fi
done
echo "total time: $((SECONDS - start))s"
echo "fuzz: $passed passed, $failed failed"
[ "$failed" = 0 ]
