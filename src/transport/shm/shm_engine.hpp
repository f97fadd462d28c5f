// ShmEngine: the shared-memory transport's progress thread, one per communicator and rank. It
// moves bytes on the rank's shared-memory connections when no waiting thread does, sleeps on the
// rank's doorbell (a futex word in its segment that every writer bumps) when there is nothing to
// do, and checks now and then that the peers still live.
//
// Why a thread of its own and not the epoll ProgressEngine: a futex cannot join an epoll set, and
// the alternative (an eventfd per rank passed over a Unix socket) needs a channel that network
// namespaces and containers often cut. The thread also holds the segment's liveness mutex for
// its whole life, which is what tells peers that this rank is alive (segment.hpp).
//
// Threads: start() and stop() from the communicator's thread; add() before start().
#pragma once

#include <atomic>
#include <thread>
#include <vector>

#include "transport/shm/shm_connection.hpp"

namespace loom {
namespace shm {

class ShmEngine {
 public:
  ShmEngine(int rank, SegmentHeader* mine) : rank_(rank), mine_(mine) {}
  ~ShmEngine() { stop(); }
  ShmEngine(const ShmEngine&) = delete;
  ShmEngine& operator=(const ShmEngine&) = delete;

  /// Starts the thread and returns once it holds the liveness mutex.
  void start();
  /// Connections to drive; they must outlive stop(). Before seal().
  void add(ShmConnection* c);
  /// No more connections: attend() may then read the list without a lock.
  void seal() { sealed_.store(true, std::memory_order_release); }
  /// Marks the segment closed (a clean exit), releases the liveness mutex and joins. Idempotent.
  void stop();
  /// A thread of this rank enters (on) or leaves (off) an operation in which it polls the
  /// connections itself; while one is in, peers do not wake this engine. The last one out wakes
  /// it if anything is left to move. Any thread.
  void attend(bool on) noexcept;
  /// A thread of this rank goes to sleep in a wait (on) or wakes (off): while one sleeps, every
  /// message wakes the engine, which completes the requests.
  void waiting(bool on) noexcept;

 private:
  void run(std::atomic<int>* started);
  /// Wakes the engine if a connection needs it: with anyWork, for any bytes to move (a thread
  /// is about to sleep); otherwise after taking in what this thread can.
  void handOver(bool anyWork) noexcept;

  const int rank_;
  SegmentHeader* const mine_;  // mapped by the transport, which stops us before unmapping
  std::mutex mu_;
  std::vector<ShmConnection*> conns_;  // guarded by mu_; copied by the thread when it changes
  std::atomic<uint32_t> version_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> sealed_{false};
  std::thread thread_;
};

}  // namespace shm
}  // namespace loom
