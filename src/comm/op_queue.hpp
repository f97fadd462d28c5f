// OpQueue: runs a communicator's collectives one after another in call order, so that several
// asynchronous collectives in flight complete correctly and in order. A blocking call on an idle
// queue runs on the caller's thread (no hand-off); otherwise, and for asynchronous calls, a
// worker thread (started on first use) runs the queued ops.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/function_ref.hpp"
#include "core/request.hpp"

namespace loom {

class OpQueue {
 public:
  explicit OpQueue(int rank) : rank_(rank) {}
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  /// Queues `fn`; `done` completes when it returned (or fails with what it threw).
  void submit(RequestPtr done, std::function<void()> fn);
  /// Runs `fn` now on this thread if nothing is queued or running; returns false otherwise.
  /// Exceptions from fn propagate.
  bool runInlineIfIdle(FunctionRef<void()> fn);
  /// Runs queued ops on this thread, in order, while the worker is idle and `done` (the
  /// completion of a queued op) has not run: a waiting thread takes its own op instead of waking
  /// the worker. Returns at once when the worker is busy or `done` is not queued.
  void runQueuedUntil(const detail::Request* done);
  /// Fails every queued op with `status` and stops the worker. Idempotent.
  void shutdown(const Status& status);

 private:
  struct Item {
    RequestPtr done;
    std::function<void()> fn;
  };
  void work();
  /// Runs `item` and completes its request; called without the lock, with busy_ set.
  static void runItem(Item& item);
  /// Takes the first queued op and runs it on this thread, marked busy; `lock` (on mu_) is held on
  /// entry and on return, released while the op runs.
  void runFront(std::unique_lock<std::mutex>& lock);

  const int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool busy_ = false;
  bool stop_ = false;
  Status stopStatus_;
  std::thread worker_;
};

}  // namespace loom
