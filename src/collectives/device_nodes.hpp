// Collectives on device buffers across nodes, node-aware: CUDA IPC within each node, the network
// only between nodes. Where every node has the same number L >= 2 of ranks, linked within it by
// cuda_ipc (with the node's shared arena); "column l" is the ranks of local index l, one per node.
//   all-reduce (the "2D" form of the host path, hierarchical.cc, on device memory):
//     1. within the node, through CUDA IPC: local rank l reduces slice l of every local rank's
//        input into its own output (the n-input kernel, in local rank order); barrier;
//     2. across nodes: column l all-reduces slice l, staged through a pinned slot in chunks (each a
//        host all-reduce over the links between nodes, with the algorithm the cost model picks for
//        them); avg divides once, at the end, by the world size; barrier;
//     3. within the node: each rank copies the other slices from their owners' outputs; barrier.
//     Every element is computed by one rank and copied to the others: the same bits everywhere.
//   broadcast: the root's column broadcasts across nodes (staged, in chunks); then, within each
//     node, the others copy from that column's rank through CUDA IPC.
//   all-gather: column l all-gathers its blocks across nodes (staged, in chunks) into their places;
//     then, within each node, each rank copies the other columns' blocks from their holders.
//   reduce-scatter: local rank l sums over the node, through CUDA IPC, the input blocks of column
//     l's ranks; column l reduce-scatters them across nodes (staged, in chunks).
//   reduce: as all-reduce's steps 1 and 2 (into scratch, across nodes to the column's rank on the
//     root's node), then the root copies the slices from its node's ranks.
// The last barrier of each means no peer reads this rank's buffers any more. All-to-all across
// nodes is staged flat (comm/device_staging.hpp).
//
// The communicator's part (each rank's record in the node's arena, buffers exported and mapped
// through CUDA IPC, pinned slots, streams) is behind NodeDeviceMemory, which comm/device_nodes.cc
// gives; what each collective moves, and in which steps, is here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/algorithms.hpp"
#include "collectives/context.hpp"
#include "device/runtime.hpp"
#include "transport/arena.hpp"

namespace loom {
namespace coll {

/// What the node-aware device collectives need of the communicator for one call.
class NodeDeviceMemory {
 public:
  enum class Buffer { Send, Recv };
  virtual ~NodeDeviceMemory() = default;
  /// Puts device buffer `p` (`bytes` long) in this rank's record as its `which` buffer, for the
  /// node's ranks to map. Memory CUDA IPC cannot share goes through device scratch `slot` (an
  /// `input` is copied there first); returns that copy, or nullptr where `p` itself is shared.
  virtual uint8_t* share(const void* p, size_t bytes, int slot, bool input, Buffer which) = 0;
  /// Writes this rank's record, passes the arena's barrier of step ++*step, and checks that every
  /// rank of the node is in this call; then peer() answers.
  virtual void exchange(uint64_t* step) = 0;
  /// Local rank p's `which` buffer, mapped into this process (after exchange()).
  virtual uint8_t* peer(size_t p, Buffer which) = 0;
  /// Pinned host memory of at least `bytes` for one chunk across nodes.
  virtual uint8_t* hostSlot(size_t bytes) = 0;
  /// Device scratch `slot` (0 or 1) of at least `bytes`, shareable as it is (cudaMalloc).
  virtual uint8_t* deviceScratch(int slot, size_t bytes) = 0;
  /// The streams that copy device to host and host to device; `work` runs the kernels.
  virtual device::StreamHandle toHost() = 0;
  virtual device::StreamHandle toDevice() = 0;
  virtual device::StreamHandle work() = 0;
  /// Waits for what was queued on `s` (`what` names it in an error; the deadline applies).
  virtual void drain(device::StreamHandle s, const std::string& what) = 0;
};

/// The sequence numbers collective `kind` of `a` takes on `comm`: one for the exchange within the
/// node, one per chunk across nodes (chunks of what `stagingBytes` of pinned memory hold).
int64_t deviceNodeSeqs(const CommView& comm, Coll kind, const Args& a, size_t stagingBytes);

/// Runs collective `kind` (not all-to-all, gather or scatter; a.count > 0) of `a` on device
/// buffers, node-aware as above: `ctx` is the call's (sequence number, signature), `ar` the node's
/// arena, `stagingBytes` the pinned slot's size.
void runDeviceNodes(Context& ctx, CommView& comm, const LocalArena& ar, Coll kind, const Args& a,
                    device::DeviceRuntime& rt, NodeDeviceMemory& mem, size_t stagingBytes);

}  // namespace coll
}  // namespace loom
