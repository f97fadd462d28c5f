// ShmEngine: how the shared-memory transport's links are driven in the background. Its
// connections are ProgressSources of a progress engine (core/progress_engine.hpp) that the link
// table made for the rank's doorbell (a futex word in its segment that every writer bumps); that
// engine's thread holds the segment's liveness mutex for its whole life, which is what tells peers
// that this rank is alive (segment.hpp), and checks now and then that the peers still live.
//
// What stays here is the protocol between writers and the owner's threads that decides when a
// writer must ring (segment.hpp, ring()): attend() and waiting() keep the segment's counters that
// writers read, and hand over to the engine what an attending thread leaves behind.
//
// Threads: start() and stop() from the communicator's thread; add() before seal().
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "core/progress_engine.hpp"
#include "transport/shm/shm_connection.hpp"

namespace loom {
namespace shm {

class ShmEngine {
 public:
  /// `engine` polls the connections and sleeps on `mine`'s doorbell (the link table's; it
  /// outlives this).
  ShmEngine(SegmentHeader* mine, ProgressEngine& engine) : mine_(mine), engine_(engine) {}
  ~ShmEngine() { stop(); }
  ShmEngine(const ShmEngine&) = delete;
  ShmEngine& operator=(const ShmEngine&) = delete;

  /// Starts the engine's thread and returns once it holds the liveness mutex.
  void start();
  /// Connections to drive; they must outlive stop(). Before seal().
  void add(ShmConnection* c);
  /// No more connections: attend() may then read the list without a lock.
  void seal() { sealed_.store(true, std::memory_order_release); }
  /// Stops the engine: it marks the segment closed (a clean exit) and releases the liveness
  /// mutex as its thread ends. Idempotent.
  void stop() { engine_.stop(); }
  /// A thread of this rank enters (on) or leaves (off) an operation in which it polls the
  /// connections itself; while one is in, peers do not wake the engine. The last one out wakes
  /// it if anything is left to move. Any thread.
  void attend(bool on) noexcept;
  /// A thread of this rank goes to sleep in a wait (on) or wakes (off): while one sleeps, every
  /// message wakes the engine, which completes the requests.
  void waiting(bool on) noexcept;

 private:
  /// Wakes the engine if a connection needs it: with anyWork, for any bytes to move (a thread
  /// is about to sleep); otherwise after taking in what this thread can.
  void handOver(bool anyWork) noexcept;

  SegmentHeader* const mine_;  // mapped by the transport, which stops us before unmapping
  ProgressEngine& engine_;
  std::mutex mu_;
  std::vector<ShmConnection*> conns_;  // guarded by mu_ until sealed
  std::atomic<bool> sealed_{false};
};

}  // namespace shm
}  // namespace loom
