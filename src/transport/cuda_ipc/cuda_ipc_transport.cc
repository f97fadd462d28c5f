#include "transport/cuda_ipc/cuda_ipc_transport.hpp"

#include "core/logging.hpp"
#include "device/runtime.hpp"

namespace loom {
namespace cuda_ipc {

CudaIpcTransport::~CudaIpcTransport() {
  shm_.stop();
  cache_.clear();
}

bool CudaIpcTransport::reaches(const TransportContext& ctx, int peer) const {
  return device::devicesPresent() && shm_.reaches(ctx, peer);
}

std::vector<std::unique_ptr<Connection>> CudaIpcTransport::connect(TransportContext& ctx,
                                                                   const std::vector<int>& peers) {
  auto conns = shm_.connect(ctx, peers);
  LOOM_INFO(
      "cuda_ipc: device buffers shared with %zu local peer(s) through CUDA IPC (%s), host bytes over shared "
      "memory%s",
      peers.size(), device::runtime() != nullptr ? device::runtime()->name() : "CUDA started on a first device buffer",
      shm_.arena() != nullptr ? "" : "; no shared arena, so device collectives are staged through host memory");
  return conns;
}

}  // namespace cuda_ipc
}  // namespace loom
