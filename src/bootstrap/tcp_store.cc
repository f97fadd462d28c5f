#include "bootstrap/tcp_store.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "bootstrap/store_protocol.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/status.hpp"

namespace loom {

TcpStoreClient::TcpStoreClient(const std::string& host, int port, const JobKey& key, int rank, const Deadline& deadline,
                               std::chrono::milliseconds opTimeout)
    : rank_(rank), opTimeout_(opTimeout) {
  endpoint_ = host.find(':') != std::string::npos ? "[" + host + "]:" + std::to_string(port)
                                                  : host + ":" + std::to_string(port);
  int lastErr = 0;
  auto pause = std::chrono::milliseconds(10);
  int attempts = 0;
  while (!sock_.valid()) {
    ++attempts;
    std::vector<SockAddr> addrs;
    try {
      addrs = SockAddr::resolve(host, port);
    } catch (const Error&) {
      if (deadline.expired()) throw;  // keep trying: DNS may lag behind the allocation
    }
    for (const auto& a : addrs) {
      Deadline attempt(std::chrono::milliseconds(std::min(deadline.remainingMs(), 5000)));
      Socket s = connectTo(a, attempt, &lastErr);
      if (!s.valid()) continue;
      setNoDelay(s.fd());
      // Handshake: read the server hello, send ours with our proof, check the server's proof.
      uint8_t hello[storewire::kServerHello];
      Deadline hs(std::chrono::milliseconds(std::max(deadline.remainingMs(), 5000)));
      int err = recvAll(s.fd(), hello, sizeof(hello), hs);
      if (err != 0 || std::memcmp(hello, storewire::kServerMagic, 8) != 0) {
        LOOM_THROW(ErrorCode::InvalidUsage, rank_,
                   strFormat("%s does not answer as a Loom rendezvous store (%s): another program holds this port; "
                             "set MASTER_PORT to a free port",
                             endpoint_.c_str(), err != 0 ? errnoText(err).c_str() : "unexpected greeting"));
      }
      Nonce serverNonce, clientNonce = randomNonce();
      std::memcpy(serverNonce.data(), hello + 8, 16);
      Mac proof = computeMac(key, "store-client", serverNonce, clientNonce);
      uint8_t reply[storewire::kClientHello];
      std::memcpy(reply, storewire::kClientMagic, 8);
      std::memcpy(reply + 8, clientNonce.data(), 16);
      std::memcpy(reply + 24, proof.data(), 32);
      uint8_t serverProof[storewire::kServerProof];
      err = sendAll(s.fd(), reply, sizeof(reply), hs);
      if (err == 0) err = recvAll(s.fd(), serverProof, sizeof(serverProof), hs);
      if (err != 0 || !macEqual(computeMac(key, "store-server", clientNonce, serverNonce), serverProof)) {
        LOOM_THROW(ErrorCode::InvalidUsage, rank_,
                   strFormat("the rendezvous store at %s belongs to another job (it refused our job key or proved a "
                             "different one): two jobs share this port; give each its own MASTER_PORT, and the same "
                             "LOOM_JOB_KEY to all ranks of one job",
                             endpoint_.c_str()));
      }
      hostedHere_ = localAddress(s.fd()).host() == peerAddress(s.fd()).host();
      sock_ = std::move(s);
      break;
    }
    if (sock_.valid()) break;
    if (deadline.expired()) {
      LOOM_THROW(ErrorCode::Timeout, rank_,
                 strFormat("could not reach the rendezvous store at %s within %.0f s (%d attempts; last error: %s): "
                           "is rank 0 running, and do MASTER_ADDR and MASTER_PORT name its host and a port it can "
                           "open? (LOOM_INIT_TIMEOUT sets how long to wait)",
                           endpoint_.c_str(), deadline.totalSeconds(), attempts,
                           lastErr != 0 ? errnoText(lastErr).c_str() : "no address"));
    }
    std::this_thread::sleep_for(std::min(pause, std::chrono::milliseconds(deadline.remainingMs() + 1)));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  LOOM_TRACE("connected to the rendezvous store at %s", endpoint_.c_str());
}

Bytes TcpStoreClient::roundTrip(const Bytes& request, uint8_t* status, std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (limit.count() <= 0) {
    limit = opTimeout_;
    lock.lock();
  } else {
    // Bounded: another thread's request may hold the connection, for as long as its own limit.
    // (Polled, not a timed mutex: ThreadSanitizer does not follow pthread_mutex_timedlock.)
    const Deadline lockBy(limit);
    while (!lock.try_lock()) {
      if (lockBy.expired()) {
        LOOM_THROW(ErrorCode::Timeout, rank_,
                   strFormat("rendezvous store at %s: another request has been waiting for its reply for %lld ms",
                             endpoint_.c_str(), static_cast<long long>(limit.count())));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  if (!sock_.valid()) {
    LOOM_THROW(ErrorCode::Remote, rank_,
               strFormat("the connection to the rendezvous store at %s was lost", endpoint_.c_str()));
  }
  Deadline deadline(limit);
  int err = sendAll(sock_.fd(), request.data(), request.size(), deadline);
  uint8_t head[5];
  if (err == 0) err = recvAll(sock_.fd(), head, sizeof(head), deadline);
  uint32_t len = err == 0 ? storewire::getU32(head) : 0;
  if (err == 0 && (len < 1 || len > storewire::kMaxFrame + 1)) err = EPROTO;
  Bytes payload(len > 0 ? len - 1 : 0);
  if (err == 0 && !payload.empty()) err = recvAll(sock_.fd(), payload.data(), payload.size(), deadline);
  if (err != 0) {
    sock_.reset();
    LOOM_THROW(err == ETIMEDOUT ? ErrorCode::Timeout : ErrorCode::Remote, rank_,
               strFormat("rendezvous store at %s: %s (did the rank hosting it, rank 0, exit or hang?)",
                         endpoint_.c_str(), errnoText(err).c_str()));
  }
  *status = head[4];
  return payload;
}

void TcpStoreClient::set(const std::string& key, const Bytes& value) {
  uint8_t status = 0;
  roundTrip(storewire::encodeRequest(storewire::Op::Set, key, value), &status);
}

std::optional<Bytes> TcpStoreClient::tryGet(const std::string& key) {
  uint8_t status = 0;
  Bytes v = roundTrip(storewire::encodeRequest(storewire::Op::TryGet, key, {}), &status);
  if (status == static_cast<uint8_t>(storewire::Reply::NotFound)) return std::nullopt;
  return v;
}

bool TcpStoreClient::setBounded(const std::string& key, const Bytes& value, std::chrono::milliseconds limit) {
  try {
    uint8_t status = 0;
    roundTrip(storewire::encodeRequest(storewire::Op::Set, key, value), &status, limit);
    return true;
  } catch (...) {
    return false;
  }
}

std::optional<Bytes> TcpStoreClient::tryGetBounded(const std::string& key, std::chrono::milliseconds limit) {
  try {
    uint8_t status = 0;
    Bytes v = roundTrip(storewire::encodeRequest(storewire::Op::TryGet, key, {}), &status, limit);
    if (status == static_cast<uint8_t>(storewire::Reply::NotFound)) return std::nullopt;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

std::vector<std::optional<Bytes>> TcpStoreClient::tryGetMany(const std::vector<std::string>& keys) {
  std::vector<std::optional<Bytes>> out;
  out.reserve(keys.size());
  for (size_t at = 0; at < keys.size(); at += storewire::kMaxKeysPerRequest) {
    const size_t n = std::min<size_t>(storewire::kMaxKeysPerRequest, keys.size() - at);
    const std::vector<std::string> part(keys.begin() + static_cast<std::ptrdiff_t>(at),
                                        keys.begin() + static_cast<std::ptrdiff_t>(at + n));
    uint8_t status = 0;
    Bytes r = roundTrip(storewire::encodeRequest(storewire::Op::GetMany, "many", storewire::encodeKeys(part)), &status);
    std::vector<std::optional<Bytes>> values;
    if (status != static_cast<uint8_t>(storewire::Reply::Ok) || !storewire::decodeValues(r, n, &values))
      LOOM_THROW(ErrorCode::Remote, rank_, "rendezvous store: malformed reply to a many-key read");
    for (auto& v : values) out.push_back(std::move(v));
  }
  return out;
}

void TcpStoreClient::setMany(const std::vector<std::pair<std::string, Bytes>>& pairs) {
  // In parts of at most kMaxKeysPerRequest pairs and, roughly, a quarter of the frame limit.
  size_t at = 0;
  while (at < pairs.size()) {
    size_t end = at, bytes = 0;
    while (end < pairs.size() && end - at < storewire::kMaxKeysPerRequest &&
           (end == at || bytes + pairs[end].first.size() + pairs[end].second.size() + 8 < storewire::kMaxFrame / 4)) {
      bytes += pairs[end].first.size() + pairs[end].second.size() + 8;
      ++end;
    }
    const std::vector<std::pair<std::string, Bytes>> part(pairs.begin() + static_cast<std::ptrdiff_t>(at),
                                                          pairs.begin() + static_cast<std::ptrdiff_t>(end));
    uint8_t status = 0;
    roundTrip(storewire::encodeRequest(storewire::Op::SetMany, "many", storewire::encodePairs(part)), &status);
    at = end;
  }
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  Bytes v(8);
  storewire::putI64(v.data(), delta);
  uint8_t status = 0;
  Bytes r = roundTrip(storewire::encodeRequest(storewire::Op::Add, key, v), &status);
  if (r.size() != 8) LOOM_THROW(ErrorCode::Remote, rank_, "rendezvous store: malformed reply to add");
  return storewire::getI64(r.data());
}

std::optional<Bytes> TcpStoreClient::get(const std::string& key, const Deadline& deadline) {
  // In slices, so that another thread's request (a note on a failure path) waits for this one a
  // short while at most, and a store host that died is noticed within the operation timeout.
  constexpr std::chrono::milliseconds kSlice{250};
  for (;;) {
    const auto left = std::chrono::milliseconds(std::max<int64_t>(0, deadline.remainingMs()));
    const auto slice = std::min(left, kSlice);
    Bytes ms(4);
    storewire::putU32(ms.data(), static_cast<uint32_t>(slice.count()));
    uint8_t status = 0;
    Bytes v = roundTrip(storewire::encodeRequest(storewire::Op::Wait, key, ms), &status);
    if (status == static_cast<uint8_t>(storewire::Reply::Ok)) return v;
    if (deadline.expired() || left.count() == 0) return std::nullopt;
  }
}

}  // namespace loom
