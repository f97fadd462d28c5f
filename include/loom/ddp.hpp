// Loom's data-parallel layer: averages a model's gradients across ranks during the backward pass,
// the way PyTorch's DistributedDataParallel does, and shards a dataset across ranks.
//
// GradSync (in the spirit of DDP's Reducer):
//   - Parameters are registered once, in the model's order (first layer first). Their gradients
//     are grouped into buckets in reverse order (gradients become ready from the last layer to the
//     first), with PyTorch's defaults: a bucket cap of 25 MiB and a first bucket of 1 MiB, so that
//     the first all-reduce starts early. Parameters of different datatypes never share a bucket.
//   - At construction every rank checks that all registered the same parameters (count, datatype,
//     order), and the parameters are broadcast from rank 0 so that every replica starts identical.
//   - During backward the training loop calls markReady(i) as each gradient is final; a bucket's
//     asynchronous all-reduce starts as soon as all its gradients are ready, and a large gradient
//     all-reduced in place (GradSyncOptions::directMinBytes) as soon as it is (buckets start in
//     order, so that every rank issues the same collectives in the same order), overlapping the
//     rest of the backward pass. synchronize() waits for every bucket and leaves every gradient
//     averaged over the ranks.
//   - gradientAsBucketView: the gradients live inside the buckets (gradient(i) says where), which
//     saves a copy each way. noSync(): gradient accumulation, no communication until the scope
//     ends. Compression::Float16 / Bfloat16 sends the gradients in half precision (as DDP's
//     fp16_compress_hook) and restores them.
//   - Misuse throws loom::Error (InvalidUsage): a gradient marked ready twice in a step,
//     synchronize() with gradients never marked, parameters that differ across ranks.
//
// DistributedSampler (as torch.utils.data.DistributedSampler): each rank's disjoint share of a
// dataset's indices, padded (by repeating indices) or with the tail dropped, reshuffled each
// epoch from a seed every rank shares.
//
// Buffers are host memory, or all device memory (GradSyncOptions::cudaStream). GradSync is driven
// from one thread (the training loop's).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.hpp"

namespace loom {
namespace ddp {

/// One parameter of the model: its values (broadcast from rank 0 at construction) and its
/// gradient (averaged by synchronize()).
struct Parameter {
  void* data = nullptr;  ///< count elements of `type`
  void* grad = nullptr;  ///< count elements of `type`; unused with gradientAsBucketView
  size_t count = 0;
  DataType type = DataType::Float32;
  std::string name;  ///< for error messages ("layer3.weight"); "parameter 7" when empty
};

/// Gradient compression on the wire (DDP's fp16_compress_hook / bf16_compress_hook).
enum class Compression { None, Float16, Bfloat16 };

struct GradSyncOptions {
  size_t bucketCapBytes = 25u << 20;      ///< PyTorch's bucket_cap_mb = 25
  size_t firstBucketCapBytes = 1u << 20;  ///< PyTorch's first bucket: 1 MiB
  /// The gradients live in the buckets' memory: write them at gradient(i), not Parameter::grad.
  bool gradientAsBucketView = false;
  /// Only for float32 gradients (others are sent as they are).
  Compression compression = Compression::None;
  /// Gradients of at least this many bytes are all-reduced in place, in their own buffers (no copy
  /// into the bucket and back), each as soon as it and the in-place gradients before it in its
  /// bucket are ready, once the buckets before have started; smaller ones are packed into the
  /// bucket's memory and all-reduced together when the whole bucket is ready. Every rank issues
  /// the all-reduces in that same order. With gradientAsBucketView or compression every gradient
  /// is in the bucket.
  size_t directMinBytes = 1u << 20;
  /// Broadcast every parameter from rank 0 at construction.
  bool broadcastParameters = true;
  /// Device parameters (CUDA memory, Loom built with CUDA): the stream the backward pass runs on
  /// (nullptr: the legacy default stream). markReady(i) is called once gradient i's kernel is
  /// queued on it; the all-reduces and the copies into and out of the buckets are ordered on it,
  /// and synchronize() returns once they are queued: work queued on the stream after it sees the
  /// averaged gradients. Buckets are then device memory, and compression converts on the device
  /// (a conversion kernel on the stream, the half-precision copy in device memory).
  void* cudaStream = nullptr;
};

/// The buckets for parameters of `bytes[i]` bytes and datatype key `kinds[i]` (registration
/// order): parameter indices in reverse order, a bucket closed when adding the next parameter
/// would pass the cap (the first bucket's cap for bucket 0, of every kind), one parameter larger
/// than the cap alone in its bucket; parameters of different kinds never share a bucket. Pure.
std::vector<std::vector<size_t>> planBuckets(const std::vector<size_t>& bytes, const std::vector<int>& kinds,
                                             size_t firstCapBytes, size_t capBytes);

/// Averages gradients across the ranks of a communicator, bucket by bucket, during backward.
class GradSync {
 public:
  /// Registers `params` (the model's order) on `comm`, which must outlive this. Collective: every
  /// rank constructs its GradSync at the same point. Throws InvalidUsage when ranks registered
  /// different parameters, InvalidArgument on null buffers or unsupported datatypes.
  GradSync(Communicator& comm, std::vector<Parameter> params, GradSyncOptions options = {});
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  /// Parameter i's gradient is final for this step (call during backward, last layer first).
  /// Starts the all-reduce of every bucket that is now complete, in bucket order.
  void markReady(size_t i);
  /// Waits for every bucket's all-reduce; afterwards every gradient holds the average over the
  /// ranks. Throws InvalidUsage naming the gradients not marked ready this step.
  void synchronize();

  /// Where parameter i's gradient lives: inside its bucket with gradientAsBucketView, else
  /// Parameter::grad.
  void* gradient(size_t i) const;

  /// Within the returned scope, markReady() and synchronize() check but do not communicate: the
  /// gradients of several micro-batches accumulate (the caller adds into them), and the first
  /// step after the scope averages the sum.
  class NoSyncScope {
   public:
    explicit NoSyncScope(GradSync& sync);
    ~NoSyncScope();
    NoSyncScope(const NoSyncScope&) = delete;
    NoSyncScope& operator=(const NoSyncScope&) = delete;

   private:
    GradSync& sync_;
  };
  NoSyncScope noSync() { return NoSyncScope(*this); }

  /// The buckets: parameter indices of each, in the order their all-reduces run.
  const std::vector<std::vector<size_t>>& buckets() const;
  /// Buckets whose all-reduce has started in the current step (for tests and tools: with more
  /// than one bucket, some start before the last markReady()).
  size_t bucketsStarted() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Each rank's disjoint share of the indices 0..size-1 of a dataset.
class DistributedSampler {
 public:
  /// dropLast: drop the tail that does not divide by the world size (else pad by repeating the
  /// first indices, so that every rank gets the same number).
  DistributedSampler(size_t datasetSize, int rank, int worldSize, bool shuffle = true, uint64_t seed = 0,
                     bool dropLast = false);
  /// Reshuffles for `epoch` (every rank passes the same epoch).
  void setEpoch(uint64_t epoch) { epoch_ = epoch; }
  /// This rank's indices for the current epoch.
  std::vector<size_t> indices() const;
  /// How many indices each rank gets.
  size_t size() const { return perRank_; }

 private:
  size_t datasetSize_, perRank_;
  int rank_, worldSize_;
  bool shuffle_;
  uint64_t seed_, epoch_ = 0;
};

}  // namespace ddp
}  // namespace loom
