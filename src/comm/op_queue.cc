#include "comm/op_queue.hpp"

#include "core/logging.hpp"

namespace loom {

OpQueue::~OpQueue() { shutdown(Status::error(ErrorCode::Aborted, "the communicator was destroyed")); }

void OpQueue::submit(RequestPtr done, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) {
    done->fail(stopStatus_);
    return;
  }
  items_.push_back(Item{std::move(done), std::move(fn)});
  if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  cv_.notify_all();
}

bool OpQueue::runInlineIfIdle(FunctionRef<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || busy_ || !items_.empty()) return false;
    busy_ = true;
  }
  struct Release {
    OpQueue* q;
    ~Release() {
      std::lock_guard<std::mutex> lock(q->mu_);
      q->busy_ = false;
      q->cv_.notify_all();
    }
  } release{this};
  fn();
  return true;
}

void OpQueue::runItem(Item& item) {
  try {
    item.fn();
    item.done->complete(0);
  } catch (...) {
    item.done->fail(statusFromCurrentException());
  }
}

void OpQueue::runFront(std::unique_lock<std::mutex>& lock) {
  Item item = std::move(items_.front());
  items_.pop_front();
  busy_ = true;
  lock.unlock();
  runItem(item);
  lock.lock();
  busy_ = false;
  cv_.notify_all();
}

void OpQueue::runQueuedUntil(const detail::Request* done) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !busy_ && !done->done()) {
    bool queued = false;
    for (const auto& item : items_) queued = queued || item.done.get() == done;
    if (!queued) return;
    runFront(lock);
  }
}

void OpQueue::shutdown(const Status& status) {
  std::deque<Item> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      stop_ = true;
      stopStatus_ = status;
    }
    dropped.swap(items_);
    cv_.notify_all();
  }
  for (auto& item : dropped) item.done->fail(status);
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

void OpQueue::work() {
  setThreadLogRank(rank_);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || (!busy_ && !items_.empty()); });
    if (stop_) return;
    runFront(lock);
  }
}

}  // namespace loom
