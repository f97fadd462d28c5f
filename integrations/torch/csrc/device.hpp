// Operations on CUDA tensors, with ProcessGroupNCCL's stream semantics. Each runs on a stream of
// the backend's own per device ("Loom's stream"), after the work already queued on the caller's
// current stream; Loom holds Loom's stream until the data has moved, and the copies out of staging
// tensors are queued behind it, so the caller's thread never waits. Work::wait() and synchronize()
// make the caller's current stream wait for an event recorded after the operation; the tensors are
// marked in use by Loom's stream for the caching allocator (recordStream), and the Work's Future
// carries the device, so callbacks chained on it (DDP's comm hooks) see the results in order.
//
// Compiled in every build; the CUDA side only where setup.py finds PyTorch built with CUDA
// (LOOM_TORCH_CUDA). Elsewhere a CUDA tensor is refused with a message saying so.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace loom_torch {

/// Whether this build takes CUDA tensors (built against PyTorch with CUDA).
bool builtWithCuda();

/// Loom's streams, one per CUDA device the group has used, made on first use (device.cc).
struct DeviceStreams;
std::shared_ptr<DeviceStreams> makeDeviceStreams();

/// What a Work on CUDA tensors keeps of its operation: the device, Loom's stream, and an event
/// recorded on it after the operation (its copies out included).
struct DeviceDone;

/// The device of one call's tensors (all of them, staging tensors included): nullopt for CPU
/// tensors; throws when they are on several devices, or on CUDA in a build without it.
std::optional<c10::Device> deviceOfCall(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                                        const char* op);

/// The stream side of one call on CUDA tensors, from construction to finish(). Construction
/// makes `device` current and has Loom's stream wait for the work queued so far on the caller's
/// current stream.
class DeviceCall {
 public:
  DeviceCall(DeviceStreams& streams, c10::Device device);
  ~DeviceCall();
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;

  /// The cudaStream_t to pass to Loom.
  void* stream() const;
  /// After the Loom call was queued: queues `copies` (the copies out of staging tensors; may be
  /// empty) on Loom's stream, records the event, and marks `a` and `b` in use by Loom's stream.
  std::shared_ptr<DeviceDone> finish(const std::function<void()>& copies, const std::vector<at::Tensor>& a,
                                     const std::vector<at::Tensor>& b);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Makes the calling thread's current stream of the Work's device wait for the operation, without
/// blocking the host (Work::wait and synchronize).
void makeCurrentStreamWait(const DeviceDone& done);
/// Whether the device has finished the operation.
bool deviceFinished(const DeviceDone& done);
/// The device, for the Work's Future.
c10::Device deviceOf(const DeviceDone& done);
/// Runs `fn` with, as the current stream of the device, one that has waited for the operation:
/// a Future marked complete inside records its events there, after the operation only.
void runAfter(const DeviceDone& done, const std::function<void()>& fn);

}  // namespace loom_torch
