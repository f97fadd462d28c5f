#include "transport/tcp/tcp_transport.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "bootstrap/store_protocol.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/progress_engine.hpp"
#include "net/interfaces.hpp"
#include "transport/sockets/handshake.hpp"
#include "transport/sockets/on_demand_links.hpp"
#include "transport/tcp/tcp_connection.hpp"

namespace loom {
namespace tcp {

using sockets::Endpoints;
using sockets::Handshakes;
using sockets::OnDemandLinks;
using sockets::StrayRejector;

namespace {

LOOM_PARAM_INT(latencyParam, "LOOM_TCP_LATENCY_US", 40, "cost model: microseconds per message over TCP");
LOOM_PARAM_INT(bandwidthParam, "LOOM_TCP_MBPS", 1500, "cost model: MB/s per TCP link");
LOOM_PARAM_INT(readsPerEventParam, "LOOM_TCP_READS_PER_EVENT", 64,
               "recv calls per readable socket event before the engine turns to other sockets");
LOOM_PARAM_INT(readyBytesParam, "LOOM_READY_BYTES", 64 << 20,
               "largest message sent at once (no RTS/CTS round trip) when the receiver said its receive is posted "
               "(max 1 GiB); 0: never");
LOOM_PARAM_INT(pushBytesParam, "LOOM_PUSH_BYTES", 1024 * 1024,
               "largest message of a collective sent over TCP at once, without waiting for the receiver to ask for it "
               "(max 1 MiB; 0: never)");
LOOM_PARAM_INT(quickAckParam, "LOOM_TCP_QUICKACK", 1,
               "1: ask TCP to acknowledge bulk reads at once (TCP_QUICKACK), so that delayed ACKs never hold up a "
               "sender; 0: the kernel's delayed ACKs");
LOOM_PARAM_INT(lowWaterParam, "LOOM_TCP_LOWAT", 256 * 1024,
               "with more ranks than cores, bytes of a long payload a socket gathers before its reader is woken "
               "(SO_RCVLOWAT); 0: every packet");
LOOM_PARAM_INT(eagerBytesParam, "LOOM_EAGER_BYTES", 64 * 1024,
               "largest TCP message sent at once; larger ones wait for the receiver (max 1 MiB)");
LOOM_PARAM_INT(reduceOnArrivalParam, "LOOM_TCP_REDUCE_ON_ARRIVAL", 1,
               "1: a collective's reduce steps over TCP reduce each run of bytes as it is read, while in cache "
               "(core/receive_consumer.hpp); 0: the chunk lands in a staging buffer and is reduced from there");

}  // namespace

LinkProperties TcpTransport::linkProperties() {
  LinkProperties p;
  p.latencyUs = static_cast<double>(latencyParam());
  p.gbps = static_cast<double>(std::max<int64_t>(1, bandwidthParam())) / 1000.0;
  p.ringChunkBytes = size_t{2} << 20;
  p.parallelChannels = true;
  return p;
}

TcpTransport::TcpTransport() = default;

TcpTransport::~TcpTransport() {
  if (engine_ != nullptr)
    for (auto& l : listeners_)
      if (l.valid()) engine_->remove(l.fd());
}

SockAddr TcpTransport::listenAddress(size_t i) const { return localAddress(listeners_.at(i).fd()); }

namespace {

// One entry per interface, all of the first entry's family (a socket joins two of the same).
std::vector<Interface> usableInterfaces() {
  std::vector<Interface> out;
  for (const auto& i : selectedInterfaces()) {
    if (!out.empty() && i.addr.family() != out.front().addr.family()) continue;
    bool seen = false;
    for (const auto& o : out) seen = seen || o.name == i.name;
    if (!seen) out.push_back(i);
  }
  return out;
}

// The endpoint record: a count, then per interface its address (SockAddr wire form) and name.
Bytes encodeEndpoints(const std::vector<std::pair<SockAddr, std::string>>& eps) {
  Bytes b(1, static_cast<uint8_t>(eps.size()));
  for (const auto& [addr, name] : eps) {
    const size_t at = b.size();
    b.resize(at + SockAddr::kWireBytes);
    addr.toWire(b.data() + at);
    b.push_back(static_cast<uint8_t>(std::min<size_t>(name.size(), 255)));
    b.insert(b.end(), name.begin(), name.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(name.size(), 255)));
  }
  return b;
}

bool decodeEndpoints(const Bytes& b, Endpoints* eps) {
  eps->clear();
  if (b.empty() || b[0] == 0) return false;
  size_t at = 1;
  for (int i = 0; i < b[0]; ++i) {
    SockAddr addr;
    if (at + SockAddr::kWireBytes + 1 > b.size() || !SockAddr::fromWire(b.data() + at, &addr)) return false;
    at += SockAddr::kWireBytes;
    const size_t len = b[at++];
    if (at + len > b.size()) return false;
    eps->emplace_back(addr, std::string(b.begin() + static_cast<std::ptrdiff_t>(at),
                                        b.begin() + static_cast<std::ptrdiff_t>(at + len)));
    at += len;
  }
  return true;
}

}  // namespace

void TcpTransport::publish(TransportContext& ctx) {
  ifaces_ = usableInterfaces();
  std::vector<std::pair<SockAddr, std::string>> eps;
  for (const auto& iface : ifaces_) {
    SockAddr bindAddr = iface.addr;
    bindAddr.setPort(0);
    int err = 0;
    listeners_.push_back(listenOn(bindAddr, 1024, &err));
    if (!listeners_.back().valid()) {
      LOOM_THROW(ErrorCode::System, ctx.rank,
                 strFormat("cannot listen on %s (%s): %s%s", bindAddr.host().c_str(), iface.name.c_str(),
                           errnoText(err).c_str(), listenAdvice(err).c_str()));
    }
    eps.emplace_back(localAddress(listeners_.back().fd()), iface.name);
  }
  ctx.store->set("tcp/" + std::to_string(ctx.rank), encodeEndpoints(eps));
  if (ctx.rank == 0 || logLevel() >= LogLevel::Trace) {
    std::string list;
    for (const auto& [addr, name] : eps) list += (list.empty() ? "" : ", ") + name + " " + addr.host();
    const std::string spec = socketIfnameSetting();
    LOOM_INFO("tcp: %s %s%s%s", ifaces_.size() == 1 ? "using" : "striping sockets over", list.c_str(),
              !spec.empty() ? " (LOOM_SOCKET_IFNAME="
                            : " (every interface up but lo and docker*; LOOM_SOCKET_IFNAME "
                              "narrows it",
              !spec.empty() ? (spec + ")").c_str() : ")");
  }
}

namespace {

TcpOptions optionsFromSettings() {
  TcpOptions options;
  options.eagerBytes = static_cast<size_t>(std::clamp<int64_t>(eagerBytesParam(), 0, kMaxEagerBytes));
  options.readyBytes = static_cast<size_t>(std::clamp<int64_t>(readyBytesParam(), 0, kMaxPushBytes));
  options.pushBytes = static_cast<size_t>(std::clamp<int64_t>(pushBytesParam(), 0, kMaxEagerBytes));
  options.readsPerEvent = static_cast<int>(std::clamp<int64_t>(readsPerEventParam(), 1, 1 << 20));
  options.quickAck = quickAckParam() != 0;
  options.lowWater = static_cast<size_t>(std::clamp<int64_t>(lowWaterParam(), 0, 16 << 20));
  options.consume = reduceOnArrivalParam() != 0;
  return options;
}

// "rank 0 <-> rank 1: tcp, 2 sockets, via eth0 198.18.0.1 -> 198.18.0.2:41234, eth1 198.18.1.1 ->
// 198.18.1.2:38001": each interface pair the sockets use, seen from the rank that connected.
std::string describeLink(int rank, int peer, int sockets, const std::vector<Interface>& mine, const Endpoints& theirs) {
  const bool outbound = peer > rank;
  const size_t pairs = std::min<size_t>(static_cast<size_t>(sockets), std::max(mine.size(), theirs.size()));
  std::string via;
  for (size_t k = 0; k < pairs; ++k) {
    const Interface& me = mine[k % mine.size()];
    const auto& them = theirs[k % theirs.size()];
    via += (via.empty() ? "" : ", ") + me.name + " " + me.addr.host() + (outbound ? " -> " : " <- ") +
           (outbound ? them.first.toString() : them.first.host() + " (" + them.second + ")");
  }
  return strFormat("rank %d <-> rank %d: tcp, %d socket%s, via %s", rank, peer, sockets, sockets == 1 ? "" : "s",
                   via.c_str());
}

}  // namespace

namespace {

// The peers' endpoints, as they published them (one store request).
std::map<int, Endpoints> publishedEndpoints(const TransportContext& ctx, const std::vector<int>& peers) {
  std::map<int, Endpoints> remote;
  std::vector<std::string> keys;
  for (int peer : peers) keys.push_back("tcp/" + std::to_string(peer));
  std::vector<Bytes> values;
  std::vector<std::string> absent;
  const bool all = ctx.store->getAll(keys, ctx.deadline, &values, &absent);
  for (size_t i = 0; i < peers.size(); ++i) {
    const int peer = peers[i];
    const bool missing = std::find(absent.begin(), absent.end(), keys[i]) != absent.end();
    if ((!all && missing) || !decodeEndpoints(values[i], &remote[peer])) {
      LOOM_THROW_PEER(ErrorCode::Timeout, ctx.rank, peer,
                      strFormat("rank %d did not publish its TCP address within %.0f s%s", peer,
                                ctx.deadline.totalSeconds(), missing ? "" : " (what it published does not parse)"));
    }
  }
  return remote;
}

}  // namespace

void TcpTransport::linkOnDemand(TransportContext& ctx, const std::vector<int>& peers, LinkSink* sink) {
  engine_ = ctx.engine;
  const int sockets = ctx.socketsPerPeer;
  auto remote = std::make_shared<const std::map<int, Endpoints>>(publishedEndpoints(ctx, peers));
  const TcpOptions options = optionsFromSettings();
  // Each link's sockets become its connection; the context's fields are copied (it is gone after init).
  OnDemandLinks::Former form = [this, rank = ctx.rank, sockets, remote, options, engine = ctx.engine,
                                sendEngine = ctx.sendEngine, failure = ctx.failure, lastWordOf = ctx.lastWordOf,
                                sink](int peer, std::vector<Socket> socks, double tookMs) {
    auto conn =
        std::make_unique<TcpConnection>(rank, peer, std::move(socks), engine, sendEngine, failure, options,
                                        describeLink(rank, peer, sockets, ifaces_, remote->at(peer)), lastWordOf);
    sink->adopt(peer, *conn);
    conn->start();
    LOOM_INFO("%s (linked on first use, in %.1f ms)", conn->describe().c_str(), tookMs);
    sink->linked(peer, std::move(conn));
  };
  onDemand_ = std::make_unique<OnDemandLinks>(ctx, ifaces_, listeners_, remote, sink, std::move(form), "peer port");
}

void TcpTransport::linkTo(int peer) noexcept {
  if (onDemand_) onDemand_->linkTo(peer);
}

std::vector<std::unique_ptr<Connection>> TcpTransport::connect(TransportContext& ctx, const std::vector<int>& peers) {
  engine_ = ctx.engine;
  // 1. The peers' endpoints, as they published them.
  std::map<int, Endpoints> remote = publishedEndpoints(ctx, peers);
  // 2. Every socket of every link, connected or accepted, and proved (sockets/handshake.hpp).
  Handshakes handshakes(ctx, ifaces_, listeners_);
  std::map<int, std::vector<Socket>> sockets = handshakes.run(remote);
  // 3. The connections; from now on the listeners turn newcomers away.
  const TcpOptions options = optionsFromSettings();
  std::vector<std::unique_ptr<Connection>> out;
  for (int peer : peers) {
    auto conn = std::make_unique<TcpConnection>(
        ctx.rank, peer, std::move(sockets[peer]), ctx.engine, ctx.sendEngine, ctx.failure, options,
        describeLink(ctx.rank, peer, ctx.socketsPerPeer, ifaces_, remote[peer]), ctx.lastWordOf);
    conn->start();
    out.push_back(std::move(conn));
  }
  for (auto& l : listeners_) {
    rejectors_.push_back(std::make_unique<StrayRejector>(l.fd(), ctx.rank, "peer port"));
    ctx.engine->add(l.fd(), rejectors_.back().get(), EPOLLIN);
  }
  if (handshakes.rejected() > 0)
    LOOM_INFO("tcp: turned away %d stray connection(s) during setup", handshakes.rejected());
  return out;
}

}  // namespace tcp
}  // namespace loom
