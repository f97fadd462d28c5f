// Request: the completion of one operation (a send, a receive, a whole collective), shared by
// the Work the caller holds and by the code that completes it (a Connection on the progress
// thread, or the op queue). Complete or fail exactly once; waiters spin briefly, then sleep.
//
// FailureState: the communicator's first error. Shared by the communicator and its requests, so
// that a Work that outlives its communicator can still be waited on safely.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "core/deadline.hpp"
#include "core/receive_consumer.hpp"
#include "core/status.hpp"

namespace loom {

namespace detail {
class Request;
}

class FailureState {
 public:
  /// Records `s` as the communicator's failure if it is the first; then runs the failure hook
  /// (which fails every pending request). Returns true for the first failure.
  bool fail(const Status& s);
  /// The two halves of fail(), for a transport that must fail its own requests between them:
  /// record() records `s` if it is the first failure (failed() is true from then on) and returns
  /// whether it was; the caller that got true then calls runHook(s). A thread woken by a request
  /// that failed must find its communicator failed already (tcp_connection.cc, failFrom).
  bool record(const Status& s);
  void runHook(const Status& s);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// The first failure (ok when none).
  Status first() const;
  /// Installs (or, with nullptr, removes) the hook run on the first failure. The hook runs with
  /// an internal lock held: removing it waits until a running hook has finished.
  void setHook(std::function<void(const Status&)> hook);

 private:
  mutable std::mutex mu_;
  Status first_;
  std::atomic<bool> failed_{false};
  std::mutex hookMu_;
  std::function<void(const Status&)> hook_;
};

/// What a waiting thread can drive: its communicator's connection to one peer.
class Progressable {
 public:
  virtual ~Progressable() = default;
  virtual bool pollPeer(int peer) noexcept = 0;
  /// Polls one connection other than `peer`'s, taking them in turn: a waiter also moves what
  /// its other peers need of this rank (a receive engine may be resting; tcp_connection.hpp).
  virtual bool pollAnother(int peer) noexcept = 0;
  virtual void beginPolling(int peer) noexcept = 0;
  virtual void endPolling(int peer) noexcept = 0;
  /// A thread enters or leaves an operation in which it polls (ProgressEngine::attend).
  virtual void attend(bool on) noexcept = 0;
  /// A thread goes to sleep in a wait, or wakes (ProgressEngine::waiting).
  virtual void waiting(bool on) noexcept = 0;
  /// Called now and then by a thread that has waited a while: looks for what would make the wait
  /// hopeless (a peer of this node in another collective call) and fails the communicator then.
  virtual void check() noexcept = 0;
  /// For a wait that timed out: a report of what every rank is doing ("" when there is none).
  virtual std::string diagnose() noexcept = 0;
  /// Called by a thread about to wait for a queued collective's completion `done`: runs the ops
  /// queued up to it on that thread, in order, when the queue's worker has not taken them yet
  /// (saves the hand-off to the worker, and a second busy thread per rank on a small machine).
  virtual void runQueued(const detail::Request* done) noexcept = 0;
};

/// Lets a waiting thread drive its communicator's connections (see ProgressSource::progress). Shared by
/// the communicator and its requests; the communicator detaches it before it tears down, and
/// detach() waits for calls in progress.
class ProgressHook {
 public:
  explicit ProgressHook(Progressable* target) : target_(target) {}
  bool poll(int peer) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return target_ != nullptr && target_->pollPeer(peer);
  }
  bool pollAnother(int peer) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return target_ != nullptr && target_->pollAnother(peer);
  }
  void begin(int peer) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (target_ != nullptr) target_->beginPolling(peer);
  }
  void end(int peer) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (target_ != nullptr) target_->endPolling(peer);
  }
  void attend(bool on) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (target_ != nullptr) target_->attend(on);
  }
  void waiting(bool on) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (target_ != nullptr) target_->waiting(on);
  }
  void check() {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (target_ != nullptr) target_->check();
  }
  std::string diagnose() {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return target_ != nullptr ? target_->diagnose() : std::string();
  }
  void runQueued(const detail::Request* done) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (target_ != nullptr) target_->runQueued(done);
  }
  void detach() {
    std::unique_lock<std::shared_mutex> lock(mu_);
    target_ = nullptr;
  }

 private:
  std::shared_mutex mu_;
  Progressable* target_;  // the communicator; valid until detach()
};

namespace detail {

/// Marks the calling thread as attending `hook`'s communicator for its lifetime (a collective
/// running on it: it polls the connections itself, so transports need not wake their progress
/// threads). A wait that gives up spinning and sleeps steps out meanwhile.
class AttendScope {
 public:
  explicit AttendScope(const std::shared_ptr<ProgressHook>& hook);
  ~AttendScope();
  AttendScope(const AttendScope&) = delete;
  AttendScope& operator=(const AttendScope&) = delete;
  /// The hook the calling thread attends, or nullptr.
  static ProgressHook* current();

 private:
  ProgressHook* hook_;
  ProgressHook* previous_;
};

/// What a message is, for timeout and error messages: kept as fields and formatted only when a
/// message needs it (formatting a string for every message cost about a microsecond of
/// small-message latency). The strings are static (collective, algorithm and type names).
struct Label {
  const char* coll = nullptr;  ///< collective name, or nullptr for a user message
  const char* algo = "";
  int64_t seq = -1;
  int channel = 0;
  bool send = false;
  size_t bytes = 0;  ///< collective messages
  size_t count = 0;  ///< user messages
  const char* type = "";
  uint32_t tag = 0;
  std::string format(int peer) const;
};

class Request {
 public:
  /// `what` describes the operation for timeout messages ("recv of 40 B from rank 0, tag 0").
  Request(int rank, int peer, std::string what, std::chrono::milliseconds timeout,
          std::shared_ptr<FailureState> failure, std::shared_ptr<ProgressHook> progress = nullptr);
  /// The same, described by a label formatted only when needed.
  Request(int rank, int peer, const Label& label, std::chrono::milliseconds timeout,
          std::shared_ptr<FailureState> failure, std::shared_ptr<ProgressHook> progress = nullptr);

  /// Marks success with `bytes` moved. No-op when already done.
  void complete(size_t bytes) noexcept;
  /// Marks failure. No-op when already done.
  void fail(const Status& status) noexcept;

  bool done() const { return done_.load(std::memory_order_acquire); }
  /// Waits until done or until the deadline; returns done().
  bool waitUntil(Clock::time_point deadline);
  /// Waits with the request's timeout, then throws on failure or timeout (a timeout also marks
  /// the communicator failed).
  void wait();
  void wait(std::chrono::milliseconds timeout);
  /// Throws the failure if done and failed; returns done().
  bool test();
  /// Runs `fn` once the request is done: at once on this thread if it already is, else on the
  /// thread that completes or fails it, after the request is marked done (no lock held).
  void onDone(std::function<void(const Status&)> fn);

  Status status() const;
  size_t bytes() const { return bytes_; }
  int rank() const { return rank_; }
  int peer() const { return peer_; }
  /// The rank whose message a receive took: its peer, or for a receive from any source (peer -1)
  /// the peer of the link that matched it, -1 until one did.
  int source() const { return source_.load(std::memory_order_acquire); }
  /// Set by the link that matches a receive from any source, before it completes it.
  void setSource(int rank) { source_.store(rank, std::memory_order_release); }
  /// For a device receive from any source (kDeviceAnySourceRecv): the mark of the message it took,
  /// a CUDA IPC descriptor or plain bytes (0); set by the link before it completes it.
  uint64_t matchedSignature() const { return matchedSig_.load(std::memory_order_acquire); }
  void setMatchedSignature(uint64_t sig) { matchedSig_.store(sig, std::memory_order_release); }
  std::string what() const { return label_ ? label_->format(peer_) : what_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// For a collective's completion on the op queue: lets wait() run the queued ops itself
  /// (Progressable::runQueued). Set before the request is queued.
  void setQueue(std::shared_ptr<ProgressHook> queue) { queue_ = std::move(queue); }
  /// For a collective's completion on the op queue: a timeout carries the hang report, as one in
  /// the collective's own waits does (the caller's wait may end first while a worker thread runs
  /// the collective). Set before the request is queued.
  bool diagnoseOnTimeout = false;
  /// For receives whose size must match exactly (collectives): the size expected, or SIZE_MAX.
  size_t expectBytes = SIZE_MAX;
  /// For the waiter of a receive with a consumer (RecvSpec::consumer): the consumer and the
  /// receive's buffer, where the bytes are when the link did not hand them on (consumed false),
  /// so that the waiter hands them on itself. Transports read the RecvSpec, not these.
  std::shared_ptr<ReceiveConsumer> consumer;
  const void* consumerBuffer = nullptr;
  /// Set by a transport that handed every byte to `consumer` (and wrote none to the buffer), before
  /// it completes the request; read by the waiter once done() (whose acquire orders it).
  bool consumed = false;

 private:
  void throwIfFailed();

  const int rank_;
  const int peer_;
  std::atomic<int> source_;
  std::atomic<uint64_t> matchedSig_{0};
  const std::string what_;
  const std::optional<Label> label_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<FailureState> failure_;
  const std::shared_ptr<ProgressHook> progress_;
  std::shared_ptr<ProgressHook> queue_;
  std::atomic<bool> done_{false};
  size_t bytes_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status status_;
  int sleepers_ = 0;
  std::vector<std::function<void(const Status&)>> callbacks_;  // guarded by mu_, run once when done
  void runCallbacks(std::unique_lock<std::mutex>& lock) noexcept;
};

}  // namespace detail

using RequestPtr = std::shared_ptr<detail::Request>;

}  // namespace loom
