#include "work.hpp"

#include <ATen/core/jit_type.h>
#include <c10/util/StringUtil.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace loom_torch {
namespace {

// Completes the Futures off Loom's threads. A Future runs its callbacks as it completes, and a
// callback may start another operation and wait for it (PowerSGD's hook does, twice per bucket):
// on Loom's op-queue thread that wait would hold the queue that must run the operation. Here a
// callback that waits blocks one of these threads only; while every thread is busy, a new one
// starts (a callback waiting on an operation whose Future completes later needs another).
class FuturePool {
 public:
  static FuturePool& get() {
    static FuturePool* pool = new FuturePool();  // never destroyed: its threads may run until exit
    return *pool;
  }
  void submit(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    if (queue_.size() > idle_ && threads_ < kMaxThreads) {
      ++threads_;
      std::thread([this] { run(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  static constexpr size_t kMaxThreads = 64;
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return !queue_.empty(); });
      --idle_;
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t idle_ = 0;
  size_t threads_ = 0;
};

}  // namespace

LoomWork::LoomWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                   std::function<void()> finisher, std::vector<at::Tensor> keepAlive,
                   std::shared_ptr<DeviceDone> device)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      finisher_(std::move(finisher)),
      keepAlive_(std::move(keepAlive)),
      device_(std::move(device)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()),
          device_ ? std::vector<c10::Device>{loom_torch::deviceOf(*device_)} : std::vector<c10::Device>{})) {}

LoomWork::~LoomWork() = default;

void LoomWork::watch(const c10::intrusive_ptr<LoomWork>& self, loom::Work work) {
  self->work_ = work;
  work.onCompletion([self](std::exception_ptr error) { self->complete(error); });
}

void LoomWork::complete(std::exception_ptr error) {
  if (!error && expectBytes_ != SIZE_MAX && work_.bytes() != expectBytes_) {
    error = std::make_exception_ptr(
        std::runtime_error(c10::str("loom: recv: expected ", expectBytes_, " bytes, the message from the sender had ",
                                    work_.bytes(), " (the tensors of a send and its recv must have the same size)")));
  }
  if (!error && finisher_) {
    try {
      finisher_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  finisher_ = nullptr;
  keepAlive_.clear();
  durationNs_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started_).count());
  finish(error);  // completes the Work and wakes its waiters
  auto completeFuture = [future = future_, error, outputs = outputs_, device = device_]() {
    auto mark = [&] {
      try {
        if (error)
          future->setError(error);
        else
          future->markCompleted(c10::IValue(outputs));
      } catch (const std::exception&) {  // a callback's error is the chained Future's, not ours
      }
    };
    // On CUDA tensors the Future records its events on the current stream: one that waited for
    // the operation's event, not Loom's stream itself (which may hold later operations by now).
    if (device)
      loom_torch::runAfter(*device, mark);
    else
      mark();
  };
  // A Future nobody has asked for has no callbacks: completing it here runs nothing, and costs no
  // thread hand-off (most operations: a plain dist.all_reduce never asks). Holding the lock makes a
  // concurrent getFuture() wait until it is complete; callbacks added after that run on the adder.
  std::unique_lock<std::mutex> lock(futureMutex_);
  if (!futureHanded_) {
    completeFuture();
    return;
  }
  lock.unlock();
  FuturePool::get().submit(std::move(completeFuture));
}

bool LoomWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return !device_ || exception_ || loom_torch::deviceFinished(*device_);
  }
  // Testing drives Loom's progress, as waiting does; a failure reaches the Work through complete().
  try {
    if (work_.valid()) work_.test();
  } catch (const std::exception&) {
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && (!device_ || exception_ || loom_torch::deviceFinished(*device_));
}

int LoomWork::sourceRank() const {
  TORCH_CHECK(opType_ == c10d::OpType::RECV || opType_ == c10d::OpType::RECVANYSOURCE,
              "sourceRank() may only be called on recv or recvAnysource work objects");
  return work_.source();
}

bool LoomWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr LoomWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

std::vector<at::Tensor> LoomWork::result() { return outputs_; }

void LoomWork::synchronize() {
  if (device_) loom_torch::makeCurrentStreamWait(*device_);
}

bool LoomWork::wait(std::chrono::milliseconds timeout) {
  if (device_) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (exception_) std::rethrow_exception(exception_);
    }
    loom_torch::makeCurrentStreamWait(*device_);
    return true;
  }
  // Loom's wait drives the transports from this thread and enforces the deadline (a timeout fails
  // the operation, which completes this Work with the error through the callback).
  try {
    if (timeout == kNoTimeout)
      work_.wait();
    else
      work_.wait(timeout);
  } catch (const std::exception&) {
  }
  // The callback may still be running (copying results out) on the thread that completed the
  // operation.
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return completed_; });
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

#if TORCH_VERSION_MAJOR >= 2
float LoomWork::getDuration() const {
  TORCH_CHECK(timed_,
              "loom: this Work has no duration: call the group's _enable_collectives_timing() before the "
              "operation");
  const int64_t ns = durationNs_.load();
  TORCH_CHECK(ns >= 0, "loom: the Work's duration is known once it completes");
  return static_cast<float>(ns / 1e6);
}
#endif

c10::intrusive_ptr<c10::ivalue::Future> LoomWork::getFuture() {
  std::lock_guard<std::mutex> lock(futureMutex_);
  futureHanded_ = true;
  return future_;
}

}  // namespace loom_torch
