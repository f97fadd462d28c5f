// OpenPort: the port a rank's ib links go through, opened: the device context and one protection
// domain (every registration and queue pair of the rank's ib links belongs to it), and the GID
// its RoCE queue pairs send from.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "transport/ib/queue_pair.hpp"

namespace loom {
namespace ib {

class OpenPort {
 public:
  /// Opens the port choosePort() picks for a rank at `locate()` (LOOM_IB_HCA, its GPU or NUMA
  /// node, its local index). `locate` runs only once a port is found: it may load the node's
  /// topology, which a rank of a node without RDMA devices should not pay for. Null and *why when
  /// the library, a device or a usable port is missing or cannot be opened.
  static std::unique_ptr<OpenPort> open(const Verbs& v, const IbSettings& settings,
                                        const std::function<Locality()>& locate, std::string* why);
  ~OpenPort();
  OpenPort(const OpenPort&) = delete;
  OpenPort& operator=(const OpenPort&) = delete;

  const PortContext& context() const { return pc_; }
  /// "mlx5_0:1 (InfiniBand, LID 3)" or "mlx5_1:1 (RoCE, GID index 3 ::ffff:10.0.0.1)", for logs.
  std::string describe() const;

 private:
  OpenPort() = default;
  PortContext pc_;
};

}  // namespace ib
}  // namespace loom
