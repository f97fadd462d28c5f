#include "transport/ib/side_channel.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/store_protocol.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "transport/sockets/handshake.hpp"

namespace loom {
namespace ib {
SideChannels::SideChannels() = default;

SideChannels::~SideChannels() {
  if (engine_ != nullptr)
    for (auto& l : listeners_) engine_->remove(l.fd());
}

std::string SideChannels::key(int rank) { return "ibside/" + std::to_string(rank); }

bool SideChannels::publish(TransportContext& ctx, std::string* why) {
  try {
    ifaces_ = selectedInterfaces();
  } catch (const Error& e) {
    *why = strFormat("no interface for its side channels: %s", e.what());
    return false;
  }
  ifaces_.resize(1);
  SockAddr bindAddr = ifaces_[0].addr;
  bindAddr.setPort(0);
  int err = 0;
  Socket listener = listenOn(bindAddr, 256, &err);
  if (!listener.valid()) {
    *why = strFormat("cannot listen for its side channels on %s (%s): %s%s", bindAddr.host().c_str(),
                     ifaces_[0].name.c_str(), errnoText(err).c_str(), listenAdvice(err).c_str());
    return false;
  }
  listeners_.push_back(std::move(listener));
  const SockAddr at = localAddress(listeners_.back().fd());
  Bytes record(SockAddr::kWireBytes);
  at.toWire(record.data());
  record.insert(record.end(), ifaces_[0].name.begin(), ifaces_[0].name.end());
  ctx.store->set(key(ctx.rank), record);
  return true;
}

std::map<int, sockets::Endpoints> SideChannels::endpoints(int rank, const std::map<int, Bytes>& records) {
  std::map<int, sockets::Endpoints> remote;
  for (const auto& [peer, record] : records) {
    SockAddr addr;
    if (record.size() < SockAddr::kWireBytes || !SockAddr::fromWire(record.data(), &addr)) {
      LOOM_THROW_PEER(ErrorCode::InvalidUsage, rank, peer,
                      strFormat("ib: rank %d published a side-channel address this rank cannot read", peer));
    }
    remote[peer].emplace_back(addr, std::string(record.begin() + SockAddr::kWireBytes, record.end()));
  }
  return remote;
}

std::map<int, Socket> SideChannels::connect(TransportContext& ctx, const std::map<int, Bytes>& records) {
  const std::map<int, sockets::Endpoints> remote = endpoints(ctx.rank, records);
  TransportContext one = ctx;
  one.socketsPerPeer = 1;
  sockets::Handshakes handshakes(one, ifaces_, listeners_);
  std::map<int, std::vector<Socket>> formed = handshakes.run(remote);
  std::map<int, Socket> out;
  for (auto& [peer, sockets] : formed) out[peer] = std::move(sockets.at(0));
  if (!rejector_ && ctx.engine != nullptr) {
    engine_ = ctx.engine;
    rejector_ = std::make_unique<sockets::StrayRejector>(listeners_[0].fd(), ctx.rank, "ib side-channel port");
    engine_->add(listeners_[0].fd(), rejector_.get(), EPOLLIN);
  }
  return out;
}

std::vector<uint8_t> encodeSideBye(const std::string& why) {
  std::vector<uint8_t> out(4);
  storewire::putU32(out.data(), static_cast<uint32_t>(why.size()));
  out.insert(out.end(), why.begin(), why.end());
  return out;
}

}  // namespace ib
}  // namespace loom
