// Node-aware collectives on device buffers (see device_nodes.hpp).
#include "collectives/device_nodes.hpp"

#include <algorithm>
#include <vector>

#include "collectives/arena_sync.hpp"
#include "collectives/device_ipc.hpp"
#include "collectives/plan.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {
namespace {

using Buffer = NodeDeviceMemory::Buffer;

// Elements of one chunk of a step across nodes whose host buffer holds `blocks` blocks of it:
// what one pinned slot holds.
size_t chunkElems(size_t staging, size_t elem, size_t blocks) { return std::max<size_t>(1, staging / (elem * blocks)); }

// `a` as the host collective of `n` elements in place at `h`, a chunk of a step across nodes.
Args onHost(const Args& a, uint8_t* h, size_t n) {
  Args across = a;
  across.send = across.recv = h;
  across.count = n;
  across.device = -1;
  return across;
}

// What the collectives share: the call, the node's shape as this rank sees it, and the steps.
struct NodeSteps {
  NodeSteps(Context& context, CommView& view, const LocalArena& arena, Coll k, const Args& args,
            device::DeviceRuntime& runtime, NodeDeviceMemory& memory, size_t stagingBytes)
      : ctx(context),
        comm(view),
        ar(arena),
        kind(k),
        a(args),
        rt(runtime),
        mem(memory),
        staging(stagingBytes),
        work(memory.work()),
        L(arena.ranks.size()),
        me(static_cast<size_t>(arena.me)) {
    for (int k2 = 0; k2 < view.nodeCount(); ++k2) column.push_back(view.ranksOnNode(k2)[me]);
    node = static_cast<size_t>(view.nodeOf(view.rank()));
    step = arena.steps[me]->load(std::memory_order_relaxed);
  }
  void drain() { mem.drain(work, "the device work"); }
  void exchange() { mem.exchange(&step); }
  void barrierHere() { barrier(ctx, ar, ++step); }
  size_t chunk(size_t blocks) const { return chunkElems(staging, a.elem, blocks); }
  /// `bytes` of a step across nodes as chunk `k`: `run` gets the pinned slot and the chunk's
  /// context; `in` copies device to slot before (true: something was queued), `out` slot to device
  /// after.
  template <typename In, typename Run, typename Out>
  void acrossNodes(size_t k, size_t bytes, In in, Run run, Out out) {
    uint8_t* h = mem.hostSlot(bytes);
    if (in(h, mem.toHost())) mem.drain(mem.toHost(), "a copy to host memory");
    Context chunkCtx(comm, ctx.seq() + 1 + static_cast<int64_t>(k), ctx.name(), ctx.algo(), ctx.signature());
    run(chunkCtx, h);
    if (out(h, mem.toDevice())) mem.drain(mem.toDevice(), "a copy to the device");
  }

  Context& ctx;
  CommView& comm;
  const LocalArena& ar;
  const Coll kind;
  const Args& a;
  device::DeviceRuntime& rt;
  NodeDeviceMemory& mem;
  const size_t staging;
  device::StreamHandle work;
  const size_t L, me;
  std::vector<int> column;  // the ranks of this local index, one per node
  size_t node = 0;          // this rank's, an index into column
  uint64_t step = 0;
};

// All-reduce: slice me of every local input reduced here, all-reduced across nodes by the column,
// then the other slices from their owners.
void allReduce(NodeSteps& c) {
  const Args& a = c.a;
  const size_t E = a.elem;
  c.mem.share(a.send, a.count * E, 0, true, Buffer::Send);
  uint8_t* outBounce = c.mem.share(a.recv, a.count * E, 1, false, Buffer::Recv);
  c.exchange();
  std::vector<const void*> srcs(c.L);
  std::vector<uint8_t*> outputs(c.L);
  for (size_t p = 0; p < c.L; ++p) outputs[p] = c.mem.peer(p, Buffer::Recv);
  uint8_t* out = outBounce != nullptr ? outBounce : static_cast<uint8_t*>(a.recv);
  const std::vector<Segment> slices = planSegments(a.count, static_cast<int>(c.L));
  const Segment& s = slices[c.me];
  // 1. This rank's slice, summed over the node.
  const ReduceOp op = a.op == ReduceOp::Avg ? ReduceOp::Sum : a.op;
  if (s.count > 0) {
    for (size_t p = 0; p < c.L; ++p) srcs[p] = c.mem.peer(p, Buffer::Send) + s.offset * E;
    c.rt.reduceAsync(out + s.offset * E, srcs.data(), static_cast<int>(c.L), s.count, a.type, op, 1, c.work);
  }
  c.drain();
  c.barrierHere();
  // 2. The slice across nodes.
  const size_t per = c.chunk(1);
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
void broadcast(NodeSteps& c) {
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
    const size_t per = c.chunk(1);
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
    c.mem.share(isRoot ? a.send : a.recv, bytes, 0, true, Buffer::Send);
  }
  c.exchange();
  if (!inColumn) c.rt.copyAsync(recv, c.mem.peer(rootIndex, Buffer::Send), bytes, c.work);
  c.drain();
  c.barrierHere();
}

// All-gather: each rank's block across nodes by its column, then the other columns' blocks from
// the node's ranks that hold them.
void allGather(NodeSteps& c) {
  const Args& a = c.a;
  const size_t E = a.elem, block = a.count * E, nodes = c.column.size();
  auto* out = static_cast<uint8_t*>(a.recv);
  // 1. Across nodes: the blocks of this column, into their places in this rank's output.
  const size_t per = c.chunk(nodes);
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
  c.mem.share(a.recv, static_cast<size_t>(c.comm.size()) * block, 0, true, Buffer::Recv);
  c.exchange();
  for (size_t p = 0; p < c.L; ++p) {
    if (p == c.me) continue;
    const uint8_t* theirs = c.mem.peer(p, Buffer::Recv);
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
void reduceScatter(NodeSteps& c) {
  const Args& a = c.a;
  const size_t E = a.elem, nodes = c.column.size();
  c.mem.share(a.send, static_cast<size_t>(c.comm.size()) * a.count * E, 0, true, Buffer::Send);
  c.exchange();
  std::vector<const uint8_t*> inputs(c.L);
  for (size_t p = 0; p < c.L; ++p) inputs[p] = c.mem.peer(p, Buffer::Send);
  const ReduceOp op = a.op == ReduceOp::Avg ? ReduceOp::Sum : a.op;
  const size_t per = c.chunk(nodes + 1);
  std::vector<const void*> srcs(c.L);
  for (size_t done = 0, k = 0; done < a.count; done += per, ++k) {
    const size_t n = std::min(per, a.count - done);
    uint8_t* sums = c.mem.deviceScratch(1, nodes * n * E);
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
void reduce(NodeSteps& c) {
  const Args& a = c.a;
  const size_t E = a.elem;
  const bool isRoot = c.comm.rank() == a.root;
  const auto rootNode = static_cast<size_t>(c.comm.nodeOf(a.root));
  const std::vector<Segment> slices = planSegments(a.count, static_cast<int>(c.L));
  const Segment& s = slices[c.me];
  uint8_t* sum = c.mem.deviceScratch(1, std::max<size_t>(s.count, 1) * E);
  c.mem.share(a.send, a.count * E, 0, true, Buffer::Send);
  c.mem.share(sum, std::max<size_t>(s.count, 1) * E, 1, false, Buffer::Recv);  // scratch: shared as it is
  c.exchange();
  // 1. This rank's slice, summed over the node.
  const ReduceOp op = a.op == ReduceOp::Avg ? ReduceOp::Sum : a.op;
  if (s.count > 0) {
    std::vector<const void*> srcs(c.L);
    for (size_t p = 0; p < c.L; ++p) srcs[p] = c.mem.peer(p, Buffer::Send) + s.offset * E;
    c.rt.reduceAsync(sum, srcs.data(), static_cast<int>(c.L), s.count, a.type, op, 1, c.work);
  }
  c.drain();
  c.barrierHere();
  // 2. The slice across nodes, to this column's rank on the root's node.
  const size_t per = c.chunk(1);
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
        c.rt.copyAsync(static_cast<uint8_t*>(a.recv) + t.offset * E, c.mem.peer(p, Buffer::Recv), t.count * E, c.work);
    }
    c.drain();
  }
  c.barrierHere();
}

}  // namespace

int64_t deviceNodeSeqs(const CommView& comm, Coll kind, const Args& a, size_t stagingBytes) {
  // Elements each rank moves across nodes: all-reduce and reduce, the largest slice (the slices of
  // one column are alike, the others' may be one element shorter, and every rank reserves as many
  // sequence numbers); broadcast and all-gather, the whole count (of a block).
  const auto L = static_cast<size_t>(comm.nodes().on(comm.nodeOf(comm.rank())).size());
  const auto nodes = static_cast<size_t>(comm.nodeCount());
  const size_t across = kind == Coll::AllReduce || kind == Coll::Reduce ? (a.count + L - 1) / L : a.count;
  const size_t blocks = kind == Coll::AllGather ? nodes : kind == Coll::ReduceScatter ? nodes + 1 : 1;
  const size_t per = chunkElems(stagingBytes, a.elem, blocks);
  return 1 + static_cast<int64_t>(std::max<size_t>(1, (across + per - 1) / per));
}

void runDeviceNodes(Context& ctx, CommView& comm, const LocalArena& ar, Coll kind, const Args& a,
                    device::DeviceRuntime& rt, NodeDeviceMemory& mem, size_t stagingBytes) {
  NodeSteps c(ctx, comm, ar, kind, a, rt, mem, stagingBytes);
  switch (kind) {
    case Coll::AllReduce:
      return allReduce(c);
    case Coll::Broadcast:
      return broadcast(c);
    case Coll::AllGather:
      return allGather(c);
    case Coll::ReduceScatter:
      return reduceScatter(c);
    case Coll::Reduce:
      return reduce(c);
    default:
      return;  // deviceNodesUsable refuses the others
  }
}

}  // namespace coll
}  // namespace loom
