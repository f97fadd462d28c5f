// Algorithm selection: a cost model time = latency x steps + bytes / bandwidth (+ the reduction
// passes an algorithm cannot overlap with receiving) per algorithm, with the links' latency and
// bandwidth (each transport's LinkProperties: LOOM_TCP_LATENCY_US / LOOM_TCP_MBPS,
// LOOM_SHM_LATENCY_US / LOOM_SHM_MBPS, or what LOOM_TUNE measured at init) and the reduction's speed
// (LOOM_REDUCE_MBPS), picks the algorithm per call. LOOM_ALGO overrides it, for all collectives ("ring") or per
// collective
// ("allreduce:rd,broadcast:chain"); an algorithm that does not exist for a collective is ignored
// for it. `loom-info --algos` prints the table of choices.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/link_properties.hpp"

namespace loom {
namespace coll {

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll };
enum class Algo {
  Ring,
  RecursiveDoubling,
  Binomial,
  Chain,
  Pairwise,
  DoubleTree,
  Hierarchical,
  Direct,
  HalvingDoubling
};

const char* collName(Coll c);  ///< "all_reduce", ...
const char* algoName(Algo a);  ///< "ring", "rd", "tree", "chain", "pairwise", "dbtree", "hier", "direct", "hd"

struct CostModel {
  double latencyUs = 25.0;              ///< per message step
  double gbps = 1.5;                    ///< GB/s per link
  double reduceGbps = 10;               ///< GB/s of the reduction kernel (counted where it cannot overlap the network)
  size_t chunkBytes = 512 * 1024;       ///< the ring's pipeline chunk (ringChunkBytesFor)
  size_t pipeChunkBytes = 512 * 1024;   ///< LOOM_CHUNK_BYTES: chain and tree broadcast and reduce
  size_t treeChunkBytes = 64 * 1024;    ///< LOOM_TREE_CHUNK_BYTES: double-tree pipeline
  int ringChannels = 2;                 ///< LOOM_RING_CHANNELS
  size_t channelMinBytes = 256 * 1024;  ///< LOOM_RING_CHANNEL_MIN_BYTES
  bool halvingDoubling = true;          ///< whether the model may pick halving-doubling (LOOM_ALGO still can)
};

/// LOOM_SHM_DIRECT_MIN_BYTES (16 KiB unless set).
size_t directMinBytesFromEnv();
/// The model for links like `link` (their latency, bandwidth, chunk and channels; each transport
/// reads its own settings, e.g. LOOM_TCP_LATENCY_US), with the tunables of the environment.
CostModel costModelFor(const LinkProperties& link);
/// Modelled microseconds of `algo` for `bytes` (the whole buffer) on `ranks` ranks.
double modelUs(Coll c, Algo a, size_t bytes, int ranks, const CostModel& m);
/// The algorithm for one call. `override` is LOOM_ALGO's text ("" for the model alone).
Algo selectAlgo(Coll c, size_t bytes, int ranks, const CostModel& m, const std::string& override);
/// LOOM_ALGO's current value.
std::string algoOverrideFromEnv();
/// The algorithm `override` forces for collective c, if any.
bool forcedAlgo(Coll c, const std::string& override, Algo* out);

/// One communicator's choice: its cost model and LOOM_ALGO, read once when the communicator is
/// made (nothing is parsed per call), with the override resolved per collective. Immutable.
/// What a node-aware choice needs to know of the communicator: how many nodes, the most ranks
/// on one, and the model of the links within a node (the selector's own model is that of the
/// slowest links, those between nodes).
struct NodeShape {
  int nodes = 1;
  int maxLocal = 1;
  bool evenNodes = false;  ///< every node has maxLocal ranks (the node-aware all-reduce's 2D form)
  CostModel intra;
  /// Every rank shares one node and its memory arena: the direct all-reduce is possible, and
  /// taken from this many bytes up (LOOM_SHM_DIRECT_MIN_BYTES).
  bool direct = false;
  size_t directMinBytes = 16 * 1024;
  size_t directSmallMaxBytes = 0;  ///< up to this, the one-barrier form (directSmallMaxBytes())
};

/// The largest all-reduce the direct algorithm runs in its one-barrier form, for an area of
/// `areaBytes`: 16 KiB, or a quarter of a smaller area.
inline size_t directSmallMaxBytes(size_t areaBytes) { return areaBytes / 4 < 16384 ? areaBytes / 4 : 16384; }
/// With two ranks on one node, broadcasts and all-gathers of up to this many bytes in all take
/// the direct forms; larger ones the chain and pairwise single-copy reads (Selector::pick).
constexpr size_t kDirectPairMaxBytes = size_t{256} << 10;

class Selector {
 public:
  Selector(const CostModel& m, const std::string& override, const NodeShape& shape = {});
  /// The algorithm for a call on the whole communicator (`ranks` ranks); may be Hierarchical
  /// when the communicator spans several nodes with several ranks on some.
  Algo pick(Coll c, size_t bytes, int ranks) const;
  /// Within one node (shared-memory model) or between node leaders (the model): never
  /// Hierarchical, never forced.
  Algo pickIntra(Coll c, size_t bytes, int ranks) const { return selectAlgo(c, bytes, ranks, shape_.intra, ""); }
  Algo pickInter(Coll c, size_t bytes, int ranks) const { return selectAlgo(c, bytes, ranks, m_, ""); }
  /// Whether a node-aware algorithm can differ from a flat one here.
  bool hierarchical() const { return shape_.nodes >= 2 && shape_.maxLocal >= 2; }
  /// Whether the direct (shared-arena) all-reduce can run here.
  bool direct() const { return shape_.direct; }
  /// Modelled microseconds of the hierarchical form of c.
  double hierarchicalUs(Coll c, size_t bytes) const;
  const CostModel& model() const { return m_; }

 private:
  CostModel m_;
  NodeShape shape_;
  int forced_[6];  // per Coll: the forced Algo, or -1
  // The last choice per collective (bytes << 8 | algo + 1): back-to-back calls of one size, the
  // usual case, skip the model. Relaxed atomics: a stale entry is only a missed shortcut.
  mutable std::atomic<uint64_t> last_[6] = {};
};

}  // namespace coll
}  // namespace loom
