#include "bootstrap/record_fanout.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "bootstrap/sha256.hpp"
#include "bootstrap/store_protocol.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/status.hpp"
#include "net/interfaces.hpp"

namespace loom {

namespace {

// One message per connection, sender to receiver: magic, from, to, length, proof, then the value.
// The proof covers the communicator, both ranks and the value's digest, so that a replay can only
// deliver the same value to the same rank again; no answer is awaited, so a hop costs the
// receiver one wake-up.
constexpr char kMagic[] = "LOOMFAN2";
constexpr size_t kHead = 8 + 4 + 4 + 8 + 32;
constexpr uint64_t kMaxValue = uint64_t{1} << 30;
constexpr size_t kGrowth = size_t{1} << 20;  // a stranger's length claims no memory it does not send
constexpr size_t kMaxPending = 16;           // connections read at once; more wait in the backlog
constexpr const char* kLabel = "loom fan-out";

Mac proofOf(const JobKey& key, const Nonce& commId, uint32_t from, uint32_t to, uint64_t length,
            const Sha256Digest& digest) {
  uint8_t extra[4 + 4 + 8 + 32];
  storewire::putU32(extra, from);
  storewire::putU32(extra + 4, to);
  storewire::putI64(extra + 8, static_cast<int64_t>(length));
  std::memcpy(extra + 16, digest.data(), digest.size());
  return computeMac(key, kLabel, commId, Nonce{}, extra, sizeof(extra));
}

// Reads what is there toward `need` bytes of *buf without blocking: 1 once it holds them, 0 when
// more must come, -1 when the socket closed or failed.
int readToward(int fd, Bytes* buf, size_t need) {
  while (buf->size() < need) {
    const size_t have = buf->size();
    buf->resize(std::min(need, have + kGrowth));
    const ssize_t n = ::recv(fd, buf->data() + have, buf->size() - have, 0);
    buf->resize(have + static_cast<size_t>(n > 0 ? n : 0));
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
  }
  return 1;
}

}  // namespace

FanOutListener::FanOutListener(const JobKey& key, const Nonce& commId, int rank)
    : key_(key), commId_(commId), rank_(rank) {
  SockAddr bindAddr = selectedInterfaces().front().addr;
  bindAddr.setPort(0);
  int err = 0;
  listener_ = listenOn(bindAddr, 64, &err);
  if (!listener_.valid()) {
    LOOM_THROW(ErrorCode::System, rank,
               strFormat("cannot listen on %s for the records: %s%s", bindAddr.host().c_str(), std::strerror(err),
                         listenAdvice(err).c_str()));
  }
  address_ = localAddress(listener_.fd());
}

std::optional<Bytes> FanOutListener::receive(const Deadline& until) {
  struct Pending {
    Socket sock;
    Bytes head, value;
    uint64_t length = 0;
  };
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign(1, pollfd{listener_.fd(), static_cast<short>(pending.size() < kMaxPending ? POLLIN : 0), 0});
    for (const Pending& p : pending) fds.push_back(pollfd{p.sock.fd(), POLLIN, 0});
    const int rc = ::poll(fds.data(), fds.size(), until.remainingMs());
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return std::nullopt;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Pending& p = pending[i - 1];
      int step = readToward(p.sock.fd(), &p.head, kHead);
      if (step == 1 && p.length == 0 && p.value.empty()) {
        p.length = static_cast<uint64_t>(storewire::getI64(p.head.data() + 16));
        if (std::memcmp(p.head.data(), kMagic, 8) != 0 || p.length > kMaxValue ||
            storewire::getU32(p.head.data() + 12) != static_cast<uint32_t>(rank_))
          step = -1;
      }
      if (step == 1) step = readToward(p.sock.fd(), &p.value, p.length);
      if (step == 1) {
        const uint32_t from = storewire::getU32(p.head.data() + 8);
        const Sha256Digest digest = sha256(p.value.data(), p.value.size());
        if (macEqual(proofOf(key_, commId_, from, static_cast<uint32_t>(rank_), p.length, digest), p.head.data() + 24))
          return std::move(p.value);
      }
      if (step != 0) {
        // Not proved, or closed before its value was whole: turned away (a proved sender that went
        // away leaves this rank to read the store).
        ++rejected_;
        p.sock.reset();
      }
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return !p.sock.valid(); }),
                  pending.end());
    if (fds[0].revents & POLLIN) {
      while (pending.size() < kMaxPending) {
        const int c = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        pending.emplace_back();
        pending.back().sock.reset(c);
      }
    }
  }
}

std::vector<int> fanOut(const JobKey& key, const Nonce& commId, int from, const Bytes& value,
                        const std::vector<std::pair<int, SockAddr>>& targets, const Deadline& until) {
  struct Out {
    int rank;
    Socket sock;
    uint8_t head[kHead];
    size_t sent = 0;  // of head, then value
  };
  const Sha256Digest digest = sha256(value.data(), value.size());
  std::vector<Out> outs;
  std::vector<int> missed;
  for (const auto& [rank, addr] : targets) {
    Socket s(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid() || (::connect(s.fd(), addr.raw(), addr.length()) != 0 && errno != EINPROGRESS)) {
      missed.push_back(rank);
      continue;
    }
    outs.push_back(Out{rank, std::move(s), {}, 0});
    Out& o = outs.back();
    std::memcpy(o.head, kMagic, 8);
    storewire::putU32(o.head + 8, static_cast<uint32_t>(from));
    storewire::putU32(o.head + 12, static_cast<uint32_t>(rank));
    storewire::putI64(o.head + 16, static_cast<int64_t>(value.size()));
    const Mac proof =
        proofOf(key, commId, static_cast<uint32_t>(from), static_cast<uint32_t>(rank), value.size(), digest);
    std::memcpy(o.head + 24, proof.data(), proof.size());
  }
  const size_t total = kHead + value.size();
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    bool open = false;
    for (const Out& o : outs) {
      const bool busy = o.sock.valid() && o.sent < total;
      fds.push_back(pollfd{busy ? o.sock.fd() : -1, POLLOUT, 0});
      open = open || busy;
    }
    if (!open) break;
    const int rc = ::poll(fds.data(), fds.size(), until.remainingMs());
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) break;
    for (size_t i = 0; i < outs.size(); ++i) {
      Out& o = outs[i];
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      bool failed = (fds[i].revents & (POLLERR | POLLHUP)) != 0;
      while (!failed && o.sent < total) {
        const bool inHead = o.sent < kHead;
        const uint8_t* at = inHead ? o.head + o.sent : value.data() + (o.sent - kHead);
        const size_t left = inHead ? kHead - o.sent : total - o.sent;
        const ssize_t n = ::send(o.sock.fd(), at, left, MSG_NOSIGNAL);
        if (n > 0) {
          o.sent += static_cast<size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        failed = !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
        break;
      }
      if (failed) o.sock.reset();
    }
  }
  for (const Out& o : outs)
    if (o.sent != total || !o.sock.valid()) missed.push_back(o.rank);
  return missed;
}

}  // namespace loom
