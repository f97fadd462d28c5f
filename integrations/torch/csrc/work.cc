#include "work.hpp"

#include <ATen/core/jit_type.h>
#include <c10/util/StringUtil.h>

#include <stdexcept>

namespace loom_torch {

LoomWork::LoomWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                   std::function<void()> finisher, std::vector<at::Tensor> keepAlive)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      finisher_(std::move(finisher)),
      keepAlive_(std::move(keepAlive)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

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
  finish(error);  // completes the Work and wakes its waiters
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

bool LoomWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  // Testing drives Loom's progress, as waiting does; a failure reaches the Work through complete().
  try {
    if (work_.valid()) work_.test();
  } catch (const std::exception&) {
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
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

bool LoomWork::wait(std::chrono::milliseconds timeout) {
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

c10::intrusive_ptr<c10::ivalue::Future> LoomWork::getFuture() { return future_; }

}  // namespace loom_torch
