// The progress policy: when a thread that waits for bytes looks, spins, yields or sleeps. One set
// of rules for the progress engines' threads (core/progress_engine.hpp) and for callers' threads
// waiting on a request (Request::waitUntil), including those for machines with more ranks than
// cores ("crowded"), where a spinning thread takes the core its peer needs (docs/performance.md,
// "Why the defaults").
#pragma once

#include <chrono>
#include <cstddef>

namespace loom {
namespace progress {

/// Called by each communicator at join with its ranks on this machine (same boot id, even across
/// network namespaces or containers): more than the cores here makes this process crowded.
void noteRanksOnThisMachine(int ranks);
/// Whether this process shares the machine's cores with more ranks than there are cores.
bool crowded() noexcept;

/// What a thread does after `idle` polls in a row found nothing: with a core per rank it spins
/// on pause instructions (a message about to land must not cost a trip through the scheduler),
/// then yields; crowded, it yields at once, so that the peer it waits for runs (yielding later
/// more than doubled small all-reduces with 4 ranks on 2 cores).
void pause(int idle) noexcept;
/// Empty polls before a thread yields its core (pause() yields from then on).
int pauseSpins() noexcept;

// ---- A caller's thread waiting on a request. ----
/// CPU time of its own without progress a waiter polls before it sleeps (LOOM_SPIN_WAIT_US, or
/// LOOM_CROWDED_SPIN_WAIT_US when crowded).
std::chrono::microseconds waiterSpinBudget() noexcept;
/// However little CPU time a waiter gets, it looks at its deadline and at what would make the
/// wait hopeless at least this often.
constexpr std::chrono::milliseconds kWaiterWallLimit{100};
/// How often a sleeping waiter looks for what would make the wait hopeless.
constexpr std::chrono::milliseconds kSleeperCheckEvery{100};
/// Whether a wait for a collective's message of `bytes` skips polling and sleeps at once: when
/// crowded, for large transfers (LOOM_CROWDED_SLEEP_BYTES), which are not worth a core.
bool waiterSleepsAtOnce(size_t bytes) noexcept;
/// The calling thread's CPU time (what the spin budget counts).
std::chrono::nanoseconds threadCpuTime() noexcept;

// ---- An engine's thread over a wake word. ----
/// How long it keeps looking after anything moved before it sleeps (LOOM_SHM_ENGINE_SPIN_US).
std::chrono::microseconds engineSpin();
/// How often it runs its sources' maintenance (LOOM_SHM_LIVENESS_MS, at least 10 ms).
std::chrono::milliseconds maintenancePeriod();

}  // namespace progress
}  // namespace loom
