// Double-binary-tree all-reduce, in the way NCCL builds it: two complementary trees
// (planDoubleTree), each reducing then broadcasting one half of the buffer in chunks of
// LOOM_TREE_CHUNK_BYTES, so that the leaves of one tree do the interior work of the other and the
// tree's depth, not the world size, sets the number of latency steps. Each tree's messages go on
// their own channel (tag): a pair of ranks linked in both trees never confuses the two.
#include <algorithm>

#include "collectives/context.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {
namespace {

constexpr size_t kTreeChunksPerHalf = 16;
constexpr size_t kTreeChunkMaxBytes = 1u << 20;

}  // namespace

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
  // Chunks of LOOM_TREE_CHUNK_BYTES, or larger for large halves: about kTreeChunksPerHalf of them
  // keep the pipeline full at any depth, and more only add messages.
  const size_t chunk =
      std::max(c.treeChunkElems(E),
               std::min((halves[0].count + kTreeChunksPerHalf - 1) / kTreeChunksPerHalf, kTreeChunkMaxBytes / E));
  std::vector<Segment> chunks[2] = {planChunks(halves[0], chunk), planChunks(halves[1], chunk)};
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
          fromChild[t][k].push_back(c.recv(node[t].children[k], stagingAt(t, k, ch), ch.count * E, t));
      if (node[t].parent >= 0) fromParent[t].push_back(c.recv(node[t].parent, out + ch.offset * E, ch.count * E, t));
    }
  auto down = [&](int t, const Segment& ch) {
    for (int k = 0; k < 2; ++k)
      if (node[t].children[k] >= 0) sends.push_back(c.send(node[t].children[k], out + ch.offset * E, ch.count * E, t));
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
        sends.push_back(c.send(node[t].parent, out + ch.offset * E, ch.count * E, t));
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

}  // namespace coll
}  // namespace loom
