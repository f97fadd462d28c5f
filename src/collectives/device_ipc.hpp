// The collectives on device buffers among the ranks of one node, once every rank's buffers are
// mapped into this process (comm/device_ipc.hpp exports, exchanges and maps them through CUDA IPC
// and the node's arena): what each collective reads and writes, with the reduction and copy
// kernels on the device, each step ended by draining the device work and a barrier on the arena.
//
//   all-reduce       each rank reduces its slice of every rank's input (the n-input kernel, in
//                    rank order) into its output; barrier; each copies the other slices from
//                    their owners' outputs
//   reduce           each rank reduces its slice into the root's output
//   reduce-scatter   each rank reduces its own block of every input
//   broadcast, all-gather, gather, scatter, all-to-all(v)
//                    copies from the peers' inputs
//
// Each element is reduced once, by one rank, in rank order (reproducible mode: along the
// canonical tree): every rank holds the same bits. HBM traffic of the all-reduce is about 2·S per
// rank (S read for the reduction, S/n written, the rest of the output read and written once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/algorithms.hpp"
#include "collectives/context.hpp"
#include "collectives/plan.hpp"
#include "core/function_ref.hpp"
#include "core/status.hpp"
#include "device/runtime.hpp"
#include "transport/arena.hpp"

namespace loom {
namespace coll {

/// What one rank of the node says of its all-to-all-v send side: `n` send counts, then `n` send
/// displacements (elements), in `counts`; n = 0 where it gave none.
struct PeerCounts {
  uint32_t n = 0;
  const uint64_t* counts = nullptr;
};

/// One collective's buffers and device work, as this rank sees them once the peers' are mapped.
struct DeviceIpcCall {
  device::DeviceRuntime& rt;
  device::StreamHandle work;           ///< where the kernels and copies are queued
  FunctionRef<void()> drain;           ///< waits for `work` (a failure throws)
  const std::string& label;            ///< heads error messages: "all_reduce #3 (cuda_ipc)"
  std::vector<const uint8_t*> sendOf;  ///< every local rank's input, mapped here (null: not shared)
  std::vector<uint8_t*> recvOf;        ///< every local rank's shared output, mapped here
  uint8_t* out;                        ///< this rank's output (or the device copy it is bounced through)
  std::vector<PeerCounts> counts;      ///< all-to-all-v: every local rank's (empty otherwise)
};

/// Runs collective `kind` of `a` (a.count > 0, or counts per peer) over the node's ranks in `ar`
/// (all of the communicator) as above; *step is the arena's barrier step, advanced for each one.
/// Throws, having failed the communicator so that no peer waits at a barrier, where a peer's
/// counts do not match this rank's.
void runDeviceIpc(Context& ctx, const LocalArena& ar, Coll kind, const Args& a, DeviceIpcCall& call, uint64_t* step);

/// Queues on `work` the copy into `out` of every slice but this rank's (index `me`) from the output
/// of its owner (`owners[p]` holds slice p, as `out` will).
void gatherSlices(device::DeviceRuntime& rt, uint8_t* out, const std::vector<uint8_t*>& owners,
                  const std::vector<Segment>& slices, size_t me, size_t elem, device::StreamHandle work);

/// Fails the communicator with `s` (so that the peers waiting at a barrier learn it) and throws.
[[noreturn]] void failDeviceCall(const Context& ctx, Status s);

}  // namespace coll
}  // namespace loom
