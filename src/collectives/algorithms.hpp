// The table of algorithms: one row per collective and algorithm, as UCC's per-collective tables
// (id, name, description, init). A row says which collective it serves, its names for LOOM_ALGO,
// where it can run at all, what the cost model says it costs (or the rule that takes it over the
// model, with its reason), and the function that runs it. The selector (select.hpp), LOOM_ALGO's
// parser, `loom-info --algos` and the dispatch (comm/collective_calls.cc, hierarchical.cc) all
// read it; adding an algorithm is a file that implements it and a row here.
//
// Choosing: among the rows of the call's collective and mode that can run it, the lowest cost
// wins, ties to the row first in the table; a row whose cost is kAlways wins wherever it can run
// (a rule that beats the model, such as reading the peers' memory in place on one node), and one
// whose cost is kNever is left to LOOM_ALGO. LOOM_ALGO names a row that can run the call: it
// runs, whatever the cost says.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/cost.hpp"

namespace loom {
namespace coll {

class CommView;
class Context;
struct Args;

/// The collectives. Each has rows in the table; kCollCount counts them.
enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Gather, Scatter, Barrier };
constexpr int kCollCount = 9;

/// The algorithms, by family: one family (the ring) serves several collectives, one row each.
enum class Algo {
  Ring,
  RecursiveDoubling,
  Binomial,
  Chain,
  Pairwise,
  DoubleTree,
  Hierarchical,
  Direct,
  HalvingDoubling,
  Linear,
  Dissemination,
  Canonical,
  CanonicalDoubling,
  CanonicalAcrossNodes,
  CanonicalDirect
};

/// "all_reduce", ... (messages, the flight recorder, Communicator::algorithmFor).
const char* collName(Coll c);
/// "allreduce", ...: the collective's key in LOOM_ALGO ("allreduce:rd").
const char* collKey(Coll c);

/// Default: the cost model and LOOM_ALGO choose. Reproducible: the rows a float reduction takes in
/// reproducible mode (docs/reproducibility.md), chosen by rule, never forced.
enum class Mode { Default, Reproducible };

/// Where an algorithm can run at all (a forced choice too).
enum class Needs {
  Links,          ///< any communicator
  OneNodeArena,   ///< every rank on one node, sharing its memory arena (NodeShape::direct)
  SeveralNodes,   ///< two or more nodes with two or more ranks on some (node-aware)
  CanonicalNodes  ///< reproducible mode's node-aware form (reproducibleAcrossNodes)
};

/// Costs beyond the model's range: kAlways takes the row wherever it can run; kNever leaves it to
/// LOOM_ALGO.
constexpr double kAlways = -1.0;
constexpr double kNever = 1e300;

/// One call as the rows see it.
struct Call {
  Coll coll = Coll::AllReduce;
  size_t bytes = 0;  ///< the whole buffer: every rank's block for all-gather, reduce-scatter,
                     ///< all-to-all, gather and scatter
  int ranks = 1;
  const CostModel* model = nullptr;  ///< the links between the call's ranks (the slowest)
  /// The communicator's nodes where the call spans it; null for a step within or across nodes.
  const NodeShape* shape = nullptr;
  /// Reproducible mode: the communicator and the arguments (CanonicalNodes), and what the default
  /// mode would run (the canonical rows follow it).
  const CommView* comm = nullptr;
  const Args* args = nullptr;
  Algo defaultAlgo = Algo::Ring;

  /// A call with no node shape (a step within or across nodes, a model's estimate).
  static Call flat(Coll c, size_t bytes, int ranks, const CostModel& m) {
    Call call;
    call.coll = c;
    call.bytes = bytes;
    call.ranks = ranks;
    call.model = &m;
    return call;
  }
};

struct AlgoRow {
  Coll coll;
  Algo algo;
  Mode mode;
  const char* name;     ///< LOOM_ALGO's name, and what messages and algorithmFor say
  const char* aliases;  ///< more names LOOM_ALGO takes, comma-separated
  Needs needs;
  double (*cost)(const Call&);  ///< modelled microseconds, kAlways or kNever
  void (*run)(Context&, const Args&);
  const char* why;  ///< what it does and when it is taken, in a line (loom-info --algos)
};

/// Every row, in the order ties are broken.
const std::vector<AlgoRow>& algorithmTable();
/// Whether `row` can run `call` (its Needs).
bool canRun(const AlgoRow& row, const Call& call);
/// The row of `mode` the table takes for `call`, `forced` first where it can run it.
const AlgoRow& chooseRow(const Call& call, Mode mode, const AlgoRow* forced = nullptr);
/// The default-mode row of collective `c` named `name` (or one of its aliases), or null.
const AlgoRow* findRow(Coll c, const std::string& name);
/// The default-mode row of `c` for algorithm `a`, or null.
const AlgoRow* rowOf(Coll c, Algo a);

}  // namespace coll
}  // namespace loom
