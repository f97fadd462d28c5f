// The reproducible reductions (LOOM_REPRODUCIBLE, docs/reproducibility.md): every element is
// reduced once, by one rank, from all n inputs at once, along the canonical tree over rank order
// (kernels::reduceCanonical). Which rank reduces which element, how the message is cut in pieces
// and which links carry them change nothing in the bits.
//
// Latency-bound all-reduces take a recursive doubling whose combinations are the canonical tree's:
// at distance d = 1, 2, 4, ... the ranks of each group [g, g + 2d) combine its lower half's value
// with its upper half's, lower first (where the upper half is short, its ranks serve the lower
// half's extra ranks too); half precision travels widened to float32 and is rounded once at the
// end. Small reduces gather every input on the root and reduce there. Larger calls cut the buffer
// into one block per rank; each rank receives its block from every peer in pieces and reduces each
// piece as soon as every peer's has come (a direct reduce-scatter, the ring's bytes in one step),
// then the reduced pieces go to every peer (all-reduce), the root (reduce) or nowhere
// (reduce-scatter). Messages of the first half use channel 0, of the second channel 1, so pieces
// match in order on each.
//
// Where every node holds an aligned power-of-two block of ranks, the tree's subtrees are the nodes:
// a large float32 or float64 all-reduce then reduces within each node first, then across nodes by
// the ranks of one local index (each over its own slice), then gathers within the node, so that
// each slice crosses the network once per node rather than once per rank.
#include <algorithm>
#include <functional>

#include "collectives/context.hpp"
#include "collectives/reduce_on_arrival.hpp"
#include "kernels/copy.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {
namespace {

// Up to this many bytes received in all, a call gathers every input instead of cutting blocks.
constexpr size_t kGatherAllBytes = size_t{96} << 10;
// The node-aware form wants every local rank to own a real slice (as hierarchical.cc's 2D form).
constexpr size_t kAcrossNodesMinElemsPerRank = 16384;

bool gathersAll(const Context& c, size_t bytes) { return bytes * static_cast<size_t>(c.size() - 1) <= kGatherAllBytes; }

// Elements per piece: the ring's chunk, which the cost model sizes for these links.
size_t pieceElems(const Context& c, size_t elem) { return std::max<size_t>(1, c.ringChunkElems(elem)); }

// Every rank q owns `own[q]` (elements of `in`); this rank sends each peer the pieces of its part
// and reduces its own part, piece by piece, into `dst` (dst[0] is own[me]'s first element), calling
// `done(offset, count)` (relative to its part) after each piece. Waits for its sends.
void reduceToOwners(Context& c, const Args& a, const std::vector<Segment>& own, const uint8_t* in, uint8_t* dst,
                    const std::function<void(size_t, size_t)>& done) {
  const int n = c.size(), me = c.rank();
  const size_t E = a.elem, P = pieceElems(c, E);
  const Segment mine = own[static_cast<size_t>(me)];
  // Peers' pieces of this rank's part: one region per peer, in rank order.
  uint8_t* from = c.scratch(mine.count * E * static_cast<size_t>(n - 1), 0);
  const auto region = [&](int q) { return from + static_cast<size_t>(q < me ? q : q - 1) * mine.count * E; };
  std::vector<RequestPtr> recvs, sends;
  for (size_t off = 0; off < mine.count; off += P) {
    const size_t len = std::min(P, mine.count - off);
    for (int k = 1; k < n; ++k) {
      const int q = (me - k + n) % n;
      recvs.push_back(c.recv(q, region(q) + off * E, len * E, 0));
    }
  }
  // Sends piece by piece across the peers, so that every owner starts reducing early.
  size_t most = 0;
  for (const Segment& s : own) most = std::max(most, s.count);
  for (size_t off = 0; off < most; off += P) {
    for (int k = 1; k < n; ++k) {
      const int q = (me + k) % n;
      const Segment& s = own[static_cast<size_t>(q)];
      if (off >= s.count) continue;
      sends.push_back(c.send(q, in + (s.offset + off) * E, std::min(P, s.count - off) * E, 0));
    }
  }
  std::vector<const void*> srcs(static_cast<size_t>(n));
  size_t next = 0;
  for (size_t off = 0; off < mine.count; off += P) {
    const size_t len = std::min(P, mine.count - off);
    for (int k = 1; k < n; ++k) c.wait(recvs[next++]);
    for (int q = 0; q < n; ++q)
      srcs[static_cast<size_t>(q)] = q == me ? in + (mine.offset + off) * E : region(q) + off * E;
    kernels::reduceCanonical(dst + off * E, srcs.data(), n, len, a.type, a.op);
    done(off, len);
  }
  c.waitAll(sends);
}

// Every input on this rank (`root` < 0: every rank gathers; else only the root), reduced into out.
void gatherAllAndReduce(Context& c, const Args& a, int root, void* out) {
  const int n = c.size(), me = c.rank();
  const size_t bytes = a.count * a.elem;
  std::vector<RequestPtr> reqs;
  if (root < 0 || me == root) {
    uint8_t* from = c.scratch(bytes * static_cast<size_t>(n), 0);
    std::vector<const void*> srcs(static_cast<size_t>(n));
    for (int k = 1; k < n; ++k) {
      const int q = (me - k + n) % n;
      reqs.push_back(c.recv(q, from + static_cast<size_t>(q) * bytes, bytes));
    }
    if (root < 0)
      for (int k = 1; k < n; ++k) reqs.push_back(c.send((me + k) % n, a.send, bytes));
    for (int q = 0; q < n; ++q) srcs[static_cast<size_t>(q)] = q == me ? a.send : from + static_cast<size_t>(q) * bytes;
    c.waitAll(reqs);  // sends included: in place, out is the input they read
    kernels::reduceCanonical(out, srcs.data(), n, a.count, a.type, a.op);
    return;
  }
  reqs.push_back(c.send(root, a.send, bytes));
  c.waitAll(reqs);
}

// Half precision as float32 (`to` holds count floats), and back, rounding once.
void widen(void* to, const void* from, size_t count, DataType type) {
  auto* f = static_cast<float*>(to);
  const auto* h = static_cast<const uint16_t*>(from);
  for (size_t i = 0; i < count; ++i)
    f[i] = type == DataType::Float16 ? kernels::fp16ToFloat(h[i]) : kernels::bf16ToFloat(h[i]);
}
void narrow(void* to, const void* from, size_t count, DataType type) {
  auto* h = static_cast<uint16_t*>(to);
  const auto* f = static_cast<const float*>(from);
  for (size_t i = 0; i < count; ++i)
    h[i] = type == DataType::Float16 ? kernels::floatToFp16(f[i]) : kernels::floatToBf16(f[i]);
}

}  // namespace

void allReduceReproducibleDoubling(Context& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  if (a.count == 0) return;
  const bool half = a.type == DataType::Float16 || a.type == DataType::Bfloat16;
  const DataType acc = half ? DataType::Float32 : a.type;
  const size_t elemAcc = sizeOf(acc), bytesAcc = a.count * elemAcc;
  const ReduceOp op = a.op == ReduceOp::Avg ? ReduceOp::Sum : a.op;
  uint8_t* res = half ? c.scratch(bytesAcc, 0) : bytes(a.recv);  // where the running value goes
  uint8_t* got = c.scratch(bytesAcc, 1);
  // The running value: the input itself until the first combination (as the default recursive
  // doubling: no copy, and that first step reduces as the bytes land); half precision widened.
  const uint8_t* cur = cbytes(a.send);
  if (half) {
    widen(res, a.send, a.count, a.type);
    cur = res;
  }
  std::vector<RequestPtr> sends;
  for (int d = 1; d < n; d *= 2) {
    const int g = me / (2 * d) * (2 * d), upper = g + d;
    if (upper >= n) continue;  // this group has no upper half yet
    const int upperSize = std::min(g + 2 * d, n) - upper;
    const bool lower = me < upper;
    // The partner at distance d, or (past the end) the upper rank that serves this one.
    const int from = lower ? upper + (me - g) % upperSize : me - d;
    // Reduced as it lands where the value is still the input (it is sent from there, not from res).
    const bool onArrival = cur != res;
    RequestPtr rq = onArrival
                        ? c.recv(from, got, bytesAcc, 0, ReduceOnArrival::make(res, cur, acc, op, elemAcc, !lower))
                        : c.recv(from, got, bytesAcc);
    if (lower) {
      if (me + d < n) sends.push_back(c.send(me + d, cur, bytesAcc));
    } else {
      for (int l = g; l < upper; ++l)
        if (upper + (l - g) % upperSize == me) sends.push_back(c.send(l, cur, bytesAcc));
    }
    c.wait(rq);
    c.waitAll(sends);
    if (!onArrival) kernels::reduce(res, lower ? res : got, lower ? got : res, a.count, acc, op);
    cur = res;
  }
  copyIfDistinct(res, cur, bytesAcc);  // one rank alone: nothing was combined
  if (a.op == ReduceOp::Avg) kernels::divide(res, a.count, acc, n);
  if (half) narrow(a.recv, res, a.count, a.type);
}

void allReduceReproducible(Context& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t E = a.elem;
  if (a.count == 0) return;
  if (n == 1 || gathersAll(c, a.count * E)) return gatherAllAndReduce(c, a, -1, a.recv);
  const auto own = planSegments(a.count, n);
  const uint8_t* in = cbytes(a.send);
  uint8_t* out = bytes(a.recv);
  const Segment mine = own[static_cast<size_t>(me)];
  const size_t P = pieceElems(c, E);
  // The reduced pieces of the other blocks, posted up front. In place they land where this rank's
  // own pieces of those blocks were sent from: a peer sends its reduced piece only once it has
  // received this rank's, so nothing is overwritten before it has been read.
  std::vector<RequestPtr> reqs;
  size_t most = 0;
  for (const Segment& s : own) most = std::max(most, s.count);
  for (size_t off = 0; off < most; off += P) {
    for (int k = 1; k < n; ++k) {
      const int q = (me - k + n) % n;
      const Segment& s = own[static_cast<size_t>(q)];
      if (off < s.count) reqs.push_back(c.recv(q, out + (s.offset + off) * E, std::min(P, s.count - off) * E, 1));
    }
  }
  uint8_t* dst = out + mine.offset * E;
  reduceToOwners(c, a, own, in, dst, [&](size_t off, size_t len) {
    for (int k = 1; k < n; ++k) reqs.push_back(c.send((me + k) % n, dst + off * E, len * E, 1));
  });
  c.waitAll(reqs);
}

bool reproducibleAcrossNodes(const CommView& comm, const Args& a) {
  if (a.type != DataType::Float32 && a.type != DataType::Float64) return false;  // halves: float32 between steps
  const int nodes = comm.nodeCount(), L = comm.localSize();
  if (nodes < 2 || L < 2 || (L & (L - 1)) != 0 || a.count < static_cast<size_t>(L) * kAcrossNodesMinElemsPerRank)
    return false;
  // Node k must hold ranks kL .. kL + L - 1: then the canonical tree's subtrees of L leaves are the
  // nodes (L a power of two), and reducing within nodes first is the tree's own order.
  for (int k = 0; k < nodes; ++k) {
    const std::vector<int>& on = comm.ranksOnNode(k);
    if (static_cast<int>(on.size()) != L) return false;
    for (int j = 0; j < L; ++j)
      if (on[static_cast<size_t>(j)] != k * L + j) return false;
  }
  return true;
}

void allReduceReproducibleAcrossNodes(Context& c, const Args& a) {
  const CommView& comm = c.comm();
  const int nodes = comm.nodeCount(), L = comm.localSize(), l = comm.localRank();
  const size_t E = a.elem;
  Args sum = a;
  if (a.op == ReduceOp::Avg) sum.op = ReduceOp::Sum;
  // 1. Within the node (channels 6 and 7 of the collective's tag): each local rank reduces its
  // slice of the node's inputs, the node's subtree of the canonical tree.
  Context local(c, comm.ranksOnNode(comm.nodeOf(comm.rank())), 6, 2);
  const auto own = planSegments(a.count, L);
  const Segment mine = own[static_cast<size_t>(l)];
  uint8_t* out = bytes(a.recv);
  uint8_t* dst = out + mine.offset * E;
  reduceToOwners(local, sum, own, cbytes(a.send), dst, [](size_t, size_t) {});
  // 2. Across nodes, the ranks of local index l (channels 0-5): the canonical tree over the nodes'
  // subtrees, which is the whole tree's top.
  if (mine.count > 0) {
    std::vector<int> column;
    for (int k = 0; k < nodes; ++k) column.push_back(k * L + l);
    Context across(c, column, 0, 6);
    Args slice = sum;
    slice.send = slice.recv = dst;
    slice.count = mine.count;
    if (gathersAll(across, mine.count * E)) {
      allReduceReproducibleDoubling(across, slice);
    } else {
      allReduceReproducible(across, slice);
    }
    if (a.op == ReduceOp::Avg) kernels::divide(dst, mine.count, a.type, c.size());
  }
  // 3. Within the node again: every slice to every local rank.
  std::vector<RequestPtr> reqs;
  for (int k = 1; k < L; ++k) {
    const int q = (l - k + L) % L;
    const Segment& s = own[static_cast<size_t>(q)];
    if (s.count > 0) reqs.push_back(local.recv(q, out + s.offset * E, s.count * E, 1));
  }
  if (mine.count > 0)
    for (int k = 1; k < L; ++k) reqs.push_back(local.send((l + k) % L, dst, mine.count * E, 1));
  local.waitAll(reqs);
}

void reduceScatterReproducible(Context& c, const Args& a) {
  const int n = c.size();
  if (a.count == 0) return;
  std::vector<Segment> own(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) own[static_cast<size_t>(q)] = Segment{static_cast<size_t>(q) * a.count, a.count};
  reduceToOwners(c, a, own, cbytes(a.send), bytes(a.recv), [](size_t, size_t) {});
}

void reduceReproducible(Context& c, const Args& a) {
  const int n = c.size(), me = c.rank();
  const size_t E = a.elem;
  if (a.count == 0) return;
  if (n == 1 || gathersAll(c, a.count * E)) return gatherAllAndReduce(c, a, a.root, a.recv);
  const auto own = planSegments(a.count, n);
  const Segment mine = own[static_cast<size_t>(me)];
  const size_t P = pieceElems(c, E);
  std::vector<RequestPtr> reqs;
  if (me == a.root) {
    size_t most = 0;
    for (const Segment& s : own) most = std::max(most, s.count);
    for (size_t off = 0; off < most; off += P) {
      for (int q = 0; q < n; ++q) {
        const Segment& s = own[static_cast<size_t>(q)];
        if (q != me && off < s.count)
          reqs.push_back(c.recv(q, bytes(a.recv) + (s.offset + off) * E, std::min(P, s.count - off) * E, 1));
      }
    }
  }
  // The root reduces its block into its output; the others into scratch, then to the root.
  uint8_t* dst = me == a.root ? bytes(a.recv) + mine.offset * E : c.scratch(mine.count * E, 1);
  reduceToOwners(c, a, own, cbytes(a.send), dst, [&](size_t off, size_t len) {
    if (me != a.root) reqs.push_back(c.send(a.root, dst + off * E, len * E, 1));
  });
  c.waitAll(reqs);
}

}  // namespace coll
}  // namespace loom
