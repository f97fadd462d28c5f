// The ordered table of transports compiled into this build. For each pair of ranks the first
// transport that can connect them wins (CUDA IPC, then shared memory, then TCP; InfiniBand will
// sit before TCP); LOOM_TRANSPORT narrows the table with the LOOM_SOCKET_IFNAME syntax
// ("tcp", "^shm"). A transport not compiled in is simply absent.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.hpp"

namespace loom {

struct TransportEntry {
  const char* name;
  std::function<std::unique_ptr<Transport>()> make;
};

/// Every transport of this build, in preference order.
const std::vector<TransportEntry>& allTransports();

/// The entries `spec` allows (empty spec: LOOM_TRANSPORT, then all). Throws Error(InvalidArgument)
/// listing what exists when nothing is left.
std::vector<TransportEntry> selectTransports(const std::string& spec);

}  // namespace loom
