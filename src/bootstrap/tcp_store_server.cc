#include "bootstrap/tcp_store_server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "bootstrap/store_protocol.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/status.hpp"

namespace loom {
namespace {

LOOM_PARAM_INT(storeAuthTimeoutMs, "LOOM_STORE_AUTH_TIMEOUT_MS", 10000,
               "ms a rendezvous client has to prove the job key before it is dropped");

constexpr size_t kMaxClients = 65536;

std::atomic<uint64_t> served{0};
std::atomic<uint64_t> keysRead{0};
std::atomic<uint64_t> bytesSent{0};

}  // namespace

struct TcpStoreServer::Client {
  Socket sock;
  std::string peer;
  bool authed = false;
  Nonce nonce{};
  Clock::time_point acceptedAt;
  Bytes in;
  Bytes out;
  size_t outPos = 0;
  // A Wait not answered yet: the key, and when to give up. Its later requests stay in `in`.
  bool waiting = false;
  std::string waitKey;
  Clock::time_point waitUntil;
};

TcpStoreServer::TcpStoreServer(const SockAddr& addr, const JobKey& key) : key_(key) {
  int err = 0;
  listener_ = listenOn(addr, 512, &err);
  if (!listener_.valid()) {
    std::string advice = !listenAdvice(err).empty() ? listenAdvice(err).substr(2)
                         : err == EADDRINUSE
                             ? "another job or an earlier run holds this port: set MASTER_PORT to a free port, or "
                               "start the job with loomrun, which picks a free one"
                             : "check MASTER_ADDR / LOOM_SOCKET_IFNAME";
    LOOM_THROW(ErrorCode::System, 0,
               strFormat("the rendezvous store cannot listen on %s: %s; %s", addr.toString().c_str(),
                         errnoText(err).c_str(), advice.c_str()));
  }
  port_ = localAddress(listener_.fd()).port();
  if (pipe2(wakeFd_, O_CLOEXEC | O_NONBLOCK) != 0) LOOM_THROW(ErrorCode::System, 0, "pipe: " + errnoText(errno));
  thread_ = std::thread([this] { run(); });
  LOOM_INFO("rendezvous store listening on %s", localAddress(listener_.fd()).toString().c_str());
}

TcpStoreServer::~TcpStoreServer() {
  char c = 1;
  (void)!write(wakeFd_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  close(wakeFd_[0]);
  close(wakeFd_[1]);
}

void TcpStoreServer::run() {
  setThreadLogRank(0);
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wakeFd_[0], POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (auto& [fd, c] : clients_) {
      short ev = POLLIN;
      if (c->outPos < c->out.size()) ev |= POLLOUT;
      fds.push_back({fd, ev, 0});
    }
    int timeoutMs = 500;
    if (nextWait_ != Clock::time_point::max()) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(nextWait_ - Clock::now()).count() + 1;
      timeoutMs = static_cast<int>(std::clamp<long long>(ms, 0, timeoutMs));
    }
    int rc = poll(fds.data(), fds.size(), timeoutMs);
    if (rc < 0 && errno != EINTR) {
      LOOM_WARN("rendezvous store: poll failed: %s", errnoText(errno).c_str());
      return;
    }
    if (fds[0].revents != 0) return;  // stop
    if (fds[1].revents & POLLIN) onAccept();
    const auto now = Clock::now();
    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = clients_.find(fds[i].fd);
      if (it == clients_.end()) continue;
      Client& c = *it->second;
      bool keep = true;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) keep = onReadable(c);
      if (keep && (fds[i].revents & POLLOUT)) keep = flush(c);
      if (keep && !c.authed && now - c.acceptedAt > std::chrono::milliseconds(storeAuthTimeoutMs())) {
        LOOM_WARN("rendezvous store: dropped connection from %s: no job-key proof within %lld ms", c.peer.c_str(),
                  static_cast<long long>(storeAuthTimeoutMs()));
        ++rejected_;
        keep = false;
      }
      if (!keep) clients_.erase(it);
    }
    answerWaits();
  }
}

uint64_t TcpStoreServer::servedInProcess() { return served.load(std::memory_order_relaxed); }

uint64_t TcpStoreServer::keysReadInProcess() { return keysRead.load(std::memory_order_relaxed); }

uint64_t TcpStoreServer::bytesSentInProcess() { return bytesSent.load(std::memory_order_relaxed); }

void TcpStoreServer::answerWaits() {
  // A request answered here may unblock a later one of the same client that sets a key another
  // waits for: go round until nothing changes (each round answers at least one wait or stops).
  for (int round = 0; round < 64; ++round) {
    const auto now = Clock::now();
    if (!changed_ && now < nextWait_) return;
    changed_ = false;
    nextWait_ = Clock::time_point::max();
    std::vector<int> drop;
    for (auto& [fd, cp] : clients_) {
      Client& c = *cp;
      if (!c.waiting) continue;
      auto it = data_.find(c.waitKey);
      if (it == data_.end() && now < c.waitUntil) {
        nextWait_ = std::min(nextWait_, c.waitUntil);
        continue;
      }
      c.waiting = false;
      const Bytes reply = it != data_.end() ? storewire::encodeReply(storewire::Reply::Ok, it->second)
                                            : storewire::encodeReply(storewire::Reply::NotFound, {});
      bytesSent.fetch_add(reply.size(), std::memory_order_relaxed);
      c.out.insert(c.out.end(), reply.begin(), reply.end());
      if (!handleRequests(c) || !flush(c)) drop.push_back(fd);
    }
    for (int fd : drop) clients_.erase(fd);
    if (!changed_) return;
  }
}

void TcpStoreServer::onAccept() {
  for (;;) {
    int fd = accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    auto c = std::make_unique<Client>();
    c->sock.reset(fd);
    if (clients_.size() >= kMaxClients) {
      ++rejected_;
      continue;  // closes it
    }
    setNoDelay(fd);
    c->peer = peerAddress(fd).toString();
    c->acceptedAt = Clock::now();
    c->nonce = randomNonce();
    c->out.insert(c->out.end(), storewire::kServerMagic, storewire::kServerMagic + 8);
    c->out.insert(c->out.end(), c->nonce.begin(), c->nonce.end());
    if (!flush(*c)) continue;
    clients_[fd] = std::move(c);
  }
}

bool TcpStoreServer::flush(Client& c) {
  while (c.outPos < c.out.size()) {
    ssize_t n = send(c.sock.fd(), c.out.data() + c.outPos, c.out.size() - c.outPos, MSG_NOSIGNAL);
    if (n > 0) {
      c.outPos += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      return true;
    } else {
      return false;
    }
  }
  c.out.clear();
  c.outPos = 0;
  return true;
}

bool TcpStoreServer::onReadable(Client& c) {
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = recv(c.sock.fd(), buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.insert(c.in.end(), buf, buf + n);
      // Before the handshake only a client hello may arrive; bound what we keep.
      if (!c.authed && c.in.size() > storewire::kClientHello) break;
      if (c.in.size() > storewire::kMaxFrame + 16) break;
      continue;
    }
    if (n == 0) {
      if (!c.authed) {
        ++rejected_;
        LOOM_WARN("rendezvous store: connection from %s closed before proving the job key", c.peer.c_str());
      }
      return false;
    }
    if (errno == EAGAIN || errno == EINTR) break;
    return false;
  }
  if (!c.authed) {
    size_t have = std::min(c.in.size(), static_cast<size_t>(8));
    if (std::memcmp(c.in.data(), storewire::kClientMagic, have) != 0) {
      ++rejected_;
      LOOM_WARN(
          "rendezvous store: rejected connection from %s: it does not speak Loom's protocol (a stray client "
          "or port scanner?)",
          c.peer.c_str());
      return false;
    }
    if (c.in.size() < storewire::kClientHello) return true;
    Nonce clientNonce;
    std::memcpy(clientNonce.data(), c.in.data() + 8, 16);
    Mac expect = computeMac(key_, "store-client", c.nonce, clientNonce);
    if (!macEqual(expect, c.in.data() + 24)) {
      ++rejected_;
      LOOM_WARN(
          "rendezvous store: rejected connection from %s: wrong job key (a rank of another job using this "
          "port?)",
          c.peer.c_str());
      return false;
    }
    c.authed = true;
    c.in.erase(c.in.begin(), c.in.begin() + storewire::kClientHello);
    Mac proof = computeMac(key_, "store-server", clientNonce, c.nonce);
    c.out.insert(c.out.end(), proof.begin(), proof.end());
  }
  if (!handleRequests(c)) return false;
  return flush(c);
}

bool TcpStoreServer::handleRequests(Client& c) {
  if (c.waiting && c.in.size() > storewire::kMaxFrame + 16) {
    ++rejected_;
    LOOM_WARN("rendezvous store: dropped client %s: it piled up requests behind a wait", c.peer.c_str());
    return false;
  }
  size_t pos = 0;
  while (!c.waiting) {
    storewire::Request req;
    size_t used = 0;
    std::string why;
    auto r = storewire::decodeRequest(c.in.data() + pos, c.in.size() - pos, &req, &used, &why);
    if (r == storewire::Parse::Incomplete) break;
    if (r == storewire::Parse::Malformed) {
      ++rejected_;
      LOOM_WARN("rendezvous store: dropped client %s: malformed request (%s)", c.peer.c_str(), why.c_str());
      return false;
    }
    pos += used;
    if (req.op != storewire::Op::Add || storewire::getI64(req.value.data()) != 0)
      served.fetch_add(1, std::memory_order_relaxed);
    LOOM_TRACE("rendezvous store: %s asks op %d for \"%s\"", c.peer.c_str(), static_cast<int>(req.op), req.key.c_str());
    Bytes reply;
    switch (req.op) {
      case storewire::Op::Set:
        changed_ = true;
        data_[req.key] = std::move(req.value);
        reply = storewire::encodeReply(storewire::Reply::Ok, {});
        break;
      case storewire::Op::TryGet: {
        keysRead.fetch_add(1, std::memory_order_relaxed);
        auto it = data_.find(req.key);
        reply = it == data_.end() ? storewire::encodeReply(storewire::Reply::NotFound, {})
                                  : storewire::encodeReply(storewire::Reply::Ok, it->second);
        break;
      }
      case storewire::Op::GetMany: {
        std::vector<std::string> keys;
        if (!storewire::decodeKeys(req.value, &keys, &why)) {
          ++rejected_;
          LOOM_WARN("rendezvous store: dropped client %s: malformed request (%s)", c.peer.c_str(), why.c_str());
          return false;
        }
        keysRead.fetch_add(keys.size(), std::memory_order_relaxed);
        std::vector<std::optional<Bytes>> values(keys.size());
        for (size_t i = 0; i < keys.size(); ++i) {
          auto it = data_.find(keys[i]);
          if (it != data_.end()) values[i] = it->second;
        }
        reply = storewire::encodeReply(storewire::Reply::Ok, storewire::encodeValues(values));
        break;
      }
      case storewire::Op::SetMany: {
        std::vector<std::pair<std::string, Bytes>> pairs;
        if (!storewire::decodePairs(req.value, &pairs, &why)) {
          ++rejected_;
          LOOM_WARN("rendezvous store: dropped client %s: malformed request (%s)", c.peer.c_str(), why.c_str());
          return false;
        }
        for (auto& [k, v] : pairs) data_[k] = std::move(v);
        changed_ = true;
        reply = storewire::encodeReply(storewire::Reply::Ok, {});
        break;
      }
      case storewire::Op::Add: {
        int64_t cur = 0;
        auto it = data_.find(req.key);
        if (it != data_.end() && it->second.size() == 8) cur = storewire::getI64(it->second.data());
        // Two's complement wrap-around, as a counter would: an overflow from a hostile or broken
        // client must not be undefined behaviour in the server (found by the store_server fuzzer).
        cur = static_cast<int64_t>(static_cast<uint64_t>(cur) +
                                   static_cast<uint64_t>(storewire::getI64(req.value.data())));
        Bytes v(8);
        storewire::putI64(v.data(), cur);
        data_[req.key] = v;
        changed_ = true;
        reply = storewire::encodeReply(storewire::Reply::Ok, v);
        break;
      }
      case storewire::Op::Wait: {
        keysRead.fetch_add(1, std::memory_order_relaxed);
        auto it = data_.find(req.key);
        if (it != data_.end()) {
          reply = storewire::encodeReply(storewire::Reply::Ok, it->second);
          break;
        }
        const uint32_t ms = std::min(storewire::getU32(req.value.data()), storewire::kMaxWaitMs);
        c.waiting = true;
        c.waitKey = req.key;
        c.waitUntil = Clock::now() + std::chrono::milliseconds(ms);
        nextWait_ = std::min(nextWait_, c.waitUntil);
        break;  // answered by answerWaits()
      }
    }
    bytesSent.fetch_add(reply.size(), std::memory_order_relaxed);
    c.out.insert(c.out.end(), reply.begin(), reply.end());
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  return true;
}

}  // namespace loom
