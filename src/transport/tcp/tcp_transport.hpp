// TcpTransport: sets up TcpConnections. Each rank listens on every interface LOOM_SOCKET_IFNAME
// selects (one address family, one address per interface), publishes the addresses in the store,
// then the lower rank of every pair opens LOOM_SOCKETS_PER_PEER sockets to the higher one, socket
// k from its interface k mod (its count) to the peer's interface k mod (the peer's count): with
// two interfaces (two rails, two NICs) and two sockets, a large message is striped over both
// links. Every socket proves the job key (sockets/handshake.hpp); connections that fail it are
// closed and logged while setup goes on, and after setup the listener stays open and turns every
// newcomer away. Links made on first use (LOOM_CONNECT=lazy, the default above 8 ranks) are dialled
// by whichever rank of the pair needs the link first (sockets/on_demand_links.hpp).
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "net/interfaces.hpp"
#include "net/socket.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace sockets {  // sockets/handshake.hpp, sockets/on_demand_links.hpp
class StrayRejector;
class OnDemandLinks;
}  // namespace sockets

namespace tcp {

class TcpConnection;

class TcpTransport : public Transport {
 public:
  TcpTransport();
  ~TcpTransport() override;
  const char* name() const override { return "tcp"; }
  LinkProperties properties() const override { return linkProperties(); }
  /// Socket links: LOOM_TCP_LATENCY_US and LOOM_TCP_MBPS for the cost model, 2 MiB ring chunks
  /// (fewer, larger sends), several rings in parallel.
  static LinkProperties linkProperties();
  void publish(TransportContext& ctx) override;
  /// Its sockets to the peer.
  int descriptorsPerLink(const TransportContext& ctx) const override { return ctx.socketsPerPeer; }
  std::vector<std::unique_ptr<Connection>> connect(TransportContext& ctx, const std::vector<int>& peers) override;
  bool linksOnDemand() const override { return true; }
  void linkOnDemand(TransportContext& ctx, const std::vector<int>& peers, LinkSink* sink) override;
  void linkTo(int peer) noexcept override;

  /// The address this rank listens on for interface `i` (after publish).
  SockAddr listenAddress(size_t i = 0) const;

 private:
  std::vector<Interface> ifaces_;  // one per interface used, in the order sockets take them
  std::vector<Socket> listeners_;  // by interface
  std::vector<std::unique_ptr<sockets::StrayRejector>> rejectors_;
  std::unique_ptr<sockets::OnDemandLinks> onDemand_;  // with LOOM_CONNECT=lazy
  ProgressEngine* engine_ = nullptr;                  // set in connect(); stopped by the communicator before we go
};

}  // namespace tcp
}  // namespace loom
