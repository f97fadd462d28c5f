#!/usr/bin/env bash
# Fuzzes every parser of bytes that come from outside (tests/fuzz: the rendezvous store's
# requests, the running store's handshake and request handling, TCP frames, unique ids, Slurm
# host lists, interface names, launcher environments, flight-recorder records) with libFuzzer +
# AddressSanitizer + UndefinedBehaviorSanitizer, for a bounded time each. Builds with clang in
# build-fuzz/; seeds come from tests/fuzz/corpus/<target>, what the run finds goes to
# build-fuzz/corpus/<target> (kept between runs). A crash, a leak, a
# sanitizer report or a timeout fails the run and leaves the reproducer in build-fuzz/crashes/.
#   tools/fuzz.sh [target...]        LOOM_FUZZ_SECONDS per target (default 30)
# Run by `meson test` (suite "fuzz").
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
dir="$ROOT/build-fuzz"
seconds="${LOOM_FUZZ_SECONDS:-30}"
all=(store_request store_server tcp_frames unique_id hostlist ifname launcher_env flight_record)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is missing (tools/install-deps.sh installs it)" >&2; exit 1; }

if [ ! -f "$dir/build.ninja" ]; then
  CC=clang CXX=clang++ meson setup "$dir" "$ROOT" -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dwerror=true -Dtests=disabled -Dbenchmarks=false -Dexamples=false -Dcuda=disabled \
    -Doptimization=1 -Db_ndebug=true -Dcpp_args=-g1 -Dc_args=-g1 >/dev/null
fi
ninja -C "$dir" $(printf 'tests/fuzz/%s_fuzz ' "${targets[@]}") >"$dir/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$dir/build.log" | head -60; exit 1; }

export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitizers/lsan.supp"
mkdir -p "$dir/crashes"
status=0
for t in "${targets[@]}"; do
  corpus="$dir/corpus/$t"
  mkdir -p "$corpus"
  seeds="$ROOT/tests/fuzz/corpus/$t"
  log="$dir/$t.log"
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb bounds memory.
  if "$dir/tests/fuzz/${t}_fuzz" "$corpus" "$seeds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/crashes/$t-" >"$log" 2>&1; then
    execs=$(grep -m1 "stat::number_of_executed_units" "$log" | awk '{print $2}')
    cov=$(grep -E "^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)" "$log" | tail -1 | grep -oE "cov: [0-9]+ ft: [0-9]+" || true)
    echo "fuzz $t: ok, ${execs:-?} inputs in ${seconds} s, $cov, corpus $(ls "$corpus" | wc -l) files"
  else
    status=1
    echo "fuzz $t: FAILED (reproducer in $dir/crashes/, log $log):"
    grep -E "ERROR: |runtime error:|==[0-9]+==|SUMMARY|Test unit written|ALARM|deadly signal" -A14 "$log" | head -60
  fi
done
exit $status
