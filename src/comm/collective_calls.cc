// Entry points of the collectives: argument checks, algorithm choice, and ordered execution on
// the communicator's op queue (inline when the queue is idle and the call is blocking).
#include <cstring>

#include "collectives/context.hpp"
#include "collectives/select.hpp"
#include "comm/device_ipc.hpp"
#include "comm/device_nodes.hpp"
#include "comm/device_staging.hpp"
#include "core/format.hpp"
#include "core/signature.hpp"
#include "device/runtime.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace {

using coll::Algo;
using coll::Args;
using coll::Coll;

void checkOp(ReduceOp op, int rank) {
  int o = static_cast<int>(op);
  if (o < 0 || o > static_cast<int>(ReduceOp::Avg)) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank, strFormat("unknown reduction op %d", o));
  }
}

detail::CommImpl& implOf(const Communicator& c) {
  if (c.impl() == nullptr) LOOM_THROW(ErrorCode::InvalidUsage, -1, "the communicator was moved from");
  return *c.impl();
}

size_t timesSize(const detail::CommImpl& c, size_t count, const char* what) {
  if (count > SIZE_MAX / static_cast<size_t>(c.size())) {
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
               strFormat("%s: count %zu times %d ranks overflows", what, count, c.size()));
  }
  return count * static_cast<size_t>(c.size());
}

// Buffers must be the same (in place) or not overlap at all.
void checkOverlap(const detail::CommImpl& c, const void* a, size_t aBytes, const void* b, size_t bBytes,
                  const void* inPlaceAt, const char* what) {
  if (a == nullptr || b == nullptr || aBytes == 0 || bBytes == 0) return;
  if (a == inPlaceAt) return;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  if (x < y + bBytes && y < x + aBytes) {
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
               strFormat("%s: send and receive buffers overlap without being in place (pass the same pointer for "
                         "an in-place operation)",
                         what));
  }
}

// The algorithm a collective of `bytes` in all runs with on this communicator.
Algo chooseAlgo(const detail::CommImpl& c, Coll kind, size_t bytes) {
  Algo algo = c.selector() != nullptr ? c.selector()->pick(kind, bytes, c.size())
                                      : coll::selectAlgo(kind, bytes, c.size(), coll::costModelFor(c.slowestLink()),
                                                         coll::algoOverrideFromEnv());
  // Forced node-aware on a communicator where it is the flat algorithm anyway (one node, or one
  // rank per node), or direct where the ranks share no arena: the model's flat choice.
  if ((algo == Algo::Hierarchical && (c.selector() == nullptr || !c.selector()->hierarchical())) ||
      (algo == Algo::Direct && (c.selector() == nullptr || !c.selector()->direct())))
    algo = coll::selectAlgo(kind, bytes, c.size(),
                            c.selector() != nullptr ? c.selector()->model() : coll::costModelFor(c.slowestLink()), "");
  return algo;
}

// Whether reproducible mode decides how this call reduces: a float sum, avg or prod reduction on a
// communicator in that mode (the other types and ops are exact in any order).
bool canonicalCall(const detail::CommImpl& c, Coll kind, const Args& a) {
  return c.reproducible() && (kind == Coll::AllReduce || kind == Coll::Reduce || kind == Coll::ReduceScatter) &&
         kernels::isCanonicalReduction(a.type, a.op);
}

// The algorithm of a canonical call (runCanonical): the direct all-reduce on one node's arena; the
// node-aware form where the nodes are the tree's subtrees and the buffer large; the canonical
// recursive doubling where the cost model would pick recursive doubling (the latency-bound sizes);
// else the canonical reduce-scatter and gather.
const char* canonicalAlgo(const detail::CommImpl& c, Coll kind, const Args& a) {
  if (kind != Coll::AllReduce) return "canonical";
  // What the default mode would run (the selector remembers its last choice: no model per call).
  const size_t bytes = a.count * a.elem;
  const Algo picked = c.selector() != nullptr
                          ? c.selector()->pick(kind, bytes, c.size())
                          : coll::selectAlgo(kind, bytes, c.size(), coll::costModelFor(c.slowestLink()), "");
  // The direct all-reduce where the selector takes it (from LOOM_SHM_DIRECT_MIN_BYTES up; below,
  // messages over the node's links are faster than its barrier).
  if (picked == Algo::Direct && c.selector() != nullptr && c.selector()->direct()) return "direct";
  if (coll::reproducibleAcrossNodes(c, a)) return "canonical-hier";
  return picked == Algo::RecursiveDoubling ? "canonical-rd" : "canonical";
}

// A reproducible reduction: the canonical algorithms (collectives/reproducible.cc), or the direct
// all-reduce reducing along the canonical tree where every rank shares one node's arena. LOOM_ALGO
// and the cost model do not apply: no other algorithm is needed for the same bits.
void runCanonical(detail::CommImpl& c, Coll kind, const Args& a, uint64_t sig, int64_t seq) {
  const char* algo = canonicalAlgo(c, kind, a);
  c.diagnostics().enterCall(seq, sig, algo);
  coll::Context ctx(c, seq, coll::collName(kind), algo, sig);
  if (std::strcmp(algo, "direct") == 0) {
    Args b = a;
    b.canonical = true;
    return coll::allReduceDirect(ctx, b);
  }
  if (std::strcmp(algo, "canonical-rd") == 0) return coll::allReduceReproducibleDoubling(ctx, a);
  if (std::strcmp(algo, "canonical-hier") == 0) return coll::allReduceReproducibleAcrossNodes(ctx, a);
  if (kind == Coll::AllReduce) return coll::allReduceReproducible(ctx, a);
  if (kind == Coll::Reduce) return coll::reduceReproducible(ctx, a);
  coll::reduceScatterReproducible(ctx, a);
}

// Runs collective `kind` on host buffers as call `seq`, with the algorithm chosen for its size.
void runOnHost(detail::CommImpl& c, Coll kind, const Args& a, uint64_t sig, int64_t seq) {
  if (canonicalCall(c, kind, a)) return runCanonical(c, kind, a, sig, seq);
  const size_t bytes = (kind == Coll::AllGather || kind == Coll::ReduceScatter || kind == Coll::AllToAll)
                           ? a.count * a.elem * static_cast<size_t>(c.size())
                           : a.count * a.elem;
  const Algo algo = chooseAlgo(c, kind, bytes);
  c.diagnostics().enterCall(seq, sig, coll::algoName(algo));
  coll::Context ctx(c, seq, coll::collName(kind), coll::algoName(algo), sig);
  switch (kind) {
    case Coll::AllReduce:
      if (algo == Algo::Hierarchical) return coll::allReduceHierarchical(ctx, a);
      if (algo == Algo::Direct) return coll::allReduceDirect(ctx, a);
      if (algo == Algo::RecursiveDoubling) return coll::allReduceRecursiveDoubling(ctx, a);
      if (algo == Algo::HalvingDoubling) return coll::allReduceHalvingDoubling(ctx, a);
      if (algo == Algo::DoubleTree) return coll::allReduceDoubleTree(ctx, a);
      return coll::allReduceRing(ctx, a);
    case Coll::Broadcast:
      if (algo == Algo::Hierarchical) return coll::broadcastHierarchical(ctx, a);
      if (algo == Algo::Direct) return coll::broadcastDirect(ctx, a);
      return algo == Algo::Binomial ? coll::broadcastBinomial(ctx, a) : coll::broadcastChain(ctx, a);
    case Coll::Reduce:
      if (algo == Algo::Hierarchical) return coll::reduceHierarchical(ctx, a);
      return algo == Algo::Binomial ? coll::reduceBinomial(ctx, a) : coll::reduceRing(ctx, a);
    case Coll::AllGather:
      if (algo == Algo::Direct) return coll::allGatherDirect(ctx, a);
      if (algo == Algo::Pairwise) return coll::allGatherPairwise(ctx, a);
      if (algo == Algo::RecursiveDoubling) return coll::allGatherBruck(ctx, a);
      return coll::allGatherRing(ctx, a);
    case Coll::ReduceScatter:
      return coll::reduceScatterRing(ctx, a);
    case Coll::AllToAll:
      return a.counts ? coll::allToAllvPairwise(ctx, a) : coll::allToAllPairwise(ctx, a);
  }
}

// Runs one collective: asynchronously (returns its Work) or blocking. Device buffers go through
// CUDA IPC among the ranks of one node, else the staging path; both are stream-ordered and never
// block the caller.
Work launch(detail::CommImpl& c, Coll kind, Args a, void* stream, bool async) {
  uint64_t sig = a.counts
                     ? makeAllToAllvSignature(a.type)
                     : makeSignature(static_cast<SigKind>(static_cast<int>(kind) + 1), a.type, a.op, a.root, a.count);
  if (canonicalCall(c, kind, a)) sig = inReproducibleMode(sig);
  if (a.device >= 0) {
    sig = onDeviceBuffers(sig);
    // Reproducible reductions of device buffers: through CUDA IPC with the canonical kernel among
    // the few ranks one kernel reads, else staged through host memory and reduced there (the
    // node-aware device path reduces in another order).
    if (canonicalCall(c, kind, a)) {
      if (c.size() <= device::kMaxCanonicalInputs && detail::deviceIpcUsable(c, kind, false))
        return detail::launchOnDeviceIpc(c, kind, a, stream, sig);
      return detail::launchOnDevice(c, kind, a, stream, sig,
                                    [&c, kind, sig](const Args& h, int64_t seq) { runOnHost(c, kind, h, sig, seq); });
    }
    if (detail::deviceIpcUsable(c, kind, a.counts != nullptr))
      return detail::launchOnDeviceIpc(c, kind, a, stream, sig);
    if (detail::deviceNodesUsable(c, kind)) return detail::launchAcrossNodesOnDevice(c, kind, a, stream, sig);
    return detail::launchOnDevice(c, kind, a, stream, sig,
                                  [&c, kind, sig](const Args& h, int64_t seq) { runOnHost(c, kind, h, sig, seq); });
  }
  auto body = [&c, kind, a, sig](int64_t seq) { runOnHost(c, kind, a, sig, seq); };
  if (async) return Work(c.submit(coll::collName(kind), body, sig));
  c.run(coll::collName(kind), body, sig);
  return Work();
}

Args makeArgs(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root) {
  Args a;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.type = type;
  a.op = op;
  a.root = root;
  a.elem = sizeOf(type);
  return a;
}

Work allReduceImpl(const Communicator& comm, const void* s, void* r, size_t n, DataType t, ReduceOp op, void* st,
                   bool async) {
  auto& c = implOf(comm);
  c.checkOk("all_reduce");
  size_t b = c.checkBuffer(s, n, t, "all-reduce");
  c.checkBuffer(r, n, t, "all-reduce");
  checkOp(op, c.rank());
  checkOverlap(c, s, b, r, b, r, "all-reduce");
  Args a = makeArgs(s, r, n, t, op, 0);
  a.device = detail::locateBuffers(c, {b ? s : nullptr, b ? r : nullptr}, st, "all-reduce");
  return launch(c, Coll::AllReduce, a, st, async);
}

Work broadcastImpl(const Communicator& comm, const void* s, void* r, size_t n, DataType t, int root, void* st,
                   bool async) {
  auto& c = implOf(comm);
  c.checkOk("broadcast");
  c.checkPeer(root, "broadcast root");
  size_t b = c.checkBuffer(r, n, t, "broadcast");
  if (c.rank() == root) {
    c.checkBuffer(s, n, t, "broadcast");
    checkOverlap(c, s, b, r, b, r, "broadcast");
  }
  Args a = makeArgs(s, r, n, t, ReduceOp::Sum, root);
  a.device = detail::locateBuffers(c, {b && c.rank() == root ? s : nullptr, b ? r : nullptr}, st, "broadcast");
  return launch(c, Coll::Broadcast, a, st, async);
}

Work reduceImpl(const Communicator& comm, const void* s, void* r, size_t n, DataType t, ReduceOp op, int root, void* st,
                bool async) {
  auto& c = implOf(comm);
  c.checkOk("reduce");
  c.checkPeer(root, "reduce root");
  size_t b = c.checkBuffer(s, n, t, "reduce");
  checkOp(op, c.rank());
  if (c.rank() == root) {
    c.checkBuffer(r, n, t, "reduce");
    checkOverlap(c, s, b, r, b, r, "reduce");
  }
  Args a = makeArgs(s, r, n, t, op, root);
  a.device = detail::locateBuffers(c, {b ? s : nullptr, b && c.rank() == root ? r : nullptr}, st, "reduce");
  return launch(c, Coll::Reduce, a, st, async);
}

Work allGatherImpl(const Communicator& comm, const void* s, void* r, size_t n, DataType t, void* st, bool async) {
  auto& c = implOf(comm);
  c.checkOk("all_gather");
  size_t b = c.checkBuffer(s, n, t, "all-gather");
  size_t total = c.checkBuffer(r, timesSize(c, n, "all-gather"), t, "all-gather");
  const void* inPlace = static_cast<const uint8_t*>(r) + static_cast<size_t>(c.rank()) * b;
  checkOverlap(c, s, b, r, total, inPlace, "all-gather");
  Args a = makeArgs(s, r, n, t, ReduceOp::Sum, 0);
  a.device = detail::locateBuffers(c, {b ? s : nullptr, total ? r : nullptr}, st, "all-gather");
  return launch(c, Coll::AllGather, a, st, async);
}

Work reduceScatterImpl(const Communicator& comm, const void* s, void* r, size_t n, DataType t, ReduceOp op, void* st,
                       bool async) {
  auto& c = implOf(comm);
  c.checkOk("reduce_scatter");
  size_t total = c.checkBuffer(s, timesSize(c, n, "reduce-scatter"), t, "reduce-scatter");
  size_t b = c.checkBuffer(r, n, t, "reduce-scatter");
  checkOp(op, c.rank());
  const void* inPlace = static_cast<const uint8_t*>(s) + static_cast<size_t>(c.rank()) * b;
  checkOverlap(c, r, b, s, total, inPlace, "reduce-scatter");
  Args a = makeArgs(s, r, n, t, op, 0);
  a.device = detail::locateBuffers(c, {total ? s : nullptr, b ? r : nullptr}, st, "reduce-scatter");
  return launch(c, Coll::ReduceScatter, a, st, async);
}

Work allToAllImpl(const Communicator& comm, const void* s, void* r, size_t n, DataType t, void* st, bool async) {
  auto& c = implOf(comm);
  c.checkOk("all_to_all");
  size_t total = c.checkBuffer(s, timesSize(c, n, "all-to-all"), t, "all-to-all");
  c.checkBuffer(r, timesSize(c, n, "all-to-all"), t, "all-to-all");
  checkOverlap(c, s, total, r, total, r, "all-to-all");
  Args a = makeArgs(s, r, n, t, ReduceOp::Sum, 0);
  a.device = detail::locateBuffers(c, {total ? s : nullptr, total ? r : nullptr}, st, "all-to-all");
  return launch(c, Coll::AllToAll, a, st, async);
}

// The extent in bytes of blocks at `displs` of `counts` elements (0 when all are empty).
size_t extentOf(const detail::CommImpl& c, const std::vector<size_t>& counts, const std::vector<size_t>& displs,
                size_t elem, const char* which) {
  size_t end = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    if (displs[i] > SIZE_MAX / elem - counts[i]) {
      LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
                 strFormat("all-to-all-v: %s block %zu (displacement %zu, count %zu) overflows", which, i, displs[i],
                           counts[i]));
    }
    end = std::max(end, (displs[i] + counts[i]) * elem);
  }
  return end;
}

Work allToAllvImpl(const Communicator& comm, const void* s, const std::vector<size_t>& sendCounts,
                   const std::vector<size_t>& sendDispls, void* r, const std::vector<size_t>& recvCounts,
                   const std::vector<size_t>& recvDispls, DataType t, void* st, bool async) {
  auto& c = implOf(comm);
  c.checkOk("all_to_allv");
  c.checkBuffer(nullptr, 0, t, "all-to-all-v");  // the datatype
  const auto n = static_cast<size_t>(c.size());
  if (sendCounts.size() != n || sendDispls.size() != n || recvCounts.size() != n || recvDispls.size() != n) {
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
               strFormat("all-to-all-v: counts and displacements need %zu entries each (one per rank); got %zu, "
                         "%zu, %zu, %zu",
                         n, sendCounts.size(), sendDispls.size(), recvCounts.size(), recvDispls.size()));
  }
  const size_t elem = sizeOf(t);
  const size_t sendBytes = extentOf(c, sendCounts, sendDispls, elem, "send");
  const size_t recvBytes = extentOf(c, recvCounts, recvDispls, elem, "receive");
  c.checkBuffer(s, sendBytes / elem, t, "all-to-all-v send");
  c.checkBuffer(r, recvBytes / elem, t, "all-to-all-v receive");
  if (sendBytes > 0 && recvBytes > 0) {
    auto x = reinterpret_cast<uintptr_t>(s), y = reinterpret_cast<uintptr_t>(r);
    if (x < y + recvBytes && y < x + sendBytes) {
      LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
                 "all-to-all-v: the send and receive buffers overlap (it has no in-place form)");
    }
  }
  const auto me = static_cast<size_t>(c.rank());
  if (sendCounts[me] != recvCounts[me]) {
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
               strFormat("all-to-all-v: this rank sends itself %zu elements but expects %zu from itself",
                         sendCounts[me], recvCounts[me]));
  }
  Args a = makeArgs(s, r, 0, t, ReduceOp::Sum, 0);
  auto counts = std::make_shared<std::vector<size_t>>();
  counts->reserve(4 * n);
  for (const auto* v : {&sendCounts, &sendDispls, &recvCounts, &recvDispls})
    counts->insert(counts->end(), v->begin(), v->end());
  a.counts = std::move(counts);
  a.device = detail::locateBuffers(c, {sendBytes ? s : nullptr, recvBytes ? r : nullptr}, st, "all-to-all-v");
  return launch(c, Coll::AllToAll, a, st, async);
}

}  // namespace

int Communicator::deviceOf(const void* p) {
  device::DeviceRuntime* rt = device::runtime();
  return rt == nullptr ? -1 : rt->deviceOf(p);
}

std::string Communicator::algorithmFor(const std::string& collective, size_t bytes) const {
  auto& c = implOf(*this);
  for (Coll k :
       {Coll::AllReduce, Coll::Broadcast, Coll::Reduce, Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll}) {
    if (collective != coll::collName(k)) continue;
    Args floatSum;  // (Args' defaults: a float32 sum)
    floatSum.count = bytes / floatSum.elem;
    if (canonicalCall(c, k, floatSum)) return canonicalAlgo(c, k, floatSum);
    return coll::algoName(chooseAlgo(c, k, bytes));
  }
  LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
             strFormat("algorithmFor: unknown collective \"%s\" (all_reduce, broadcast, reduce, all_gather, "
                       "reduce_scatter, all_to_all)",
                       collective.c_str()));
}

Work Communicator::iallReduce(const void* s, void* r, size_t n, DataType t, ReduceOp op, void* st) {
  return allReduceImpl(*this, s, r, n, t, op, st, true);
}
void Communicator::allReduce(const void* s, void* r, size_t n, DataType t, ReduceOp op, void* st) {
  allReduceImpl(*this, s, r, n, t, op, st, false);
}
Work Communicator::ibroadcast(const void* s, void* r, size_t n, DataType t, int root, void* st) {
  return broadcastImpl(*this, s, r, n, t, root, st, true);
}
void Communicator::broadcast(const void* s, void* r, size_t n, DataType t, int root, void* st) {
  broadcastImpl(*this, s, r, n, t, root, st, false);
}
Work Communicator::ireduce(const void* s, void* r, size_t n, DataType t, ReduceOp op, int root, void* st) {
  return reduceImpl(*this, s, r, n, t, op, root, st, true);
}
void Communicator::reduce(const void* s, void* r, size_t n, DataType t, ReduceOp op, int root, void* st) {
  reduceImpl(*this, s, r, n, t, op, root, st, false);
}
Work Communicator::iallGather(const void* s, void* r, size_t n, DataType t, void* st) {
  return allGatherImpl(*this, s, r, n, t, st, true);
}
void Communicator::allGather(const void* s, void* r, size_t n, DataType t, void* st) {
  allGatherImpl(*this, s, r, n, t, st, false);
}
Work Communicator::ireduceScatter(const void* s, void* r, size_t n, DataType t, ReduceOp op, void* st) {
  return reduceScatterImpl(*this, s, r, n, t, op, st, true);
}
void Communicator::reduceScatter(const void* s, void* r, size_t n, DataType t, ReduceOp op, void* st) {
  reduceScatterImpl(*this, s, r, n, t, op, st, false);
}
Work Communicator::iallToAll(const void* s, void* r, size_t n, DataType t, void* st) {
  return allToAllImpl(*this, s, r, n, t, st, true);
}
void Communicator::allToAll(const void* s, void* r, size_t n, DataType t, void* st) {
  allToAllImpl(*this, s, r, n, t, st, false);
}

Work Communicator::iallToAllv(const void* s, const std::vector<size_t>& sendCounts,
                              const std::vector<size_t>& sendDispls, void* r, const std::vector<size_t>& recvCounts,
                              const std::vector<size_t>& recvDispls, DataType t, void* st) {
  return allToAllvImpl(*this, s, sendCounts, sendDispls, r, recvCounts, recvDispls, t, st, true);
}
void Communicator::allToAllv(const void* s, const std::vector<size_t>& sendCounts,
                             const std::vector<size_t>& sendDispls, void* r, const std::vector<size_t>& recvCounts,
                             const std::vector<size_t>& recvDispls, DataType t, void* st) {
  allToAllvImpl(*this, s, sendCounts, sendDispls, r, recvCounts, recvDispls, t, st, false);
}

}  // namespace loom
