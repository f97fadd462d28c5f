// Context: what an algorithm sees of the communicator while it runs one collective (on the op
// queue, one collective at a time): its rank and size, byte-level sends and receives on this
// collective's private tag, scratch memory, and a reducer. Algorithms are plain functions over it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/comm_view.hpp"
#include "collectives/plan.hpp"
#include "core/function_ref.hpp"
#include "core/request.hpp"
#include "loom/loom.hpp"

namespace loom {
namespace coll {

/// The arguments of one collective, already validated.
struct Args {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  ///< elements (per rank block for all-gather, reduce-scatter, all-to-all, gather, scatter)
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  size_t elem = 4;  ///< bytes per element
  /// All-to-all with counts per peer: send counts, send displacements, receive counts, receive
  /// displacements (elements), size() entries each, one after another. Null otherwise.
  std::shared_ptr<const std::vector<size_t>> counts;
  /// The CUDA device the buffers are on, -1 for host memory (comm/device_staging.hpp).
  int device = -1;
  /// Reduce along the canonical tree over rank order (reproducible mode; kernels::reduceCanonical).
  bool canonical = false;
};

class Context {
 public:
  /// `name` ("all_reduce") and `algo` ("ring") appear in timeout and error messages.
  /// `sig` (core/signature.hpp) goes with every message, so that ranks in different calls fail
  /// clearly; 0 for internal exchanges that are no user call.
  Context(CommView& comm, int64_t seq, const char* name, const char* algo, uint64_t sig = 0)
      : comm_(comm), seq_(seq), name_(name), algo_(algo), sig_(sig) {}
  /// A view of `parent` restricted to `members` (global ranks; this rank among them): rank(),
  /// size() and peers are then indices into `members`, so that any algorithm runs on the group.
  /// Its messages use channels channelBase .. channelBase + channelCount - 1 of the collective's
  /// tag, apart from the other groups' of the same collective.
  Context(const Context& parent, std::vector<int> members, int channelBase, int channelCount);

  int rank() const { return members_.empty() ? comm_.rank() : groupRank_; }
  int size() const { return members_.empty() ? comm_.size() : static_cast<int>(members_.size()); }
  int64_t seq() const { return seq_; }
  /// The communicator as algorithms see it (node map, links, selector, arena).
  const CommView& comm() const { return comm_; }
  const char* name() const { return name_; }
  /// The algorithm's name ("ring", "direct"), for messages.
  const char* algo() const { return algo_; }
  /// The call's signature (core/signature.hpp), 0 for internal exchanges.
  uint64_t signature() const { return sig_; }
  /// The hang report for this collective (CommView::diagnose), for an algorithm's own timeouts.
  std::string diagnose() const { return comm_.diagnose(); }
  /// What a long wait does now and then (CommView::check): answers dump requests, finds peers in
  /// another call.
  void check() const { comm_.check(); }

  /// Messages of this collective on `channel` (0 to kMaxChannels-1): each channel has its own tag.
  RequestPtr send(int peer, const void* p, size_t bytes, int channel = 0);
  RequestPtr recv(int peer, void* p, size_t bytes, int channel = 0);
  /// A receive whose bytes `consumer` takes as they land (core/receive_consumer.hpp): over a link
  /// that hands them on, `p` is never written; over others they land in `p`, and wait() hands `p`
  /// to the consumer once the receive is complete. Either way the consumer has had every byte when
  /// wait() returns.
  RequestPtr recv(int peer, void* p, size_t bytes, int channel, std::shared_ptr<ReceiveConsumer> consumer);
  /// Waits for a request of this collective (the communicator's timeout applies). A receive that
  /// got fewer bytes than the algorithm expects means the ranks called mismatched collectives:
  /// that fails the communicator with a message naming the collective and the peer. A receive with
  /// a consumer that its link did not hand the bytes to hands them on here.
  void wait(const RequestPtr& r);
  void waitAll(std::vector<RequestPtr>& rs) {
    for (auto& r : rs) wait(r);
    rs.clear();
  }
  /// Scratch memory for this collective; slots are separate buffers.
  uint8_t* scratch(size_t bytes, int slot = 0) { return comm_.scratch(bytes, slot); }
  /// Elements per pipelined chunk of the chain and tree broadcast and reduce (LOOM_CHUNK_BYTES).
  size_t chunkElems(size_t elem) const;
  /// Elements per pipelined chunk of the ring algorithms: the communicator's cost model says
  /// (ringChunkBytesFor), so that every rank cuts the same chunks.
  size_t ringChunkElems(size_t elem) const;
  /// Elements per pipelined chunk of the tree algorithms (LOOM_TREE_CHUNK_BYTES).
  size_t treeChunkElems(size_t elem) const;
  /// Parallel rings for a ring collective moving `bytes` in all (LOOM_RING_CHANNELS).
  int ringChannels(size_t bytes) const;

 private:
  int global(int peer) const { return members_.empty() ? peer : members_[static_cast<size_t>(peer)]; }

  CommView& comm_;  // outlives the collective that made this context
  const int64_t seq_;
  const char* name_;
  const char* algo_;
  uint64_t sig_ = 0;
  std::vector<int> members_;  // empty: the whole communicator
  int groupRank_ = 0;
  int channelBase_ = 0;
  int channelCount_ = kMaxChannels;
};

// The pipeline tunables, parsed and clamped once here for the algorithms and the cost model alike.
size_t ringChunkBytes();  ///< LOOM_CHUNK_BYTES (read once)
/// The ring's chunk on links like `link`: LOOM_CHUNK_BYTES where set, else the link's own
/// (LinkProperties::ringChunkBytes; docs/performance.md).
size_t ringChunkBytesFor(const LinkProperties& link);
size_t treeChunkBytes();       ///< LOOM_TREE_CHUNK_BYTES (read once)
int maxRingChannels();         ///< LOOM_RING_CHANNELS, 1 to kMaxChannels (read on every call)
bool ringChannelsSet();        ///< whether LOOM_RING_CHANNELS is set (else defaults depend on the links)
size_t ringChannelMinBytes();  ///< LOOM_RING_CHANNEL_MIN_BYTES (read on every call)

inline const uint8_t* cbytes(const void* p) { return static_cast<const uint8_t*>(p); }
inline uint8_t* bytes(void* p) { return static_cast<uint8_t*>(p); }
/// memcpy unless in place.
void copyIfDistinct(void* dst, const void* src, size_t n);

// ---- Algorithms, one file each. Each leaves the result where the collective's contract says. ----
// Results are bitwise identical on every rank: each element is reduced along one fixed order (a
// ring, a tree, or rank order) and then copied, never reduced twice differently.

// ring.cc: reduce-scatter then all-gather around `ringChannels` parallel rings, pipelined in chunks.

void allReduceRing(Context& c, const Args& a);
/// A step on the segments (element ranges of the receive buffer) a rank owns, reduced, between
/// the ring all-reduce's reduce-scatter and its all-gather.
using OwnedStep = std::function<void(const std::vector<Segment>& owned)>;
/// The ring all-reduce with `between` run on the owned segments between its halves (the node-aware
/// "2D" all-reduce reduces them across nodes there); avg is then left to `between`.
void allReduceRingAround(Context& c, const Args& a, const OwnedStep& between);
void reduceRing(Context& c, const Args& a);
void allGatherRing(Context& c, const Args& a);
void reduceScatterRing(Context& c, const Args& a);
// recursive_doubling.cc: log2(n) exchanges of the whole buffer; for latency-bound sizes.
void allReduceRecursiveDoubling(Context& c, const Args& a);
// halving_doubling.cc: reduce-scatter by recursive halving, all-gather by recursive doubling
// (Rabenseifner): the ring's bandwidth in 2 log2(n) steps; for medium sizes.
void allReduceHalvingDoubling(Context& c, const Args& a);
// double_tree.cc: two complementary binary trees, each reducing and broadcasting half, pipelined.
void allReduceDoubleTree(Context& c, const Args& a);
// binomial.cc: pipelined binomial-tree broadcast and reduce.
void broadcastBinomial(Context& c, const Args& a);
void reduceBinomial(Context& c, const Args& a);
// chain.cc: pipelined chain broadcast root -> root+1 -> ... -> root-1.
void broadcastChain(Context& c, const Args& a);
// pairwise.cc: all-to-all, every pair exchanging its block directly.
void allToAllPairwise(Context& c, const Args& a);
/// The same with a count and displacement per peer (Args::counts); not in place.
void allToAllvPairwise(Context& c, const Args& a);
/// All-gather: every rank sends its block to every other at once (no forwarding).
void allGatherPairwise(Context& c, const Args& a);
// dissemination.cc: the barrier over links, ceil(log2 n) rounds of messages of no bytes.
void barrierDissemination(Context& c, const Args& a);
// linear.cc: gather and scatter, the root exchanging each rank's block with it directly, every
// message in flight at once (the root links only its peers; no rank forwards another's block).
void gatherLinear(Context& c, const Args& a);
void scatterLinear(Context& c, const Args& a);
// bruck.cc: all-gather in ceil(log2 n) steps for any n (Bruck's); for latency-bound sizes.
void allGatherBruck(Context& c, const Args& a);
// direct.cc: within one node, reading the peers' staged data in place (shared-memory arena):
// all-reduce, broadcast and all-gather (one barrier for small buffers, then one per chunk).
void allReduceDirect(Context& c, const Args& a);
/// A barrier of a communicator whose ranks all share the arena: one step on its counters, with
/// the same-call check; no message and no link.
void barrierDirect(Context& c);
void broadcastDirect(Context& c, const Args& a);
void allGatherDirect(Context& c, const Args& a);
/// One step on the arena of a communicator whose ranks all share it, for exchanges that are no
/// user call: every rank stages `block` bytes (at most directSmallMaxBytes of the area; every rank
/// the same count), then `take(rank, bytes)` sees each rank's, this one's included, in rank order,
/// before any rank writes its area again. With the same-call check, on the call's signature. A
/// rank reads only what it needs of the others' (a split's groups read their members').
void exchangeDirect(Context& c, const void* send, size_t block, FunctionRef<void(int, const uint8_t*)> take);
// hierarchical.cc: node-aware: within each node over shared memory, across nodes between one
// leader per node, then within each node again.
void allReduceHierarchical(Context& c, const Args& a);
/// All-reduce of host buffers among `members` (one rank per node, this rank among them) with the
/// algorithm the cost model picks for the links between nodes: the step across nodes of the
/// node-aware all-reduce on device buffers (comm/device_nodes.cc).
void allReduceAcrossNodes(Context& c, const std::vector<int>& members, const Args& a);
/// Broadcast from and reduce to a.root (an index into `members`), all-gather and reduce-scatter
/// among `members`, likewise.
void broadcastAcrossNodes(Context& c, const std::vector<int>& members, const Args& a);
void allGatherAcrossNodes(Context& c, const std::vector<int>& members, const Args& a);
void reduceScatterAcrossNodes(Context& c, const std::vector<int>& members, const Args& a);
void reduceAcrossNodes(Context& c, const std::vector<int>& members, const Args& a);
void broadcastHierarchical(Context& c, const Args& a);
// reproducible.cc: reproducible mode's float reductions (docs/reproducibility.md): each element
// reduced by one rank from every input at once along the canonical tree over rank order
// (kernels::reduceCanonical), so that neither the size nor the links change its bits.
void allReduceReproducible(Context& c, const Args& a);
/// The latency-bound form: a recursive doubling that combines along the canonical tree.
void allReduceReproducibleDoubling(Context& c, const Args& a);
/// Whether the node-aware form may run: nodes of one power-of-two size L >= 2, node k holding
/// ranks kL .. kL + L - 1, float32 or float64, a large enough buffer.
bool reproducibleAcrossNodes(const CommView& comm, const Args& a);
/// The node-aware form: canonical within nodes, then across them, then gathered within nodes.
void allReduceReproducibleAcrossNodes(Context& c, const Args& a);
void reduceReproducible(Context& c, const Args& a);
void reduceScatterReproducible(Context& c, const Args& a);
void reduceHierarchical(Context& c, const Args& a);

}  // namespace coll
}  // namespace loom
