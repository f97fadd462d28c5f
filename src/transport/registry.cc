#include "transport/registry.hpp"

#include "core/format.hpp"
#include "core/param.hpp"
#include "core/status.hpp"
#include "loom_config.h"
#include "net/interfaces.hpp"
#include "transport/cuda_ipc/cuda_ipc_transport.hpp"
#if LOOM_HAVE_IBVERBS
#include "transport/ib/ib_transport.hpp"
#endif
#include "transport/shm/shm_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace loom {
namespace {

LOOM_PARAM_STR(
    transportParam, "LOOM_TRANSPORT", "",
    "transports allowed: cuda_ipc, shm, ib, tcp, or exclusions such as ^shm (which excludes cuda_ipc too: it "
    "carries host bytes over shared memory) or ^cuda_ipc (device buffers staged through host memory); "
    "each pair of ranks gets the first allowed one that reaches it (default: all)");

}  // namespace

const std::vector<TransportEntry>& allTransports() {
  static const std::vector<TransportEntry> table = {
    {"cuda_ipc", [] { return std::unique_ptr<Transport>(new cuda_ipc::CudaIpcTransport()); }},
    {"shm", [] { return std::unique_ptr<Transport>(new shm::ShmTransport()); }},
#if LOOM_HAVE_IBVERBS
    {"ib", [] { return std::unique_ptr<Transport>(new ib::IbTransport()); }},
#endif
    {"tcp", [] { return std::unique_ptr<Transport>(new tcp::TcpTransport()); }},
  };
  return table;
}

std::vector<TransportEntry> selectTransports(const std::string& specIn) {
  std::string spec = specIn.empty() ? transportParam() : specIn;
  std::vector<TransportEntry> out;
  IfnameSpec parsed = parseIfnameSpec(spec);
  parsed.exact = true;  // transport names are whole words
  for (const auto& t : allTransports())
    if (spec.empty() || ifnameMatches(parsed, t.name)) out.push_back(t);
  // CUDA IPC carries its host bytes over shared memory: excluding shared memory ("^shm")
  // excludes it too; naming it ("cuda_ipc,tcp") brings shared memory along inside it.
  auto has = [&out](const char* name) {
    for (const auto& t : out)
      if (std::string(t.name) == name) return true;
    return false;
  };
  if (!spec.empty() && spec[0] == '^' && has("cuda_ipc") && !has("shm")) {
    for (auto it = out.begin(); it != out.end(); ++it)
      if (std::string(it->name) == "cuda_ipc") {
        out.erase(it);
        break;
      }
  }
  if (out.empty()) {
    std::string names;
    for (const auto& t : allTransports()) names += (names.empty() ? "" : ", ") + std::string(t.name);
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               strFormat("LOOM_TRANSPORT / transports=\"%s\" leaves no transport; this build has: %s", spec.c_str(),
                         names.c_str()));
  }
  return out;
}

}  // namespace loom
