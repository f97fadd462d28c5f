// SideChannels: one TCP socket to each ib peer beside its queue pairs, for what RDMA cannot say
// promptly. A peer process that ends (killed, crashed) has its sockets closed by its kernel at
// once, while a queue pair learns it only when its retries run out (LOOM_IB_TIMEOUT and
// LOOM_IB_RETRY_CNT: about half a minute by default); and a rank whose queue pairs broke cannot
// send its BYE over them. Each IbConnection watches its socket (ib_connection.hpp, Closing).
//
// The sockets are made as TCP's are (sockets/handshake.hpp: the lower rank connects, both prove the
// job key and the communicator), from one listener on the first interface LOOM_SOCKET_IFNAME
// selects; its address is published under ibside/<rank>.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/store.hpp"
#include "core/progress_engine.hpp"
#include "net/interfaces.hpp"
#include "net/socket.hpp"
#include "transport/sockets/handshake.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace ib {

class SideChannels {
 public:
  SideChannels();
  ~SideChannels();
  SideChannels(const SideChannels&) = delete;
  SideChannels& operator=(const SideChannels&) = delete;

  /// The store key of `rank`'s address.
  static std::string key(int rank);
  /// Listens and publishes the address; false (and *why) when it cannot listen.
  bool publish(TransportContext& ctx, std::string* why);
  /// A proved socket to each peer of `records` (the peers' values of key()), by peer. Throws,
  /// naming the peers, when the deadline passes first or a peer proves another job key.
  /// Afterwards the listener turns strangers away.
  std::map<int, Socket> connect(TransportContext& ctx, const std::map<int, Bytes>& records);
  /// The peers' side-channel addresses of `records` (as connect() reads them), for links made on
  /// first use (sockets::OnDemandLinks, on interfaces() and listeners()). Throws naming a peer whose
  /// record does not read.
  static std::map<int, sockets::Endpoints> endpoints(int rank, const std::map<int, Bytes>& records);
  const std::vector<Interface>& interfaces() const { return ifaces_; }
  const std::vector<Socket>& listeners() const { return listeners_; }

 private:
  std::vector<Interface> ifaces_;  // the one interface listened on
  std::vector<Socket> listeners_;  // its listener
  ProgressEngine* engine_ = nullptr;
  std::unique_ptr<PollHandler> rejector_;
};

/// The side channel's one message: a rank closing its links says why (the BYE of ib_protocol.hpp),
/// as a 4-byte length and the text.
std::vector<uint8_t> encodeSideBye(const std::string& why);

}  // namespace ib
}  // namespace loom
