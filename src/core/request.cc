#include "core/request.hpp"

#include <algorithm>
#include <thread>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/progress_policy.hpp"

namespace loom {

bool FailureState::fail(const Status& s) {
  if (!record(s)) return false;
  runHook(s);
  return true;
}

bool FailureState::record(const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) return false;
  first_ = s;
  failed_.store(true, std::memory_order_release);
  return true;
}

void FailureState::runHook(const Status& s) {
  std::lock_guard<std::mutex> lock(hookMu_);
  if (hook_) hook_(s);
}

Status FailureState::first() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

void FailureState::setHook(std::function<void(const Status&)> hook) {
  std::lock_guard<std::mutex> lock(hookMu_);
  hook_ = std::move(hook);
}

namespace detail {

namespace {
thread_local ProgressHook* tlAttended = nullptr;
}  // namespace

AttendScope::AttendScope(const std::shared_ptr<ProgressHook>& hook) : hook_(hook.get()), previous_(tlAttended) {
  if (hook_ == nullptr) return;
  hook_->attend(true);
  tlAttended = hook_;
}

AttendScope::~AttendScope() {
  if (hook_ == nullptr) return;
  tlAttended = previous_;
  hook_->attend(false);
}

ProgressHook* AttendScope::current() { return tlAttended; }

Request::Request(int rank, int peer, std::string what, std::chrono::milliseconds timeout,
                 std::shared_ptr<FailureState> failure, std::shared_ptr<ProgressHook> progress)
    : rank_(rank),
      peer_(peer),
      source_(peer),
      what_(std::move(what)),
      timeout_(timeout),
      failure_(std::move(failure)),
      progress_(std::move(progress)) {}

Request::Request(int rank, int peer, const Label& label, std::chrono::milliseconds timeout,
                 std::shared_ptr<FailureState> failure, std::shared_ptr<ProgressHook> progress)
    : rank_(rank),
      peer_(peer),
      source_(peer),
      label_(label),
      timeout_(timeout),
      failure_(std::move(failure)),
      progress_(std::move(progress)) {}

std::string Label::format(int peer) const {
  if (coll == nullptr) {
    if (!send && peer < 0) return strFormat("recv of %zu %s from any rank (tag %u)", count, type, tag);
    return send ? strFormat("send of %zu %s to rank %d (tag %u)", count, type, peer, tag)
                : strFormat("recv of %zu %s from rank %d (tag %u)", count, type, peer, tag);
  }
  return send ? strFormat("%s #%lld (%s, channel %d): send of %zu B to rank %d", coll, static_cast<long long>(seq),
                          algo, channel, bytes, peer)
              : strFormat("%s #%lld (%s, channel %d): receive of %zu B from rank %d", coll, static_cast<long long>(seq),
                          algo, channel, bytes, peer);
}

void Request::complete(size_t bytes) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_.load(std::memory_order_relaxed)) return;
  bytes_ = bytes;
  done_.store(true, std::memory_order_release);
  if (sleepers_ > 0) cv_.notify_all();
  if (!callbacks_.empty()) runCallbacks(lock);
}

void Request::fail(const Status& status) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_.load(std::memory_order_relaxed)) return;
  status_ = status;
  done_.store(true, std::memory_order_release);
  if (sleepers_ > 0) cv_.notify_all();
  if (!callbacks_.empty()) runCallbacks(lock);
}

void Request::onDone(std::function<void(const Status&)> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_.load(std::memory_order_relaxed)) {
    callbacks_.push_back(std::move(fn));
    return;
  }
  const Status s = status_;
  lock.unlock();
  fn(s);
}

void Request::runCallbacks(std::unique_lock<std::mutex>& lock) noexcept {
  auto callbacks = std::move(callbacks_);
  callbacks_.clear();
  const Status s = status_;
  lock.unlock();
  for (auto& fn : callbacks) {
    try {
      fn(s);
    } catch (const std::exception& e) {
      LOOM_WARN("a completion callback threw: %s", e.what());
    } catch (...) {
      LOOM_WARN("a completion callback threw");
    }
  }
}

bool Request::waitUntil(Clock::time_point deadline) {
  if (done()) return true;
  // First drive the peer's connection from this thread (no wake-up of a progress thread on the
  // path), for as long as bytes keep moving; after the spin budget of its own CPU time without
  // progress, sleep and leave the rest to the progress threads (core/progress_policy.hpp).
  const auto budget = progress::waiterSpinBudget();
  const bool sleepAtOnce = label_.has_value() && progress::waiterSleepsAtOnce(label_->bytes);
  if (budget.count() > 0 && !sleepAtOnce) {
    if (progress_) progress_->begin(peer_);
    // Read at the first look at the clocks: most waits end before it, and the CPU clock's read is a
    // system call.
    std::chrono::nanoseconds lastProgress{-1};
    Clock::time_point lastProgressWall;
    bool finished = false;
    int idle = 0;
    bool progressed = false;
    for (unsigned spins = 0;; ++spins) {
      // Reading a clock costs as much as a poll (more on some virtual machines): look at them
      // every 64 rounds, and note progress as a flag in between.
      if ((spins & 63) == 63) {
        const auto now = progress::threadCpuTime();
        const auto wall = Clock::now();
        if (progressed || lastProgress.count() < 0) {
          lastProgress = now;
          lastProgressWall = wall;
          progressed = false;
        } else if (now - lastProgress >= budget || wall - lastProgressWall >= progress::kWaiterWallLimit ||
                   wall >= deadline) {
          break;
        }
      }
      if (done()) {
        finished = true;
        break;
      }
      if (progress_ && progress_->poll(peer_)) {
        progressed = true;
        idle = 0;
      } else if ((spins & 15) == 15 && progress_ && progress_->pollAnother(peer_)) {
        // What other peers need of this rank (a CTS to read, a send to finish) moves too.
        progressed = true;
      } else {
        progress::pause(++idle);
      }
    }
    if (progress_) progress_->end(peer_);
    if (finished) return true;
    if (progress_) progress_->check();
  }
  // Asleep, this thread polls nothing: step out of the operation it attends meanwhile, so that
  // the transports' progress threads take over.
  ProgressHook* attended = AttendScope::current();
  if (attended != nullptr) attended->attend(false);
  if (progress_) progress_->waiting(true);
  bool ok = false;
  {
    // In slices, looking between them for what would make the wait hopeless (Progressable::check).
    std::unique_lock<std::mutex> lock(mu_);
    ++sleepers_;
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + progress::kSleeperCheckEvery);
      ok = cv_.wait_until(lock, slice, [this] { return done_.load(std::memory_order_acquire); });
      if (ok || slice >= deadline) break;
      if (progress_) {
        lock.unlock();
        progress_->check();
        lock.lock();
      }
    }
    --sleepers_;
  }
  if (progress_) progress_->waiting(false);
  if (attended != nullptr) attended->attend(true);
  return ok;
}

void Request::throwIfFailed() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok) throw status_.toError(rank_);
}

void Request::wait() { wait(timeout_); }

void Request::wait(std::chrono::milliseconds timeout) {
  Deadline deadline(timeout);
  if (queue_ && !done()) queue_->runQueued(this);
  if (!waitUntil(deadline.at())) {
    // What every rank is doing, where they answer (the flight records, comm/flight_recorder.hpp).
    // (Only for a collective's messages: a point-to-point wait is no collective's.)
    const bool collective = (label_.has_value() && label_->coll != nullptr) || diagnoseOnTimeout;
    ProgressHook* hook = progress_ ? progress_.get() : queue_.get();
    const std::string report = hook != nullptr && collective && !done() ? hook->diagnose() : std::string();
    Status s = Status::error(
        ErrorCode::Timeout,
        strFormat("timed out after %.1f s waiting for %s: the peer may have stopped, hung or called a different "
                  "operation (LOOM_TIMEOUT sets the deadline)%s%s",
                  deadline.totalSeconds(), what().c_str(), report.empty() ? "" : "\n", report.c_str()),
        peer_);
    if (failure_) failure_->fail(s);  // fails every pending request of the communicator, this one too
    fail(s);
  }
  throwIfFailed();
}

bool Request::test() {
  // Testing drives progress, as waiting does: a plain message a peer left in a shared-memory ring
  // wakes no one while nobody waits (ProgressEngine::waiting).
  if (!done() && progress_) progress_->poll(peer_);
  if (!done()) return false;
  throwIfFailed();
  return true;
}

Status Request::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

}  // namespace detail
}  // namespace loom
