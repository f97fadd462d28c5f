// CommView: what the algorithms need of the communicator they run on, and nothing else: its rank
// and size, byte-level sends and receives on the collective tag space, scratch memory, the node
// map, what each link is like, the selector, the node's shared arena, and the hooks a long wait
// calls. The communicator (src/comm/) implements it; the algorithms see it through a Context
// (context.hpp), so that nothing in src/collectives/ includes the communicator.
//
// Threads: algorithms run on the communicator's op queue, one collective at a time; scratch() is
// theirs alone while they run.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/node_map.hpp"
#include "core/receive_consumer.hpp"
#include "core/request.hpp"
#include "transport/arena.hpp"
#include "transport/link_properties.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace coll {

class Selector;

/// Tags at or above kCollectiveTagBit (transport.hpp) belong to Loom; user tags stay below.
/// A collective's tag also carries its channel (bits 28-30), so that the channels of one collective
/// never match each other's messages, and the low 27 bits of its sequence number (collectives in
/// flight at once are far fewer than 2^27 apart). Bit 27 set: the acknowledgements of device
/// sends through CUDA IPC (p2pAckTag), numbered by their sender.
constexpr int kMaxChannels = 8;
inline uint32_t collectiveTag(int64_t seq, int channel = 0) {
  return kCollectiveTagBit | (static_cast<uint32_t>(channel) & 7u) << 28 | static_cast<uint32_t>(seq & 0x07ffffff);
}
inline uint32_t p2pAckTag(uint32_t number) { return kCollectiveTagBit | 1u << 27 | (number & 0x07ffffff); }

class CommView {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// How long one wait of a collective may take (the communicator's timeout).
  virtual std::chrono::milliseconds timeout() const = 0;
  /// Byte-level messages on a collective's tag (collectiveTag). `sig` (core/signature.hpp) goes
  /// with the message so that ranks in different calls fail clearly; 0 for internal exchanges.
  virtual RequestPtr postSend(int peer, const void* buf, size_t bytes, uint32_t tag, const detail::Label& label,
                              uint64_t sig) = 0;
  /// `consumer` (may be null) takes the bytes as they land (core/receive_consumer.hpp).
  virtual RequestPtr postRecv(int peer, void* buf, size_t bytes, uint32_t tag, const detail::Label& label, uint64_t sig,
                              std::shared_ptr<ReceiveConsumer> consumer) = 0;
  /// Scratch memory, `slot` 0 to 2: separate buffers that grow and never shrink.
  virtual uint8_t* scratch(size_t bytes, int slot) = 0;
  /// Where the communicator's first failure is kept; failing it fails the communicator.
  virtual std::shared_ptr<FailureState> failureState() const = 0;
  /// The hang report for the collective this rank is in, for an algorithm's own timeouts.
  virtual std::string diagnose() noexcept = 0;
  /// What a long wait does now and then: answers dump requests, finds peers in another call.
  virtual void check() noexcept = 0;

  /// Which ranks share a node.
  virtual const NodeMap& nodes() const = 0;
  /// What the link to `peer` is like (this rank's own link for peer == rank()).
  virtual const LinkProperties& link(int peer) const = 0;
  /// What a link between two ranks of one node is like: the same on every rank, also on a rank
  /// alone on its node, so that every rank models node-aware algorithms alike.
  virtual const LinkProperties& nodeLink() const = 0;
  /// The communicator's algorithm selector (null only while it is being made).
  virtual const Selector* selector() const = 0;
  /// The node's shared arena (ranks of one node that read each other's memory), or nullptr.
  virtual const LocalArena* arena() const = 0;
  /// The first local peer in collective `seq` with a signature other than `sig`, as an error;
  /// success when there is none (or no shared arena).
  virtual Status localCallMismatch(int64_t seq, uint64_t sig) const = 0;

  // Node map shorthands.
  int nodeCount() const { return nodes().count(); }
  int nodeOf(int rank) const { return nodes().of(rank); }
  const std::vector<int>& ranksOnNode(int node) const { return nodes().on(node); }
  int localRank() const { return nodes().localRank(rank()); }
  int localSize() const { return static_cast<int>(ranksOnNode(nodeOf(rank())).size()); }

  /// The slowest of this rank's links to its peers (a flat algorithm runs at the pace of its
  /// slowest link); this rank's own link when it has no peer.
  LinkProperties slowestLink() const {
    LinkProperties slowest = link(rank());
    bool any = false;
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      if (!any || link(p).slowerThan(slowest)) slowest = link(p);
      any = true;
    }
    return slowest;
  }

 protected:
  ~CommView() = default;
};

}  // namespace coll
}  // namespace loom
