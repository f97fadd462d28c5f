// ProgressEngine: a thread that drives connections in the background, with the one policy for
// when to look, spin and sleep. A connection gives it one of two things to watch:
//
//  - a file descriptor (a socket, a completion channel): the engine waits in epoll and calls the
//    descriptor's PollHandler with the events;
//  - a wake word (a futex word in memory that peers in other processes bump when they leave
//    work): the engine polls the connection as a ProgressSource, keeps polling for a short while
//    after anything moved (LOOM_SHM_ENGINE_SPIN_US), calls its maintenance now and then
//    (LOOM_SHM_LIVENESS_MS), and sleeps on the word when there is nothing to do.
//
// One engine watches one kind: a futex cannot join an epoll set, and the alternative (an eventfd
// per rank passed to the peers) needs a channel that network namespaces and containers often cut.
// A communicator's link table (transport/link_table.hpp) owns every engine: one that reads
// sockets, one that finishes writes (so that both directions of a link move at once), and one per
// wake word, made on request by a transport (shared memory's doorbell). Callers' threads only post
// work, may write to an idle socket themselves, and while waiting poll their connections.
//
// Handlers and sources must stay valid until the engine stopped; the link table stops its engines
// before it destroys connections.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom {

class PollHandler {
 public:
  virtual ~PollHandler() = default;
  /// Called on the engine thread with epoll's event bits. Must not throw.
  virtual void onPollEvents(uint32_t events) noexcept = 0;
};

/// A connection an engine polls (one woken through a word in memory).
class ProgressSource {
 public:
  virtual ~ProgressSource() = default;
  /// Moves whatever can move now without blocking; returns whether anything moved.
  virtual bool progress() noexcept = 0;
  /// Whether work is left that only the engine will do now (it then looks again, not sleeps).
  virtual bool needsEngine() const noexcept = 0;
  /// Called every maintenance period on the engine thread (a peer's liveness).
  virtual void maintain() noexcept {}
};

/// How a polling engine is woken: whoever leaves it work bumps `word` and, when `sleepers` is not
/// zero, wakes the futex on `word`. Both may live in memory shared with other processes.
struct WakeWord {
  std::atomic<uint32_t>* word = nullptr;
  std::atomic<uint32_t>* sleepers = nullptr;
};

class ProgressEngine {
 public:
  /// An engine over file descriptors; its thread starts at once. `rank` is what its log lines show.
  explicit ProgressEngine(int rank);
  /// An engine over sources woken through `wake`; its thread starts with start().
  ProgressEngine(int rank, WakeWord wake);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // ---- Descriptors (the first constructor). ----
  /// Registers fd (level-triggered) with the given EPOLLIN/EPOLLOUT interest. Any thread.
  void add(int fd, PollHandler* handler, uint32_t events);
  /// Changes the interest of a registered fd. Any thread.
  void modify(int fd, PollHandler* handler, uint32_t events);
  /// Unregisters fd. Any thread.
  void remove(int fd);

  // ---- Sources (the second constructor). ----
  /// Adds a source to poll. Any thread, before or after start().
  void add(ProgressSource* source);
  /// Starts the thread: it runs `atStart` first (start() returns after it ran) and `atExit` last,
  /// both on the engine thread (a lock that must be held by a thread for as long as the engine
  /// lives, such as shared memory's liveness mutex).
  void start(std::function<void()> atStart, std::function<void()> atExit);

  /// Stops and joins the thread; handlers and sources are not called after it returns. Idempotent.
  void stop();
  bool onEngineThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void runDescriptors();
  void runSources();

  int rank_;
  int epollFd_ = -1;
  int wakeFd_ = -1;
  WakeWord wake_;
  std::mutex mu_;
  std::vector<ProgressSource*> sources_;  // guarded by mu_; copied by the thread when it changes
  std::atomic<uint32_t> version_{0};
  std::function<void()> atExit_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace loom
