// What every stream-ordered operation on device buffers shares, whichever way it moves the data
// (pinned host staging, device_staging.hpp; CUDA IPC, device_ipc.hpp):
//  - DeviceState, one per communicator: the completion flag in mapped host memory that callers'
//    streams wait on (a counter: token k released lets every wait for k or earlier go on), the
//    copy streams per device, and the pinned staging slots;
//  - holdStream: queues an operation on the op queue and holds the caller's stream until it
//    completes, fails or is aborted (a failure is never a hung stream);
//  - awaitInput / waitEvent: the op queue's waits on device work, with the communicator's deadline
//    and failure checks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "collectives/algorithms.hpp"
#include "comm/comm_impl.hpp"
#include "core/deadline.hpp"
#include "device/runtime.hpp"
#include "loom/loom.hpp"

namespace loom {
namespace detail {

/// Per communicator: the flag and its counters, copy streams, pinned slots.
class DeviceState {
 public:
  explicit DeviceState(device::DeviceRuntime& rt);
  ~DeviceState();
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  device::DeviceRuntime& rt() { return rt_; }
  volatile uint32_t* flag() { return flag_; }
  std::mutex& callMutex() { return callMu_; }
  /// The next completion token (call with callMutex held, in queue order).
  uint32_t nextToken() { return ++issued_; }
  /// Lets streams waiting for `token` (and every earlier one) go on.
  void release(uint32_t token);
  void releaseAll();

  struct Streams {
    device::StreamHandle d2h = nullptr, h2d = nullptr;
  };
  /// The copy streams on `dev` (the op queue's thread, with `dev` current).
  Streams& streams(int dev);
  /// Pinned slot `i` (0 to 2) of at least `bytes` (op queue's thread only).
  uint8_t* slot(int i, size_t bytes);
  /// The number of this rank's next device send through CUDA IPC: its acknowledgement's tag.
  uint32_t nextAckNumber() { return acks_.fetch_add(1, std::memory_order_relaxed); }
  /// Device scratch `i` (0 or 1) of at least `bytes` on the current device (op queue's thread
  /// only; grows, freed with the state), from cudaMalloc and so shareable through CUDA IPC: where an
  /// in-place all-to-all keeps its input while peers read it, and where a buffer from a
  /// stream-ordered pool, which CUDA IPC cannot share, is bounced.
  uint8_t* deviceScratch(int i, size_t bytes);

 private:
  struct Slot {
    void* mem = nullptr;
    size_t bytes = 0;
  };
  /// `s` with at least `bytes` (pinned host or device memory), reallocated when smaller.
  uint8_t* grow(Slot& s, size_t bytes, bool pinned);

  device::DeviceRuntime& rt_;
  volatile uint32_t* flag_;
  std::mutex callMu_, relMu_;
  uint32_t issued_ = 0, released_ = 0;
  std::map<int, Streams> streams_;
  Slot slots_[3];
  Slot scratch_[2];
  std::atomic<uint32_t> acks_{0};
  std::vector<std::pair<void*, bool>> retired_;  // outgrown blocks (pinned?), freed with the state
};

/// The communicator's DeviceState (made on first use).
std::shared_ptr<DeviceState> stateOf(detail::CommImpl& c, device::DeviceRuntime& rt);

/// Waits for `e` on the op queue's thread: spins a little, then sleeps in short steps; checks the
/// communicator now and then (a failed peer, a dump request) and gives up at `deadline`.
void waitEvent(device::DeviceRuntime& rt, device::EventHandle e, const detail::CommImpl& c, const Deadline& deadline,
               const char* what);

/// The start of every queued device operation: its device made current, then the wait for the
/// work queued on the caller's stream before the call (`ready`, destroyed here whatever happens).
void awaitInput(device::DeviceRuntime& rt, device::EventHandle ready, int dev, const detail::CommImpl& c,
                const std::string& what);

/// Records a new event on `s` and waits for it (waitEvent); the event is destroyed whatever happens,
/// once the device has passed it.
void drainStream(device::DeviceRuntime& rt, device::StreamHandle s, const detail::CommImpl& c, const char* what);

/// Queues work ordered on `stream` (`submit` queues it and returns its completion; `ready` is its
/// input event) and holds the stream until it completes, fails or is aborted. The token and the
/// queue position are taken together, so that tokens complete in token order.
Work holdStream(device::DeviceRuntime& rt, const std::shared_ptr<DeviceState>& st, void* stream,
                device::EventHandle ready, const std::function<RequestPtr()>& submit);

/// Rejects a stream being captured into a CUDA graph: host-driven work cannot be replayed.
void rejectCapture(device::DeviceRuntime& rt, void* stream, const detail::CommImpl& c, const char* what);

/// A collective's work on device buffers, run on the op queue's thread once the input is ready.
using DeviceBody = std::function<void(int64_t seq, DeviceState& st)>;
/// The launch every collective on device buffers shares, whichever way it moves the data: the
/// stream checked (rejectCapture), the device made current, an event recorded on `stream` for the
/// input, then `body` queued on the op queue in call order with `seqs` sequence numbers (after
/// awaitInput), the stream held until it ends (holdStream).
Work launchDeviceCall(detail::CommImpl& c, coll::Coll kind, int device, void* stream, uint64_t sig, int64_t seqs,
                      DeviceBody body);

}  // namespace detail
}  // namespace loom
