// LinkProperties: what a transport's links are like, for the layers above that must plan around
// them (the cost model, the ring's chunking and channels, node-aware selection) without knowing
// which transport it is. Code outside src/transport/ reads these and never a transport's name.
#pragma once

#include <cstddef>

namespace loom {

struct LinkProperties {
  /// One-way time of a small message, in microseconds (the cost model's alpha).
  double latencyUs = 40;
  /// Sustained bandwidth of one link, one way, GB/s (the cost model's beta is its inverse).
  double gbps = 1.5;
  /// The ring's pipeline chunk that suits the link: small enough to stay in cache where a copy
  /// is the cost, large enough to keep a network stream busy where the per-send cost is.
  size_t ringChunkBytes = 2 << 20;
  /// Whether several rings in parallel go faster than one (several streams in flight over a
  /// network; not where one thread drives every link of the node).
  bool parallelChannels = true;
  /// The peer's bytes are read where the user put them (no staging copy on the sender).
  bool readsInPlace = false;
  /// One-sided writes into a peer's registered memory (RDMA).
  bool oneSidedWrites = false;
  /// Device (GPU) buffers of a collective are shared between the ranks in place (CUDA IPC).
  bool deviceMemory = false;
  /// Point-to-point messages may be sent from and received into device buffers directly
  /// (Connection::takesDeviceBuffers: GPUDirect RDMA at both ends); per link.
  bool deviceBuffers = false;
  /// Buffers must be registered with the transport before they move.
  bool needsRegistration = false;

  /// Whether this link is slower than `o`: less bandwidth, or as much with more latency.
  bool slowerThan(const LinkProperties& o) const {
    return gbps < o.gbps || (gbps == o.gbps && latencyUs > o.latencyUs);
  }
};

}  // namespace loom
