#include "bootstrap/tcp_store_server.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
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
constexpr uint64_t kWakeTag = 0, kListenerTag = 1;

std::atomic<uint64_t> served{0};
std::atomic<uint64_t> keysRead{0};
std::atomic<uint64_t> bytesSent{0};

}  // namespace

struct TcpStoreServer::Client {
  ClientId id = 0;
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
  uint64_t waitNumber = 0;   // which of its waits an entry of waitsDue_ is for
  bool watchingOut = false;  // epoll reports room to send (something is queued)
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
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  epoll_event wake{}, accept{};
  wake.events = accept.events = EPOLLIN;
  wake.data.u64 = kWakeTag;
  accept.data.u64 = kListenerTag;
  if (epoll_ < 0 || epoll_ctl(epoll_, EPOLL_CTL_ADD, wakeFd_[0], &wake) != 0 ||
      epoll_ctl(epoll_, EPOLL_CTL_ADD, listener_.fd(), &accept) != 0) {
    const std::string why = errnoText(errno);
    if (epoll_ >= 0) close(epoll_);
    close(wakeFd_[0]);
    close(wakeFd_[1]);
    LOOM_THROW(ErrorCode::System, 0, "the rendezvous store cannot watch its sockets: epoll: " + why);
  }
  thread_ = std::thread([this] { run(); });
  LOOM_INFO("rendezvous store listening on %s", localAddress(listener_.fd()).toString().c_str());
}

TcpStoreServer::~TcpStoreServer() {
  char c = 1;
  (void)!write(wakeFd_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  clients_.clear();
  close(epoll_);
  close(wakeFd_[0]);
  close(wakeFd_[1]);
}

void TcpStoreServer::run() {
  setThreadLogRank(0);
  epoll_event events[256];
  for (;;) {
    const int n = epoll_wait(epoll_, events, 256, sleepMs());
    if (n < 0 && errno != EINTR) {
      LOOM_WARN("rendezvous store: epoll_wait failed: %s", errnoText(errno).c_str());
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) return;  // stop
      if (tag == kListenerTag) {
        onAccept();
        continue;
      }
      // A client dropped earlier in this batch (its answer's flush failed) may still have events.
      auto it = clients_.find(tag);
      if (it == clients_.end()) continue;
      Client& c = *it->second;
      bool keep = true;
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) keep = onReadable(c);
      if (keep && (events[i].events & EPOLLOUT)) keep = flush(c);
      if (!keep) drop(tag);
    }
    dropUnproven(Clock::now());
    answerWaits();
  }
}

int TcpStoreServer::sleepMs() const {
  auto until = Clock::now() + std::chrono::milliseconds(500);
  if (!waitsDue_.empty()) until = std::min(until, waitsDue_.top().first);
  if (!unproven_.empty())
    until = std::min(until, unproven_.front().first + std::chrono::milliseconds(storeAuthTimeoutMs()));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count() + 1;
  return static_cast<int>(std::clamp<long long>(ms, 0, 500));
}

void TcpStoreServer::dropUnproven(Clock::time_point now) {
  const auto limit = std::chrono::milliseconds(storeAuthTimeoutMs());
  while (!unproven_.empty()) {
    const auto [accepted, id] = unproven_.front();
    auto it = clients_.find(id);
    if (it != clients_.end() && !it->second->authed) {
      if (now - accepted <= limit) return;
      LOOM_WARN("rendezvous store: dropped connection from %s: no job-key proof within %lld ms",
                it->second->peer.c_str(), static_cast<long long>(limit.count()));
      ++rejected_;
      drop(id);
    }
    unproven_.pop_front();
  }
}

void TcpStoreServer::drop(ClientId id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& c = *it->second;
  if (c.waiting) {
    auto w = waiters_.find(c.waitKey);
    if (w != waiters_.end() && w->second.erase(id) > 0 && w->second.empty()) waiters_.erase(w);
  }
  clients_.erase(it);  // closing the socket takes it out of the epoll set
}

uint64_t TcpStoreServer::servedInProcess() { return served.load(std::memory_order_relaxed); }

uint64_t TcpStoreServer::keysReadInProcess() { return keysRead.load(std::memory_order_relaxed); }

uint64_t TcpStoreServer::bytesSentInProcess() { return bytesSent.load(std::memory_order_relaxed); }

void TcpStoreServer::answerWaits() {
  // An answer may unblock a later request of the same client that sets a key another waits for:
  // go on until no key with waiters is left unanswered (each pass answers at least one wait).
  for (;;) {
    if (!setKeys_.empty()) {
      std::vector<std::string> keys;
      keys.swap(setKeys_);
      for (const std::string& key : keys) {
        auto w = waiters_.find(key);
        if (w == waiters_.end()) continue;
        const std::unordered_set<ClientId> ids = std::move(w->second);
        waiters_.erase(w);
        for (ClientId id : ids) {
          auto it = clients_.find(id);
          if (it != clients_.end() && it->second->waiting && !answer(*it->second)) drop(id);
        }
      }
      continue;
    }
    const auto now = Clock::now();
    if (waitsDue_.empty() || waitsDue_.top().first > now) return;
    const auto [id, number] = waitsDue_.top().second;
    waitsDue_.pop();
    auto it = clients_.find(id);
    if (it == clients_.end() || !it->second->waiting || it->second->waitNumber != number) continue;
    Client& c = *it->second;
    auto w = waiters_.find(c.waitKey);
    if (w != waiters_.end() && w->second.erase(id) > 0 && w->second.empty()) waiters_.erase(w);
    if (!answer(c)) drop(id);
  }
}

bool TcpStoreServer::answer(Client& c) {
  c.waiting = false;
  auto it = data_.find(c.waitKey);
  const Bytes reply = it != data_.end() ? storewire::encodeReply(storewire::Reply::Ok, it->second)
                                        : storewire::encodeReply(storewire::Reply::NotFound, {});
  bytesSent.fetch_add(reply.size(), std::memory_order_relaxed);
  c.out.insert(c.out.end(), reply.begin(), reply.end());
  return handleRequests(c) && flush(c);
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
    c->id = nextId_++;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = c->id;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      LOOM_WARN("rendezvous store: cannot watch the connection from %s: %s", c->peer.c_str(), errnoText(errno).c_str());
      continue;  // closes it
    }
    if (!flush(*c)) continue;
    unproven_.emplace_back(c->acceptedAt, c->id);
    clients_[c->id] = std::move(c);
  }
}

bool TcpStoreServer::flush(Client& c) {
  while (c.outPos < c.out.size()) {
    ssize_t n = send(c.sock.fd(), c.out.data() + c.outPos, c.out.size() - c.outPos, MSG_NOSIGNAL);
    if (n > 0) {
      c.outPos += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      break;
    } else {
      return false;
    }
  }
  const bool left = c.outPos < c.out.size();
  if (!left) {
    c.out.clear();
    c.outPos = 0;
  }
  if (left != c.watchingOut) {
    epoll_event ev{};
    ev.events = EPOLLIN | (left ? EPOLLOUT : 0u);
    ev.data.u64 = c.id;
    if (epoll_ctl(epoll_, EPOLL_CTL_MOD, c.sock.fd(), &ev) != 0) return false;
    c.watchingOut = left;
  }
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
        if (waiters_.count(req.key) != 0) setKeys_.push_back(req.key);
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
        for (auto& [k, v] : pairs) {
          if (waiters_.count(k) != 0) setKeys_.push_back(k);
          data_[k] = std::move(v);
        }
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
        if (waiters_.count(req.key) != 0) setKeys_.push_back(req.key);
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
        waiters_[req.key].insert(c.id);
        waitsDue_.push({Clock::now() + std::chrono::milliseconds(ms), {c.id, ++c.waitNumber}});
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
