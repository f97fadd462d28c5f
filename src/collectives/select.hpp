// Algorithm selection: each call runs the row of the algorithm table (algorithms.hpp) with the
// lowest cost under the communicator's cost model (cost.hpp), or the row LOOM_ALGO forces, for all
// collectives ("ring") or per collective ("allreduce:rd,broadcast:chain"); a name a collective has
// no row for is ignored for it, and a forced row that cannot run the call (direct across nodes)
// leaves the choice to the model. `loom-info --algos` prints the rows and the choices.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/algorithms.hpp"
#include "collectives/cost.hpp"

namespace loom {
namespace coll {

/// Modelled microseconds of `algo` for `bytes` (the whole buffer) on `ranks` ranks, flat (no node
/// shape): kNever where collective c has no such algorithm.
double modelUs(Coll c, Algo a, size_t bytes, int ranks, const CostModel& m);
/// The flat choice for one call (no node shape: steps within or across nodes, and callers with no
/// selector). `override` is LOOM_ALGO's text ("" for the model alone).
Algo selectAlgo(Coll c, size_t bytes, int ranks, const CostModel& m, const std::string& override);
/// The name LOOM_ALGO and messages use for `a` ("ring", "rd", "tree", "hier", "canonical", ...).
const char* algoName(Algo a);
/// LOOM_ALGO's current value.
std::string algoOverrideFromEnv();
/// The row LOOM_ALGO's text `override` forces for collective c, or null.
const AlgoRow* forcedRow(Coll c, const std::string& override);

/// One communicator's choice: its cost model, node shape and LOOM_ALGO, read once when the
/// communicator is made (nothing is parsed per call), with the override resolved per collective.
/// Immutable but for a memo of the last choice per collective.
class Selector {
 public:
  Selector(const CostModel& m, const std::string& override, const NodeShape& shape = {});
  /// The row for a call on the whole communicator (`ranks` ranks): node-aware, direct or flat.
  const AlgoRow& pick(Coll c, size_t bytes, int ranks) const;
  /// Within one node (shared-memory model) or between node leaders (the model): flat, never forced.
  const AlgoRow& pickIntra(Coll c, size_t bytes, int ranks) const;
  const AlgoRow& pickInter(Coll c, size_t bytes, int ranks) const;
  /// Whether a node-aware algorithm can differ from a flat one here.
  bool hierarchical() const { return shape_.nodes >= 2 && shape_.maxLocal >= 2; }
  /// Whether every rank shares one node's arena (the direct algorithms can run).
  bool direct() const { return shape_.direct; }
  /// Modelled microseconds of the node-aware form of c.
  double hierarchicalUs(Coll c, size_t bytes) const;
  const CostModel& model() const { return m_; }
  const NodeShape& shape() const { return shape_; }

 private:
  CostModel m_;
  NodeShape shape_;
  const AlgoRow* forced_[kCollCount] = {};
  // The last choice per collective (bytes << 8 | row index + 1): back-to-back calls of one size,
  // the usual case, skip the model. Relaxed atomics: a stale entry is only a missed shortcut.
  mutable std::atomic<uint64_t> last_[kCollCount] = {};
};

}  // namespace coll
}  // namespace loom
