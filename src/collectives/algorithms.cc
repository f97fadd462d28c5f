// The collective algorithms, as numbered steps over Context. Index arithmetic comes from plan.hpp.
// Results are bitwise identical on every rank: each element is reduced along one fixed order (the
// ring, or rank order in recursive doubling) and then copied, never reduced twice differently.
#include <cstring>

#include "collectives/context.hpp"
#include "core/format.hpp"
#include "core/param.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {
namespace {

LOOM_PARAM_INT(chunkBytesParam, "LOOM_CHUNK_BYTES", 512 * 1024,
               "bytes per pipelined chunk of ring and chain algorithms");

const uint8_t* cbytes(const void* p) { return static_cast<const uint8_t*>(p); }
uint8_t* bytes(void* p) { return static_cast<uint8_t*>(p); }

void copyIfDistinct(void* dst, const void* src, size_t n) {
  if (dst != src && n > 0) std::memcpy(dst, src, n);
}

// Ring reduce-scatter over `segs`: `in` is this rank's input, `work` receives the partial sums of
// each segment this rank reduces (work may equal in). The owned segment ends fully reduced in
// `work`, or in `finalOut` when given. Chunks are pipelined: a chunk is forwarded as soon as it
// is reduced, and the receives of the next step are posted one step ahead into a second buffer.
void ringReduceScatter(Context& c, const Args& a, const std::vector<Segment>& segs, const uint8_t* in, uint8_t* work,
                       int shift, uint8_t* finalOut) {
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t E = a.elem, chunk = c.chunkElems(E);
  size_t maxSeg = 0;
  for (const auto& s : segs) maxSeg = std::max(maxSeg, s.count);
  uint8_t* staging[2] = {c.scratch(maxSeg * E, 0), c.scratch(maxSeg * E, 1)};
  std::vector<RequestPtr> sends;
  std::vector<RequestPtr> recvs[2];

  auto postRecvs = [&](int step) {
    const Segment& seg = segs[static_cast<size_t>(ringRecvSegment(r, n, step, shift))];
    auto& q = recvs[step % 2];
    for (const auto& ch : planChunks(seg, chunk))
      q.push_back(c.recv(prev, staging[step % 2] + (ch.offset - seg.offset) * E, ch.count * E));
  };
  // 1. Step 0 sends this rank's own input for its first segment.
  for (const auto& ch : planChunks(segs[static_cast<size_t>(ringSendSegment(r, n, 0, shift))], chunk))
    sends.push_back(c.send(next, in + ch.offset * E, ch.count * E));
  postRecvs(0);
  for (int step = 0; step < n - 1; ++step) {
    // 2. Post the next step's receives before reducing this one.
    if (step + 1 < n - 1) postRecvs(step + 1);
    const Segment& seg = segs[static_cast<size_t>(ringRecvSegment(r, n, step, shift))];
    const bool last = step == n - 2;
    auto chunks = planChunks(seg, chunk);
    for (size_t k = 0; k < chunks.size(); ++k) {
      // 3. Reduce each chunk as it lands, then forward it at once.
      c.wait(recvs[step % 2][k]);
      const Segment& ch = chunks[k];
      uint8_t* dst = (last && finalOut != nullptr) ? finalOut + (ch.offset - seg.offset) * E : work + ch.offset * E;
      kernels::reduce(dst, in + ch.offset * E, staging[step % 2] + (ch.offset - seg.offset) * E, ch.count, a.type,
                      a.op);
      if (!last) sends.push_back(c.send(next, dst, ch.count * E));
    }
    recvs[step % 2].clear();
  }
  c.waitAll(sends);
}

// Ring all-gather of `segs` in `buf`, after a reduce-scatter with the same shift (the owned
// segment is in place). Every receive lands in its final place; chunks are forwarded as they come.
void ringAllGather(Context& c, const std::vector<Segment>& segs, uint8_t* buf, size_t E, int shift) {
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t chunk = c.chunkElems(E);
  std::vector<std::vector<RequestPtr>> recvs(static_cast<size_t>(n));
  std::vector<RequestPtr> sends;
  for (int step = 0; step < n - 1; ++step)
    for (const auto& ch : planChunks(segs[static_cast<size_t>(ringGatherRecv(r, n, step, shift))], chunk))
      recvs[static_cast<size_t>(step)].push_back(c.recv(prev, buf + ch.offset * E, ch.count * E));
  for (const auto& ch : planChunks(segs[static_cast<size_t>(ringGatherSend(r, n, 0, shift))], chunk))
    sends.push_back(c.send(next, buf + ch.offset * E, ch.count * E));
  for (int step = 0; step < n - 1; ++step) {
    auto chunks = planChunks(segs[static_cast<size_t>(ringGatherRecv(r, n, step, shift))], chunk);
    for (size_t k = 0; k < chunks.size(); ++k) {
      c.wait(recvs[static_cast<size_t>(step)][k]);
      if (step + 1 < n - 1) sends.push_back(c.send(next, buf + chunks[k].offset * E, chunks[k].count * E));
    }
  }
  c.waitAll(sends);
}

}  // namespace

RequestPtr Context::send(int peer, const void* p, size_t bytes) {
  return comm_.postSend(
      peer, p, bytes, tag_,
      strFormat("%s #%lld (%s): send of %zu B to rank %d", name_, static_cast<long long>(seq_), algo_, bytes, peer));
}

RequestPtr Context::recv(int peer, void* p, size_t bytes) {
  auto r = comm_.postRecv(peer, p, bytes, tag_,
                          strFormat("%s #%lld (%s): receive of %zu B from rank %d", name_, static_cast<long long>(seq_),
                                    algo_, bytes, peer));
  r->expectBytes = bytes;
  return r;
}

void Context::wait(const RequestPtr& r) {
  try {
    r->wait();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::InvalidUsage) throw;
    // A message larger than the algorithm's receive: the ranks disagree about this collective.
    Status s = Status::error(ErrorCode::InvalidUsage,
                             strFormat("%s #%lld (%s): %s; the ranks called this collective with different counts "
                                       "or datatypes",
                                       name_, static_cast<long long>(seq_), algo_, e.message().c_str()),
                             e.peer(), seq_);
    comm_.failureState()->fail(s);
    throw s.toError(rank());
  }
  if (r->expectBytes != SIZE_MAX && r->bytes() != r->expectBytes) {
    Status s = Status::error(
        ErrorCode::InvalidUsage,
        strFormat("%s #%lld: rank %d sent %zu bytes where this rank expected %zu: the ranks called this collective "
                  "with different counts or datatypes",
                  name_, static_cast<long long>(seq_), r->peer(), r->bytes(), r->expectBytes),
        r->peer(), seq_);
    comm_.failureState()->fail(s);
    throw s.toError(rank());
  }
}

size_t Context::chunkElems(size_t elem) const {
  static const int64_t bytesPerChunk = std::max<int64_t>(4096, chunkBytesParam());
  return std::max<size_t>(1, static_cast<size_t>(bytesPerChunk) / elem);
}

void allReduceRing(Context& c, const Args& a) {
  const int n = c.size();
  const size_t E = a.elem;
  uint8_t* out = bytes(a.recv);
  if (n == 1) {
    copyIfDistinct(out, a.send, a.count * E);
  } else {
    auto segs = planSegments(a.count, n);
    // 1. Reduce-scatter: this rank ends with segment rank+1 fully reduced in `out`.
    ringReduceScatter(c, a, segs, cbytes(a.send), out, 0, nullptr);
    // 2. Avg: scale the owned segment once, before anyone copies it.
    const Segment& own = segs[static_cast<size_t>(ringOwnedSegment(c.rank(), n, 0))];
    if (a.op == ReduceOp::Avg) kernels::divide(out + own.offset * E, own.count, a.type, n);
    // 3. All-gather the reduced segments.
    ringAllGather(c, segs, out, E, 0);
    return;
  }
  if (a.op == ReduceOp::Avg) kernels::divide(out, a.count, a.type, n);
}

void allReduceRecursiveDoubling(Context& c, const Args& a) {
  const int r = c.rank();
  const size_t bytesTotal = a.count * a.elem;
  uint8_t* out = bytes(a.recv);
  copyIfDistinct(out, a.send, bytesTotal);
  uint8_t* tmp = c.scratch(bytesTotal, 0);
  DoublingPlan plan = planRecursiveDoubling(r, c.size());
  // Operands go in rank order (lower rank's data first) so that both partners compute the same bits.
  auto combine = [&](int partner) {
    if (partner < r)
      kernels::reduce(out, tmp, out, a.count, a.type, a.op);
    else
      kernels::reduce(out, out, tmp, a.count, a.type, a.op);
  };
  if (plan.foldTo >= 0) {
    // 1'. Sit out: hand the data to the odd neighbour, take the result back at the end.
    c.wait(c.send(plan.foldTo, out, bytesTotal));
    c.wait(c.recv(plan.foldTo, out, bytesTotal));
    return;
  }
  if (plan.foldFrom >= 0) {
    // 1. Take the even neighbour's data.
    c.wait(c.recv(plan.foldFrom, tmp, bytesTotal));
    combine(plan.foldFrom);
  }
  // 2. Exchange with a partner at distance 1, 2, 4, ...
  for (int partner : plan.partners) {
    auto rq = c.recv(partner, tmp, bytesTotal);
    auto sq = c.send(partner, out, bytesTotal);
    c.wait(sq);
    c.wait(rq);
    combine(partner);
  }
  if (a.op == ReduceOp::Avg) kernels::divide(out, a.count, a.type, c.size());
  // 3. Hand the result back to the neighbour that sat out.
  if (plan.foldFrom >= 0) c.wait(c.send(plan.foldFrom, out, bytesTotal));
}

void allReduceDoubleTree(Context& c, const Args& a) {
  // Two trees, each reducing then broadcasting one half of the buffer, in pipelined chunks:
  // 1. every node adds its children's chunks to its own and passes the sum up;
  // 2. each root scales (avg) and sends the finished chunk down; every node forwards it down.
  const int n = c.size(), r = c.rank();
  const size_t E = a.elem;
  uint8_t* out = bytes(a.recv);
  copyIfDistinct(out, a.send, a.count * E);
  if (n == 1) {
    if (a.op == ReduceOp::Avg) kernels::divide(out, a.count, a.type, 1);
    return;
  }
  const auto halves = planSegments(a.count, 2);
  BinaryNode node[2] = {planDoubleTree(r, n, 0), planDoubleTree(r, n, 1)};
  std::vector<Segment> chunks[2] = {planChunks(halves[0], c.chunkElems(E)), planChunks(halves[1], c.chunkElems(E))};
  const size_t nChunks = std::max(chunks[0].size(), chunks[1].size());
  // Staging for the children's partial sums: one region per tree and child, as large as a half.
  uint8_t* staging = c.scratch(2 * 2 * std::max(halves[0].count, halves[1].count) * E, 0);
  auto stagingAt = [&](int t, int k, const Segment& ch) {
    const Segment& h = halves[static_cast<size_t>(t)];
    return staging +
           ((static_cast<size_t>(t) * 2 + static_cast<size_t>(k)) * std::max(halves[0].count, halves[1].count) +
            (ch.offset - h.offset)) *
               E;
  };
  std::vector<RequestPtr> fromChild[2][2], fromParent[2], sends;
  for (int t = 0; t < 2; ++t)
    for (const auto& ch : chunks[t]) {
      for (int k = 0; k < 2; ++k)
        if (node[t].children[k] >= 0)
          fromChild[t][k].push_back(c.recv(node[t].children[k], stagingAt(t, k, ch), ch.count * E));
      if (node[t].parent >= 0) fromParent[t].push_back(c.recv(node[t].parent, out + ch.offset * E, ch.count * E));
    }
  auto down = [&](int t, const Segment& ch) {
    for (int k = 0; k < 2; ++k)
      if (node[t].children[k] >= 0) sends.push_back(c.send(node[t].children[k], out + ch.offset * E, ch.count * E));
  };
  size_t forwarded[2] = {0, 0};
  auto forwardArrived = [&](bool block) {
    for (int t = 0; t < 2; ++t) {
      if (node[t].parent < 0) continue;
      while (forwarded[t] < chunks[t].size() && (block || fromParent[t][forwarded[t]]->done())) {
        c.wait(fromParent[t][forwarded[t]]);
        down(t, chunks[t][forwarded[t]]);
        ++forwarded[t];
      }
    }
  };
  for (size_t i = 0; i < nChunks; ++i) {
    for (int t = 0; t < 2; ++t) {
      if (i >= chunks[t].size()) continue;
      const Segment& ch = chunks[t][i];
      for (int k = 0; k < 2; ++k) {
        if (node[t].children[k] < 0) continue;
        c.wait(fromChild[t][k][i]);
        kernels::reduce(out + ch.offset * E, out + ch.offset * E, stagingAt(t, k, ch), ch.count, a.type, a.op);
      }
      if (node[t].parent >= 0) {
        sends.push_back(c.send(node[t].parent, out + ch.offset * E, ch.count * E));
      } else {
        if (a.op == ReduceOp::Avg) kernels::divide(out + ch.offset * E, ch.count, a.type, n);
        down(t, ch);
      }
    }
    forwardArrived(false);  // keep the broadcast flowing while reducing later chunks
  }
  forwardArrived(true);
  c.waitAll(sends);
}

void broadcastBinomial(Context& c, const Args& a) {
  // Down a binomial tree in chunks: a node forwards each chunk to its children as soon as it has
  // it, so the tree's levels work on different chunks at once.
  const size_t E = a.elem;
  uint8_t* buf = bytes(a.recv);
  if (c.rank() == a.root) copyIfDistinct(buf, a.send, a.count * E);
  TreeNode node = planBinomialTree(c.rank(), c.size(), a.root);
  auto chunks = planChunks(Segment{0, a.count}, c.chunkElems(E));
  std::vector<RequestPtr> recvs, sends;
  if (node.parent >= 0)
    for (const auto& ch : chunks) recvs.push_back(c.recv(node.parent, buf + ch.offset * E, ch.count * E));
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (node.parent >= 0) c.wait(recvs[k]);
    for (int child : node.children) sends.push_back(c.send(child, buf + chunks[k].offset * E, chunks[k].count * E));
  }
  c.waitAll(sends);
}

void broadcastChain(Context& c, const Args& a) {
  // root -> root+1 -> ... -> root-1, in chunks: every rank forwards a chunk as soon as it has it.
  const int n = c.size(), r = c.rank();
  const size_t E = a.elem;
  uint8_t* buf = bytes(a.recv);
  const int pos = (r - a.root + n) % n;
  const int next = pos + 1 < n ? (r + 1) % n : -1;
  const int prev = pos > 0 ? (r + n - 1) % n : -1;
  auto chunks = planChunks(Segment{0, a.count}, c.chunkElems(E));
  std::vector<RequestPtr> recvs, sends;
  if (prev < 0) {
    copyIfDistinct(buf, a.send, a.count * E);
  } else {
    for (const auto& ch : chunks) recvs.push_back(c.recv(prev, buf + ch.offset * E, ch.count * E));
  }
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (prev >= 0) c.wait(recvs[k]);
    if (next >= 0) sends.push_back(c.send(next, buf + chunks[k].offset * E, chunks[k].count * E));
  }
  c.waitAll(sends);
}

void reduceBinomial(Context& c, const Args& a) {
  // Up a binomial tree in chunks: a node adds its children's chunk to its own and passes the sum
  // up at once, so the tree's levels work on different chunks at once.
  const int r = c.rank();
  const size_t E = a.elem, total = a.count * E;
  TreeNode node = planBinomialTree(r, c.size(), a.root);
  uint8_t* acc = r == a.root ? bytes(a.recv) : c.scratch(total, 0);
  copyIfDistinct(acc, a.send, total);
  auto chunks = planChunks(Segment{0, a.count}, c.chunkElems(E));
  const size_t kids = node.children.size();
  uint8_t* staging = c.scratch(std::max<size_t>(1, kids) * total, 1);
  // Receives for every child and chunk, posted up front into a region per child.
  std::vector<std::vector<RequestPtr>> fromChild(kids);
  for (size_t k = 0; k < kids; ++k)
    for (const auto& ch : chunks)
      fromChild[k].push_back(c.recv(node.children[k], staging + k * total + ch.offset * E, ch.count * E));
  std::vector<RequestPtr> sends;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Segment& ch = chunks[i];
    // Nearest child last: the order is fixed, so the root's result does not depend on timing.
    for (size_t k = 0; k < kids; ++k) {
      c.wait(fromChild[k][i]);
      kernels::reduce(acc + ch.offset * E, acc + ch.offset * E, staging + k * total + ch.offset * E, ch.count, a.type,
                      a.op);
    }
    if (node.parent >= 0) {
      sends.push_back(c.send(node.parent, acc + ch.offset * E, ch.count * E));
    } else if (a.op == ReduceOp::Avg) {
      kernels::divide(acc + ch.offset * E, ch.count, a.type, c.size());
    }
  }
  c.waitAll(sends);
}

void reduceRing(Context& c, const Args& a) {
  // 1. Ring reduce-scatter into scratch; 2. every rank sends its reduced segment to the root.
  const int n = c.size(), r = c.rank();
  const size_t E = a.elem;
  if (n == 1) {
    copyIfDistinct(a.recv, a.send, a.count * E);
    return;
  }
  auto segs = planSegments(a.count, n);
  uint8_t* work = c.scratch(a.count * E, 2);
  ringReduceScatter(c, a, segs, cbytes(a.send), work, 0, nullptr);
  const Segment& own = segs[static_cast<size_t>(ringOwnedSegment(r, n, 0))];
  if (a.op == ReduceOp::Avg) kernels::divide(work + own.offset * E, own.count, a.type, n);
  if (r != a.root) {
    c.wait(c.send(a.root, work + own.offset * E, own.count * E));
    return;
  }
  uint8_t* out = bytes(a.recv);
  std::vector<RequestPtr> recvs;
  for (int p = 0; p < n; ++p) {
    const Segment& s = segs[static_cast<size_t>(ringOwnedSegment(p, n, 0))];
    if (p == r)
      std::memcpy(out + s.offset * E, work + s.offset * E, s.count * E);
    else
      recvs.push_back(c.recv(p, out + s.offset * E, s.count * E));
  }
  c.waitAll(recvs);
}

void allGatherRing(Context& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t E = a.elem;
  uint8_t* out = bytes(a.recv);
  copyIfDistinct(out + static_cast<size_t>(r) * a.count * E, a.send, a.count * E);
  if (n == 1) return;
  std::vector<Segment> segs;
  for (int p = 0; p < n; ++p) segs.push_back({static_cast<size_t>(p) * a.count, a.count});
  // Shift -1: rank r starts by sending its own block r.
  ringAllGather(c, segs, out, E, n - 1);
}

void reduceScatterRing(Context& c, const Args& a) {
  const int n = c.size();
  const size_t E = a.elem;
  if (n == 1) {
    copyIfDistinct(a.recv, a.send, a.count * E);
    if (a.op == ReduceOp::Avg) kernels::divide(a.recv, a.count, a.type, 1);
    return;
  }
  std::vector<Segment> segs;
  for (int p = 0; p < n; ++p) segs.push_back({static_cast<size_t>(p) * a.count, a.count});
  uint8_t* work = c.scratch(static_cast<size_t>(n) * a.count * E, 2);
  // Shift n-1: rank r ends owning block r, reduced straight into recv.
  ringReduceScatter(c, a, segs, cbytes(a.send), work, n - 1, bytes(a.recv));
  if (a.op == ReduceOp::Avg) kernels::divide(a.recv, a.count, a.type, n);
}

void allToAllPairwise(Context& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t block = a.count * a.elem;
  const uint8_t* in = cbytes(a.send);
  if (a.send == a.recv) {  // in place: keep a copy of what is to be sent
    uint8_t* copy = c.scratch(block * static_cast<size_t>(n), 0);
    std::memcpy(copy, in, block * static_cast<size_t>(n));
    in = copy;
  }
  uint8_t* out = bytes(a.recv);
  std::vector<RequestPtr> reqs;
  // Each pair exchanges one block; receives first, then sends, each in a rotated order so that
  // not every rank starts with rank 0.
  for (int k = 1; k < n; ++k) {
    int from = (r - k + n) % n;
    reqs.push_back(c.recv(from, out + static_cast<size_t>(from) * block, block));
  }
  for (int k = 1; k < n; ++k) {
    int to = (r + k) % n;
    reqs.push_back(c.send(to, in + static_cast<size_t>(to) * block, block));
  }
  std::memmove(out + static_cast<size_t>(r) * block, in + static_cast<size_t>(r) * block, block);
  c.waitAll(reqs);
}

}  // namespace coll
}  // namespace loom
