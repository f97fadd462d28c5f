#include "transport/tcp/tcp_transport.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

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
#include "transport/tcp/tcp_connection.hpp"

namespace loom {
namespace tcp {
namespace {

LOOM_PARAM_INT(latencyParam, "LOOM_TCP_LATENCY_US", 40, "cost model: microseconds per message over TCP");
LOOM_PARAM_INT(bandwidthParam, "LOOM_TCP_MBPS", 1500, "cost model: MB/s per TCP link");
LOOM_PARAM_INT(socketBufferBytes, "LOOM_SOCKET_BUFFER", 0,
               "SO_SNDBUF/SO_RCVBUF bytes of data sockets (0: the kernel's autotuning, usually best)");
LOOM_PARAM_INT(readsPerEventParam, "LOOM_TCP_READS_PER_EVENT", 64,
               "recv calls per readable socket event before the engine turns to other sockets");
LOOM_PARAM_INT(readyBytesParam, "LOOM_READY_BYTES", 64 << 20,
               "largest message sent at once (no RTS/CTS round trip) when the receiver said its receive is posted "
               "(max 1 GiB); 0: never");
LOOM_PARAM_INT(keepaliveParam, "LOOM_TCP_KEEPALIVE_S", 10,
               "seconds of silence before TCP probes a peer link (then every fifth of it, 3 times); 0: off");
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

constexpr char kAcceptorMagic[8] = {'L', 'O', 'O', 'M', 'P', 'E', 'A', '1'};
constexpr char kConnectorMagic[8] = {'L', 'O', 'O', 'M', 'P', 'E', 'C', '1'};
constexpr size_t kAcceptorHello = 24;
constexpr size_t kIdsBytes = 32;
constexpr size_t kConnectorHello = 8 + 16 + kIdsBytes + 32;
constexpr size_t kProof = 32;

struct Ids {
  Nonce commId;
  uint32_t from, to, index, count;
};

void encodeIds(const Ids& ids, uint8_t* out) {
  std::memcpy(out, ids.commId.data(), 16);
  storewire::putU32(out + 16, ids.from);
  storewire::putU32(out + 20, ids.to);
  storewire::putU32(out + 24, ids.index);
  storewire::putU32(out + 28, ids.count);
}

Ids decodeIds(const uint8_t* in) {
  Ids ids;
  std::memcpy(ids.commId.data(), in, 16);
  ids.from = storewire::getU32(in + 16);
  ids.to = storewire::getU32(in + 20);
  ids.index = storewire::getU32(in + 24);
  ids.count = storewire::getU32(in + 28);
  return ids;
}

// One socket being set up, either direction.
struct Pending {
  enum State { Connecting, ReadHello, ReadProof, ReadClientHello, Done } state;
  Socket sock;
  int peer = -1;
  int index = 0;
  Nonce mine{};
  Nonce theirs{};
  std::vector<uint8_t> buf;
  Clock::time_point since;
  Clock::time_point retryAt;
  std::string remote;
  SockAddr target;  // connecting: the peer's listener for this socket
  size_t from = 0;  // connecting: this rank's interface for it
};

void tune(int fd) {
  setNoDelay(fd);
  setBufferSizes(fd, static_cast<int>(socketBufferBytes()));
  // A heartbeat on idle links: a peer host that vanished without a word (power, network) shows
  // as an error after the keepalive probes go unanswered, and unacknowledged data gives up as
  // soon; a killed process is seen at once anyway (its kernel resets the connection).
  const int idle = static_cast<int>(std::clamp<int64_t>(keepaliveParam(), 0, 3600));
  if (idle > 0) {
    int one = 1, interval = std::max(1, idle / 5), count = 3;
    unsigned userTimeout = static_cast<unsigned>(idle + interval * count) * 1000u;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeout, sizeof userTimeout);
  }
}

}  // namespace

LinkProperties TcpTransport::linkProperties() {
  LinkProperties p;
  p.latencyUs = static_cast<double>(latencyParam());
  p.gbps = static_cast<double>(std::max<int64_t>(1, bandwidthParam())) / 1000.0;
  p.ringChunkBytes = size_t{2} << 20;
  p.parallelChannels = true;
  return p;
}

class TcpTransport::StrayRejector : public PollHandler {
 public:
  StrayRejector(int fd, int rank) : fd_(fd), rank_(rank) {}
  void onPollEvents(uint32_t) noexcept override {
    for (;;) {
      int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) return;
      LOOM_WARN("rejected a connection from %s on rank %d's peer port: the communicator is already formed",
                peerAddress(c).toString().c_str(), rank_);
      ::close(c);
    }
  }

 private:
  int fd_;
  int rank_;
};

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

bool decodeEndpoints(const Bytes& b, std::vector<std::pair<SockAddr, std::string>>* eps) {
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

std::vector<std::unique_ptr<Connection>> TcpTransport::connect(TransportContext& ctx, const std::vector<int>& peers) {
  engine_ = ctx.engine;
  const int S = ctx.socketsPerPeer;
  std::map<int, std::vector<Socket>> done;                                 // peer -> sockets by index
  std::map<int, std::vector<std::pair<SockAddr, std::string>>> remoteEps;  // peer -> its interfaces
  std::vector<std::unique_ptr<Pending>> pending;
  std::set<int> inboundPeers;

  // Learn the peers' endpoints and start connecting to the higher ranks: socket k from this
  // rank's interface k mod (its count) to the peer's interface k mod (the peer's count).
  for (int peer : peers) {
    done[peer] = std::vector<Socket>(static_cast<size_t>(S));
    auto ep = ctx.store->get("tcp/" + std::to_string(peer), ctx.deadline);
    if (!ep || !decodeEndpoints(*ep, &remoteEps[peer])) {
      LOOM_THROW_PEER(
          ErrorCode::Timeout, ctx.rank, peer,
          strFormat("rank %d did not publish its TCP address within %.0f s", peer, ctx.deadline.totalSeconds()));
    }
    if (peer < ctx.rank) {
      inboundPeers.insert(peer);
      continue;
    }
    for (int k = 0; k < S; ++k) {
      auto p = std::make_unique<Pending>();
      p->state = Pending::Connecting;
      p->peer = peer;
      p->index = k;
      p->target = remoteEps[peer][static_cast<size_t>(k) % remoteEps[peer].size()].first;
      p->from = static_cast<size_t>(k) % ifaces_.size();
      p->remote = p->target.toString();
      p->since = p->retryAt = Clock::now();
      pending.push_back(std::move(p));
    }
  }

  auto missing = [&]() {
    size_t n = 0;
    for (auto& [peer, socks] : done)
      for (auto& s : socks)
        if (!s.valid()) ++n;
    return n;
  };
  std::string lastError;
  int rejected = 0;

  while (missing() > 0) {
    if (ctx.failure && ctx.failure->failed()) throw ctx.failure->first().toError(ctx.rank);
    if (ctx.deadline.expired()) {
      std::string out, in;
      for (auto& [peer, socks] : done) {
        size_t have = 0;
        for (auto& s : socks) have += s.valid() ? 1 : 0;
        if (have == socks.size()) continue;
        std::string& list = peer > ctx.rank ? out : in;
        list += (list.empty() ? "" : ", ") + std::to_string(peer);
      }
      LOOM_THROW(
          ErrorCode::Timeout, ctx.rank,
          strFormat("TCP links not formed within %.0f s: %s%s%s%s%s%s (a firewall between nodes, or the wrong "
                    "interface? see LOOM_SOCKET_IFNAME)",
                    ctx.deadline.totalSeconds(), out.empty() ? "" : "could not connect to rank(s) ", out.c_str(),
                    (!out.empty() && !in.empty()) ? "; " : "", in.empty() ? "" : "no connection arrived from rank(s) ",
                    in.c_str(), lastError.empty() ? "" : (" — last error: " + lastError).c_str()));
    }
    // Start connects that are due.
    const auto now = Clock::now();
    for (auto& p : pending) {
      if (p->state != Pending::Connecting || p->sock.valid() || now < p->retryAt) continue;
      Socket s(::socket(p->target.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      // From this rank's interface for the socket, so that each socket keeps to its rail.
      SockAddr from = ifaces_[p->from].addr;
      from.setPort(0);
      if (from.family() == p->target.family()) (void)::bind(s.fd(), from.raw(), from.length());
      if (::connect(s.fd(), p->target.raw(), p->target.length()) != 0 && errno != EINPROGRESS) {
        lastError = strFormat("%s: %s", p->remote.c_str(), errnoText(errno).c_str());
        p->retryAt = now + std::chrono::milliseconds(50);
        continue;
      }
      p->sock = std::move(s);
    }
    std::vector<pollfd> fds;
    for (const auto& l : listeners_) fds.push_back({l.fd(), POLLIN, 0});
    const size_t nl = listeners_.size();
    for (auto& p : pending) {
      if (!p->sock.valid()) {
        fds.push_back({-1, 0, 0});
        continue;
      }
      fds.push_back({p->sock.fd(), static_cast<short>(p->state == Pending::Connecting ? POLLOUT : POLLIN), 0});
    }
    int rc = ::poll(fds.data(), fds.size(), std::min(ctx.deadline.remainingMs(), 50));
    if (rc < 0 && errno != EINTR) LOOM_THROW(ErrorCode::System, ctx.rank, "poll: " + errnoText(errno));

    for (size_t li = 0; li < nl; ++li) {
      if ((fds[li].revents & POLLIN) == 0) continue;
      for (;;) {
        int c = accept4(listeners_[li].fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        auto p = std::make_unique<Pending>();
        p->state = Pending::ReadClientHello;
        p->sock.reset(c);
        p->remote = peerAddress(c).toString();
        p->since = Clock::now();
        p->mine = randomNonce();
        uint8_t hello[kAcceptorHello];
        std::memcpy(hello, kAcceptorMagic, 8);
        std::memcpy(hello + 8, p->mine.data(), 16);
        if (sendAll(c, hello, sizeof(hello), Deadline(std::chrono::milliseconds(1000))) != 0) continue;
        pending.push_back(std::move(p));
      }
    }

    for (size_t i = 0; i < pending.size() && i + nl < fds.size(); ++i) {
      Pending& p = *pending[i];
      const short rev = fds[i + nl].revents;
      if (rev == 0 || !p.sock.valid()) continue;
      auto drop = [&](const std::string& why, bool stray) {
        if (stray) {
          ++rejected;
          LOOM_WARN("rejected a connection from %s on the peer port: %s", p.remote.c_str(), why.c_str());
          p.state = Pending::Done;
        } else {
          lastError = p.remote + ": " + why;
          p.retryAt = Clock::now() + std::chrono::milliseconds(50);
          p.state = Pending::Connecting;
          p.buf.clear();
        }
        p.sock.reset();
      };
      if (p.state == Pending::Connecting) {
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        getsockopt(p.sock.fd(), SOL_SOCKET, SO_ERROR, &soerr, &len);
        if (soerr != 0) {
          drop(errnoText(soerr), false);
          continue;
        }
        p.state = Pending::ReadHello;
        continue;
      }
      // Read what the current state still needs.
      size_t need = p.state == Pending::ReadHello   ? kAcceptorHello
                    : p.state == Pending::ReadProof ? kProof
                                                    : kConnectorHello;
      uint8_t tmp[kConnectorHello];
      ssize_t n = ::recv(p.sock.fd(), tmp, need - p.buf.size(), MSG_DONTWAIT);
      if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        const bool inbound = p.state == Pending::ReadClientHello;
        drop(n == 0 ? "closed during the handshake" : errnoText(errno), inbound);
        continue;
      }
      p.buf.insert(p.buf.end(), tmp, tmp + n);
      const char* magic = p.state == Pending::ReadHello ? kAcceptorMagic : kConnectorMagic;
      if (p.state != Pending::ReadProof && std::memcmp(p.buf.data(), magic, std::min<size_t>(p.buf.size(), 8)) != 0) {
        if (p.state == Pending::ReadClientHello) {
          drop("it does not speak Loom's protocol (a stray client or port scanner?)", true);
        } else {
          LOOM_THROW_PEER(
              ErrorCode::Remote, ctx.rank, p.peer,
              strFormat("%s, published as rank %d's address, is not a Loom peer", p.remote.c_str(), p.peer));
        }
        continue;
      }
      if (p.buf.size() < need) continue;

      if (p.state == Pending::ReadHello) {
        std::memcpy(p.theirs.data(), p.buf.data() + 8, 16);
        p.mine = randomNonce();
        Ids ids{ctx.commId, static_cast<uint32_t>(ctx.rank), static_cast<uint32_t>(p.peer),
                static_cast<uint32_t>(p.index), static_cast<uint32_t>(S)};
        uint8_t msg[kConnectorHello];
        std::memcpy(msg, kConnectorMagic, 8);
        std::memcpy(msg + 8, p.mine.data(), 16);
        encodeIds(ids, msg + 24);
        Mac mac = computeMac(ctx.key, "peer-client", p.theirs, p.mine, msg + 24, kIdsBytes);
        std::memcpy(msg + 24 + kIdsBytes, mac.data(), 32);
        p.buf.assign(msg + 24, msg + 24 + kIdsBytes);  // keep the ids for checking the proof
        if (sendAll(p.sock.fd(), msg, sizeof(msg), Deadline(std::chrono::milliseconds(5000))) != 0) {
          drop("handshake send failed", false);
          continue;
        }
        p.state = Pending::ReadProof;
        p.buf.clear();
        continue;
      }
      if (p.state == Pending::ReadProof) {
        uint8_t idsBytes[kIdsBytes];
        encodeIds(Ids{ctx.commId, static_cast<uint32_t>(ctx.rank), static_cast<uint32_t>(p.peer),
                      static_cast<uint32_t>(p.index), static_cast<uint32_t>(S)},
                  idsBytes);
        if (!macEqual(computeMac(ctx.key, "peer-server", p.mine, p.theirs, idsBytes, kIdsBytes), p.buf.data())) {
          LOOM_THROW_PEER(ErrorCode::InvalidUsage, ctx.rank, p.peer,
                          strFormat("the process at %s (rank %d's published address) proved a different job key: are "
                                    "two jobs mixed up? give every rank of a job the same LOOM_JOB_KEY",
                                    p.remote.c_str(), p.peer));
        }
        tune(p.sock.fd());
        done[p.peer][static_cast<size_t>(p.index)] = std::move(p.sock);
        p.state = Pending::Done;
        continue;
      }
      // ReadClientHello: check the connector's proof and identity.
      std::memcpy(p.theirs.data(), p.buf.data() + 8, 16);
      const uint8_t* idsBytes = p.buf.data() + 24;
      Ids ids = decodeIds(idsBytes);
      if (!macEqual(computeMac(ctx.key, "peer-client", p.mine, p.theirs, idsBytes, kIdsBytes), idsBytes + kIdsBytes)) {
        drop("wrong job key (another job, or a stray client)", true);
        continue;
      }
      if (ids.commId != ctx.commId) {
        drop("it belongs to another communicator of this job", true);
        continue;
      }
      const int from = static_cast<int>(ids.from);
      if (ids.to != static_cast<uint32_t>(ctx.rank) || inboundPeers.count(from) == 0 ||
          ids.count != static_cast<uint32_t>(S) || ids.index >= static_cast<uint32_t>(S) ||
          done[from][ids.index].valid()) {
        drop(strFormat("unexpected link (from %u to %u, socket %u of %u)", ids.from, ids.to, ids.index, ids.count),
             true);
        continue;
      }
      Mac proof = computeMac(ctx.key, "peer-server", p.theirs, p.mine, idsBytes, kIdsBytes);
      if (sendAll(p.sock.fd(), proof.data(), proof.size(), Deadline(std::chrono::milliseconds(5000))) != 0) {
        drop("handshake send failed", true);
        continue;
      }
      tune(p.sock.fd());
      done[from][ids.index] = std::move(p.sock);
      p.state = Pending::Done;
    }
    // Forget finished and stale entries (an inbound stranger gets 10 s to prove itself).
    const auto cutoff = Clock::now() - std::chrono::seconds(10);
    for (auto& p : pending) {
      if (p->state == Pending::ReadClientHello && p->since < cutoff) {
        ++rejected;
        LOOM_WARN("rejected a connection from %s on the peer port: no handshake within 10 s", p->remote.c_str());
        p->state = Pending::Done;
        p->sock.reset();
      }
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const std::unique_ptr<Pending>& p) { return p->state == Pending::Done; }),
                  pending.end());
  }

  // Every link is up: build the connections; from now on the listener turns newcomers away.
  TcpOptions options;
  options.eagerBytes = static_cast<size_t>(std::clamp<int64_t>(eagerBytesParam(), 0, kMaxEagerBytes));
  options.readyBytes = static_cast<size_t>(std::clamp<int64_t>(readyBytesParam(), 0, kMaxPushBytes));
  options.pushBytes = static_cast<size_t>(std::clamp<int64_t>(pushBytesParam(), 0, kMaxEagerBytes));
  options.readsPerEvent = static_cast<int>(std::clamp<int64_t>(readsPerEventParam(), 1, 1 << 20));
  options.quickAck = quickAckParam() != 0;
  options.lowWater = static_cast<size_t>(std::clamp<int64_t>(lowWaterParam(), 0, 16 << 20));
  options.consume = reduceOnArrivalParam() != 0;
  std::vector<std::unique_ptr<Connection>> out;
  for (int peer : peers) {
    // "via eth0 198.18.0.1 -> 198.18.0.2:41234, eth1 198.18.1.1 -> 198.18.1.2:38001": each
    // interface pair the sockets use, seen from the rank that connected.
    const auto& theirs = remoteEps[peer];
    const bool outbound = peer > ctx.rank;
    const size_t mine = ifaces_.size(), pairs = std::min<size_t>(static_cast<size_t>(S), std::max(mine, theirs.size()));
    std::string via;
    for (size_t k = 0; k < pairs; ++k) {
      const Interface& me = ifaces_[k % mine];
      const auto& them = theirs[k % theirs.size()];
      via += (via.empty() ? "" : ", ") + me.name + " " + me.addr.host() + (outbound ? " -> " : " <- ") +
             (outbound ? them.first.toString() : them.first.host() + " (" + them.second + ")");
    }
    std::string desc =
        strFormat("rank %d <-> rank %d: tcp, %d socket%s, via %s", ctx.rank, peer, S, S == 1 ? "" : "s", via.c_str());
    auto conn = std::make_unique<TcpConnection>(ctx.rank, peer, std::move(done[peer]), ctx.engine, ctx.sendEngine,
                                                ctx.failure, options, desc, &sleepers_, ctx.lastWordOf);
    conn->start();
    conns_.push_back(conn.get());
    out.push_back(std::move(conn));
  }
  for (auto& l : listeners_) {
    rejectors_.push_back(std::make_unique<StrayRejector>(l.fd(), ctx.rank));
    ctx.engine->add(l.fd(), rejectors_.back().get(), EPOLLIN);
  }
  if (rejected > 0) LOOM_INFO("tcp: turned away %d stray connection(s) during setup", rejected);
  return out;
}

void TcpTransport::waiting(bool on) noexcept {
  if (!on) {
    // The engines disarm themselves at their next event once nothing needs them.
    sleepers_.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  sleepers_.fetch_add(1, std::memory_order_acq_rel);
  for (TcpConnection* c : conns_) c->wakeEngine();
}

}  // namespace tcp
}  // namespace loom
