#include "anchors.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "net/interfaces.hpp"
#include "net/socket.hpp"

namespace loom {
namespace bench {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

double memcpyGBs(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> rates;
  for (int i = 0; i < 7; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(static_cast<double>(bytes) / s / 1e9);
    a[i] = b[i + 1];  // keep the copies observable
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// Raw TCP, shaped like the benchmark: each rank streams `bytes` to rank+1 while receiving the
// same from rank-1, repeated `reps` times; returns GB/s per rank (median over reps).
double rawRingGBs(loom::Communicator& c, size_t bytes, int reps) {
  const int n = c.size(), me = c.rank(), to = (me + 1) % n, from = (me + n - 1) % n;
  loom::SockAddr addr = loom::selectedInterfaces().front().addr;
  addr.setPort(0);
  int err = 0;
  loom::Socket lst = loom::listenOn(addr, 4, &err);
  uint8_t wire[loom::SockAddr::kWireBytes], peerWire[loom::SockAddr::kWireBytes];
  loom::localAddress(lst.fd()).toWire(wire);
  auto r = c.irecv(peerWire, sizeof(peerWire), loom::DataType::Uint8, to, 79);
  c.isend(wire, sizeof(wire), loom::DataType::Uint8, from, 79).wait();
  r.wait();
  loom::SockAddr peer;
  loom::SockAddr::fromWire(peerWire, &peer);
  loom::Socket out = loom::connectTo(peer, loom::Deadline(std::chrono::seconds(10)), &err);
  int in = -1;
  while (in < 0) in = accept(lst.fd(), nullptr, nullptr);
  int fl = 0;
  for (int fd : {out.fd(), in}) {
    fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    loom::setNoDelay(fd);
  }
  std::vector<char> sbuf(bytes, 1), rbuf(bytes);
  std::vector<double> rates;
  for (int rep = 0; rep < reps; ++rep) {
    c.barrier();
    auto t0 = Clock::now();
    std::thread sender([&] {
      size_t done = 0;
      while (done < bytes) {
        ssize_t k = ::send(out.fd(), sbuf.data() + done, bytes - done, MSG_NOSIGNAL);
        if (k <= 0) return;
        done += static_cast<size_t>(k);
      }
    });
    size_t got = 0;
    while (got < bytes) {
      ssize_t k = ::recv(in, rbuf.data() + got, bytes - got, 0);
      if (k <= 0) break;
      got += static_cast<size_t>(k);
    }
    sender.join();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    c.allReduce(&s, &s, 1, loom::DataType::Float64, loom::ReduceOp::Max);
    rates.push_back(static_cast<double>(bytes) / s / 1e9);
  }
  ::close(in);
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace bench
}  // namespace loom
