// ProgressEngine: a thread that drives connections in the background: it waits in epoll on their
// sockets and calls their handlers. A communicator has two: one reads, one finishes writes, so
// that both directions of a link move at once (the guide's single engine serialised them and
// left large messages at two thirds of what raw sockets carry). Callers' threads only post work
// and may try a non-blocking write themselves (see tcp_connection.hpp).
//
// Handlers registered with add() must stay valid until remove() returned or the engine stopped;
// the communicator destroys connections only after stop().
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace loom {

class PollHandler {
 public:
  virtual ~PollHandler() = default;
  /// Called on the engine thread with epoll's event bits. Must not throw.
  virtual void onPollEvents(uint32_t events) noexcept = 0;
};

class ProgressEngine {
 public:
  /// Starts the thread; `rank` is what its log lines show.
  explicit ProgressEngine(int rank);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  /// Registers fd (level-triggered) with the given EPOLLIN/EPOLLOUT interest. Any thread.
  void add(int fd, PollHandler* handler, uint32_t events);
  /// Changes the interest of a registered fd. Any thread.
  void modify(int fd, PollHandler* handler, uint32_t events);
  /// Unregisters fd. Any thread.
  void remove(int fd);
  /// Stops and joins the thread; handlers are not called after it returns. Idempotent.
  void stop();
  bool onEngineThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void run();

  int rank_;
  int epollFd_ = -1;
  int wakeFd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace loom
