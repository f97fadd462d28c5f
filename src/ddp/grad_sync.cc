// GradSync (include/loom/ddp.hpp): buckets of gradients all-reduced asynchronously as they become
// ready during backward, averaged over the ranks.
#include <algorithm>
#include <cstring>

#include "core/format.hpp"
#include "core/status.hpp"
#include "device/runtime.hpp"
#include "kernels/copy.hpp"
#include "kernels/reduce.hpp"
#include "loom/ddp.hpp"

namespace loom {
namespace ddp {

struct GradSync::Impl {
  struct Slot {  // a parameter's bucket, and where its gradient sits in the bucket's memory
    size_t bucket = 0;
    size_t offset = 0;  // elements from the start of `flat` (packed gradients only)
  };
  struct Bucket {
    std::vector<size_t> params;  // all of the bucket's parameters
    std::vector<size_t> packed;  // those whose gradients are in `flat` (copied there, or living there)
    std::vector<size_t> direct;  // those all-reduced in place, in their own buffers (no copy)
    DataType type = DataType::Float32;
    size_t count = 0;            // elements in `flat`
    std::vector<uint8_t> flat;   // the packed gradients, end to end (host gradients)
    uint8_t* mem = nullptr;      // where they are: flat's data, or device memory (device gradients)
    std::vector<uint16_t> wire;  // compressed copy sent instead (Compression; host gradients)
    uint8_t* wireDev = nullptr;  // the same in device memory (device gradients)
    size_t pending = 0;          // gradients not yet ready this step
    size_t directStarted = 0;    // `direct` gradients whose all-reduce has started this step
    bool started = false;        // all of it started (the packed gradients last)
    std::vector<Work> works;     // this step's all-reduces
  };

  Communicator& comm;
  GradSyncOptions options;
  std::vector<Parameter> params;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::vector<std::vector<size_t>> plan;
  std::vector<bool> ready;  // marked this step
  size_t nextToStart = 0;   // buckets start in order
  size_t started = 0;
  int noSyncDepth = 0;
  // Device gradients: the runtime, and the stream the backward pass and the collectives run on.
  device::DeviceRuntime* rt = nullptr;
  void* stream = nullptr;

  Impl(Communicator& c, std::vector<Parameter> p, GradSyncOptions o)
      : comm(c), options(o), params(std::move(p)), stream(o.cudaStream) {}
  ~Impl() {
    if (rt == nullptr) return;
    try {
      rt->synchronize(stream);  // copies into and out of the buckets may still be queued
    } catch (...) {
    }
    for (auto& b : buckets) {
      rt->freeDevice(b.mem);
      rt->freeDevice(b.wireDev);
    }
  }
  // A copy between a gradient and its bucket: on the stream for device gradients.
  void copy(void* dst, const void* src, size_t bytes) {
    if (rt != nullptr) {
      rt->copyAsync(dst, src, bytes, stream);
    } else {
      kernels::copy(dst, src, bytes);
    }
  }

  std::string nameOf(size_t i) const {
    return params[i].name.empty() ? strFormat("parameter %zu", i)
                                  : strFormat("parameter %zu (%s)", i, params[i].name.c_str());
  }
  bool compressed(const Bucket& b) const {
    return options.compression != Compression::None && b.type == DataType::Float32;
  }
  void* inBucket(size_t i) { return buckets[slots[i].bucket].mem + slots[i].offset * sizeOf(params[i].type); }

  void validate();
  void checkSameAcrossRanks();
  void build();
  // Starts what may start now, in the one order every rank follows whatever order its gradients
  // became ready in: bucket after bucket; within a bucket, its in-place gradients in plan order,
  // each as soon as it and those before it are ready (a large gradient need not wait for the rest of
  // its bucket), then its packed gradients once all of the bucket's are ready.
  void advance();
  void startDirect(Bucket& b, size_t i);
  void startPacked(Bucket& b);
  void finish(Bucket& b);
  // Waits for whatever a bucket has in flight, ignoring errors (the caller reports its own).
  static void drain(Bucket& b) noexcept {
    for (auto& w : b.works) {
      try {
        w.wait();
      } catch (...) {
        // The communicator failed: its error reaches the caller through its next call.
      }
    }
  }
  void resetStep() {
    std::fill(ready.begin(), ready.end(), false);
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.directStarted = 0;
      b.started = false;
      b.works.clear();
    }
    nextToStart = 0;
    started = 0;
  }
};

void GradSync::Impl::validate() {
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i];
    if (static_cast<int>(p.type) < 0 || static_cast<int>(p.type) > static_cast<int>(DataType::Bfloat16)) {
      LOOM_THROW(ErrorCode::InvalidArgument, comm.rank(),
                 strFormat("GradSync: %s has an unknown datatype (%d)", nameOf(i).c_str(), static_cast<int>(p.type)));
    }
    if (p.count > 0 && p.data == nullptr && options.broadcastParameters) {
      LOOM_THROW(
          ErrorCode::InvalidArgument, comm.rank(),
          strFormat("GradSync: %s has a null data pointer (needed to broadcast it from rank 0)", nameOf(i).c_str()));
    }
    if (p.count > 0 && p.grad == nullptr && !options.gradientAsBucketView) {
      LOOM_THROW(ErrorCode::InvalidArgument, comm.rank(),
                 strFormat("GradSync: %s has a null gradient pointer", nameOf(i).c_str()));
    }
  }
  if (options.bucketCapBytes == 0 || options.firstBucketCapBytes == 0) {
    LOOM_THROW(ErrorCode::InvalidArgument, comm.rank(), "GradSync: bucket caps must be positive");
  }
  // Host or device: every buffer alike.
  int where = -2;
  for (size_t i = 0; i < params.size(); ++i)
    for (const void* p : {params[i].data, params[i].grad}) {
      if (p == nullptr || params[i].count == 0) continue;
      const int d = Communicator::deviceOf(p);
      if (where != -2 && (d >= 0) != (where >= 0)) {
        LOOM_THROW(ErrorCode::InvalidArgument, comm.rank(),
                   strFormat("GradSync: %s is in %s memory but earlier parameters are in %s memory: register all "
                             "parameters on the device or all on the host",
                             nameOf(i).c_str(), d >= 0 ? "device" : "host", where >= 0 ? "device" : "host"));
      }
      where = d;
    }
  if (where >= 0 || options.cudaStream != nullptr) {
    rt = device::runtime();
    if (rt == nullptr) {
      LOOM_THROW(ErrorCode::InvalidArgument, comm.rank(),
                 "GradSync: a CUDA stream was given, but " + device::unavailableReason());
    }
    if (where == -1) {
      LOOM_THROW(ErrorCode::InvalidArgument, comm.rank(),
                 "GradSync: a CUDA stream was given with host parameters: pass no stream for host parameters");
    }
  }
}

// Every rank must have registered the same parameters in the same order: each rank compares its
// list with rank 0's, and all ranks learn who differs where, so that each raises the same error.
void GradSync::Impl::checkSameAcrossRanks() {
  const int n = comm.size();
  if (n == 1) return;
  // Per parameter: count, datatype, and a hash of its name (so that two parameters of one shape
  // registered in swapped order are caught too, where the model names them).
  constexpr size_t kFields = 3;
  std::vector<int64_t> mine(kFields * params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    uint64_t h = 1469598103934665603ull;
    for (char ch : params[i].name) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
    mine[kFields * i] = static_cast<int64_t>(params[i].count);
    mine[kFields * i + 1] = static_cast<int64_t>(params[i].type);
    mine[kFields * i + 2] = static_cast<int64_t>(h >> 1);
  }
  int64_t count = static_cast<int64_t>(params.size()), rootCount = count;
  comm.broadcast(&count, &rootCount, 1, DataType::Int64, 0);
  // Rank 0's list (its length from rank 0: a rank with a different number still takes part).
  std::vector<int64_t> root(kFields * static_cast<size_t>(rootCount));
  if (comm.rank() == 0) root = mine;
  comm.broadcast(root.data(), root.data(), root.size(), DataType::Int64, 0);
  // Each rank's verdict: [first differing index or -1, its count there, its type there, its
  // number of parameters, whether only the name differs].
  int64_t verdict[5] = {-1, 0, 0, static_cast<int64_t>(params.size()), 0};
  const size_t common = std::min(params.size(), static_cast<size_t>(rootCount));
  for (size_t i = 0; i < common && verdict[0] < 0; ++i) {
    const int64_t* a = &mine[kFields * i];
    const int64_t* b = &root[kFields * i];
    if (a[0] != b[0] || a[1] != b[1] || a[2] != b[2]) {
      verdict[0] = static_cast<int64_t>(i);
      verdict[1] = a[0];
      verdict[2] = a[1];
      verdict[4] = a[0] == b[0] && a[1] == b[1] ? 1 : 0;
    }
  }
  if (verdict[0] < 0 && params.size() != static_cast<size_t>(rootCount)) verdict[0] = static_cast<int64_t>(common);
  std::vector<int64_t> all(5 * static_cast<size_t>(n));
  comm.allGather(verdict, all.data(), 5, DataType::Int64);
  std::string why;
  for (int r = 1; r < n && why.empty(); ++r) {
    const int64_t* v = &all[5 * static_cast<size_t>(r)];
    if (v[0] < 0) continue;
    const size_t i = static_cast<size_t>(v[0]);
    if (v[3] != rootCount) {
      why = strFormat("rank %d registered %lld parameters, rank 0 %lld", r, static_cast<long long>(v[3]),
                      static_cast<long long>(rootCount));
    } else if (v[4] != 0) {
      why = strFormat(
          "rank %d's parameter %zu has another name than rank 0's, with the same size and datatype: "
          "registered in another order?",
          r, i);
    } else {
      why = strFormat("rank %d's parameter %zu is %lld %s, rank 0's is %lld %s", r, i, static_cast<long long>(v[1]),
                      toString(static_cast<DataType>(v[2])), static_cast<long long>(root[kFields * i]),
                      toString(static_cast<DataType>(root[kFields * i + 1])));
    }
  }
  if (!why.empty()) {
    LOOM_THROW(ErrorCode::InvalidUsage, comm.rank(),
               "GradSync: the ranks registered different parameters (" + why +
                   "): every rank must register the same model's parameters in the same order");
  }
}

void GradSync::Impl::build() {
  std::vector<size_t> bytes(params.size());
  std::vector<int> kinds(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    bytes[i] = params[i].count * sizeOf(params[i].type);
    kinds[i] = static_cast<int>(params[i].type);
  }
  plan = planBuckets(bytes, kinds, options.firstBucketCapBytes, options.bucketCapBytes);
  slots.resize(params.size());
  buckets.resize(plan.size());
  for (size_t b = 0; b < plan.size(); ++b) {
    Bucket& k = buckets[b];
    k.params = plan[b];
    k.type = params[plan[b].front()].type;
    // Large gradients are all-reduced where they are, small ones packed together (one collective
    // for many); with views or compression every gradient is in the bucket.
    const bool allPacked = options.gradientAsBucketView || compressed(k);
    for (size_t i : plan[b]) {
      slots[i].bucket = b;
      const bool large = params[i].count * sizeOf(params[i].type) >= options.directMinBytes;
      (allPacked || !large ? k.packed : k.direct).push_back(i);
    }
    if (!allPacked && k.packed.size() == 1) {  // one gradient needs no packing
      k.direct.push_back(k.packed.front());
      k.packed.clear();
    }
    for (size_t i : k.packed) {
      slots[i].offset = k.count;
      k.count += params[i].count;
    }
    if (rt != nullptr) {
      k.mem = static_cast<uint8_t*>(rt->allocDevice(k.count * sizeOf(k.type)));
    } else {
      k.flat.assign(k.count * sizeOf(k.type), 0);
      k.mem = k.flat.data();
    }
    if (compressed(k) && rt != nullptr) {
      k.wireDev = static_cast<uint8_t*>(rt->allocDevice(k.count * 2));
    } else if (compressed(k)) {
      k.wire.resize(k.count);
    }
  }
  ready.assign(params.size(), false);
  resetStep();
}

void GradSync::Impl::advance() {
  while (nextToStart < buckets.size()) {
    Bucket& b = buckets[nextToStart];
    while (b.directStarted < b.direct.size() && ready[b.direct[b.directStarted]]) {
      startDirect(b, b.direct[b.directStarted]);
      ++b.directStarted;
    }
    if (b.pending > 0 || b.directStarted < b.direct.size()) return;
    startPacked(b);
    ++nextToStart;
  }
}

void GradSync::Impl::startDirect(Bucket& b, size_t i) {
  const Parameter& p = params[i];
  if (p.count > 0) b.works.push_back(comm.iallReduce(p.grad, p.grad, p.count, p.type, ReduceOp::Avg, stream));
}

void GradSync::Impl::startPacked(Bucket& b) {
  b.started = true;
  ++started;
  const size_t elem = sizeOf(b.type);
  if (b.count > 0) {
    if (!options.gradientAsBucketView) {
      for (size_t i : b.packed) {
        if (params[i].count > 0) copy(inBucket(i), params[i].grad, params[i].count * elem);
      }
    }
    if (compressed(b)) {
      // Divided by the world size first, so that the half-precision sum does not overflow.
      const float scale = 1.0f / static_cast<float>(comm.size());
      const bool bf16 = options.compression == Compression::Bfloat16;
      const DataType half = bf16 ? DataType::Bfloat16 : DataType::Float16;
      if (rt != nullptr) {  // on the device, ordered on the stream like the rest
        rt->convertAsync(b.wireDev, half, b.mem, DataType::Float32, b.count, scale, stream);
        b.works.push_back(comm.iallReduce(b.wireDev, b.wireDev, b.count, half, ReduceOp::Sum, stream));
      } else {
        const float* g = reinterpret_cast<const float*>(b.mem);
        for (size_t e = 0; e < b.count; ++e)
          b.wire[e] = bf16 ? kernels::floatToBf16(g[e] * scale) : kernels::floatToFp16(g[e] * scale);
        b.works.push_back(comm.iallReduce(b.wire.data(), b.wire.data(), b.count, half, ReduceOp::Sum));
      }
    } else {
      b.works.push_back(comm.iallReduce(b.mem, b.mem, b.count, b.type, ReduceOp::Avg, stream));
    }
  }
}

void GradSync::Impl::finish(Bucket& b) {
  // Device gradients: the copies back are ordered on the stream after the all-reduce; the host
  // does not wait (a failure fails the communicator, and its next call reports it).
  if (rt == nullptr) waitAll(b.works);
  if (b.count == 0) return;
  if (compressed(b)) {
    const bool bf16 = options.compression == Compression::Bfloat16;
    if (rt != nullptr) {
      rt->convertAsync(b.mem, DataType::Float32, b.wireDev, bf16 ? DataType::Bfloat16 : DataType::Float16, b.count,
                       1.0f, stream);
    } else {
      float* g = reinterpret_cast<float*>(b.mem);
      for (size_t e = 0; e < b.count; ++e)
        g[e] = bf16 ? kernels::bf16ToFloat(b.wire[e]) : kernels::fp16ToFloat(b.wire[e]);
    }
  }
  if (!options.gradientAsBucketView) {
    const size_t elem = sizeOf(b.type);
    for (size_t i : b.packed) {
      if (params[i].count > 0) copy(params[i].grad, inBucket(i), params[i].count * elem);
    }
  }
}

GradSync::GradSync(Communicator& comm, std::vector<Parameter> params, GradSyncOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(params), options)) {
  Impl& s = *impl_;
  s.validate();
  s.checkSameAcrossRanks();
  s.build();
  if (options.broadcastParameters && comm.size() > 1) {
    std::vector<Work> works;
    for (const Parameter& p : s.params) {
      if (p.count > 0) works.push_back(comm.ibroadcast(p.data, p.data, p.count, p.type, 0, s.stream));
    }
    waitAll(works);
  }
}

GradSync::~GradSync() {
  // Buckets still in flight (an exception during a step) must not outlive their memory.
  for (auto& b : impl_->buckets) Impl::drain(b);
}

void GradSync::markReady(size_t i) {
  Impl& s = *impl_;
  if (i >= s.params.size()) {
    LOOM_THROW(ErrorCode::InvalidArgument, s.comm.rank(),
               strFormat("GradSync::markReady: parameter %zu is out of range (%zu registered)", i, s.params.size()));
  }
  if (s.ready[i]) {
    LOOM_THROW(ErrorCode::InvalidUsage, s.comm.rank(),
               strFormat("GradSync::markReady: %s was marked ready twice in this step (a parameter used twice in the "
                         "forward pass is marked once, after its gradient is complete)",
                         s.nameOf(i).c_str()));
  }
  s.ready[i] = true;
  Impl::Bucket& b = s.buckets[s.slots[i].bucket];
  --b.pending;
  if (s.noSyncDepth > 0) return;
  s.advance();
}

void GradSync::synchronize() {
  Impl& s = *impl_;
  std::vector<size_t> missing;
  for (size_t i = 0; i < s.params.size(); ++i)
    if (!s.ready[i]) missing.push_back(i);
  if (!missing.empty()) {
    std::string names;
    for (size_t k = 0; k < missing.size() && k < 8; ++k) names += (k > 0 ? ", " : "") + s.nameOf(missing[k]);
    if (missing.size() > 8) names += strFormat(" and %zu more", missing.size() - 8);
    // Buckets already started must finish before the state is reset (their memory is in use).
    for (auto& b : s.buckets) Impl::drain(b);
    s.resetStep();
    LOOM_THROW(ErrorCode::InvalidUsage, s.comm.rank(),
               strFormat("GradSync::synchronize: %zu of %zu gradients were never marked ready this step: %s (every "
                         "parameter that took part in the forward pass must be marked; parameters that did not "
                         "need a zero gradient marked too)",
                         missing.size(), s.params.size(), names.c_str()));
  }
  if (s.noSyncDepth == 0) {
    // Buckets left unstarted (their gradients were marked inside a noSync scope that has ended).
    s.advance();
    for (auto& b : s.buckets) s.finish(b);
  }
  s.resetStep();
}

void* GradSync::gradient(size_t i) const {
  Impl& s = *impl_;
  if (i >= s.params.size()) {
    LOOM_THROW(ErrorCode::InvalidArgument, s.comm.rank(),
               strFormat("GradSync::gradient: parameter %zu is out of range (%zu registered)", i, s.params.size()));
  }
  return s.options.gradientAsBucketView ? s.inBucket(i) : s.params[i].grad;
}

const std::vector<std::vector<size_t>>& GradSync::buckets() const { return impl_->plan; }

size_t GradSync::bucketsStarted() const { return impl_->started; }

GradSync::NoSyncScope::NoSyncScope(GradSync& sync) : sync_(sync) { ++sync_.impl_->noSyncDepth; }

GradSync::NoSyncScope::~NoSyncScope() { --sync_.impl_->noSyncDepth; }

}  // namespace ddp
}  // namespace loom
