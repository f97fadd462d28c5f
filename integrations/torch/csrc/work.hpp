// LoomWork: the c10d Work of one Loom operation. It completes from Loom's own threads
// (loom::Work::onCompletion), not from a thread blocked in the call: the completion copies results
// back where the call needed a staging tensor, then completes the Work and its Future. Once someone
// has asked for the Future (DistributedDataParallel's communication hooks chain on it), a thread of
// the backend's completes it and runs its callbacks, off Loom's threads (work.cc). On CUDA tensors
// it also holds the operation's event on Loom's stream (device.hpp): wait() and synchronize() make
// the caller's current stream wait for it, as ProcessGroupNCCL's do, and the Future carries the
// device.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <loom/loom.hpp>
#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "device.hpp"

namespace loom_torch {

class LoomWork : public c10d::Work {
 public:
  /// `outputs`: what result() and the Future hold. `finisher` runs once the Loom operation
  /// succeeded, before the Work completes (copies out of staging tensors, checks of sizes); what
  /// it throws fails the Work. `keepAlive`: tensors Loom reads or writes that the caller does not
  /// hold (staging copies), kept until completion. `device`: the operation's stream side, for
  /// one on CUDA tensors (nullptr on CPU tensors).
  LoomWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
           std::function<void()> finisher = {}, std::vector<at::Tensor> keepAlive = {},
           std::shared_ptr<DeviceDone> device = nullptr);
  ~LoomWork() override;

  /// Starts watching `work`; called once, right after the Loom call returned it. The callback
  /// holds `self` until the operation completes, so a Work dropped by Python still completes.
  static void watch(const c10::intrusive_ptr<LoomWork>& self, loom::Work work);

  /// Fails a Work whose operation could not start (watch() was never called).
  void failUnstarted(std::exception_ptr error) { complete(std::move(error)); }
  /// The Loom operation watched (for Works that complete with it).
  const loom::Work& loomWork() const { return work_; }

  /// For receives: the operation must move exactly `bytes` (a shorter message fails the Work).
  void expectBytes(size_t bytes) { expectBytes_ = bytes; }
  /// The collective's sequence number in its group (0 for point-to-point), and whether the Work
  /// keeps its duration (the group's enableCollectivesTiming()).
  void stamp(uint64_t sequence, bool timed) {
    sequence_ = sequence;
    timed_ = timed;
  }

  /// For receives: the rank the message came from (a receive from any source: the sender).
  int sourceRank() const override;
  /// On CUDA tensors: once Loom has completed the operation and the device has run it.
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  /// On CUDA tensors: the caller's current stream waits for the operation (no host wait).
  void synchronize() override;
  /// On CPU tensors, waits for completion, at most `timeout` (kNoTimeout: the process group's
  /// timeout), driving Loom's progress from this thread; throws what the operation failed with.
  /// On CUDA tensors, as ProcessGroupNCCL: the caller's current stream waits for the operation and
  /// the host goes on; throws if the operation has already failed.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
#if TORCH_VERSION_MAJOR >= 2
  /// Milliseconds from the call to completion, once complete; only where timing was enabled.
  float getDuration() const override;
  uint64_t getSequencenumber() const override { return sequence_; }
#endif

 private:
  void complete(std::exception_ptr error);

  loom::Work work_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> finisher_;
  std::vector<at::Tensor> keepAlive_;
  std::shared_ptr<DeviceDone> device_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex futureMutex_;     // orders getFuture() against completion
  bool futureHanded_ = false;  // getFuture() was called: callbacks may be chained on the Future
  size_t expectBytes_ = SIZE_MAX;
  uint64_t sequence_ = 0;
  bool timed_ = false;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<int64_t> durationNs_{-1};  // set on completion
};

}  // namespace loom_torch
