#!/bin/sh
# Runs the fuzz targets one after the other and prints one line per target with its
# executions and result (RELIABILITY.md records these lines).
#
#   crates/fuzz/run.sh [SECONDS_PER_TARGET [TARGET...]]     (default: 120 s, all four)
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Corpora grow in
# crates/fuzz/corpus/<target> (seeded from real driver messages on first use, written by
# `cargo test --test it fuzz_smoke::` with FUZZ_CORPUS_DIR); crashes land in
# crates/fuzz/artifacts/<target>. Extra libFuzzer flags: FUZZ_FLAGS (not -jobs: each job then
# writes its statistics to its own fuzz-N.log and the summary shows "?"; to use several cores,
# run several run.sh at once on different targets).
# FUZZ_SANITIZER=none builds without AddressSanitizer (several times the executions per
# second; the Rust code forbids unsafe, ASan mainly watches zstd's C code).
# Run it under `nice -n 19` on a shared machine.
set -eu
cd "$(dirname "$0")/../.."
secs=${1:-120}
[ $# -gt 0 ] && shift
targets=${*:-frames classify rewrite reply}
dir=crates/fuzz

# -a: debug assertions on (the rewrite checks its computed lengths with debug_assert).
san=${FUZZ_SANITIZER:-address}
cargo +nightly fuzz build --fuzz-dir "$dir" -a -s "$san"
for t in $targets; do
    if [ ! -d "$dir/corpus/$t" ]; then
        FUZZ_CORPUS_DIR="$PWD/$dir/corpus" cargo test -q --test it fuzz_smoke::every_seed_holds >/dev/null
    fi
done

status=0
summary=""
for t in $targets; do
    log="$dir/artifacts/$t.log"
    mkdir -p "$dir/artifacts/$t"
    set +e
    # shellcheck disable=SC2086
    cargo +nightly fuzz run --fuzz-dir "$dir" -a -s "$san" "$t" "$dir/corpus/$t" -- \
        -max_total_time="$secs" -max_len=16384 -rss_limit_mb=2048 -print_final_stats=1 \
        ${FUZZ_FLAGS:-} >"$log" 2>&1
    rc=$?
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [ "$rc" -eq 0 ]; then
        result="no crash"
    else
        result="CRASH (exit $rc), see $log and $dir/artifacts/$t/"
        status=1
    fi
    summary="$summary$t: ${execs:-?} executions in ${secs} s, $result
"
done
printf '%s' "$summary"
exit $status
