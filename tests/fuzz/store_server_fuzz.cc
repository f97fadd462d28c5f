// The running rendezvous store (TcpStoreServer on loopback), fed each input over a connection of
// its own: the handshake state machine, its buffering and the request handling, not only the
// decoder. Input: byte 0 chooses the prologue (bit 0: complete the handshake with the job key
// first, so the rest reaches the request handler; else the raw bytes hit the handshake), the rest
// is sent as is, then the write side is closed and everything the server answers is read until it
// closes. Every 64 inputs a real client checks that the store still serves.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "bootstrap/auth.hpp"
#include "bootstrap/store_protocol.hpp"
#include "bootstrap/tcp_store.hpp"
#include "bootstrap/tcp_store_server.hpp"

using namespace loom;
using namespace std::chrono_literals;

namespace {

const JobKey& key() {
  static const JobKey k = deriveJobKey("fuzz");
  return k;
}

TcpStoreServer& server() {
  static TcpStoreServer* s = new TcpStoreServer(SockAddr::resolve("127.0.0.1", 0).front(), key());
  return *s;
}

// Proves the job key the way TcpStoreClient does; false if the server did not play along.
bool authenticate(int fd) {
  uint8_t hello[storewire::kServerHello];
  if (recvAll(fd, hello, sizeof(hello), Deadline(2000ms)) != 0) return false;
  Nonce serverNonce, clientNonce = randomNonce();
  std::memcpy(serverNonce.data(), hello + 8, 16);
  const Mac proof = computeMac(key(), "store-client", serverNonce, clientNonce);
  uint8_t reply[storewire::kClientHello];
  std::memcpy(reply, storewire::kClientMagic, 8);
  std::memcpy(reply + 8, clientNonce.data(), 16);
  std::memcpy(reply + 24, proof.data(), 32);
  uint8_t serverProof[storewire::kServerProof];
  return sendAll(fd, reply, sizeof(reply), Deadline(2000ms)) == 0 &&
         recvAll(fd, serverProof, sizeof(serverProof), Deadline(2000ms)) == 0 &&
         macEqual(computeMac(key(), "store-server", clientNonce, serverNonce), serverProof);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t inputs = 0;
  const int port = server().port();
  if (size == 0) return 0;
  int err = 0;
  Socket s = connectTo(SockAddr::resolve("127.0.0.1", port).front(), Deadline(2000ms), &err);
  if (!s.valid()) __builtin_trap();  // the store stopped accepting
  if ((data[0] & 1) != 0 && !authenticate(s.fd())) __builtin_trap();
  sendAll(s.fd(), data + 1, size - 1, Deadline(2000ms));
  ::shutdown(s.fd(), SHUT_WR);
  // Read the answers until the server closes (it must: our side is closed).
  uint8_t sink[4096];
  const Deadline d(5000ms);
  for (;;) {
    const ssize_t n = ::recv(s.fd(), sink, sizeof(sink), 0);
    if (n > 0) continue;
    if (n == 0 || (errno != EINTR && errno != EAGAIN)) break;
    if (d.expired()) __builtin_trap();  // the server kept a closed client's connection open
    pollfd p{s.fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
  }
  s.reset();
  if (++inputs % 64 == 0) {
    TcpStoreClient c("127.0.0.1", port, key(), 0, Deadline(5s), 5s);
    c.setString("liveness", "ok");
    const auto v = c.tryGet("liveness");
    if (!v.has_value() || std::string(v->begin(), v->end()) != "ok") __builtin_trap();
  }
  return 0;
}
