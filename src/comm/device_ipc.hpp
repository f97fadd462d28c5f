// Collectives on device buffers among the ranks of one node, through CUDA IPC: every rank's
// device buffers are mapped into its peers (transport/cuda_ipc/), and the data moves GPU to GPU
// (or within one GPU shared by several ranks) with the reduction and copy kernels, never through
// host memory.
//
// Stream order as for the staging path (device_state.hpp): an event on the caller's stream, the
// collective queued on the op queue in call order, the stream held on the completion flag. When
// its turn comes, on the op queue's thread:
//   1. wait for the input event; write this rank's device record (call, buffers' IPC handles and
//      offsets, all-to-all-v counts) in the node's arena; barrier;
//   2. check every peer's record names the same call, map the peers' buffers (cached);
//   3. the work, on the communicator's device stream, each step drained and ended by a barrier:
//      the algorithm of collectives/device_ipc.hpp (who reduces and copies what, in rank order);
//   4. the last barrier means every peer has finished reading this rank's buffers: the caller's
//      stream is released and may overwrite them.
// A lone rank (size 1) has no peers: its collectives are device copies on the same path.
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

/// All-to-all-v through CUDA IPC carries every rank's counts in its record: up to this many ranks.
constexpr int kIpcMaxAllToAllvRanks = 16;

/// Whether collective `kind` (`varCounts`: all-to-all-v) on device buffers runs through CUDA IPC
/// on this communicator: one rank, or every rank on this node linked by the cuda_ipc transport
/// with a shared arena. The same answer on every rank.
bool deviceIpcUsable(const detail::CommImpl& c, Coll kind, bool varCounts);

/// Queues collective `kind` on device buffers (a.device >= 0) ordered on `stream`, as above.
Work launchOnDeviceIpc(detail::CommImpl& c, Coll kind, const Args& a, void* stream, uint64_t sig);

}  // namespace detail
}  // namespace loom
