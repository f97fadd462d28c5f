#include "transport/sockets/handshake.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "bootstrap/auth.hpp"
#include "bootstrap/store_protocol.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/status.hpp"

namespace loom {
namespace sockets {
namespace {

LOOM_PARAM_INT(socketBufferBytes, "LOOM_SOCKET_BUFFER", 0,
               "SO_SNDBUF/SO_RCVBUF bytes of data sockets (0: the kernel's autotuning, usually best)");
LOOM_PARAM_INT(keepaliveParam, "LOOM_TCP_KEEPALIVE_S", 10,
               "seconds of silence before TCP probes a peer link (then every fifth of it, 3 times); 0: off");

constexpr char kAcceptorMagic[8] = {'L', 'O', 'O', 'M', 'P', 'E', 'A', '1'};
constexpr char kConnectorMagic[8] = {'L', 'O', 'O', 'M', 'P', 'E', 'C', '1'};
using wire::kAcceptorHello;
using wire::kConnectorHello;
using wire::kIdsBytes;
using wire::kProof;
// How long an inbound stranger may take to prove itself before it is turned away.
constexpr std::chrono::seconds kStrangerGrace(10);
constexpr std::chrono::milliseconds kRetryAfter(50);

void encodeIds(const wire::Ids& ids, uint8_t* out) {
  std::memcpy(out, ids.commId.data(), 16);
  storewire::putU32(out + 16, ids.from);
  storewire::putU32(out + 20, ids.to);
  storewire::putU32(out + 24, ids.index);
  storewire::putU32(out + 28, ids.count);
}

wire::Ids decodeIds(const uint8_t* in) {
  wire::Ids ids;
  std::memcpy(ids.commId.data(), in, 16);
  ids.from = storewire::getU32(in + 16);
  ids.to = storewire::getU32(in + 20);
  ids.index = storewire::getU32(in + 24);
  ids.count = storewire::getU32(in + 28);
  return ids;
}

}  // namespace

namespace wire {

void acceptorHello(const Nonce& mine, uint8_t out[kAcceptorHello]) {
  std::memcpy(out, kAcceptorMagic, 8);
  std::memcpy(out + 8, mine.data(), 16);
}

bool acceptorMagic(const uint8_t* msg, size_t n) {
  return std::memcmp(msg, kAcceptorMagic, std::min<size_t>(n, 8)) == 0;
}

bool connectorMagic(const uint8_t* msg, size_t n) {
  return std::memcmp(msg, kConnectorMagic, std::min<size_t>(n, 8)) == 0;
}

void connectorHello(const JobKey& key, const uint8_t* hello, const Ids& ids, Nonce* mine, Nonce* theirs,
                    uint8_t out[kConnectorHello]) {
  std::memcpy(theirs->data(), hello + 8, 16);
  *mine = randomNonce();
  std::memcpy(out, kConnectorMagic, 8);
  std::memcpy(out + 8, mine->data(), 16);
  encodeIds(ids, out + 24);
  Mac mac = computeMac(key, "peer-client", *theirs, *mine, out + 24, kIdsBytes);
  std::memcpy(out + 24 + kIdsBytes, mac.data(), 32);
}

bool checkConnectorHello(const JobKey& key, const Nonce& mine, const uint8_t* msg, Ids* ids, Nonce* theirs) {
  std::memcpy(theirs->data(), msg + 8, 16);
  const uint8_t* idsBytes = msg + 24;
  if (!macEqual(computeMac(key, "peer-client", mine, *theirs, idsBytes, kIdsBytes), idsBytes + kIdsBytes)) return false;
  *ids = decodeIds(idsBytes);
  return true;
}

void acceptorAnswer(const JobKey& key, const Nonce& mine, const Nonce& theirs, const Ids& ids, bool yield,
                    uint8_t out[kProof]) {
  uint8_t idsBytes[kIdsBytes];
  encodeIds(ids, idsBytes);
  Mac mac = computeMac(key, yield ? "peer-yield" : "peer-server", theirs, mine, idsBytes, kIdsBytes);
  std::memcpy(out, mac.data(), kProof);
}

Answer checkAcceptorAnswer(const JobKey& key, const Nonce& mine, const Nonce& theirs, const Ids& ids,
                           const uint8_t* msg) {
  uint8_t idsBytes[kIdsBytes];
  encodeIds(ids, idsBytes);
  if (macEqual(computeMac(key, "peer-server", mine, theirs, idsBytes, kIdsBytes), msg)) return Answer::Proof;
  if (macEqual(computeMac(key, "peer-yield", mine, theirs, idsBytes, kIdsBytes), msg)) return Answer::Yield;
  return Answer::Wrong;
}

}  // namespace wire

int HandshakeSocket::readStep(size_t need) {
  uint8_t tmp[wire::kConnectorHello];
  const size_t want = std::min(need - std::min(need, buf.size()), sizeof tmp);
  const ssize_t n = ::recv(sock.fd(), tmp, want, MSG_DONTWAIT);
  if (n == 0) {
    errno = 0;
    return -1;
  }
  if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
  buf.insert(buf.end(), tmp, tmp + n);
  return buf.size() >= need ? 1 : 0;
}

Socket dialFrom(const Interface& from, const SockAddr& target, std::string* error) {
  Socket s(::socket(target.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) {
    const int err = errno;
    *error = "socket: " + errnoText(err);
    errno = err;
    return s;
  }
  SockAddr local = from.addr;
  local.setPort(0);
  if (local.family() == target.family()) {
    // The port is picked at connect(), unique per peer address (not per host): a bind that
    // picks it reserves a port of its own for every socket, and a large job's sockets with those
    // its earlier runs left in TIME_WAIT use up the ephemeral range.
    int one = 1;
    (void)::setsockopt(s.fd(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    (void)::bind(s.fd(), local.raw(), local.length());
  }
  if (::connect(s.fd(), target.raw(), target.length()) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    *error = strFormat("%s: %s", target.toString().c_str(), errnoText(err).c_str());
    s.reset();
    errno = err;
  }
  return s;
}

// One socket being set up, either direction.
struct Handshakes::Pending : HandshakeSocket {
  enum State { Connecting, ReadHello, ReadProof, ReadClientHello, Done } state;
  Clock::time_point retryAt;
  SockAddr target;  // connecting: the peer's listener for this socket
  size_t from = 0;  // connecting: this rank's interface for it
};

void StrayRejector::onPollEvents(uint32_t) noexcept {
  for (;;) {
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) return;
    LOOM_WARN("rejected a connection from %s on rank %d's %s: the communicator is already formed",
              peerAddress(c).toString().c_str(), rank_, what_);
    ::close(c);
  }
}

void tuneDataSocket(int fd) {
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

Handshakes::Handshakes(const TransportContext& ctx, const std::vector<Interface>& ifaces,
                       const std::vector<Socket>& listeners)
    : ctx_(ctx), ifaces_(ifaces), listeners_(listeners), sockets_(ctx.socketsPerPeer) {}

Handshakes::~Handshakes() = default;

std::map<int, std::vector<Socket>> Handshakes::run(const std::map<int, Endpoints>& peers) {
  startConnects(peers);
  while (missing() > 0) {
    if (ctx_.failure && ctx_.failure->failed()) throw ctx_.failure->first().toError(ctx_.rank);
    if (ctx_.deadline.expired()) throwTimeout();
    connectDue();
    // Poll the listeners, then every pending socket (fd -1, ignored by poll, for one that waits to
    // retry its connect).
    std::vector<pollfd> fds;
    for (const auto& l : listeners_) fds.push_back({l.fd(), POLLIN, 0});
    const size_t nl = listeners_.size();
    for (auto& p : pending_)
      fds.push_back(p->sock.valid() ? pollfd{p->sock.fd(),
                                             static_cast<short>(p->state == Pending::Connecting ? POLLOUT : POLLIN), 0}
                                    : pollfd{-1, 0, 0});
    int rc = ::poll(fds.data(), fds.size(), std::min(ctx_.deadline.remainingMs(), 50));
    if (rc < 0 && errno != EINTR) LOOM_THROW(ErrorCode::System, ctx_.rank, "poll: " + errnoText(errno));
    const size_t polled = pending_.size();  // newcomers accepted below wait for the next poll
    for (size_t li = 0; li < nl; ++li)
      if ((fds[li].revents & POLLIN) != 0) acceptNewcomers(li);
    for (size_t i = 0; i < polled; ++i) {
      Pending& p = *pending_[i];
      if (fds[i + nl].revents != 0 && p.sock.valid()) advance(p, fds[i + nl].revents);
    }
    forgetStale();
  }
  return std::move(done_);
}

void Handshakes::startConnects(const std::map<int, Endpoints>& peers) {
  for (const auto& [peer, eps] : peers) {
    done_[peer] = std::vector<Socket>(static_cast<size_t>(sockets_));
    if (peer < ctx_.rank) {
      inbound_.insert(peer);
      continue;
    }
    for (int k = 0; k < sockets_; ++k) {
      auto p = std::make_unique<Pending>();
      p->state = Pending::Connecting;
      p->peer = peer;
      p->index = k;
      p->target = eps[static_cast<size_t>(k) % eps.size()].first;
      p->from = static_cast<size_t>(k) % ifaces_.size();
      p->remote = p->target.toString();
      p->since = p->retryAt = Clock::now();
      pending_.push_back(std::move(p));
    }
  }
}

void Handshakes::connectDue() {
  const auto now = Clock::now();
  for (auto& p : pending_) {
    if (p->state != Pending::Connecting || p->sock.valid() || now < p->retryAt) continue;
    Socket s = dialFrom(ifaces_[p->from], p->target, &lastError_);
    if (!s.valid()) {
      p->retryAt = now + kRetryAfter;
      continue;
    }
    p->sock = std::move(s);
  }
}

void Handshakes::acceptNewcomers(size_t listener) {
  for (;;) {
    int c = accept4(listeners_[listener].fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) return;
    auto p = std::make_unique<Pending>();
    p->state = Pending::ReadClientHello;
    p->sock.reset(c);
    p->remote = peerAddress(c).toString();
    p->since = Clock::now();
    p->mine = randomNonce();
    uint8_t hello[kAcceptorHello];
    wire::acceptorHello(p->mine, hello);
    if (sendAll(c, hello, sizeof(hello), Deadline(std::chrono::milliseconds(1000))) != 0) continue;
    pending_.push_back(std::move(p));
  }
}

void Handshakes::advance(Pending& p, short revents) {
  (void)revents;
  if (p.state == Pending::Connecting) {
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    getsockopt(p.sock.fd(), SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr != 0) return drop(p, errnoText(soerr), false);
    p.state = Pending::ReadHello;
    return;
  }
  // Read what the current state still needs.
  const size_t need = p.state == Pending::ReadHello   ? kAcceptorHello
                      : p.state == Pending::ReadProof ? kProof
                                                      : kConnectorHello;
  const int step = p.readStep(need);
  if (step < 0)
    return drop(p, errno == 0 ? "closed during the handshake" : errnoText(errno), p.state == Pending::ReadClientHello);
  const bool magic = p.state == Pending::ReadHello ? wire::acceptorMagic(p.buf.data(), p.buf.size())
                                                   : wire::connectorMagic(p.buf.data(), p.buf.size());
  if (p.state != Pending::ReadProof && !magic) {
    if (p.state == Pending::ReadClientHello)
      return drop(p, "it does not speak Loom's protocol (a stray client or port scanner?)", true);
    LOOM_THROW_PEER(ErrorCode::Remote, ctx_.rank, p.peer,
                    strFormat("%s, published as rank %d's address, is not a Loom peer", p.remote.c_str(), p.peer));
  }
  if (step == 0) return;
  switch (p.state) {
    case Pending::ReadHello:
      return onAcceptorHello(p);
    case Pending::ReadProof:
      return onAcceptorProof(p);
    default:
      return onConnectorHello(p);
  }
}

// Connecting side: the acceptor's nonce came; send ours, the ids and the proof of the key.
void Handshakes::onAcceptorHello(Pending& p) {
  uint8_t msg[kConnectorHello];
  wire::connectorHello(ctx_.key, p.buf.data(), idsOf(p), &p.mine, &p.theirs, msg);
  if (sendAll(p.sock.fd(), msg, sizeof(msg), Deadline(std::chrono::milliseconds(5000))) != 0)
    return drop(p, "handshake send failed", false);
  p.state = Pending::ReadProof;
  p.buf.clear();
}

// Connecting side: the acceptor proved the same key for these ids: the socket is formed.
void Handshakes::onAcceptorProof(Pending& p) {
  if (wire::checkAcceptorAnswer(ctx_.key, p.mine, p.theirs, idsOf(p), p.buf.data()) != wire::Answer::Proof) {
    LOOM_THROW_PEER(ErrorCode::InvalidUsage, ctx_.rank, p.peer,
                    strFormat("the process at %s (rank %d's published address) proved a different job key: are "
                              "two jobs mixed up? give every rank of a job the same LOOM_JOB_KEY",
                              p.remote.c_str(), p.peer));
  }
  finish(p, p.peer, static_cast<size_t>(p.index));
}

// Accepting side: check the connector's proof and identity, then prove ours.
void Handshakes::onConnectorHello(Pending& p) {
  wire::Ids ids;
  if (!wire::checkConnectorHello(ctx_.key, p.mine, p.buf.data(), &ids, &p.theirs))
    return drop(p, "wrong job key (another job, or a stray client)", true);
  if (ids.commId != ctx_.commId) return drop(p, "it belongs to another communicator of this job", true);
  const int from = static_cast<int>(ids.from);
  if (ids.to != static_cast<uint32_t>(ctx_.rank) || inbound_.count(from) == 0 ||
      ids.count != static_cast<uint32_t>(sockets_) || ids.index >= static_cast<uint32_t>(sockets_) ||
      done_[from][ids.index].valid()) {
    return drop(
        p, strFormat("unexpected link (from %u to %u, socket %u of %u)", ids.from, ids.to, ids.index, ids.count), true);
  }
  uint8_t proof[kProof];
  wire::acceptorAnswer(ctx_.key, p.mine, p.theirs, ids, false, proof);
  if (sendAll(p.sock.fd(), proof, sizeof(proof), Deadline(std::chrono::milliseconds(5000))) != 0)
    return drop(p, "handshake send failed", true);
  finish(p, from, ids.index);
}

wire::Ids Handshakes::idsOf(const Pending& p) const {
  return wire::Ids{ctx_.commId, static_cast<uint32_t>(ctx_.rank), static_cast<uint32_t>(p.peer),
                   static_cast<uint32_t>(p.index), static_cast<uint32_t>(sockets_)};
}

void Handshakes::drop(Pending& p, const std::string& why, bool stray) {
  if (stray) {
    ++rejected_;
    LOOM_WARN("rejected a connection from %s on the peer port: %s", p.remote.c_str(), why.c_str());
    p.state = Pending::Done;
  } else {
    lastError_ = p.remote + ": " + why;
    p.retryAt = Clock::now() + kRetryAfter;
    p.state = Pending::Connecting;
    p.buf.clear();
  }
  p.sock.reset();
}

void Handshakes::finish(Pending& p, int peer, size_t index) {
  tuneDataSocket(p.sock.fd());
  done_[peer][index] = std::move(p.sock);
  p.state = Pending::Done;
}

void Handshakes::forgetStale() {
  const auto cutoff = Clock::now() - kStrangerGrace;
  for (auto& p : pending_) {
    if (p->state == Pending::ReadClientHello && p->since < cutoff) {
      ++rejected_;
      LOOM_WARN("rejected a connection from %s on the peer port: no handshake within %lld s", p->remote.c_str(),
                static_cast<long long>(kStrangerGrace.count()));
      p->state = Pending::Done;
      p->sock.reset();
    }
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const std::unique_ptr<Pending>& p) { return p->state == Pending::Done; }),
                 pending_.end());
}

size_t Handshakes::missing() const {
  size_t n = 0;
  for (const auto& [peer, socks] : done_)
    for (const auto& s : socks)
      if (!s.valid()) ++n;
  return n;
}

void Handshakes::throwTimeout() const {
  std::string out, in;
  for (const auto& [peer, socks] : done_) {
    size_t have = 0;
    for (const auto& s : socks) have += s.valid() ? 1 : 0;
    if (have == socks.size()) continue;
    std::string& list = peer > ctx_.rank ? out : in;
    list += (list.empty() ? "" : ", ") + std::to_string(peer);
  }
  LOOM_THROW(
      ErrorCode::Timeout, ctx_.rank,
      strFormat("TCP links not formed within %.0f s: %s%s%s%s%s%s (a firewall between nodes, or the wrong "
                "interface? see LOOM_SOCKET_IFNAME)",
                ctx_.deadline.totalSeconds(), out.empty() ? "" : "could not connect to rank(s) ", out.c_str(),
                (!out.empty() && !in.empty()) ? "; " : "", in.empty() ? "" : "no connection arrived from rank(s) ",
                in.c_str(), lastError_.empty() ? "" : (" — last error: " + lastError_).c_str()));
}

}  // namespace sockets
}  // namespace loom
