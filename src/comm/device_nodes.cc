// Node-aware collectives on device buffers (see device_nodes.hpp).
#include "comm/device_nodes.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "collectives/arena_sync.hpp"
#include "collectives/plan.hpp"
#include "comm/device_record.hpp"
#include "comm/device_staging.hpp"
#include "comm/device_state.hpp"
#include "core/format.hpp"
#include "device/runtime.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace detail {

using coll::planSegments;
using coll::Segment;

using coll::allGatherAcrossNodes;
using coll::allReduceAcrossNodes;
using coll::Args;
using coll::barrier;
using coll::broadcastAcrossNodes;
using coll::Coll;
using coll::collName;
using coll::Context;
using coll::reduceAcrossNodes;
using coll::reduceScatterAcrossNodes;
namespace {

constexpr const char* kAlgo = "cuda_ipc+net";

// Elements of one chunk of a step across nodes whose host buffer holds `blocks` blocks of it:
// what one pinned slot holds.
size_t chunkElems(size_t elem, size_t blocks) { return std::max<size_t>(1, deviceStagingBytes() / (elem * blocks)); }

// Elements each rank moves across nodes: all-reduce, the largest slice (the slices of one column
// are alike, the others' may be one element shorter, and every rank reserves as many sequence
// numbers); broadcast and all-gather, the whole count (of a block).
size_t acrossCount(const detail::CommImpl& c, Coll kind, const Args& a) {
  const auto L = static_cast<size_t>(c.localSize());
  return kind == Coll::AllReduce || kind == Coll::Reduce ? (a.count + L - 1) / L : a.count;
}

size_t blocksOf(const detail::CommImpl& c, Coll kind) {
  const auto nodes = static_cast<size_t>(c.nodeCount());
  return kind == Coll::AllGather ? nodes : kind == Coll::ReduceScatter ? nodes + 1 : 1;
}

size_t chunksOf(const detail::CommImpl& c, Coll kind, const Args& a) {
  const size_t per = chunkElems(a.elem, blocksOf(c, kind));
  return std::max<size_t>(1, (acrossCount(c, kind, a) + per - 1) / per);
}

// `a` as the host collective of `n` elements in place at `h`, a chunk of a step across nodes.
Args onHost(const Args& a, uint8_t* h, size_t n) {
  Args across = a;
  across.send = across.recv = h;
  across.count = n;
  across.device = -1;
  return across;
}

// What the three collectives share: the call's context within the node, its device stream and
// record, and the steps across nodes.
struct NodeCall {
  NodeCall(detail::CommImpl& c, DeviceState& s, Coll k, const Args& args, uint64_t signature, int64_t sequence)
      : comm(c),
        st(s),
        rt(s.rt()),
        kind(k),
        a(args),
        sig(signature),
        seq(sequence),
        ctx(c, sequence, collName(k), kAlgo, signature),
        label(strFormat("%s #%lld (%s)", collName(k), static_cast<long long>(sequence), kAlgo)),
        work(s.streams(args.device).d2h),
        ar(*c.arena()),
        L(ar.ranks.size()),
        me(static_cast<size_t>(ar.me)) {
    for (int k2 = 0; k2 < c.nodeCount(); ++k2) column.push_back(c.ranksOnNode(k2)[me]);
    node = static_cast<size_t>(c.nodeOf(c.rank()));
    mine.seq = static_cast<uint64_t>(sequence);
    mine.sig = signature;
    mine.bytes = args.count * args.elem;
    mine.proc = cuda_ipc::thisProcess();
    mine.device = args.device;
    step = ar.steps[me]->load(std::memory_order_relaxed);
  }
  void drain() { drainStream(rt, work, comm, (label + ": the device work").c_str()); }
  uint8_t* share(const void* p, size_t bytes, int slot, bool input, uint64_t* ptr, device::IpcHandle* h) {
    return shareDeviceBuffer(
        st, p, bytes, slot, input, work, [this] { drain(); }, ptr, h);
  }
  /// The records of the node's ranks (checked to be in this call), after a barrier.
  std::vector<DeviceRecord> exchange() { return exchangeRecords(ctx, ar, mine, &step, label); }
  uint8_t* peer(const std::vector<DeviceRecord>& recs, size_t p, bool send) {
    const DeviceRecord& r = recs[p];
    return peerDeviceBuffer(comm, rt, mine, r, p == me, send ? r.sendPtr : r.recvPtr, send ? r.send : r.recv, a.device);
  }
  void barrierHere() { barrier(ctx, ar, ++step); }
  /// `n` elements (of `blocks` blocks in the slot) across nodes as chunk `k`: `run` gets the slot
  /// and the chunk's context; `in` copies device to slot before, `out` slot to device after.
  template <typename In, typename Run, typename Out>
  void acrossNodes(size_t k, size_t bytes, In in, Run run, Out out) {
    const DeviceState::Streams& cs = st.streams(a.device);
    uint8_t* h = st.slot(0, bytes);
    if (in(h, cs.d2h)) drainStream(rt, cs.d2h, comm, (label + ": a copy to host memory").c_str());
    Context chunk(comm, seq + 1 + static_cast<int64_t>(k), collName(kind), kAlgo, sig);
    run(chunk, h);
    if (out(h, cs.h2d)) drainStream(rt, cs.h2d, comm, (label + ": a copy to the device").c_str());
  }

  detail::CommImpl& comm;
  DeviceState& st;
  device::DeviceRuntime& rt;
  const Coll kind;
  const Args a;
  const uint64_t sig;
  const int64_t seq;
  Context ctx;
  const std::string label;
  device::StreamHandle work;
  const LocalArena& ar;
  const size_t L, me;
  std::vector<int> column;  // the ranks of this local index, one per node
  size_t node = 0;          // this rank's, an index into column
  DeviceRecord mine;
  uint64_t step = 0;
};

// All-reduce: slice me of every local input reduced here, all-reduced across nodes by the column,
// then the other slices from their owners.
void allReduce(NodeCall& c) {
  const Args& a = c.a;
  const size_t E = a.elem;
  c.share(a.send, a.count * E, 0, true, &c.mine.sendPtr, &c.mine.send);
  uint8_t* outBounce = c.share(a.recv, a.count * E, 1, false, &c.mine.recvPtr, &c.mine.recv);
  const std::vector<DeviceRecord> recs = c.exchange();
  std::vector<const void*> srcs(c.L);
  std::vector<uint8_t*> outputs(c.L);
  for (size_t p = 0; p < c.L; ++p) outputs[p] = c.peer(recs, p, false);
  uint8_t* out = outBounce != nullptr ? outBounce : static_cast<uint8_t*>(a.recv);
  const std::vector<Segment> slices = planSegments(a.count, static_cast<int>(c.L));
  const Segment& s = slices[c.me];
  // 1. This rank's slice, summed over the node.
  const ReduceOp op = a.op == ReduceOp::Avg ? ReduceOp::Sum : a.op;
  if (s.count > 0) {
    for (size_t p = 0; p < c.L; ++p) srcs[p] = c.peer(recs, p, true) + s.offset * E;
    c.rt.reduceAsync(out + s.offset * E, srcs.data(), static_cast<int>(c.L), s.count, a.type, op, 1, c.work);
  }
  c.drain();
  c.barrierHere();
  // 2. The slice across nodes.
  const size_t per = chunkElems(E, 1);
  for (size_t done = 0, k = 0; done < s.count; done += per, ++k) {
    const size_t n = std::min(per, s.count - done);
    uint8_t* d = out + (s.offset + done) * E;
    c.acrossNodes(
        k, n * E, [&](uint8_t* h, device::StreamHandle cs) { return c.rt.copyAsync(h, d, n * E, cs), true; },
        [&](Context& chunk, uint8_t* h) {
          Args across = onHost(a, h, n);
          across.op = op;
          allReduceAcrossNodes(chunk, c.column, across);
          if (a.op == ReduceOp::Avg) kernels::divide(h, n, a.type, c.comm.size());
        },
        [&](uint8_t* h, device::StreamHandle cs) { return c.rt.copyAsync(d, h, n * E, cs), true; });
  }
  c.barrierHere();
  // 3. The other slices, from their owners.
  gatherSlices(c.rt, out, outputs, slices, c.me, E, c.work);
  c.drain();
  c.barrierHere();
  if (outBounce != nullptr) {
    c.rt.copyAsync(a.recv, outBounce, a.count * E, c.work);
    c.drain();
  }
}

// Broadcast: across nodes by the root's column, then within each node from that column's rank.
void broadcast(NodeCall& c) {
  const Args& a = c.a;
  const size_t E = a.elem, bytes = a.count * E;
  const int root = a.root;
  const int rootNode = c.comm.nodeOf(root);
  const size_t rootIndex = static_cast<size_t>(c.comm.nodes().localRank(root));
  const bool isRoot = c.comm.rank() == root, inColumn = c.me == rootIndex;
  auto* recv = static_cast<uint8_t*>(a.recv);
  // 1. Across nodes, by the ranks of the root's local index.
  if (inColumn) {
    if (isRoot && a.send != a.recv) c.rt.copyAsync(recv, a.send, bytes, c.work);
    const size_t per = chunkElems(E, 1);
    for (size_t done = 0, k = 0; done < a.count; done += per, ++k) {
      const size_t n = std::min(per, a.count - done);
      auto* from = static_cast<const uint8_t*>(a.send) + done * E;
      c.acrossNodes(
          k, n * E,
          [&](uint8_t* h, device::StreamHandle cs) { return isRoot && (c.rt.copyAsync(h, from, n * E, cs), true); },
          [&](Context& chunk, uint8_t* h) {
            Args across = onHost(a, h, n);
            across.root = rootNode;
            broadcastAcrossNodes(chunk, c.column, across);
          },
          [&](uint8_t* h, device::StreamHandle cs) {
            return !isRoot && (c.rt.copyAsync(recv + done * E, h, n * E, cs), true);
          });
    }
    c.drain();
    // 2. Within the node, from this rank (its copy, where CUDA IPC cannot share it).
    c.share(isRoot ? a.send : a.recv, bytes, 0, true, &c.mine.sendPtr, &c.mine.send);
  }
  const std::vector<DeviceRecord> recs = c.exchange();
  if (!inColumn) c.rt.copyAsync(recv, c.peer(recs, rootIndex, true), bytes, c.work);
  c.drain();
  c.barrierHere();
}

// All-gather: each rank's block across nodes by its column, then the other columns' blocks from
// the node's ranks that hold them.
void allGather(NodeCall& c) {
  const Args& a = c.a;
  const size_t E = a.elem, block = a.count * E, nodes = c.column.size();
  auto* out = static_cast<uint8_t*>(a.recv);
  // 1. Across nodes: the blocks of this column, into their places in this rank's output.
  const size_t per = chunkElems(E, nodes);
  for (size_t done = 0, k = 0; done < a.count; done += per, ++k) {
    const size_t n = std::min(per, a.count - done);
    c.acrossNodes(
        k, nodes * n * E,
        [&](uint8_t* h, device::StreamHandle cs) {
          c.rt.copyAsync(h + c.node * n * E, static_cast<const uint8_t*>(a.send) + done * E, n * E, cs);
          return true;
        },
        [&](Context& chunk, uint8_t* h) {
          Args across = onHost(a, h, n);
          across.send = h + c.node * n * E;
          allGatherAcrossNodes(chunk, c.column, across);
        },
        [&](uint8_t* h, device::StreamHandle cs) {
          for (size_t j = 0; j < nodes; ++j)
            c.rt.copyAsync(out + static_cast<size_t>(c.column[j]) * block + done * E, h + j * n * E, n * E, cs);
          return true;
        });
  }
  // 2. Within the node: the other columns' blocks from their holders' outputs.
  c.share(a.recv, static_cast<size_t>(c.comm.size()) * block, 0, true, &c.mine.recvPtr, &c.mine.recv);
  const std::vector<DeviceRecord> recs = c.exchange();
  for (size_t p = 0; p < c.L; ++p) {
    if (p == c.me) continue;
    const uint8_t* theirs = c.peer(recs, p, false);
    for (int k = 0; k < c.comm.nodeCount(); ++k) {
      const auto r = static_cast<size_t>(c.comm.ranksOnNode(k)[p]);
      c.rt.copyAsync(out + r * block, theirs + r * block, block, c.work);
    }
  }
  c.drain();
  c.barrierHere();
}

// Reduce-scatter: the blocks of this rank's column summed over the node here (from every local
// input, through CUDA IPC), then reduce-scattered across nodes by the column.
void reduceScatter(NodeCall& c) {
  const Args& a = c.a;
  const size_t E = a.elem, nodes = c.column.size();
  c.share(a.send, static_cast<size_t>(c.comm.size()) * a.count * E, 0, true, &c.mine.sendPtr, &c.mine.send);
  const std::vector<DeviceRecord> recs = c.exchange();
  std::vector<const uint8_t*> inputs(c.L);
  for (size_t p = 0; p < c.L; ++p) inputs[p] = c.peer(recs, p, true);
  const ReduceOp op = a.op == ReduceOp::Avg ? ReduceOp::Sum : a.op;
  const size_t per = chunkElems(E, nodes + 1);
  std::vector<const void*> srcs(c.L);
  for (size_t done = 0, k = 0; done < a.count; done += per, ++k) {
    const size_t n = std::min(per, a.count - done);
    uint8_t* sums = c.st.deviceScratch(1, nodes * n * E);
    c.acrossNodes(
        k, (nodes + 1) * n * E,
        [&](uint8_t* h, device::StreamHandle cs) {
          for (size_t j = 0; j < nodes; ++j) {
            const size_t at = (static_cast<size_t>(c.column[j]) * a.count + done) * E;
            for (size_t p = 0; p < c.L; ++p) srcs[p] = inputs[p] + at;
            c.rt.reduceAsync(sums + j * n * E, srcs.data(), static_cast<int>(c.L), n, a.type, op, 1, c.work);
          }
          c.drain();
          c.rt.copyAsync(h, sums, nodes * n * E, cs);
          return true;
        },
        [&](Context& chunk, uint8_t* h) {
          Args across = onHost(a, h, n);
          across.recv = h + nodes * n * E;
          across.op = op;
          reduceScatterAcrossNodes(chunk, c.column, across);
          if (a.op == ReduceOp::Avg) kernels::divide(across.recv, n, a.type, c.comm.size());
        },
        [&](uint8_t* h, device::StreamHandle cs) {
          c.rt.copyAsync(static_cast<uint8_t*>(a.recv) + done * E, h + nodes * n * E, n * E, cs);
          return true;
        });
  }
  c.barrierHere();
}

// Reduce: slice l of every local input summed over the node by local rank l (into its scratch),
// reduced across nodes by column l to its rank on the root's node, then gathered by the root from
// its node's ranks.
void reduce(NodeCall& c) {
  const Args& a = c.a;
  const size_t E = a.elem;
  const bool isRoot = c.comm.rank() == a.root;
  const auto rootNode = static_cast<size_t>(c.comm.nodeOf(a.root));
  const std::vector<Segment> slices = planSegments(a.count, static_cast<int>(c.L));
  const Segment& s = slices[c.me];
  uint8_t* sum = c.st.deviceScratch(1, std::max<size_t>(s.count, 1) * E);
  c.share(a.send, a.count * E, 0, true, &c.mine.sendPtr, &c.mine.send);
  c.mine.recvPtr = reinterpret_cast<uintptr_t>(sum);  // scratch from cudaMalloc: shareable as it is
  c.mine.recv = c.rt.ipcExport(sum);
  const std::vector<DeviceRecord> recs = c.exchange();
  // 1. This rank's slice, summed over the node.
  const ReduceOp op = a.op == ReduceOp::Avg ? ReduceOp::Sum : a.op;
  if (s.count > 0) {
    std::vector<const void*> srcs(c.L);
    for (size_t p = 0; p < c.L; ++p) srcs[p] = c.peer(recs, p, true) + s.offset * E;
    c.rt.reduceAsync(sum, srcs.data(), static_cast<int>(c.L), s.count, a.type, op, 1, c.work);
  }
  c.drain();
  c.barrierHere();
  // 2. The slice across nodes, to this column's rank on the root's node.
  const size_t per = chunkElems(E, 1);
  const bool receives = c.node == rootNode;
  for (size_t done = 0, k = 0; done < s.count; done += per, ++k) {
    const size_t n = std::min(per, s.count - done);
    c.acrossNodes(
        k, n * E,
        [&](uint8_t* h, device::StreamHandle cs) { return c.rt.copyAsync(h, sum + done * E, n * E, cs), true; },
        [&](Context& chunk, uint8_t* h) {
          Args across = onHost(a, h, n);
          across.op = op;
          across.root = static_cast<int>(rootNode);
          reduceAcrossNodes(chunk, c.column, across);
          if (receives && a.op == ReduceOp::Avg) kernels::divide(h, n, a.type, c.comm.size());
        },
        [&](uint8_t* h, device::StreamHandle cs) {
          return receives && (c.rt.copyAsync(sum + done * E, h, n * E, cs), true);
        });
  }
  c.barrierHere();
  // 3. The root gathers the slices from its node's ranks.
  if (isRoot) {
    for (size_t p = 0; p < c.L; ++p) {
      const Segment& t = slices[p];
      if (t.count > 0)
        c.rt.copyAsync(static_cast<uint8_t*>(a.recv) + t.offset * E, c.peer(recs, p, false), t.count * E, c.work);
    }
    c.drain();
  }
  c.barrierHere();
}

void run(detail::CommImpl& comm, Coll kind, const Args& a, uint64_t sig, int64_t seq, DeviceState& st) {
  comm.diagnostics().enterCall(seq, sig, kAlgo);
  if (a.count == 0) return;  // the count is in the signature: every rank skips alike
  NodeCall c(comm, st, kind, a, sig, seq);
  try {
    if (kind == Coll::AllReduce) allReduce(c);
    if (kind == Coll::Broadcast) broadcast(c);
    if (kind == Coll::AllGather) allGather(c);
    if (kind == Coll::ReduceScatter) reduceScatter(c);
    if (kind == Coll::Reduce) reduce(c);
  } catch (const Error&) {
    // A rank that gives up mid-exchange must not leave its peers waiting at a barrier.
    failCommunicatorWithCurrent(comm, c.label);
    throw;
  }
}

}  // namespace

bool deviceNodesUsable(const detail::CommImpl& c, Coll kind) {
  if (kind == Coll::AllToAll || kind == Coll::Gather || kind == Coll::Scatter) return false;  // staged flat
  if (c.nodeCount() < 2) return false;
  const int L = c.localSize();
  if (L < 2) return false;
  for (int k = 0; k < c.nodeCount(); ++k)
    if (static_cast<int>(c.ranksOnNode(k).size()) != L) return false;
  const LocalArena* ar = c.arena();
  if (c.ipcCache() == nullptr || ar == nullptr || ar->ranks != c.ranksOnNode(c.nodeOf(c.rank())) ||
      static_cast<int>(ar->deviceRecords.size()) != L)
    return false;
  for (int r : ar->ranks)
    if (r != c.rank() && !c.link(r).deviceMemory) return false;
  return true;
}

Work launchAcrossNodesOnDevice(detail::CommImpl& c, Coll kind, const Args& a, void* stream, uint64_t sig) {
  // One sequence number for the exchange within the node, one per chunk across nodes.
  const auto seqs = static_cast<int64_t>(1 + chunksOf(c, kind, a));
  return launchDeviceCall(c, kind, a.device, stream, sig, seqs,
                          [&c, kind, a, sig](int64_t seq, DeviceState& st) { run(c, kind, a, sig, seq, st); });
}

}  // namespace detail
}  // namespace loom
