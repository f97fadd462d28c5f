// GPUDirect RDMA for the ib transport (gpu_direct.hpp): choosing the way, and registering device
// allocations.
#include "transport/ib/gpu_direct.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "device/runtime.hpp"

namespace loom {
namespace ib {
namespace {

LOOM_PARAM_STR(gpuDirectParam, "LOOM_IB_GPU_DIRECT", "auto",
               "how the ib transport registers device (GPU) buffers for RDMA in place: auto, dmabuf, peermem or off "
               "(off: device buffers are staged through host memory)");

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

bool exists(const char* path) {
  struct stat st {};
  return stat(path, &st) == 0;
}

// Whether a peer-memory module lets ibv_reg_mr take device pointers.
bool peerMemoryModule() {
  return exists("/sys/kernel/mm/memory_peers/nv_mem/version") || exists("/sys/module/nvidia_peermem/version") ||
         exists("/sys/module/nv_peer_mem/version");
}

// Whether the adapter's provider imports dma-bufs: asked with no file, it says EBADF (or EINVAL)
// where it does and "not supported" where it does not.
bool adapterImportsDmabuf(const PortContext& pc) {
  if (pc.verbs->regDmabufMr == nullptr) return false;
  errno = 0;
  ibv_mr* mr = pc.verbs->regDmabufMr(pc.pd, 0, 0, 0, -1, 0);
  if (mr != nullptr) {
    pc.verbs->deregMr(mr);
    return true;
  }
  return errno != EOPNOTSUPP && errno != EPROTONOSUPPORT && errno != ENOSYS;
}

}  // namespace

const char* toString(GpuDirectMode mode) {
  switch (mode) {
    case GpuDirectMode::Dmabuf:
      return "dma-buf";
    case GpuDirectMode::PeerMemory:
      return "peer memory";
    case GpuDirectMode::Off:
      break;
  }
  return "off";
}

GpuDirectChoice chooseGpuDirect(const PortContext& pc) {
  const std::string asked = gpuDirectParam();
  if (asked != "auto" && asked != "dmabuf" && asked != "peermem" && asked != "off") {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               strFormat("LOOM_IB_GPU_DIRECT=\"%s\": write auto, dmabuf, peermem or off", asked.c_str()));
  }
  if (asked == "off") return {GpuDirectMode::Off, "LOOM_IB_GPU_DIRECT=off"};
  device::DeviceRuntime* rt = device::runtime();
  if (rt == nullptr) return {GpuDirectMode::Off, device::unavailableReason()};
  if (asked == "dmabuf") {
    if (pc.verbs->regDmabufMr == nullptr)
      return {GpuDirectMode::Off, "LOOM_IB_GPU_DIRECT=dmabuf, but the verbs library has no ibv_reg_dmabuf_mr"};
    return {GpuDirectMode::Dmabuf, "LOOM_IB_GPU_DIRECT=dmabuf"};
  }
  if (asked == "peermem") return {GpuDirectMode::PeerMemory, "LOOM_IB_GPU_DIRECT=peermem"};
  const int device = rt->currentDevice();
  std::string noDmabuf;
  if (pc.verbs->regDmabufMr == nullptr)
    noDmabuf = "the verbs library has no ibv_reg_dmabuf_mr (rdma-core before 34)";
  else if (!rt->dmabufSupported(device))
    noDmabuf = strFormat("%s device %d does not export dma-bufs", rt->name(), device);
  else if (!adapterImportsDmabuf(pc))
    noDmabuf = pc.port.device + " does not import dma-bufs";
  if (noDmabuf.empty()) return {GpuDirectMode::Dmabuf, strFormat("%s device %d exports dma-bufs", rt->name(), device)};
  if (peerMemoryModule()) return {GpuDirectMode::PeerMemory, noDmabuf + "; the peer-memory module is loaded"};
  return {GpuDirectMode::Off, noDmabuf + ", and no peer-memory module (nvidia-peermem) is loaded"};
}

// The registrations made and not yet deregistered: a release after the owner is gone does nothing.
struct DeviceRegistrations::Shared {
  std::mutex mu;
  const Verbs* verbs = nullptr;
  std::set<ibv_mr*> live;

  void release(ibv_mr* mr) {
    std::lock_guard<std::mutex> lock(mu);
    if (live.erase(mr) != 0) verbs->deregMr(mr);
  }
};

DeviceRegistrations::DeviceRegistrations(const PortContext& pc, GpuDirectMode mode, size_t maxEntries)
    : pc_(pc), mode_(mode), maxEntries_(maxEntries == 0 ? 1 : maxEntries), shared_(std::make_shared<Shared>()) {
  shared_->verbs = pc.verbs;
}

DeviceRegistrations::~DeviceRegistrations() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (ibv_mr* mr : shared_->live) pc_.verbs->deregMr(mr);
  shared_->live.clear();
}

Registration DeviceRegistrations::acquire(const void* addr, size_t bytes, Status* error) {
  device::DeviceRuntime* rt = device::runtime();
  device::DeviceAllocation a;
  if (rt == nullptr || !rt->allocationOf(addr, &a)) {
    *error = Status::error(ErrorCode::InvalidArgument,
                           strFormat("ib: %p is not device memory the device runtime knows", addr));
    return nullptr;
  }
  const auto p = reinterpret_cast<uintptr_t>(addr);
  if (p + bytes > a.base + a.bytes) {
    *error = Status::error(ErrorCode::InvalidArgument,
                           strFormat("ib: the device buffer of %zu bytes at %p runs past the end of its allocation "
                                     "(%zu bytes at %#zx)",
                                     bytes, addr, a.bytes, static_cast<size_t>(a.base)));
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(a.base);
  if (it != entries_.end() && it->second.id == a.id && it->second.reg->covers(addr, bytes)) {
    stats_.hits++;
    it->second.lastUse = ++clock_;
    return it->second.reg;
  }
  // Whatever was registered over this allocation's addresses belonged to memory freed since.
  for (auto e = entries_.begin(); e != entries_.end();) {
    const RegisteredRange& r = *e->second.reg;
    if (r.begin < a.base + a.bytes && a.base < r.begin + r.bytes) {
      e = entries_.erase(e);
      stats_.invalidations++;
    } else {
      ++e;
    }
  }
  Registration reg;
  const Status made = registerAllocation(a.base, a.bytes, &reg);
  if (!reg) {
    *error = made;
    return nullptr;
  }
  stats_.misses++;
  entries_[a.base] = Entry{a.id, reg, ++clock_};
  evictLocked();
  return reg;
}

Status DeviceRegistrations::registerAllocation(uintptr_t base, size_t bytes, Registration* out) {
  ibv_mr* mr = nullptr;
  std::string how;
  int err = 0;
  if (mode_ == GpuDirectMode::Dmabuf) {
    uint64_t offset = 0;
    std::string why;
    const int fd = device::runtime()->exportDmabuf(reinterpret_cast<void*>(base), bytes, &offset, &why);
    if (fd < 0) {
      return Status::error(ErrorCode::System,
                           strFormat("ib: cannot register device memory for RDMA: %s (LOOM_IB_GPU_DIRECT=off stages "
                                     "device buffers through host memory instead)",
                                     why.c_str()));
    }
    mr = pc_.verbs->regDmabufMr(pc_.pd, offset, bytes, base, fd, kAccess);
    err = errno;
    close(fd);  // the region holds the buffer now
    how = "as a dma-buf";
  } else {
    mr = pc_.verbs->regMr(pc_.pd, reinterpret_cast<void*>(base), bytes, kAccess);
    err = errno;
    how = "by its pointer (peer memory)";
  }
  if (mr == nullptr) {
    return Status::error(
        ErrorCode::System,
        strFormat("ib: registering %zu bytes of device memory at %#zx %s with %s failed: %s%s", bytes,
                  static_cast<size_t>(base), how.c_str(), pc_.port.device.c_str(), std::strerror(err),
                  mode_ == GpuDirectMode::PeerMemory
                      ? " (is the nvidia-peermem module loaded? LOOM_IB_GPU_DIRECT=off stages through host memory)"
                      : " (LOOM_IB_GPU_DIRECT=off stages device buffers through host memory)"));
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->live.insert(mr);
  }
  auto r = std::shared_ptr<RegisteredRange>(new RegisteredRange, [shared = shared_](RegisteredRange* range) {
    shared->release(static_cast<ibv_mr*>(range->handle));
    delete range;
  });
  r->begin = base;
  r->bytes = bytes;
  r->localKey = mr->lkey;
  r->remoteKey = mr->rkey;
  r->handle = mr;
  *out = std::move(r);
  return Status::success();
}

void DeviceRegistrations::evictLocked() {
  while (entries_.size() > maxEntries_) {
    auto victim = entries_.end();
    for (auto e = entries_.begin(); e != entries_.end(); ++e)
      if (e->second.reg.use_count() == 1 && (victim == entries_.end() || e->second.lastUse < victim->second.lastUse))
        victim = e;
    if (victim == entries_.end()) return;  // every one is held
    entries_.erase(victim);
    stats_.evictions++;
  }
}

RegistrationStats DeviceRegistrations::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RegistrationStats s = stats_;
  s.entries = entries_.size();
  for (const auto& [base, e] : entries_) s.bytes += e.reg->bytes;
  return s;
}

}  // namespace ib
}  // namespace loom
