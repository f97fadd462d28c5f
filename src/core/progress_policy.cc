#include "core/progress_policy.hpp"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>

#include "core/param.hpp"

namespace loom {
namespace progress {
namespace {

// Long enough to ride out the skew between ranks that start a collective at slightly different
// times (a DDP bucket started during backward: a tenth of it hid markedly less of the gradient
// all-reduce in bench/ddp_overlap), short enough not to hold a core while a peer computes.
// Back-to-back collectives never sleep, so it does not change them.
LOOM_PARAM_INT(spinWaitUs, "LOOM_SPIN_WAIT_US", 500,
               "microseconds of its own CPU time without progress a waiter keeps polling its connection before it "
               "sleeps");
// Crowded, a waiter yields its core after every empty poll, so polling longer costs the ranks that
// share the core little, while each sleep costs a wake-up through the progress engine and a new
// placement by the scheduler, which can leave several spinning ranks on one core for a while.
LOOM_PARAM_INT(crowdedSpinWaitUs, "LOOM_CROWDED_SPIN_WAIT_US", 5000,
               "LOOM_SPIN_WAIT_US with more ranks than cores on the machine");
LOOM_PARAM_INT(crowdedSleepParam, "LOOM_CROWDED_SLEEP_BYTES", 256 * 1024,
               "with more ranks than cores, waits for collective messages this large sleep at once instead of "
               "polling (0: always poll first)");
// The names say shared memory: its doorbell is the only wake word so far, and users set these.
LOOM_PARAM_INT(engineSpinParam, "LOOM_SHM_ENGINE_SPIN_US", 20,
               "microseconds a progress engine woken through a wake word (shared memory's) keeps looking for "
               "work before it sleeps");
LOOM_PARAM_INT(livenessMsParam, "LOOM_SHM_LIVENESS_MS", 100,
               "how often (ms) a progress engine woken through a wake word checks that its peers still run");

constexpr int kPauseSpinsAlone = 4096;
constexpr int kPauseSpinsCrowded = 1;
std::atomic<int> pauseSpins_{kPauseSpinsAlone};

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void noteRanksOnThisMachine(int ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (ranks > cores) pauseSpins_.store(kPauseSpinsCrowded, std::memory_order_relaxed);
}

bool crowded() noexcept { return pauseSpins_.load(std::memory_order_relaxed) <= kPauseSpinsCrowded; }

int pauseSpins() noexcept { return pauseSpins_.load(std::memory_order_relaxed); }

void pause(int idle) noexcept {
  if (idle < pauseSpins_.load(std::memory_order_relaxed))
    cpuRelax();
  else
    std::this_thread::yield();
}

std::chrono::microseconds waiterSpinBudget() noexcept {
  static const int64_t alone = spinWaitUs();
  static const int64_t shared = crowdedSpinWaitUs();
  return std::chrono::microseconds(crowded() ? shared : alone);
}

bool waiterSleepsAtOnce(size_t bytes) noexcept {
  static const size_t limit = [] {
    const auto v = static_cast<size_t>(std::max<int64_t>(0, crowdedSleepParam()));
    return v == 0 ? SIZE_MAX : v;
  }();
  return crowded() && bytes >= limit;
}

// The spin budget counts this thread's own CPU time: crowded, a waiter that the scheduler left off
// its core for a millisecond (while its peer ran there) has not waited in vain, and going to sleep
// then (a wake-up through the progress engine, and a fresh placement by the scheduler) costs more
// than the message it waits for. With a core per rank the two clocks agree.
std::chrono::nanoseconds threadCpuTime() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

std::chrono::microseconds engineSpin() { return std::chrono::microseconds(engineSpinParam()); }

std::chrono::milliseconds maintenancePeriod() {
  return std::chrono::milliseconds(std::max<int64_t>(10, livenessMsParam()));
}

}  // namespace progress
}  // namespace loom
