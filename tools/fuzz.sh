#!/usr/bin/env bash
# Fuzzes every parser of bytes that come from outside (tests/fuzz: the rendezvous store's
# requests, the running store's handshake and request handling, TCP frames, unique ids, Slurm
# host lists, interface names, launcher environments, flight-recorder records) with libFuzzer +
# AddressSanitizer + UndefinedBehaviorSanitizer, for a bounded time each. Builds with clang in
# build-fuzz/; seeds come from tests/fuzz/corpus/<target>, what the run finds goes to
# build-fuzz/corpus/<target> (kept between runs). A crash, a leak, a
# sanitizer report or a timeout fails the run and leaves the reproducer in build-fuzz/crashes/.
#   tools/fuzz.sh [target...]        LOOM_FUZZ_SECONDS per target (default 30), LOOM_FUZZ_JOBS at once
#                                    (default: one per core)
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
# One target's run; its summary goes to $dir/$t.summary, its status is the function's.
fuzz_one() {
  local t="$1" corpus="$dir/corpus/$1" seeds="$ROOT/tests/fuzz/corpus/$1" log="$dir/$1.log"
  mkdir -p "$corpus"
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb bounds memory.
  if "$dir/tests/fuzz/${t}_fuzz" "$corpus" "$seeds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/crashes/$t-" >"$log" 2>&1; then
    execs=$(grep -m1 "stat::number_of_executed_units" "$log" | awk '{print $2}')
    cov=$(grep -E "^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)" "$log" | tail -1 | grep -oE "cov: [0-9]+ ft: [0-9]+" || true)
    echo "fuzz $t: ok, ${execs:-?} inputs in ${seconds} s, $cov, corpus $(ls "$corpus" | wc -l) files" >"$dir/$t.summary"
  else
    {
      echo "fuzz $t: FAILED (reproducer in $dir/crashes/, log $log):"
      grep -E "ERROR: |runtime error:|==[0-9]+==|SUMMARY|Test unit written|ALARM|deadly signal" -A14 "$log" | head -60
    } >"$dir/$t.summary"
    return 1
  fi
}

# A libFuzzer run keeps one core busy: as many targets at once as there are cores
# (LOOM_FUZZ_JOBS), each for its full time, reported in order.
lanes="${LOOM_FUZZ_JOBS:-$(nproc)}"
[ "$lanes" -ge 1 ] 2>/dev/null || lanes=1
status=0
running=()
finish_first() {
  wait "${running[0]%%:*}" || status=1
  cat "$dir/${running[0]#*:}.summary"
  running=("${running[@]:1}")
}
for t in "${targets[@]}"; do
  fuzz_one "$t" &
  running+=("$!:$t")
  [ "${#running[@]}" -lt "$lanes" ] || finish_first
done
while [ "${#running[@]}" -gt 0 ]; do finish_first; done
exit $status
