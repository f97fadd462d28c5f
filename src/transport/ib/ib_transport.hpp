// IbTransport: links over InfiniBand or RoCE through RC queue pairs (ib_connection.hpp), for
// peers on other nodes (and any peer when it is the only transport allowed, LOOM_TRANSPORT=ib).
//
// Setup: publish() opens the rank's port (open_port.hpp: LOOM_IB_HCA, the NUMA node of the rank's
// CPUs, ranks spread over a node's ports) and makes the completion channel every connection's
// queue reports to, watched by the receive engine. connect() makes each peer's connection (its
// queue pairs in INIT, receives posted), writes their addresses to the store under
// ib/<rank>/<peer>, reads the peer's, brings the queue pairs to RTS and says so under
// ibok/<rank>/<peer>; it returns once every peer has said so, so that no first message meets a
// queue pair that is not ready. A rank whose setup fails writes "error: <why>" under ib/<rank>,
// and its peers fail at once with that reason, not at the deadline.
//
// Where libibverbs is missing, lists no device, or no port is usable, the transport reaches no
// peer and says why (LOOM_DEBUG=INFO, and in the error when it was the only one allowed).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/ib/ib_connection.hpp"
#include "transport/ib/open_port.hpp"
#include "transport/registration_cache.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace ib {

class IbTransport : public Transport, private Registrar {
 public:
  IbTransport();
  ~IbTransport() override;
  const char* name() const override { return "ib"; }
  /// RDMA links: LOOM_IB_LATENCY_US, the port's speed, one-sided writes into registered memory.
  LinkProperties properties() const override;
  bool reaches(const TransportContext& ctx, int peer) const override;
  std::string absentReason() const override { return port_ ? std::string() : why_; }
  void publish(TransportContext& ctx) override;
  std::vector<std::unique_ptr<Connection>> connect(TransportContext& ctx, const std::vector<int>& peers) override;
  Registration registerMemory(const void* addr, size_t bytes, Status* error) override;

 private:
  class ChannelWatch;
  Status registerRange(uintptr_t begin, size_t bytes, RegisteredRange* out) noexcept override;
  void deregisterRange(const RegisteredRange& range) noexcept override;
  std::vector<std::unique_ptr<Connection>> setUp(TransportContext& ctx, const std::vector<int>& peers);
  std::string awaitFromPeer(TransportContext& ctx, const std::string& key, int peer, const char* what);

  std::unique_ptr<OpenPort> port_;
  std::string why_;
  ibv_comp_channel* channel_ = nullptr;
  std::unique_ptr<ChannelWatch> watch_;
  std::unique_ptr<RegistrationCache> cache_;
  std::vector<IbConnection*> conns_;
};

}  // namespace ib
}  // namespace loom
