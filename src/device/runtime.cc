// Which DeviceRuntime is in use: a test's, CUDA's where built with it and a device is present.
#include "device/runtime.hpp"

#include <atomic>

#include "loom_config.h"

namespace loom {
namespace device {

#if LOOM_HAVE_CUDA
// device/cuda_runtime.cc: the CUDA runtime, or nullptr with `why` set when no device is usable.
DeviceRuntime* cudaRuntime(std::string* why);
#endif

namespace {
std::atomic<DeviceRuntime*> testRuntime{nullptr};
}

DeviceRuntime* runtime() {
  if (DeviceRuntime* t = testRuntime.load(std::memory_order_acquire)) return t;
#if LOOM_HAVE_CUDA
  return cudaRuntime(nullptr);  // every call asks: no reason string to copy
#else
  return nullptr;
#endif
}

std::string unavailableReason() {
#if LOOM_HAVE_CUDA
  std::string why;
  if (cudaRuntime(&why) != nullptr) return "";
  return why;
#else
  return "Loom is built without CUDA (meson option cuda; nvcc not found at configure time)";
#endif
}

void setRuntimeForTesting(DeviceRuntime* rt) { testRuntime.store(rt, std::memory_order_release); }

}  // namespace device
}  // namespace loom
