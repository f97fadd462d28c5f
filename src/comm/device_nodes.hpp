// Collectives on device buffers across nodes, node-aware: CUDA IPC within each node, the network
// only between nodes. Where every node has the same number L >= 2 of ranks, linked within it by
// cuda_ipc (with the node's shared arena); "column l" is the ranks of local index l, one per node.
//   all-reduce (the "2D" form of the host path, collectives/hierarchical.cc, on device memory):
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
// nodes is staged flat (device_staging.hpp).
#pragma once

#include <cstdint>

#include "collectives/context.hpp"
#include "collectives/select.hpp"
#include "comm/comm_impl.hpp"
#include "loom/loom.hpp"

namespace loom {
namespace detail {

using coll::Args;
using coll::Coll;

/// Whether collective `kind` on device buffers runs node-aware on this communicator (above):
/// any but all-to-all, on two or more nodes of L >= 2 ranks each, linked within
/// each node by cuda_ipc. The same answer on every rank.
bool deviceNodesUsable(const detail::CommImpl& c, Coll kind);

/// Queues collective `kind` on device buffers (a.device >= 0) ordered on `stream`, as above.
Work launchAcrossNodesOnDevice(detail::CommImpl& c, Coll kind, const Args& a, void* stream, uint64_t sig);

}  // namespace detail
}  // namespace loom
