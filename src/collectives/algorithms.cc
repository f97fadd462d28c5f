#include "collectives/algorithms.hpp"

#include <cstring>

#include "collectives/context.hpp"
#include "core/format.hpp"
#include "core/status.hpp"

namespace loom {
namespace coll {
namespace {

void allToAll(Context& c, const Args& a) { a.counts ? allToAllvPairwise(c, a) : allToAllPairwise(c, a); }

void barrierOnArena(Context& c, const Args&) { barrierDirect(c); }

void allReduceDirectCanonical(Context& c, const Args& a) {
  Args b = a;
  b.canonical = true;
  allReduceDirect(c, b);
}

using C = Coll;
using A = Algo;
constexpr Mode D = Mode::Default;
constexpr Mode R = Mode::Reproducible;
constexpr Needs Any = Needs::Links;
constexpr Needs Arena = Needs::OneNodeArena;
constexpr Needs Nodes = Needs::SeveralNodes;

const std::vector<AlgoRow> kTable = {
    // ---- all-reduce ----
    {C::AllReduce, A::Ring, D, "ring", "", Any, ringUs, allReduceRing,
     "reduce-scatter then all-gather around parallel rings, pipelined in chunks: the bandwidth bound"},
    {C::AllReduce, A::RecursiveDoubling, D, "rd", "recursive_doubling", Any, recursiveDoublingUs,
     allReduceRecursiveDoubling, "log2(n) exchanges of the whole buffer: the fewest steps, for small buffers"},
    {C::AllReduce, A::HalvingDoubling, D, "hd", "halving_doubling", Any, halvingDoublingUs, allReduceHalvingDoubling,
     "recursive halving then doubling (Rabenseifner): the ring's bytes in 2 log2(n) steps; from 4 ranks"},
    {C::AllReduce, A::DoubleTree, D, "dbtree", "double_tree", Any, doubleTreeUs, allReduceDoubleTree,
     "two complementary binary trees, each reducing and broadcasting half, pipelined"},
    {C::AllReduce, A::Hierarchical, D, "hier", "hierarchical", Nodes, hierarchicalUs, allReduceHierarchical,
     "node-aware: within nodes over shared memory, across them once per node (2D with even nodes)"},
    {C::AllReduce, A::Direct, D, "direct", "", Arena, directAllReduceUs, allReduceDirect,
     "one node: each rank reduces its slice reading the peers' staged data in place"},
    // ---- broadcast ----
    {C::Broadcast, A::Chain, D, "chain", "", Any, chainUs, broadcastChain,
     "root -> root+1 -> ... pipelined in chunks: every link carries the data once"},
    {C::Broadcast, A::Binomial, D, "tree", "binomial", Any, binomialUs, broadcastBinomial,
     "a binomial tree pipelined in chunks: log2(n) steps"},
    {C::Broadcast, A::Hierarchical, D, "hier", "hierarchical", Nodes, hierarchicalUs, broadcastHierarchical,
     "node-aware: across nodes between one rank per node, then within each node"},
    {C::Broadcast, A::Direct, D, "direct", "", Arena, directSpreadUs, broadcastDirect,
     "one node: the root stages chunks in its shared area, the others copy them out"},
    // ---- reduce ----
    {C::Reduce, A::Ring, D, "ring", "", Any, ringUs, reduceRing,
     "a ring reduce-scatter, then the blocks gathered at the root"},
    {C::Reduce, A::Binomial, D, "tree", "binomial", Any, binomialUs, reduceBinomial,
     "a binomial tree pipelined in chunks: log2(n) steps"},
    {C::Reduce, A::Hierarchical, D, "hier", "hierarchical", Nodes, hierarchicalUs, reduceHierarchical,
     "node-aware: within each node to one rank, then across nodes to the root"},
    // ---- all-gather ----
    {C::AllGather, A::Ring, D, "ring", "", Any, ringUs, allGatherRing, "around parallel rings, pipelined"},
    {C::AllGather, A::RecursiveDoubling, D, "rd", "recursive_doubling,bruck", Any, bruckUs, allGatherBruck,
     "Bruck's: ceil(log2 n) messages for any n, then one rotation: for small blocks"},
    {C::AllGather, A::Direct, D, "direct", "", Arena, directSpreadUs, allGatherDirect,
     "one node: every rank stages its block in its shared area, the others copy it out"},
    {C::AllGather, A::Pairwise, D, "pairwise", "", Any, pairwiseOnOneNodeUs, allGatherPairwise,
     "every rank sends its block to every other at once; on one node each is read in one copy"},
    // ---- reduce-scatter, all-to-all ----
    {C::ReduceScatter, A::Ring, D, "ring", "", Any, ringUs, reduceScatterRing, "around parallel rings, pipelined"},
    {C::AllToAll, A::Pairwise, D, "pairwise", "", Any, pairwiseUs, allToAll,
     "every pair exchanges its blocks directly (counts per peer too)"},
    // ---- gather, scatter ----
    {C::Gather, A::Linear, D, "linear", "", Any, linearUs, gatherLinear,
     "every rank sends its block to the root, all at once: the root links only its peers"},
    {C::Scatter, A::Linear, D, "linear", "", Any, linearUs, scatterLinear,
     "the root sends each rank its block, all at once: the root links only its peers"},
    // ---- barrier ----
    {C::Barrier, A::Dissemination, D, "dissemination", "", Any, disseminationUs, barrierDissemination,
     "ceil(log2 n) rounds, each rank telling the rank 2^k ahead: any number of ranks"},
    {C::Barrier, A::Direct, D, "direct", "", Arena, directBarrierUs, barrierOnArena,
     "one node: a step on the shared arena's counters, with the same-call check; links no one"},
    // ---- reproducible mode's float reductions (docs/reproducibility.md) ----
    {C::AllReduce, A::CanonicalDirect, R, "direct", "", Arena, canonicalDirectUs, allReduceDirectCanonical,
     "the direct all-reduce reducing along the canonical tree, where the default mode reads in place"},
    {C::AllReduce, A::CanonicalAcrossNodes, R, "canonical-hier", "", Needs::CanonicalNodes, canonicalUs,
     allReduceReproducibleAcrossNodes, "canonical within nodes, then across them (nodes as the tree's subtrees)"},
    {C::AllReduce, A::CanonicalDoubling, R, "canonical-rd", "", Any, canonicalDoublingUs, allReduceReproducibleDoubling,
     "a recursive doubling combining along the canonical tree: small buffers"},
    {C::AllReduce, A::Canonical, R, "canonical", "", Any, canonicalUs, allReduceReproducible,
     "each element reduced by one rank from every input along the canonical tree, then gathered"},
    {C::Reduce, A::Canonical, R, "canonical", "", Any, canonicalUs, reduceReproducible,
     "each element reduced along the canonical tree, gathered at the root"},
    {C::ReduceScatter, A::Canonical, R, "canonical", "", Any, canonicalUs, reduceScatterReproducible,
     "each element reduced along the canonical tree by the rank that keeps it"},
};

bool named(const AlgoRow& row, const std::string& name) {
  if (name == row.name) return true;
  const char* p = row.aliases;
  const size_t n = name.size();
  while (*p != '\0') {
    const char* end = std::strchr(p, ',');
    const size_t len = end == nullptr ? std::strlen(p) : static_cast<size_t>(end - p);
    if (len == n && name.compare(0, n, p, len) == 0) return true;
    if (end == nullptr) break;
    p = end + 1;
  }
  return false;
}

}  // namespace

const char* collName(Coll c) {
  static const char* const kNames[kCollCount] = {"all_reduce", "broadcast", "reduce",  "all_gather", "reduce_scatter",
                                                 "all_to_all", "gather",    "scatter", "barrier"};
  return kNames[static_cast<int>(c)];
}

const char* collKey(Coll c) {
  static const char* const kKeys[kCollCount] = {"allreduce", "broadcast", "reduce",  "allgather", "reducescatter",
                                                "alltoall",  "gather",    "scatter", "barrier"};
  return kKeys[static_cast<int>(c)];
}

const std::vector<AlgoRow>& algorithmTable() { return kTable; }

bool canRun(const AlgoRow& row, const Call& call) {
  switch (row.needs) {
    case Needs::Links:
      return true;
    case Needs::OneNodeArena:
      return call.shape != nullptr && call.shape->direct;
    case Needs::SeveralNodes:
      return call.shape != nullptr && call.shape->nodes >= 2 && call.shape->maxLocal >= 2;
    case Needs::CanonicalNodes:
      return call.comm != nullptr && call.args != nullptr && reproducibleAcrossNodes(*call.comm, *call.args);
  }
  return false;
}

const AlgoRow& chooseRow(const Call& call, Mode mode, const AlgoRow* forced) {
  if (forced != nullptr && canRun(*forced, call)) return *forced;
  const AlgoRow* best = nullptr;
  double bestCost = 0;
  for (const AlgoRow& row : kTable) {
    if (row.coll != call.coll || row.mode != mode || !canRun(row, call)) continue;
    const double cost = row.cost(call);
    if (best == nullptr || cost < bestCost) {
      best = &row;
      bestCost = cost;
    }
  }
  if (best == nullptr) {
    LOOM_THROW(ErrorCode::Internal, -1, strFormat("no algorithm runs %s here", collName(call.coll)));
  }
  return *best;
}

const AlgoRow* findRow(Coll c, const std::string& name) {
  for (const AlgoRow& row : kTable)
    if (row.coll == c && row.mode == Mode::Default && named(row, name)) return &row;
  return nullptr;
}

const AlgoRow* rowOf(Coll c, Algo a) {
  for (const AlgoRow& row : kTable)
    if (row.coll == c && row.algo == a && row.mode == Mode::Default) return &row;
  return nullptr;
}

}  // namespace coll
}  // namespace loom
