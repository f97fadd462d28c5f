#include "device/presence.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace loom {
namespace device {
namespace {

// The number of libraries the process has loaded so far (glibc counts them for dl_iterate_phdr):
// libcuda can have appeared only if it changed.
unsigned long long librariesLoaded() {
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* out) {
        if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds)
          *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        return 1;  // the first entry carries the count
      },
      &adds);
  return adds;
}

using DeviceCountFn = int (*)(int*);  // cuDeviceGetCount: CUDA_ERROR_NOT_INITIALIZED before cuInit

// libcuda's cuDeviceGetCount where the process has loaded libcuda, else nullptr. A name that is
// not loaded costs dlopen a search of the library path, so it is looked up once per new library.
DeviceCountFn loadedDeviceCount() {
  static std::atomic<DeviceCountFn> found{nullptr};
  static std::atomic<unsigned long long> lookedAt{~0ull};
  if (DeviceCountFn fn = found.load(std::memory_order_acquire)) return fn;
  const unsigned long long loaded = librariesLoaded();
  if (lookedAt.exchange(loaded, std::memory_order_acq_rel) == loaded) return nullptr;
  // Not closed: libcuda, once loaded, stays for the process's life, and the handle keeps it so.
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  auto fn = reinterpret_cast<DeviceCountFn>(dlsym(lib, "cuDeviceGetCount"));
  if (fn != nullptr) found.store(fn, std::memory_order_release);
  return fn;
}

bool exists(const char* path) { return access(path, F_OK) == 0; }

bool someNvidiaDevice() {
  DIR* dev = opendir("/dev");
  if (dev == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(dev)) {
    // nvidia0, nvidia1, ... (not nvidiactl, nvidia-uvm, nvidia-modeset)
    if (std::strncmp(e->d_name, "nvidia", 6) == 0 && e->d_name[6] >= '0' && e->d_name[6] <= '9') {
      found = true;
      break;
    }
  }
  closedir(dev);
  return found;
}

}  // namespace

bool cudaDriverInUse() {
  static std::atomic<bool> inUse{false};
  if (inUse.load(std::memory_order_acquire)) return true;
  DeviceCountFn count = loadedDeviceCount();
  int n = 0;
  if (count == nullptr || count(&n) != 0) return false;
  inUse.store(true, std::memory_order_release);
  return true;
}

bool cudaDevicesVisible() {
  static const bool visible = [] {
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
      if (*v == '\0' || std::strncmp(v, "-1", 2) == 0 || std::strcmp(v, "NoDevFiles") == 0) return false;
    }
    return (exists("/dev/nvidiactl") && someNvidiaDevice()) || exists("/dev/dxg");
  }();
  return visible;
}

}  // namespace device
}  // namespace loom
