#!/usr/bin/env bash
# Builds Loom with a sanitizer in its own build directory and runs the tests that fit the time:
#   tools/sanitize.sh address   AddressSanitizer + UndefinedBehaviorSanitizer (and LeakSanitizer)
#   tools/sanitize.sh thread    ThreadSanitizer
# Every unit test; the in-process and multi-process tests below (every transport, every fault
# path, the collectives on small matrices, a soak); any report fails the run. Suppressions live
# in tests/sanitizers/, each with its reason. Run by `meson test` (suite "sanitize").
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
kind="${1:?usage: tools/sanitize.sh address|thread}"
case "$kind" in
  address) dir="$ROOT/build-asan"; flags="address,undefined" ;;
  thread) dir="$ROOT/build-tsan"; flags="thread" ;;
  *) echo "sanitize.sh: address or thread, not $kind" >&2; exit 2 ;;
esac
# -O1 with line tables (-g1): compiles in about 40% of the release build's -O3 time on 2 cores, and
# sanitizer reports name file and line. NDEBUG as in release, so the code under test is the same.
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "$ROOT" -Db_sanitize="$flags" -Db_lundef=false -Dwerror=true -Dcuda=disabled \
    -Doptimization=1 -Db_ndebug=true -Dcpp_args=-g1 -Dc_args=-g1 >/dev/null
fi
ninja -C "$dir" tests/loom_unit_tests tests/loom_inproc_tests tests/multiproc/loom_multiproc_tests \
  tests/multiproc/loom_mp_worker tests/multiproc/loom_device_worker tools/loomrun tools/loom-info \
  examples/recover_after_failure >/dev/null

export LOOM_TEST_DATA="$ROOT/tests/unit/data"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# intercept_tls_get_addr=0: GCC 12's runtime takes a dynamic TLS block (of a library loaded with
# dlopen) that malloc placed 16 bytes into a page for one with a pre-2.25 glibc header, reads a start
# and size from before it; the leak check's tracer then scans garbage and dies at exit ("Tracer
# caught signal 11"), now and then (google/sanitizers#1409, fixed in LLVM 17). The blocks stay
# reachable, and scanned, through the thread's DTV.
export ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=0:intercept_tls_get_addr=0"
export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitizers/lsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/tests/sanitizers/tsan.supp"
export LOOM_SOAK_OPS=300
export LOOM_TEST_TIMEOUT=90  # in-process tests' collective deadline: sanitized builds run several times slower
export LOOMRUN="$dir/tools/loomrun" LOOM_INFO="$dir/tools/loom-info" LOOM_TEST_WORKER="$dir/tests/multiproc/loom_mp_worker"
export LOOM_DEVICE_WORKER="$dir/tests/multiproc/loom_device_worker"
export LOOM_EXAMPLE="$dir/examples/sendrecv_tensor" LOOM_RECOVER_EXAMPLE="$dir/examples/recover_after_failure"
ninja -C "$dir" examples/sendrecv_tensor >/dev/null
# The tests' verbs provider, for the in-process tests over ib (built where the verbs headers are).
# Asked with `-t query`, not a pipe into `grep -q`: grep leaving early can kill ninja with SIGPIPE,
# which pipefail turns into "no provider" and the ib tests into failures against the real library.
if ninja -C "$dir" -t query tests/libloom_test_verbs.so >/dev/null 2>&1; then
  ninja -C "$dir" tests/libloom_test_verbs.so >/dev/null
  export LOOM_TEST_VERBS_PROVIDER="$dir/tests/libloom_test_verbs.so"
fi

if [ "$kind" = address ]; then
  inproc='*P2P*:Shm.*:Links/*:Store.*:CApi.*:Communicator.*:Collectives.*:Shm/SmallMatrix.*/3ranks*:Tcp/SmallMatrix.*/3ranks*'
  inproc+=':Mixed/SmallMatrix.*/5ranks*:Shm/LargeCounts.*/3ranks_ring:MixedEven/*:Nodes*:DeviceStaged.*:Paths/DevicePath.*'
  inproc+=':Shm/SmallMatrix.*/5ranks_hd*:Shm/LargeCounts.*/5ranks_hd*:IbZeroCopy.*:IbGpuDirect.*:*AnySource*:MonitoredBarrier.*'
  inproc+=':Layouts/Reproducible.*/tcp3:Layouts/Reproducible.*/shm3:Layouts/Reproducible.*/mixed4:Reproducible.Ranks*'
  inproc+=':DeviceReproducible.*:OnDemand.*:OnDemandIb.*:OnDemandShm.*:Split.*:IbSetUp.*:-Collectives.Every64MiB*:Collectives.AllReduce64MiB'
  # The canonical tree's float checks are arithmetic, the same code on every layout: one layout here.
  inproc+=':Layouts/Reproducible.EveryFloatReductionIsTheCanonicalTree/tcp3:Layouts/Reproducible.EveryFloatReductionIsTheCanonicalTree/mixed4'
  # The device matrix and the three-piece ring once per kind of link, not on every mix of them: the
  # layouts left out (about 75 s here) run the same code over links the ones kept already cover.
  inproc+=':Mixed/SmallMatrix.*/5ranks_ring_3_mixed:Links/DeviceMatrix.*/4ranks_mixed:Links/DeviceMatrix.*/6ranks_mixed3_ipc'
  inproc+=':Links/DeviceMatrix.*/4ranks_ipc:Links/DeviceMatrix.*/5ranks_ipc'
  # The plan's exchanges are index arithmetic that the test itself bounds-checks on every buffer
  # (41 s under AddressSanitizer, a second or two in release).
  unit='-Plan.HalvingDoublingExchangesMatchAndCoverTheBuffer'
  multiproc='Faults.*:SharedMemory.*:Loomrun.*:CudaIpc.*:IbProcesses.*'
else
  inproc='*P2P*:Links/Mismatch*:Links/HangReport*:Communicator.*:Collectives.SeveralInFlight*:Collectives.BadArguments*'
  inproc+=':Tcp/SmallMatrix.*/3ranks_auto*:Shm/SmallMatrix.*/3ranks_auto*:Shm/SmallMatrix.*/4ranks_direct*:Links/Soak.*/4ranks_shm'
  inproc+=':Soak.TwoCommunicators*:GradSync.*:Ranks/DataParallel.*:DeviceStaged.*:Paths/DevicePath.*:Links/DeviceMatrix.*/3ranks*'
  inproc+=':Shm/SmallMatrix.*/5ranks_hd*:IbZeroCopy.*:IbGpuDirect.*:*AnySource*:Layouts/Reproducible.*/tcp3'
  inproc+=':Layouts/Reproducible.*/shm3:OnDemand.*:OnDemandIb.*:OnDemandShm.*:Split.*:Store.*Wait*:IbSetUp.*:-*LargeBothDirections*'
  # Large counts through the staged device path once (37 s): DeviceStaged.* covers its threads.
  inproc+=':Paths/DevicePath.LargeCountsWithDefaultSlots/staged'
  # Single-threaded plan arithmetic gives ThreadSanitizer nothing to watch (and takes it 100 s); the
  # GPUDirect test between processes moves every size through the emulated device (90 s here), whose
  # threads the in-process IbGpuDirect tests cover.
  unit='-Plan.HalvingDoublingExchangesMatchAndCoverTheBuffer'
  multiproc='Faults.RecoveryExample*:SharedMemory.SigkillInMid*:SharedMemory.ARank*:IbProcesses.*'
  multiproc+=':-IbProcesses.DeviceBuffersMoveByGpuDirectRdma'
fi
status=0
echo "sanitize ($kind): unit tests ($unit)"
"$dir/tests/loom_unit_tests" --gtest_filter="$unit" >"$dir/unit.log" 2>&1 || { tail -40 "$dir/unit.log"; status=1; }
echo "sanitize ($kind): in-process tests ($inproc)"
"$dir/tests/loom_inproc_tests" --gtest_filter="$inproc" >"$dir/inproc.log" 2>&1 || { grep -E "ERROR|WARNING|runtime error|FAILED|Failure" -A20 "$dir/inproc.log" | head -120; status=1; }
echo "sanitize ($kind): multi-process tests ($multiproc)"
"$dir/tests/multiproc/loom_multiproc_tests" --gtest_filter="$multiproc" >"$dir/multiproc.log" 2>&1 || { grep -E "ERROR|WARNING|runtime error|FAILED|Failure" -A20 "$dir/multiproc.log" | head -120; status=1; }
for log in unit inproc multiproc; do
  if grep -qE "ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:" "$dir/$log.log"; then
    echo "sanitize ($kind): reports in $log tests:"; grep -E "ERROR: |WARNING: ThreadSanitizer|runtime error:" -A12 "$dir/$log.log" | head -60
    status=1
  fi
  grep -E "^\[  (PASSED|FAILED)  \]" "$dir/$log.log" | sed "s/^/sanitize ($kind) $log: /"
done
exit $status
