// The device records through which the ranks of one node share their buffers for a collective on
// device memory through CUDA IPC (comm/device_ipc.cc, comm/device_nodes.cc): the node's shared
// arena holds one per rank. Each rank exports the buffers its peers read or write (or, for memory
// CUDA IPC cannot share, a device copy of it), writes its record, passes a barrier, reads its
// peers' records, checks they are in the same call, and maps their buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/context.hpp"
#include "collectives/device_ipc.hpp"
#include "collectives/plan.hpp"
#include "comm/comm_impl.hpp"
#include "comm/device_ipc.hpp"
#include "comm/device_state.hpp"
#include "device/runtime.hpp"
#include "transport/cuda_ipc/ipc_mem_cache.hpp"

namespace loom {
namespace detail {

using coll::Segment;

using coll::Context;
using coll::failDeviceCall;
using coll::gatherSlices;

/// A rank's record: the call it is in and where its buffers are. Written by the rank into its
/// arena slot before a barrier; read by its peers after it, until the call's next barrier.
struct DeviceRecord {
  uint64_t seq = 0;
  uint64_t sig = 0;
  uint64_t bytes = 0;  ///< count × element size (0 for all-to-all-v, whose counts follow)
  cuda_ipc::ProcessId proc;
  int32_t device = 0;  ///< the rank's GPU, as its process numbers them
  uint32_t pad0 = 0;
  uint64_t sendPtr = 0, recvPtr = 0;  ///< as the rank's process sees them; 0: not shared
  device::IpcHandle send, recv;
  uint32_t nCounts = 0;  ///< all-to-all-v: the rank's send counts, then its send displacements
  uint32_t pad = 0;
  uint64_t counts[2 * kIpcMaxAllToAllvRanks] = {};
};

/// In a catch block of a device call: fails the communicator with the error being handled (headed
/// by `label`) unless it has failed already, so that no peer is left waiting at a barrier.
void failCommunicatorWithCurrent(detail::CommImpl& comm, const std::string& label);

/// Exports `p` (`bytes` long) into *ptr and *h. Memory CUDA IPC cannot share (a cudaMallocAsync
/// pool, cuMemCreate) is bounced through device scratch `slot` from cudaMalloc: an input (`input`)
/// is copied in on `work` (then `drain`ed) before the peers read it; the caller copies an output
/// out once they have written it. Returns the bounce, or nullptr where `p` itself is shared.
uint8_t* shareDeviceBuffer(DeviceState& st, const void* p, size_t bytes, int slot, bool input,
                           device::StreamHandle work, const std::function<void()>& drain, uint64_t* ptr,
                           device::IpcHandle* h);

/// Writes `mine` into this rank's slot of `ar`, passes the barrier of step ++*step, and returns
/// every local rank's record (by index in `ar.ranks`) once each is checked to be in the same call;
/// otherwise fails the communicator naming the first that is not (`label` heads the message).
std::vector<DeviceRecord> exchangeRecords(const Context& ctx, const LocalArena& ar, const DeviceRecord& mine,
                                          uint64_t* step, const std::string& label);

/// Where the buffer (`ptr`, `h`) of record `theirs` is in this process: the pointer itself for this
/// rank or a rank of this process (peer access enabled where it is on another GPU), else the
/// peer's allocation mapped through the communicator's cache. nullptr where `ptr` is 0.
uint8_t* peerDeviceBuffer(detail::CommImpl& comm, device::DeviceRuntime& rt, const DeviceRecord& mine,
                          const DeviceRecord& theirs, bool self, uint64_t ptr, const device::IpcHandle& h, int dev);

}  // namespace detail
}  // namespace loom
