// Sends and receives on device buffers (Communicator::isend/irecv/igroup with a stream, the C
// API's loomSend/loomRecv in a group), stream-ordered as the collectives are (device_state.hpp):
// queued on the op queue behind the communicator's earlier operations, the caller's stream held
// until they are done. Each op goes one of three ways, by its peer's link:
//  - GPUDirect RDMA, where every op's link takes device buffers (ib at both ends,
//    LinkProperties::deviceBuffers): the buffers are handed to the links as they are;
//  - CUDA IPC, to and from a rank of this node on the cuda_ipc transport
//    (LinkProperties::deviceMemory): the sender exports its buffer (a device copy of it first where
//    CUDA IPC cannot share the memory: stream-ordered pools) and sends a descriptor of it on the
//    user's tag, marked kDeviceIpcMessage; the receiver maps it, copies from it into its own
//    buffer on the device, and acknowledges on a tag the sender numbered (p2pAckTag); the sender's
//    op is done, and its buffer free again, once the acknowledgement has come. No byte crosses
//    host memory. Like NCCL's, such a send completes only once its receive is posted: two ranks
//    that send to each other at once do so in one group;
//  - staged through a pinned host slot otherwise (across nodes, LOOM_TRANSPORT=^cuda_ipc).
// Both ends of an op on one node pick the same way, as their links are the same; a rank that
// passes host memory where its peer passes device memory gets an error naming both, from the
// marks. A receive from any source posts once for either kind of message and tells them apart by
// the mark of the one it took (Request::matchedSignature).
#pragma once

#include <vector>

#include "comm/comm_impl.hpp"
#include "loom/loom.hpp"

namespace loom {
namespace detail {

/// Queues the sends and receives `ops` on device buffers (all on device `dev`) ordered on
/// `stream`, posted together, receives first; returns their Work (a single receive's names its
/// sender).
Work launchPointToPointOnDevice(detail::CommImpl& c, const std::vector<PointToPoint>& ops, int dev, void* stream);

}  // namespace detail
}  // namespace loom
