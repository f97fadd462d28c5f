// ProgressEngine: a thread that drives connections in the background, and the hand-over of work
// between it and callers' threads that wait (the waiter protocol). A connection is a
// ProgressSource: it moves what it can when asked (progress()) and says whether work is left; it
// is watched through one of two things:
//
//  - file descriptors (sockets, a completion channel): the engine waits in epoll and calls each
//    descriptor's PollHandler with the events;
//  - a wake word (a futex word in memory that peers in other processes bump when they leave work):
//    the engine polls its sources, keeps polling for a short while after anything moved
//    (LOOM_SHM_ENGINE_SPIN_US), calls their maintenance now and then (LOOM_SHM_LIVENESS_MS), and
//    sleeps on the word when there is nothing to do.
//
// The waiter protocol is the engine's too. Callers' threads post work and, while they wait, poll
// the connections themselves (no thread hand-off on the path). Who polls what, when:
//
//   thread                          polls                        and tells the engines
//   a collective's thread (the op   its peers' links, through    attend(true) for as long as it
//   queue's, or the caller's that   its requests' waits          runs (detail::AttendScope)
//   runs queued ops itself)
//   a thread in Request::waitUntil  the link of the request's    pollBegin/pollEnd around the
//   (spinning, progress_policy.hpp) peer; now and then another   spin (the engine stays off that
//                                                                source: polled())
//   the same thread, asleep once    nothing                      attend(false) and waiting(true)
//   its spin budget is spent                                     while asleep
//   a descriptor engine's thread    epoll: the sockets armed,    -
//   (receive; send for writes the   listeners, a completion
//   caller's thread left)           channel
//   a wake-word engine's thread     every source, when woken;    -
//   (shared memory)                 sleeps when none needsEngine
//
// The counts these calls keep are what a writer reads to decide whether to wake an engine (for a
// wake word they live beside it, in memory the peers share). When the last thread polling a source
// leaves it, or a thread goes to sleep, the engine takes the source back: resume(sleeper) — TCP
// then arms its sockets' reads, which it leaves unarmed while the callers' threads read them
// themselves. needsEngine says a source has work only the engine will do now (requests posted
// outside an attended operation), hasWork that anything at all waits to move (a sleeper's
// hand-over looks at it). When a thread spins, yields or sleeps is core/progress_policy.hpp.
//
// One engine watches one kind: a futex cannot join an epoll set, and the alternative (an eventfd
// per rank passed to the peers) needs a channel that network namespaces and containers often cut.
// A communicator's link table (transport/link_table.hpp) owns every engine: one that reads
// sockets, one that finishes writes (so that both directions of a link move at once), and one per
// wake word, made on request by a transport (shared memory's doorbell).
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

class ProgressEngine;

class PollHandler {
 public:
  virtual ~PollHandler() = default;
  /// Called on the engine thread with epoll's event bits. Must not throw.
  virtual void onPollEvents(uint32_t events) noexcept = 0;
};

/// What an engine drives: a connection.
class ProgressSource {
 public:
  virtual ~ProgressSource() = default;
  /// Moves whatever can move now without blocking; returns whether anything moved. Any thread.
  virtual bool progress() noexcept = 0;
  /// Whether work is left that only the engine will do now (no caller's thread polls it): a
  /// wake-word engine then looks again instead of sleeping.
  virtual bool needsEngine() const noexcept { return false; }
  /// Whether anything at all waits to move (bytes in, a backlog out): a thread about to sleep
  /// wakes the engine for it.
  virtual bool hasWork() const noexcept { return needsEngine(); }
  /// Called every maintenance period on a wake-word engine's thread (a peer's liveness).
  virtual void maintain() noexcept {}
  /// The engine takes the source back from callers' threads: the last thread polling it left it
  /// (`sleeper` false), or a thread of this rank is going to sleep in a wait (true). A source
  /// whose descriptors are armed only while the engine is needed arms them here.
  virtual void resume(bool sleeper) noexcept { (void)sleeper; }
  /// Whether a caller's thread polls this source now (between ProgressEngine::pollBegin and
  /// pollEnd): the engine stays off it meanwhile.
  bool polled() const noexcept { return pollersOf_->load(std::memory_order_acquire) > 0; }
  /// The engine it was added to, or null.
  ProgressEngine* engine() const noexcept { return engine_; }
  /// This source is driven through `front`, the source its engine holds (a link made after the
  /// engine was sealed, behind the stand-in that was added in its place): polled() and engine()
  /// answer front's. Before the source is used; `front` outlives it.
  void drivenThrough(const ProgressSource& front) noexcept {
    pollersOf_ = &front.pollers_;
    engine_ = front.engine_;
  }

 private:
  friend class ProgressEngine;
  std::atomic<int> pollers_{0};
  const std::atomic<int>* pollersOf_ = &pollers_;
  ProgressEngine* engine_ = nullptr;
};

/// How a polling engine is woken, and what its writers read to decide whether to: whoever leaves
/// it work bumps `word` and, when `sleepers` is not zero, wakes the futex on `word` — unless
/// `attending` says a thread of the owner polls the sources itself, or (for work that can wait)
/// `waiters` says none of its threads sleeps in a wait. All may live in memory shared with other
/// processes.
struct WakeWord {
  std::atomic<uint32_t>* word = nullptr;
  std::atomic<uint32_t>* sleepers = nullptr;
  std::atomic<uint32_t>* attending = nullptr;
  std::atomic<uint32_t>* waiters = nullptr;
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

  // ---- Sources (either kind). ----
  /// Adds a source: a wake-word engine polls it; either kind hands it back from callers' threads
  /// (the waiter protocol below). Any thread, before seal().
  void add(ProgressSource* source);
  /// No more sources: the waiter protocol then reads the list without a lock.
  void seal() { sealed_.store(true, std::memory_order_release); }
  /// Starts a wake-word engine's thread: it runs `atStart` first (start() returns after it ran)
  /// and `atExit` last, both on the engine thread (a lock that must be held by a thread for as
  /// long as the engine lives, such as shared memory's liveness mutex).
  void start(std::function<void()> atStart, std::function<void()> atExit);

  // ---- The waiter protocol (callers' threads). ----
  /// A thread enters (on) or leaves (off) an operation in which it polls the sources itself.
  /// While one is in, writers leave a wake word alone; the last one out moves what it can of what
  /// arrived meanwhile and wakes the engine for the rest. (Descriptors need no hand-over: their
  /// readiness is the kernel's.)
  void attend(bool on) noexcept;
  /// A thread polls `source` from now until pollEnd (Request's spin); `alsoAttend` when it is not
  /// inside an attended operation already. The last thread out hands the source back (resume).
  void pollBegin(ProgressSource& source, bool alsoAttend) noexcept;
  void pollEnd(ProgressSource& source, bool alsoAttend) noexcept;
  /// A thread goes to sleep in a wait (on) or wakes (off): meanwhile every message must reach
  /// the engine, which completes the requests.
  void waiting(bool on) noexcept;
  /// Threads asleep in a wait now (a source arms its descriptors while any is).
  uint32_t waitersAsleep() const noexcept { return wake_.waiters->load(std::memory_order_acquire); }

  /// Stops and joins the thread; handlers and sources are not called after it returns. Idempotent.
  void stop();
  bool onEngineThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void runDescriptors();
  void runSources();
  /// Gives the sources back to the engine after a thread stops polling them: with `sleeper`, every
  /// source with anything to move (a thread is about to sleep); otherwise this thread first moves
  /// what it can and the engine is woken for what is left.
  void handOver(bool sleeper) noexcept;
  /// Bumps the wake word and wakes the sleeping thread, unless a thread attends.
  void wakeWord() noexcept;

  int rank_;
  int epollFd_ = -1;
  int wakeFd_ = -1;
  WakeWord wake_;
  std::mutex mu_;
  std::vector<ProgressSource*> sources_;  // guarded by mu_ until sealed; copied by the thread when it changes
  std::atomic<bool> sealed_{false};
  // A descriptor engine's counts (a wake word's live in the word's memory).
  std::atomic<uint32_t> localAttending_{0};
  std::atomic<uint32_t> localWaiters_{0};
  std::atomic<uint32_t> version_{0};
  std::function<void()> atExit_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace loom
