// CudaIpcTransport: first in the registry for ranks of one node when a CUDA device is present
// (device::devicesPresent: chosen without starting CUDA, which starts on a first device buffer).
// Device buffers of the node's ranks are shared through CUDA IPC: each rank exports the handles
// of its buffers for a collective (cudaIpcGetMemHandle of the allocation, plus the offset) in its
// device record in the node's shared arena, and its peers map them (cudaIpcOpenMemHandle, cached
// in an IpcMemCache, closed when the communicator goes) and read or write them in place with the
// reduction and copy kernels (comm/device_ipc.hpp). Ranks of one process use each other's
// pointers directly. Several ranks may share one GPU: nothing here asks for distinct devices.
//
// Host bytes between the same ranks (host-buffer collectives, send/recv, the records'
// synchronisation) go over shared memory: the transport runs a ShmTransport inside and hands its
// connections and arena out as its own, so a pair linked by cuda_ipc has everything shm gives.
// LOOM_TRANSPORT=^cuda_ipc leaves device buffers to the pinned host staging path instead.
#pragma once

#include <memory>
#include <vector>

#include "transport/cuda_ipc/ipc_mem_cache.hpp"
#include "transport/shm/shm_transport.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace cuda_ipc {

class CudaIpcTransport : public Transport {
 public:
  CudaIpcTransport() = default;
  ~CudaIpcTransport() override;
  const char* name() const override { return "cuda_ipc"; }
  /// Shared memory's, and device buffers move between the node's GPUs without host staging.
  LinkProperties properties() const override {
    LinkProperties p = shm::ShmTransport::linkProperties();
    p.deviceMemory = true;
    return p;
  }
  /// Peers the shared-memory transport reaches, when this process may have a CUDA device (decided
  /// without starting CUDA: device::devicesPresent).
  bool reaches(const TransportContext& ctx, int peer) const override;
  void publish(TransportContext& ctx) override { shm_.publish(ctx); }
  std::vector<std::unique_ptr<Connection>> connect(TransportContext& ctx, const std::vector<int>& peers) override;
  /// Shared memory's arena, and the map of the peers' device memory.
  Services services() override { return Services{shm_.arena(), &cache_}; }

 private:
  shm::ShmTransport shm_;
  IpcMemCache cache_;
};

}  // namespace cuda_ipc
}  // namespace loom
