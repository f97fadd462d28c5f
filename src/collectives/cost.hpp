// The cost model: time = latency x steps + bytes / bandwidth (+ the reduction passes an algorithm
// cannot overlap with receiving), per algorithm, with the links' latency and bandwidth (each
// transport's LinkProperties: LOOM_TCP_LATENCY_US / LOOM_TCP_MBPS, LOOM_SHM_LATENCY_US /
// LOOM_SHM_MBPS, or what LOOM_TUNE measured at init) and the reduction's speed (LOOM_REDUCE_MBPS).
// Each row of the algorithm table (algorithms.hpp) names its cost function here.
#pragma once

#include <cstddef>

#include "transport/link_properties.hpp"

namespace loom {
namespace coll {

struct Call;

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

/// What a node-aware choice needs to know of the communicator: how many nodes, the most ranks
/// on one, and the model of the links within a node (the call's own model is that of the
/// slowest links, those between nodes).
struct NodeShape {
  int nodes = 1;
  int maxLocal = 1;
  bool evenNodes = false;  ///< every node has maxLocal ranks (the node-aware all-reduce's 2D form)
  CostModel intra;
  /// Every rank shares one node and its memory arena: the direct algorithms are possible, the
  /// all-reduce's taken from this many bytes up (LOOM_SHM_DIRECT_MIN_BYTES).
  bool direct = false;
  size_t directMinBytes = 16 * 1024;
  size_t directSmallMaxBytes = 0;  ///< up to this, the one-barrier form (directSmallMaxBytes())
};

/// LOOM_SHM_DIRECT_MIN_BYTES (16 KiB unless set).
size_t directMinBytesFromEnv();
/// The model for links like `link` (their latency, bandwidth, chunk and channels; each transport
/// reads its own settings, e.g. LOOM_TCP_LATENCY_US), with the tunables of the environment.
CostModel costModelFor(const LinkProperties& link);

/// The largest all-reduce the direct algorithm runs in its one-barrier form, for an area of
/// `areaBytes`: 16 KiB, or a quarter of a smaller area.
inline size_t directSmallMaxBytes(size_t areaBytes) { return areaBytes / 4 < 16384 ? areaBytes / 4 : 16384; }
/// With two ranks on one node, broadcasts and all-gathers of up to this many bytes in all take
/// the direct forms; larger ones the chain and pairwise single-copy reads.
constexpr size_t kDirectPairMaxBytes = size_t{256} << 10;

// ---- The rows' costs (modelled microseconds of the call; kAlways / kNever, algorithms.hpp). ----
double ringUs(const Call& c);
double recursiveDoublingUs(const Call& c);
double bruckUs(const Call& c);  ///< the all-gather's recursive doubling
double halvingDoublingUs(const Call& c);
double binomialUs(const Call& c);
double chainUs(const Call& c);
double pairwiseUs(const Call& c);
double linearUs(const Call& c);
double disseminationUs(const Call& c);
double doubleTreeUs(const Call& c);
/// Node-aware: the best flat algorithm within the nodes and between them, step by step.
double hierarchicalUs(const Call& c);
/// The direct all-reduce's rule, and the direct broadcast's and all-gather's.
double directAllReduceUs(const Call& c);
double directSpreadUs(const Call& c);
/// The barrier on one node's arena: no message at all.
double directBarrierUs(const Call& c);
/// The pairwise all-gather over one node's memory: where the direct form is not taken.
double pairwiseOnOneNodeUs(const Call& c);
/// Reproducible mode's rules: the canonical forms follow what the default mode would run.
double canonicalDirectUs(const Call& c);
double canonicalDoublingUs(const Call& c);
double canonicalUs(const Call& c);

}  // namespace coll
}  // namespace loom
