#include "device.hpp"

#include <c10/util/Exception.h>

#ifdef LOOM_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#endif

namespace loom_torch {

std::optional<c10::Device> deviceOfCall(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                                        const char* op) {
  std::optional<c10::Device> found;
  for (const auto* list : {&a, &b}) {
    for (const auto& t : *list) {
      if (!t.defined()) continue;
      const c10::Device d = t.device();
      if (found && *found != d) {
        TORCH_CHECK(false, "loom: ", op, ": tensors on ", *found, " and on ", d,
                    " in one call (one device per call; every tensor on the same one)");
      }
      found = d;
    }
  }
  if (!found || found->is_cpu()) return std::nullopt;
  TORCH_CHECK(found->is_cuda(), "loom: ", op, ": tensors on ", *found, " (Loom takes CPU and CUDA tensors)");
  TORCH_CHECK(builtWithCuda(), "loom: ", op, ": a tensor on ", *found,
              ", but this build of loom_torch was made against PyTorch without CUDA (rebuild it against PyTorch "
              "with CUDA, or use backend \"cpu:loom,cuda:nccl\")");
  return found;
}

#ifdef LOOM_TORCH_CUDA

bool builtWithCuda() { return true; }

namespace {
// Loom's stream, and one that waits for an operation's event before a Future is completed on it.
struct StreamPair {
  c10::cuda::CUDAStream loom;
  c10::cuda::CUDAStream after;
};
}  // namespace

struct DeviceStreams {
  std::mutex mu;
  std::map<c10::DeviceIndex, StreamPair> byDevice;

  StreamPair of(c10::DeviceIndex d) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = byDevice.find(d);
    if (it == byDevice.end())
      it = byDevice
               .emplace(d, StreamPair{c10::cuda::getStreamFromPool(false, d), c10::cuda::getStreamFromPool(false, d)})
               .first;
    return it->second;
  }
};

std::shared_ptr<DeviceStreams> makeDeviceStreams() { return std::make_shared<DeviceStreams>(); }

struct DeviceDone {
  c10::Device device;
  c10::cuda::CUDAStream loom;
  c10::cuda::CUDAStream after;
  mutable at::cuda::CUDAEvent end;  // recorded once, in finish(); waiting on it is not a change
};

struct DeviceCall::State {
  State(DeviceStreams& all, c10::Device d) : device(d), guard(d), streams(all.of(d.index())) {}
  c10::Device device;
  c10::cuda::CUDAGuard guard;  // the device stays current for the whole call
  StreamPair streams;
};

DeviceCall::DeviceCall(DeviceStreams& streams, c10::Device device) : state_(new State(streams, device)) {
  // Loom reads the input once the caller's stream has produced it (and the staging copies made
  // for this call on that stream).
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(device.index()));
  ready.block(state_->streams.loom);
}

DeviceCall::~DeviceCall() = default;

void* DeviceCall::stream() const { return state_->streams.loom.stream(); }

std::shared_ptr<DeviceDone> DeviceCall::finish(const std::function<void()>& copies, const std::vector<at::Tensor>& a,
                                               const std::vector<at::Tensor>& b) {
  const c10::cuda::CUDAStream loom = state_->streams.loom;
  if (copies) {
    c10::cuda::CUDAStreamGuard onLoom(loom);
    copies();
  }
  // The caching allocator must not hand these blocks out again before Loom's stream is past them,
  // whenever the caller drops its tensors.
  for (const auto* list : {&a, &b}) {
    for (const auto& t : *list) {
      if (t.defined() && t.is_cuda() && t.storage().data_ptr().get() != nullptr)
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), loom);
    }
  }
  auto done = std::shared_ptr<DeviceDone>(new DeviceDone{state_->device, loom, state_->streams.after, {}});
  done->end.record(loom);
  return done;
}

void makeCurrentStreamWait(const DeviceDone& done) {
  done.end.block(c10::cuda::getCurrentCUDAStream(done.device.index()));
}

bool deviceFinished(const DeviceDone& done) { return done.end.query(); }

c10::Device deviceOf(const DeviceDone& done) { return done.device; }

void runAfter(const DeviceDone& done, const std::function<void()>& fn) {
  c10::cuda::CUDAGuard guard(done.device);
  done.end.block(done.after);
  c10::cuda::CUDAStreamGuard onAfter(done.after);
  fn();
}

#else  // PyTorch without CUDA: deviceOfCall refuses CUDA tensors, so none of the rest is reached.

bool builtWithCuda() { return false; }

struct DeviceStreams {};
std::shared_ptr<DeviceStreams> makeDeviceStreams() { return std::make_shared<DeviceStreams>(); }

struct DeviceDone {};
struct DeviceCall::State {};

DeviceCall::DeviceCall(DeviceStreams&, c10::Device) { TORCH_CHECK(false, "loom: built without CUDA"); }
DeviceCall::~DeviceCall() = default;
void* DeviceCall::stream() const { return nullptr; }
std::shared_ptr<DeviceDone> DeviceCall::finish(const std::function<void()>&, const std::vector<at::Tensor>&,
                                               const std::vector<at::Tensor>&) {
  return nullptr;
}
void makeCurrentStreamWait(const DeviceDone&) {}
bool deviceFinished(const DeviceDone&) { return true; }
c10::Device deviceOf(const DeviceDone&) { return c10::Device(c10::kCPU); }
void runAfter(const DeviceDone&, const std::function<void()>& fn) { fn(); }

#endif

}  // namespace loom_torch
