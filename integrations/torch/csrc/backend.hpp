// ProcessGroupLoom: Loom as a torch.distributed backend. One source for both PyTorch APIs: it
// subclasses c10d::ProcessGroup on PyTorch 1.x (Debian's 1.13) and c10d::Backend on 2.x, where
// ProcessGroup became a dispatcher over per-device backends; the operations' signatures are the
// same in both.
//
// Every operation is asynchronous: it validates its tensors, starts the Loom collective and returns
// a LoomWork that Loom's threads complete. Operations run on the communicator's queue in call
// order, which is what torch.distributed requires of every rank.
//
// Tensors: dense, one per call (one device per process, as DDP runs), on the CPU or (built against
// PyTorch with CUDA) on a CUDA device, with ProcessGroupNCCL's stream semantics (device.hpp). A
// non-contiguous tensor goes through a contiguous copy that is copied back on completion. Data movement (broadcast,
// gathers, all-to-all, send/recv) takes every dtype, as bytes; reductions take the dtypes Loom
// reduces (int8, uint8, int32, int64, float16, bfloat16, float32, float64, and bool with min/max).
#pragma once

#include <torch/version.h>

#include <atomic>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <chrono>
#include <loom/loom.hpp>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "device.hpp"
#include "work.hpp"

namespace loom_torch {

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

class ProcessGroupLoom : public BackendBase {
 public:
  /// Joins `size` ranks: rank 0 creates Loom's rendezvous id and publishes it in `store` (the one
  /// init_process_group made, whatever its init method), the others read it there. Blocks until
  /// every rank joined or `timeout` passed; `timeout` is also the deadline of every operation.
  /// With `shared`, joins nothing and runs on that communicator (the same group's backend for
  /// another device type).
  ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
                   std::shared_ptr<loom::Communicator> shared = nullptr);
  ~ProcessGroupLoom() override;

  const std::string getBackendName() const override { return "loom"; }
  /// The Loom communicator, for tools and tests.
  loom::Communicator& communicator() { return *comm_; }
  std::shared_ptr<loom::Communicator> sharedCommunicator() const { return comm_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputTensors,
                                           std::vector<at::Tensor>& inputTensors,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& outputBuffer, at::Tensor& inputBuffer,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  /// Every rank's `inputTensors` (one list per rank, shapes and dtypes alike on every rank) as one
  /// all-gather of their bytes.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputTensorLists, std::vector<at::Tensor>& inputTensors,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputTensors, std::vector<std::vector<at::Tensor>>& inputTensors,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& outputBuffer, at::Tensor& inputBuffer,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  /// To `rootRank`: an all-to-all with counts per peer in which only the root receives.
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputTensors,
                                        std::vector<at::Tensor>& inputTensors,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  /// From `rootRank`: an all-to-all with counts per peer in which only the root sends.
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputTensors,
                                         std::vector<std::vector<at::Tensor>>& inputTensors,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& outputBuffer, at::Tensor& inputBuffer,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputTensors, std::vector<at::Tensor>& inputTensors,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  /// The earliest message on `tag` from any rank (loom::kAnySource); the Work's sourceRank() (Python:
  /// work._source_rank(), what dist.recv returns) names the sender.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  /// loom::Communicator::monitoredBarrier: rank 0 names the ranks that did not arrive within
  /// `opts.timeout` (the group's when unset) and where each is; RuntimeError as Gloo's.
  void monitoredBarrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions(), bool waitAllRanks = false) override;
  /// The group's sequence number, as Gloo keeps it: rank 0's starting value (from the store),
  /// plus one for each collective called since.
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  /// Counts a collective call (not point-to-point) for the sequence number; returns the count.
  uint64_t countCollective() { return calls_.fetch_add(1, std::memory_order_relaxed) + 1; }

#if TORCH_VERSION_MAJOR >= 2
  /// PyTorch 2.x (dist._coalescing_manager, FSDP): output i is the all-gather of input i, all pairs
  /// in one Loom all-gather (coalesced.cc).
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  /// PyTorch 2.x: output i is this rank's share of the reduction of input i, all pairs in one Loom
  /// reduce-scatter (one dtype for all).
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  /// Works started from now on know their duration (work.get_duration(), in milliseconds).
  void enableCollectivesTiming() override { timing_.store(true, std::memory_order_relaxed); }
  /// PyTorch 2.x (batch_isend_irecv, dist._coalescing_manager): the sends and receives called
  /// between startCoalescing() and endCoalescing() are posted together as one Loom group by
  /// endCoalescing(), whose Work completes once all are done (each call's own Work with it). Ranks
  /// that send to each other so cannot deadlock, even where a send waits for its receive (device
  /// buffers through CUDA IPC). Collectives called meanwhile run at once.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // No `override`: c10d::Backend has this virtual from PyTorch 2.7 or so on (batch_isend_irecv asks
  // it there); 2.6 coalesces for CUDA tensors only, without asking.
  bool supportsCoalescing() const { return true; }
#endif
  bool collectivesTimed() const { return timing_.load(std::memory_order_relaxed); }
  /// Loom's streams on the CUDA devices this group has used.
  DeviceStreams& deviceStreams() { return *streams_; }

 private:
  /// All-reduce (sum) of a sparse COO tensor, as Gloo does it (sparse.cc): every rank's indices and
  /// values gathered, summed and coalesced; the tensor takes the result.
  c10::intrusive_ptr<c10d::Work> sparseAllreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);

  std::shared_ptr<loom::Communicator> comm_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> calls_{0};    // collectives called
  std::atomic<uint64_t> seqBase_{0};  // setSequenceNumberForGroup's start, less the calls then
  std::atomic<bool> timing_{false};   // enableCollectivesTiming() was called
  std::shared_ptr<DeviceStreams> streams_ = loom_torch::makeDeviceStreams();
  // Between startCoalescing() and endCoalescing(): the sends and receives called, not yet posted.
  struct PendingPointToPoint {
    loom::PointToPoint op;
    at::Tensor tensor;  // the caller's
    at::Tensor buf;     // what Loom reads or writes: `tensor`, or its contiguous copy
    c10::intrusive_ptr<LoomWork> work;
  };
  bool coalescing_ = false;
  std::vector<PendingPointToPoint> pending_;
  /// Queues a send or receive while coalescing; returns its Work.
  c10::intrusive_ptr<c10d::Work> coalesce(c10d::OpType type, const char* title, const loom::PointToPoint& op,
                                          const at::Tensor& tensor, const at::Tensor& buf);
};

/// The factory torch.distributed calls (through loom_torch's register_backend). PyTorch 2.x calls
/// it once per device type the backend serves ("cpu", "cuda"), with the same `groupId`: the
/// second call shares the first one's communicator (one rendezvous, one set of links, and every
/// call of the group in one order), for as long as that one lives. An empty `groupId` shares
/// nothing. With `parent` (the default group's Loom backend) and `globalRanks` (the group's
/// ranks there, in group rank order), the group is made from the parent's communicator by its
/// members alone (loom::Communicator::group): no new rendezvous.
c10::intrusive_ptr<BackendBase> createProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                       std::chrono::milliseconds timeout,
                                                       const std::string& groupId = "",
                                                       const c10::intrusive_ptr<BackendBase>& parent = {},
                                                       const std::vector<int64_t>& globalRanks = {});

}  // namespace loom_torch
