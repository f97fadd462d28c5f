// Node-aware collectives: the slow links between nodes carry each byte once per node, not once
// per rank. Each runs in three steps over group views of the collective (Context's members):
//   all-reduce: with nodes of equal size and enough data, the "2D" form: reduce-scatter within
//               each node, all-reduce of each slice across nodes by the ranks holding it (all at
//               once), all-gather within each node; otherwise reduce within each node to its
//               leader (shared memory), all-reduce between the leaders (the network), broadcast
//               within each node from its leader;
//   broadcast:  broadcast between the leaders from the root, then within each node;
//   reduce:     reduce within each node to its leader, then between the leaders to the root.
// A node's leader is the root if the root is on it, else its lowest rank (planHierarchy). Each
// step picks its own algorithm for its group and links; the steps use separate channels of the
// collective's tag. avg is a sum until the end, then one division by the world size, so that
// every rank holds the same bits.
#include "collectives/context.hpp"
#include "collectives/select.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {
namespace {

// Channels of the collective's tag: the leaders' step may use 0-5 (ring channels), the steps
// within nodes 6 and 7.
constexpr int kInterChannels = 6;
constexpr int kIntraUp = 6;
constexpr int kIntraDown = 7;
// The 2D form needs every local rank to own a real slice: below this many elements per rank, the
// leaders' form (fewer messages) runs.
constexpr size_t k2DMinElemsPerRank = 16384;

Hierarchy hierarchyOf(const Context& c, int root) {
  const auto& comm = c.comm();
  std::vector<std::vector<int>> nodes;
  for (int k = 0; k < comm.nodeCount(); ++k) nodes.push_back(comm.ranksOnNode(k));
  return planHierarchy(nodes, c.rank(), root);
}

// The flat row for a step within a node (the shared-memory model) or across nodes (the model of
// the links between them).
const AlgoRow& flatRow(const Context& c, Coll k, size_t bytes, int n, bool withinNode) {
  if (const Selector* sel = c.comm().selector())
    return withinNode ? sel->pickIntra(k, bytes, n) : sel->pickInter(k, bytes, n);
  const CostModel m = costModelFor(withinNode ? c.comm().nodeLink() : c.comm().slowestLink());
  return chooseRow(Call::flat(k, bytes, n, m), Mode::Default);
}

// Runs the step `k` on group `g` with its flat row (a copy where the group is one rank).
void runStep(Context& g, const Args& a, Coll k, bool withinNode) {
  if (g.size() == 1) return copyIfDistinct(a.recv, a.send, a.count * a.elem);
  flatRow(g, k, a.count * a.elem, g.size(), withinNode).run(g, a);
}

// The "2D" all-reduce, when every node has the same number of ranks L >= 2: the ranks of each node
// reduce-scatter the buffer among themselves (a ring over shared memory), so that each holds 1/L
// of it summed over its node; the ranks with the same local index on every node then all-reduce
// their slice across nodes, L such all-reduces at once, each over its own network links; and the
// node all-gathers the slices. Every rank of a node works the network, not only a leader, and each
// link carries 2(N-1)/N of the data per node, as the leaders' all-reduce would.
bool allReduce2D(Context& c, const Args& a) {
  const auto& comm = c.comm();
  const int nodes = comm.nodeCount(), L = comm.localSize();
  for (int k = 0; k < nodes; ++k)
    if (static_cast<int>(comm.ranksOnNode(k).size()) != L) return false;
  if (nodes < 2 || L < 2 || a.count < static_cast<size_t>(L) * k2DMinElemsPerRank) return false;
  const int l = comm.localRank();
  std::vector<int> column;  // the ranks of local index l, one per node
  for (int k = 0; k < nodes; ++k) column.push_back(comm.ranksOnNode(k)[static_cast<size_t>(l)]);
  Args sum = a;
  if (a.op == ReduceOp::Avg) sum.op = ReduceOp::Sum;
  Context local(c, comm.ranksOnNode(comm.nodeOf(comm.rank())), kIntraUp, 1);
  uint8_t* out = bytes(a.recv);
  allReduceRingAround(local, sum, [&](const std::vector<Segment>& owned) {
    Context across(c, column, 0, kInterChannels);
    for (const Segment& s : owned) {
      if (s.count == 0) continue;
      Args slice = sum;
      slice.send = slice.recv = out + s.offset * a.elem;
      slice.count = s.count;
      runStep(across, slice, Coll::AllReduce, false);
      if (a.op == ReduceOp::Avg) kernels::divide(slice.recv, s.count, a.type, c.size());
    }
  });
  return true;
}

}  // namespace

void allReduceAcrossNodes(Context& c, const std::vector<int>& members, const Args& a) {
  Context across(c, members, 0, kInterChannels);
  runStep(across, a, Coll::AllReduce, false);
}

void broadcastAcrossNodes(Context& c, const std::vector<int>& members, const Args& a) {
  Context across(c, members, 0, kInterChannels);
  runStep(across, a, Coll::Broadcast, false);
}

void allGatherAcrossNodes(Context& c, const std::vector<int>& members, const Args& a) {
  Context across(c, members, 0, kInterChannels);
  if (across.size() == 1) return copyIfDistinct(a.recv, a.send, a.count * a.elem);
  allGatherRing(across, a);
}

void reduceScatterAcrossNodes(Context& c, const std::vector<int>& members, const Args& a) {
  Context across(c, members, 0, kInterChannels);
  reduceScatterRing(across, a);
}

void reduceAcrossNodes(Context& c, const std::vector<int>& members, const Args& a) {
  Context across(c, members, 0, kInterChannels);
  runStep(across, a, Coll::Reduce, false);
}

void allReduceHierarchical(Context& c, const Args& a) {
  if (allReduce2D(c, a)) return;
  const Hierarchy h = hierarchyOf(c, 0);
  Args sum = a;
  if (a.op == ReduceOp::Avg) sum.op = ReduceOp::Sum;
  // 1. Within the node, to the leader: its receive buffer holds the node's sum.
  Context local(c, h.local, kIntraUp, 1);
  Args up = sum;
  up.root = h.localRoot;
  runStep(local, up, Coll::Reduce, true);
  // 2. Between the leaders, in place.
  if (h.leaderIndex >= 0) {
    Context leaders(c, h.leaders, 0, kInterChannels);
    Args across = sum;
    across.send = a.recv;
    runStep(leaders, across, Coll::AllReduce, false);
    if (a.op == ReduceOp::Avg) kernels::divide(a.recv, a.count, a.type, c.size());
  }
  // 3. Within the node, from the leader, in place.
  Args down = a;
  down.send = a.recv;
  down.root = h.localRoot;
  Context localDown(c, h.local, kIntraDown, 1);
  runStep(localDown, down, Coll::Broadcast, true);
}

void broadcastHierarchical(Context& c, const Args& a) {
  const Hierarchy h = hierarchyOf(c, a.root);
  // 1. Between the leaders, from the root (the leader of its node).
  if (h.leaderIndex >= 0) {
    Context leaders(c, h.leaders, 0, kInterChannels);
    Args across = a;
    across.root = h.leaderRoot;
    if (c.rank() != a.root) across.send = a.recv;
    runStep(leaders, across, Coll::Broadcast, false);
  }
  // 2. Within the node, from its leader, in place (the root's own copy is done in step 1).
  Context local(c, h.local, kIntraDown, 1);
  Args down = a;
  down.send = a.recv;
  down.root = h.localRoot;
  runStep(local, down, Coll::Broadcast, true);
}

void reduceHierarchical(Context& c, const Args& a) {
  const Hierarchy h = hierarchyOf(c, a.root);
  const size_t nbytes = a.count * a.elem;
  Args sum = a;
  if (a.op == ReduceOp::Avg) sum.op = ReduceOp::Sum;
  // Partial sums of non-leaders' nodes need somewhere to land: the leader's receive buffer is
  // only the user's on the root; elsewhere a scratch buffer.
  uint8_t* partial = c.rank() == a.root ? bytes(a.recv) : c.scratch(nbytes, 2);
  // 1. Within the node, to the leader.
  Context local(c, h.local, kIntraUp, 1);
  Args up = sum;
  up.recv = partial;
  up.root = h.localRoot;
  runStep(local, up, Coll::Reduce, true);
  // 2. Between the leaders, to the root.
  if (h.leaderIndex >= 0) {
    Context leaders(c, h.leaders, 0, kInterChannels);
    Args across = sum;
    across.send = partial;
    across.recv = partial;
    across.root = h.leaderRoot;
    runStep(leaders, across, Coll::Reduce, false);
    if (c.rank() == a.root && a.op == ReduceOp::Avg) kernels::divide(a.recv, a.count, a.type, c.size());
  }
}

}  // namespace coll
}  // namespace loom
