// Which DeviceRuntime is in use: a test's, CUDA's where built with it, a device is present, and
// the process uses CUDA (device/presence.hpp).
#include "device/runtime.hpp"

#include <atomic>

#include "device/presence.hpp"
#include "loom_config.h"

namespace loom {
namespace device {

#if LOOM_HAVE_CUDA
// device/cuda_runtime.cc: the CUDA runtime (started on the first call), or nullptr with `why` set
// when no device is usable.
DeviceRuntime* cudaRuntime(std::string* why);
#endif

namespace {
std::atomic<DeviceRuntime*> testRuntime{nullptr};
std::atomic<bool> startAsked{false};  // startRuntime was called: CUDA's own reason is known
}  // namespace

DeviceRuntime* runtime() {
  if (DeviceRuntime* t = testRuntime.load(std::memory_order_acquire)) return t;
#if LOOM_HAVE_CUDA
  // No device buffer can exist on a machine that shows no GPU (read once), nor in a process that has
  // not started CUDA: either way CUDA is left alone, and the first costs nothing per call.
  if (!cudaDevicesVisible() || !cudaDriverInUse()) return nullptr;
  return cudaRuntime(nullptr);  // every call asks: no reason string to copy
#else
  return nullptr;
#endif
}

DeviceRuntime* startRuntime() {
  if (DeviceRuntime* t = testRuntime.load(std::memory_order_acquire)) return t;
#if LOOM_HAVE_CUDA
  startAsked.store(true, std::memory_order_relaxed);
  return cudaRuntime(nullptr);
#else
  return nullptr;
#endif
}

bool devicesPresent() {
  if (testRuntime.load(std::memory_order_acquire) != nullptr) return true;
#if LOOM_HAVE_CUDA
  if (cudaDriverInUse()) return cudaRuntime(nullptr) != nullptr;  // CUDA can say exactly
  return cudaDevicesVisible();
#else
  return false;
#endif
}

std::string unavailableReason() {
#if LOOM_HAVE_CUDA
  if (testRuntime.load(std::memory_order_acquire) != nullptr) return "";
  if (cudaDriverInUse() || startAsked.load(std::memory_order_relaxed)) {
    std::string why;
    return cudaRuntime(&why) != nullptr ? "" : why;
  }
  return cudaDevicesVisible() ? "this process has not used CUDA (no CUDA stream or device buffer of it can exist)"
                              : "no CUDA device visible to this process (no /dev/nvidiactl with a /dev/nvidiaN, or "
                                "CUDA_VISIBLE_DEVICES hides them)";
#else
  return "Loom is built without CUDA (meson option cuda; nvcc not found at configure time)";
#endif
}

void setRuntimeForTesting(DeviceRuntime* rt) { testRuntime.store(rt, std::memory_order_release); }

}  // namespace device
}  // namespace loom
