// Collectives on device buffers, stream-ordered, through pinned host staging.
//
// The mechanism (NCCL's semantics, Loom's own way):
//  - At the call, on the caller's thread: an event is recorded on the caller's stream (the input
//    is ready once it completes), the collective is queued on the communicator's op queue like any
//    other (so it keeps its place in call order on every rank), and the caller's stream is held
//    by a wait on a 32-bit completion flag in mapped host memory (cuStreamWaitValue32, or a spin
//    kernel where stream memory operations are unsupported). The call then returns.
//  - On the op queue's thread, when the collective's turn comes: it waits for the input event,
//    then runs the collective in chunks through pinned host buffers, a pipeline of three slots:
//    the device-to-host copy of chunk k+1 and the host-to-device copy of chunk k-1 run on two
//    copy streams while chunk k's host collective (network, CPU reduction) runs. Each chunk is a
//    collective call of its own (a sequence number each, reserved at the call so every rank
//    numbers them alike), carrying the user call's signature so mismatches are still named.
//  - When the last copy back has completed, or the collective failed or was aborted, the flag is
//    set and the caller's stream goes on. A failure is never a hung stream: the Work, the
//    communicator's error and loomCommGetAsyncError report it.
// Graph capture is rejected: a host-driven collective cannot be replayed from a graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/context.hpp"
#include "collectives/select.hpp"
#include "device/runtime.hpp"
#include "loom/loom.hpp"

namespace loom {
namespace detail {

using coll::Args;
using coll::Coll;

/// Elements of one staged chunk and how many chunks a collective of `count` elements (per rank
/// block for all-gather, reduce-scatter, all-to-all) takes when the staging slots hold
/// `stagingBytes` (input and output together). At least one chunk, also for count 0.
struct DeviceChunks {
  size_t elems = 0;
  size_t chunks = 1;
};
DeviceChunks planDeviceChunks(Coll kind, size_t count, size_t elem, int size, size_t stagingBytes);

/// Pinned staging bytes per slot (LOOM_DEVICE_STAGING_BYTES, default 4 MiB, at least 4 KiB), read
/// at every device call; it must be the same on every rank, as the chunks it makes are calls.
size_t deviceStagingBytes();

/// Where a call's buffers are: -1 for host memory, else their device. Null buffers and buffers of
/// zero bytes are not looked at. Throws InvalidArgument for a mix of host and device memory, for
/// buffers on two devices, and for a stream given with host buffers or without CUDA.
int locateBuffers(const detail::CommImpl& c, std::initializer_list<const void*> buffers, void* stream,
                  const char* what);

/// Queues collective `kind` on device buffers (a.device >= 0) ordered on `stream`, as described
/// above; `run` runs one chunk on host buffers as call `seq`. Returns the collective's Work.
using HostRun = std::function<void(const Args& hostArgs, int64_t seq)>;
Work launchOnDevice(detail::CommImpl& c, Coll kind, const Args& a, void* stream, uint64_t sig, const HostRun& run);

}  // namespace detail
}  // namespace loom
