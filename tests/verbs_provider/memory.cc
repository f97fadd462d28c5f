// Memory regions of the tests' verbs provider (provider.hpp): ibv_reg_mr over this process's
// memory, and GPUDirect RDMA over the emulated device's (tests/common/fake_device.hpp), whose
// allocations are memfd mappings named "loom-fake-device".
//
// As on a real machine, device memory is registered one of two ways:
//  - ibv_reg_dmabuf_mr, with the file the device runtime exported for the range (a real adapter
//    imports the GPU's dma-buf; here the region reaches the bytes through its own mapping of the
//    memfd, so a wrong file or offset lands the bytes in the wrong place, as it would there);
//  - ibv_reg_mr on the device pointer, which a real adapter accepts only where the peer-memory
//    module (nvidia-peermem) is loaded, and otherwise refuses with EFAULT, as its pages are not
//    the CPU's. LOOM_TEST_VERBS_PEERMEM=1 plays the module loaded.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "provider.hpp"

#undef ibv_reg_mr

namespace vp {
namespace {

constexpr const char* kDeviceMemory = "/memfd:loom-fake-device";

bool mapped(const void* addr, size_t length) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + length;
  std::vector<unsigned char> v((end - a + page - 1) / page);
  return mincore(reinterpret_cast<void*>(a), end - a, v.data()) == 0;
}

// Whether [addr, addr + length) touches the emulated device's memory (this process's mappings).
bool touchesDeviceMemory(const void* addr, size_t length) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(kDeviceMemory) == std::string::npos) continue;
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream in(line);
    in >> std::hex >> begin >> dash >> end;
    if (a < end && begin < a + length) return true;
  }
  return false;
}

bool peerMemory() {
  const char* v = std::getenv("LOOM_TEST_VERBS_PEERMEM");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Whether `fd` is a buffer the emulated device exported.
bool deviceFile(int fd) {
  char link[64];
  char target[256] = {};
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  return n > 0 && std::strncmp(target, kDeviceMemory, std::strlen(kDeviceMemory)) == 0;
}

// Remote write (and atomics) into memory the adapter may not write locally is refused.
bool accessOk(int access) {
  const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING;
  return (access & ~known) == 0 && ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) == 0 ||
                                    (access & IBV_ACCESS_LOCAL_WRITE) != 0);
}

ibv_mr* made(Mr* m, ibv_pd* pd, int access) {
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->access = access;
  addMr(m);
  counters().registrations++;
  return &m->mr;
}

}  // namespace

uint8_t* hostAddress(const Mr* m, uint64_t addr) {
  if (m->view == nullptr) return reinterpret_cast<uint8_t*>(addr);
  return m->view + (addr - reinterpret_cast<uint64_t>(m->mr.addr));
}

uint8_t* hostAddress(Context* ctx, uint32_t key, bool remote, uint64_t addr) {
  const Mr* m = findMr(ctx, key, remote);
  return m != nullptr ? hostAddress(m, addr) : reinterpret_cast<uint8_t*>(addr);
}

}  // namespace vp

using namespace vp;  // NOLINT: the exported calls below are the provider's

extern "C" {

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  if (!accessOk(access)) {
    errno = EINVAL;
    return nullptr;
  }
  if (addr == nullptr || length == 0 || !mapped(addr, length)) {
    errno = addr == nullptr || length == 0 ? EINVAL : EFAULT;
    return nullptr;
  }
  const bool device = touchesDeviceMemory(addr, length);
  if (device && !peerMemory()) {
    errno = EFAULT;  // the device's pages are not the CPU's: only a peer-memory module lends them
    return nullptr;
  }
  auto* m = new Mr();
  m->mr.addr = addr;
  m->mr.length = length;
  if (device) counters().deviceRegistrations++;
  return made(m, pd, access);
}

ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
  if (fd < 0) {
    errno = EBADF;
    return nullptr;
  }
  struct stat st {};
  if (!accessOk(access) || length == 0 || !deviceFile(fd) || fstat(fd, &st) != 0 ||
      offset + length > static_cast<uint64_t>(st.st_size)) {
    errno = EINVAL;
    return nullptr;
  }
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset & ~(page - 1);
  const size_t bytes = static_cast<size_t>(offset + length - start);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (base == MAP_FAILED) return nullptr;
  auto* m = new Mr();
  m->mr.addr = reinterpret_cast<void*>(iova);
  m->mr.length = length;
  m->view = static_cast<uint8_t*>(base) + (offset - start);
  m->mapBase = base;
  m->mapBytes = bytes;
  counters().dmabufRegistrations++;
  return made(m, pd, access);
}

int ibv_dereg_mr(ibv_mr* mr) {
  auto* m = reinterpret_cast<Mr*>(mr);
  removeMr(m);
  counters().deregistrations++;
  if (m->mapBase != nullptr) munmap(m->mapBase, m->mapBytes);
  delete m;
  return 0;
}

}  // extern "C"
