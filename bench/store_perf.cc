// What the rendezvous store costs its host as the job grows: with C clients connected (each past
// the job-key handshake, as a job's ranks are), the round trip of one more client's requests, and
// an init-shaped burst: every client waits for one key, which is then set, and the burst lasts
// until the last of them has its answer. The server runs on a thread of this process, as it runs
// on rank 0's.
//
//   store_perf [--clients 16,256,1024,4096] [--requests 2000] [--repeats 3]
//
// One line per C: "store C request_us burst_ms" (medians of the repeats).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store_protocol.hpp"
#include "bootstrap/tcp_store.hpp"
#include "bootstrap/tcp_store_server.hpp"

using namespace loom;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

void raiseDescriptorLimit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0) return;
  l.rlim_cur = l.rlim_max;
  setrlimit(RLIMIT_NOFILE, &l);
}

// A client on a socket of its own that proves the job key as TcpStoreClient does, and whose
// requests the benchmark writes and reads itself (no thread per client).
Socket connectClient(const SockAddr& addr, const JobKey& key) {
  int err = 0;
  Socket s = connectTo(addr, Deadline(5s), &err);
  if (!s.valid()) return s;
  uint8_t hello[storewire::kServerHello];
  if (recvAll(s.fd(), hello, sizeof hello, Deadline(5s)) != 0) return Socket();
  Nonce serverNonce, clientNonce = randomNonce();
  std::memcpy(serverNonce.data(), hello + 8, 16);
  const Mac proof = computeMac(key, "store-client", serverNonce, clientNonce);
  uint8_t answer[storewire::kClientHello];
  std::memcpy(answer, storewire::kClientMagic, 8);
  std::memcpy(answer + 8, clientNonce.data(), 16);
  std::memcpy(answer + 24, proof.data(), 32);
  uint8_t serverProof[storewire::kServerProof];
  if (sendAll(s.fd(), answer, sizeof answer, Deadline(5s)) != 0 ||
      recvAll(s.fd(), serverProof, sizeof serverProof, Deadline(5s)) != 0)
    return Socket();
  return s;
}

// Reads one reply; false when none came.
bool readReply(int fd) {
  uint8_t head[5];
  if (recvAll(fd, head, sizeof head, Deadline(30s)) != 0) return false;
  std::vector<uint8_t> payload(storewire::getU32(head) - 1);
  return payload.empty() || recvAll(fd, payload.data(), payload.size(), Deadline(5s)) == 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int> parseList(const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p != '\0';) {
    out.push_back(std::atoi(p));
    const char* comma = std::strchr(p, ',');
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts = {16, 256, 1024, 4096};
  int requests = 2000, repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--clients" && i + 1 < argc) {
      counts = parseList(argv[++i]);
    } else if (a == "--requests" && i + 1 < argc) {
      requests = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--clients 16,256,1024,4096] [--requests 2000] [--repeats 3]\n", argv[0]);
      return 2;
    }
  }
  raiseDescriptorLimit();
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const JobKey key = deriveJobKey("store_perf");
  TcpStoreServer server(SockAddr::resolve("127.0.0.1", 0).front(), key);
  const SockAddr addr = SockAddr::resolve("127.0.0.1", server.port()).front();
  TcpStoreClient probe("127.0.0.1", server.port(), key, 0, Deadline(5s), 30s);
  const Bytes value(8, 1);
  for (int c : counts) {
    std::vector<Socket> clients;
    for (int i = 0; i < c; ++i) {
      clients.push_back(connectClient(addr, key));
      if (!clients.back().valid()) {
        std::printf("store %d failed: client %d could not connect (ulimit -n?)\n", c, i);
        return 1;
      }
    }
    std::vector<double> requestUs, burstMs;
    for (int r = 0; r < repeats; ++r) {
      // 1. One more client's round trips, the others idle.
      const auto t0 = Clock::now();
      for (int i = 0; i < requests; ++i) {
        probe.set("k", value);
        probe.tryGet("k");
      }
      requestUs.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / (2.0 * requests));
      // 2. Every client waits for one key; it is set; the last answer ends the burst.
      const std::string go = "go/" + std::to_string(c) + "/" + std::to_string(r);
      Bytes ms(4);
      storewire::putU32(ms.data(), 30000);
      const Bytes wait = storewire::encodeRequest(storewire::Op::Wait, go, ms);
      for (const Socket& s : clients) sendAll(s.fd(), wait.data(), wait.size(), Deadline(5s));
      probe.tryGet(go);  // a round trip after the waits went out: they are in the server's hands
      const auto t1 = Clock::now();
      probe.set(go, value);
      for (const Socket& s : clients) {
        if (!readReply(s.fd())) {
          std::printf("store %d failed: a waiting client got no answer\n", c);
          return 1;
        }
      }
      burstMs.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t1).count());
    }
    std::printf("store %d %.1f %.2f\n", c, median(requestUs), median(burstMs));
  }
  return 0;
}
