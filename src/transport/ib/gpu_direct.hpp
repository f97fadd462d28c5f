// GPUDirect RDMA for the ib transport: the adapter reads and writes device (GPU) memory in place,
// so that send/recv on device buffers moves them with no staging through host memory.
//
// The adapter must be able to register the device's memory. Machines allow it one of two ways:
//  - dma-buf: the GPU driver exports the range as a dma-buf file (cuMemGetHandleForAddressRange)
//    and the adapter imports it (ibv_reg_dmabuf_mr, rdma-core 34 and later; Linux 5.12 and
//    later). Preferred where both sides can.
//  - peer memory: a kernel module (nvidia-peermem, or the older nv_peer_mem) lets ibv_reg_mr take
//    device pointers.
// LOOM_IB_GPU_DIRECT picks: auto (the default: dma-buf where the device runtime, the verbs library
// and the adapter all can, else peer memory where the module is loaded, else none), dmabuf,
// peermem (that way, without looking: a registration it cannot make then fails its operation with
// the adapter's reason), or off.
//
// A link takes device buffers only where both of its ranks have GPUDirect (each says so with its
// queue pairs' addresses), so that a device buffer never meets a peer that would have to stage it;
// where a link does not, the communicator stages device buffers through pinned host memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "transport/ib/queue_pair.hpp"
#include "transport/registration.hpp"

namespace loom {
namespace ib {

enum class GpuDirectMode { Off, Dmabuf, PeerMemory };

/// "off", "dma-buf", "peer memory".
const char* toString(GpuDirectMode mode);

struct GpuDirectChoice {
  GpuDirectMode mode = GpuDirectMode::Off;
  std::string why;  ///< what decided it, in a phrase
};

/// The way this rank registers device memory with the port's adapter (LOOM_IB_GPU_DIRECT).
GpuDirectChoice chooseGpuDirect(const PortContext& pc);

/// Registrations of device memory with one port's protection domain, one per device allocation
/// (the whole of it, so that every buffer carved from it finds the registration made), kept for
/// reuse until the allocation is seen replaced (another allocation id at its address), the limit
/// of entries is reached (least recently used first, never one held), or this is destroyed.
/// Thread-safe. Registrations handed out may outlive this: it deregisters everything it made when
/// destroyed, and a later release does nothing.
class DeviceRegistrations {
 public:
  /// `pc` outlives this.
  DeviceRegistrations(const PortContext& pc, GpuDirectMode mode, size_t maxEntries);
  ~DeviceRegistrations();
  DeviceRegistrations(const DeviceRegistrations&) = delete;
  DeviceRegistrations& operator=(const DeviceRegistrations&) = delete;

  /// A registration covering device memory [addr, addr + bytes); null with *error set when it
  /// cannot be made (the runtime does not know the memory, the adapter refused it).
  Registration acquire(const void* addr, size_t bytes, Status* error);
  RegistrationStats stats() const;

 private:
  struct Shared;
  struct Entry {
    uint64_t id = 0;
    Registration reg;
    uint64_t lastUse = 0;
  };
  Status registerAllocation(uintptr_t base, size_t bytes, Registration* out);
  void evictLocked();

  const PortContext& pc_;
  const GpuDirectMode mode_;
  const size_t maxEntries_;
  std::shared_ptr<Shared> shared_;  // what a registration's release needs
  mutable std::mutex mu_;
  std::map<uintptr_t, Entry> entries_;  // by allocation start
  uint64_t clock_ = 0;
  RegistrationStats stats_;
};

}  // namespace ib
}  // namespace loom
