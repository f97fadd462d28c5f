// Barriers on the shared arena's step counters (see arena_sync.hpp).
#include "collectives/arena_sync.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/format.hpp"
#include "core/progress_policy.hpp"

namespace loom {
namespace coll {

namespace {
// A wait that lasts longer than kSpinFor stops yield-spinning and naps, each nap twice the last up
// to kLongestNap: ranks held for seconds (one rank writing a checkpoint before the next collective)
// leave their cores to others, and a nap adds at most kLongestNap to a wait that already lasted
// kSpinFor. Shorter waits (ranks a little apart in a training step) never nap.
constexpr auto kSpinFor = std::chrono::milliseconds(50);
constexpr auto kFirstNap = std::chrono::microseconds(50);
constexpr auto kLongestNap = std::chrono::microseconds(1000);

// ThreadSanitizer's view of the barrier (LocalArena::processClock); nothing in other builds.
inline void tsanTick(const LocalArena& ar) {
#if defined(__SANITIZE_THREAD__)
  if (ar.processClock) ar.processClock->fetch_add(1, std::memory_order_acq_rel);
#else
  (void)ar;
#endif
}
}  // namespace

void barrier(const Context& c, const LocalArena& ar, uint64_t target) {
  tsanTick(ar);
  ar.steps[static_cast<size_t>(ar.me)]->store(target, std::memory_order_release);
  const auto& comm = c.comm();
  // Set at the first slow check: a barrier that passes at once reads no clock.
  Clock::time_point deadline = Clock::time_point::max(), napFrom = Clock::time_point::max();
  auto nap = std::chrono::microseconds(0);  // 0: not napping yet
  const int pauses = progress::pauseSpins();
  for (size_t p = 0; p < ar.steps.size(); ++p) {
    if (static_cast<int>(p) == ar.me) continue;
    for (unsigned spins = 0; ar.steps[p]->load(std::memory_order_acquire) < target; ++spins) {
      if (static_cast<int>(spins) < pauses) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        continue;
      }
      if (nap.count() > 0) {
        std::this_thread::sleep_for(nap);
        nap = std::min<std::chrono::microseconds>(nap * 2, kLongestNap);
      } else {
        std::this_thread::yield();
        if ((spins & 255) != 0) continue;
      }
      c.check();  // answers a dump request (loom-info --dump, a timed-out peer) now and then
      if (comm.failureState()->failed()) throw comm.failureState()->first().toError(comm.rank());
      // A peer in another call with this one's number will never reach our step: say so.
      if (Status m = comm.localCallMismatch(c.seq(), c.signature()); !m.ok) {
        m.message =
            strFormat("%s #%lld (%s): %s", c.name(), static_cast<long long>(c.seq()), c.algo(), m.message.c_str());
        comm.failureState()->fail(m);
        throw m.toError(comm.rank());
      }
      // Any rank of the node that failed or left before it reached this step dooms this
      // collective, not only the one awaited. One that reached it did its part: after the last
      // barrier of a collective a rank may return and close its communicator while the others
      // still wait here for a third one, or read its area (which stays mapped in theirs). A rank
      // publishes its step before it leaves, so its step is read after the word that it left.
      for (size_t q = 0; ar.gone && q < ar.steps.size(); ++q) {
        if (static_cast<int>(q) == ar.me) continue;
        const std::string why = ar.gone(static_cast<int>(q));
        if (!why.empty() && ar.steps[q]->load(std::memory_order_acquire) < target) {
          Status s = Status::error(ErrorCode::Remote,
                                   strFormat("%s #%lld (%s): rank %d will not take part: %s", c.name(),
                                             static_cast<long long>(c.seq()), c.algo(), ar.ranks[q], why.c_str()),
                                   ar.ranks[q], c.seq());
          comm.failureState()->fail(s);
          throw s.toError(comm.rank());
        }
      }
      const Clock::time_point now = Clock::now();
      if (deadline == Clock::time_point::max()) {
        deadline = now + comm.timeout();
        napFrom = now + kSpinFor;
      } else if (nap.count() == 0 && now > napFrom) {
        nap = kFirstNap;
      }
      if (now > deadline) {
        const std::string report = c.diagnose();
        Status s = Status::error(
            ErrorCode::Timeout,
            strFormat("%s #%lld (%s): timed out after %.1f s waiting for rank %d to reach step %llu of the "
                      "shared-memory exchange: it may have stopped, hung or called a different collective "
                      "(LOOM_TIMEOUT sets the deadline)%s%s",
                      c.name(), static_cast<long long>(c.seq()), c.algo(),
                      static_cast<double>(comm.timeout().count()) / 1000.0, ar.ranks[p],
                      static_cast<unsigned long long>(target), report.empty() ? "" : "\n", report.c_str()),
            ar.ranks[p], c.seq());
        comm.failureState()->fail(s);
        throw s.toError(comm.rank());
      }
    }
  }
  tsanTick(ar);
}

}  // namespace coll
}  // namespace loom
