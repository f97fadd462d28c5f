// Collectives on device buffers across nodes, node-aware: CUDA IPC within each node, the network
// only between nodes, where every node has the same number L >= 2 of ranks linked within it by
// cuda_ipc. The steps of each collective are collectives/device_nodes.hpp; this is the
// communicator's part: each call's record in the node's arena, its buffers exported and the
// peers' mapped, the pinned slots and streams, and the launch ordered on the caller's stream.
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
