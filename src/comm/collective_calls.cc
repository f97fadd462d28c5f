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

// Whether reproducible mode decides how this call reduces: a float sum, avg or prod reduction on a
// communicator in that mode (the other types and ops are exact in any order).
bool canonicalCall(const detail::CommImpl& c, Coll kind, const Args& a) {
  return c.reproducible() && (kind == Coll::AllReduce || kind == Coll::Reduce || kind == Coll::ReduceScatter) &&
         kernels::isCanonicalReduction(a.type, a.op);
}

// The whole buffer a call's algorithm moves: every rank's block for the collectives of blocks.
size_t callBytes(const detail::CommImpl& c, Coll kind, const Args& a) {
  const size_t block = a.count * a.elem;
  return kind == Coll::AllReduce || kind == Coll::Broadcast || kind == Coll::Reduce
             ? block
             : block * static_cast<size_t>(c.size());
}

// The row of the algorithm table a call of `bytes` runs on this communicator: the selector's (the
// cost model, LOOM_ALGO, the node shape); in reproducible mode, for a float reduction, the
// canonical row that follows that choice (no other algorithm gives the same bits, so LOOM_ALGO and
// the model do not apply).
const coll::AlgoRow& chooseRow(const detail::CommImpl& c, Coll kind, size_t bytes, const Args& a) {
  const coll::Selector* sel = c.selector();
  const bool canonical = canonicalCall(c, kind, a);
  if (sel != nullptr && !canonical) return sel->pick(kind, bytes, c.size());
  const coll::CostModel model = sel != nullptr ? sel->model() : coll::costModelFor(c.slowestLink());
  coll::Call call = coll::Call::flat(kind, bytes, c.size(), model);
  const coll::AlgoRow& picked =
      sel != nullptr ? sel->pick(kind, bytes, c.size())
                     : coll::chooseRow(call, coll::Mode::Default, coll::forcedRow(kind, coll::algoOverrideFromEnv()));
  if (!canonical) return picked;
  call.shape = sel != nullptr ? &sel->shape() : nullptr;
  call.comm = &c;
  call.args = &a;
  call.defaultAlgo = picked.algo;
  return coll::chooseRow(call, coll::Mode::Reproducible);
}

// Runs collective `kind` on host buffers as call `seq`, with the row chosen for it.
void runOnHost(detail::CommImpl& c, Coll kind, const Args& a, uint64_t sig, int64_t seq) {
  const coll::AlgoRow& row = chooseRow(c, kind, callBytes(c, kind, a), a);
  c.diagnostics().enterCall(seq, sig, row.name);
  coll::Context ctx(c, seq, coll::collName(kind), row.name, sig);
  row.run(ctx, a);
}

// The kind a collective's signature carries (what ranks compare to catch mismatched calls).
SigKind sigKindOf(Coll kind) {
  switch (kind) {
    case Coll::AllReduce:
      return SigKind::AllReduce;
    case Coll::Broadcast:
      return SigKind::Broadcast;
    case Coll::Reduce:
      return SigKind::Reduce;
    case Coll::AllGather:
      return SigKind::AllGather;
    case Coll::ReduceScatter:
      return SigKind::ReduceScatter;
    case Coll::AllToAll:
      return SigKind::AllToAll;
    case Coll::Gather:
      return SigKind::Gather;
    case Coll::Scatter:
      return SigKind::Scatter;
    case Coll::Barrier:
      return SigKind::Barrier;
  }
  return SigKind::None;
}

// Runs one collective: asynchronously (returns its Work) or blocking. Device buffers go through
// CUDA IPC among the ranks of one node, else the staging path; both are stream-ordered and never
// block the caller.
Work launch(detail::CommImpl& c, Coll kind, Args a, void* stream, bool async) {
  uint64_t sig =
      a.counts ? makeAllToAllvSignature(a.type) : makeSignature(sigKindOf(kind), a.type, a.op, a.root, a.count);
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

Work gatherImpl(const Communicator& comm, const void* s, void* r, size_t n, DataType t, int root, void* st,
                bool async) {
  auto& c = implOf(comm);
  c.checkOk("gather");
  c.checkPeer(root, "gather root");
  const size_t b = c.checkBuffer(s, n, t, "gather");
  size_t total = 0;
  if (c.rank() == root) {
    total = c.checkBuffer(r, timesSize(c, n, "gather"), t, "gather");
    checkOverlap(c, s, b, r, total, static_cast<const uint8_t*>(r) + static_cast<size_t>(root) * b, "gather");
  }
  Args a = makeArgs(s, r, n, t, ReduceOp::Sum, root);
  a.device = detail::locateBuffers(c, {b ? s : nullptr, total ? r : nullptr}, st, "gather");
  return launch(c, Coll::Gather, a, st, async);
}

Work scatterImpl(const Communicator& comm, const void* s, void* r, size_t n, DataType t, int root, void* st,
                 bool async) {
  auto& c = implOf(comm);
  c.checkOk("scatter");
  c.checkPeer(root, "scatter root");
  const size_t b = c.checkBuffer(r, n, t, "scatter");
  size_t total = 0;
  if (c.rank() == root) {
    total = c.checkBuffer(s, timesSize(c, n, "scatter"), t, "scatter");
    checkOverlap(c, r, b, s, total, static_cast<const uint8_t*>(s) + static_cast<size_t>(root) * b, "scatter");
  }
  Args a = makeArgs(s, r, n, t, ReduceOp::Sum, root);
  a.device = detail::locateBuffers(c, {total ? s : nullptr, b ? r : nullptr}, st, "scatter");
  return launch(c, Coll::Scatter, a, st, async);
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

void detail::CommImpl::barrierBody(int64_t seq) {
  runOnHost(*this, Coll::Barrier, Args{}, makeSignature(SigKind::Barrier, DataType::Uint8, ReduceOp::Sum, 0, 0), seq);
}

std::string Communicator::algorithmFor(const std::string& collective, size_t bytes) const {
  auto& c = implOf(*this);
  std::string names;
  for (int i = 0; i < coll::kCollCount; ++i) {
    const auto k = static_cast<Coll>(i);
    names += std::string(names.empty() ? "" : ", ") + coll::collName(k);
    if (collective != coll::collName(k)) continue;
    Args floatSum;  // (Args' defaults: a float32 sum)
    floatSum.count = bytes / floatSum.elem;
    return chooseRow(c, k, bytes, floatSum).name;
  }
  LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
             strFormat("algorithmFor: unknown collective \"%s\" (%s)", collective.c_str(), names.c_str()));
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
Work Communicator::igather(const void* s, void* r, size_t n, DataType t, int root, void* st) {
  return gatherImpl(*this, s, r, n, t, root, st, true);
}
void Communicator::gather(const void* s, void* r, size_t n, DataType t, int root, void* st) {
  gatherImpl(*this, s, r, n, t, root, st, false);
}
Work Communicator::iscatter(const void* s, void* r, size_t n, DataType t, int root, void* st) {
  return scatterImpl(*this, s, r, n, t, root, st, true);
}
void Communicator::scatter(const void* s, void* r, size_t n, DataType t, int root, void* st) {
  scatterImpl(*this, s, r, n, t, root, st, false);
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
