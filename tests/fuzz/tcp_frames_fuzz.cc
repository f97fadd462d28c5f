// The TCP transport's frame reader (tcp_connection.cc), on whatever a peer or a stray process
// writes into a connection. One TcpConnection per input, over one or two socket pairs, with a few
// receives (and maybe a send) posted; the input is fed in chunks into the far ends while the
// connection is polled, then the far ends close. Whatever arrives must end as completed or failed
// requests: no crash, no read or write outside a buffer (AddressSanitizer), no hang. A receive
// with a consumer (core/receive_consumer.hpp) must be handed only runs inside its message, in
// whole elements but at the message's end, and none after the request is done.
//
// Input: byte 0 = flags (bit 0: two streams; bits 1-2: receives to post; bit 3: post a send);
// then two bytes per receive (tag selector: bits 0-1 tag, bit 2 collective, bit 3 a consumer,
// bits 4-5 its element size 1, 2, 4 or 8; size selector); then chunks, each a control byte
// (bit 0: stream; bits 1-7: length - 1) followed by up to that many bytes.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/progress_engine.hpp"
#include "core/request.hpp"
#include "transport/tcp/tcp_connection.hpp"

namespace {

using namespace loom;

// Checks the consumer contract as runs arrive; traps on a breach.
class CheckingConsumer : public ReceiveConsumer {
 public:
  CheckingConsumer(size_t capacity, size_t granule) : ReceiveConsumer(granule), capacity_(capacity) {}
  void consume(const uint8_t* src, size_t offset, size_t len) noexcept override {
    if (done_ != nullptr && done_->done()) __builtin_trap();  // handed on after completion
    if (offset > capacity_ || len > capacity_ - offset) __builtin_trap();
    if (offset % granule() != 0) __builtin_trap();
    volatile uint8_t sum = 0;  // touch every byte: AddressSanitizer checks the source
    for (size_t i = 0; i < len; ++i) sum = static_cast<uint8_t>(sum + src[i]);
    (void)sum;
  }
  const detail::Request* done_ = nullptr;

 private:
  const size_t capacity_;
};

ProgressEngine& engine() {
  static ProgressEngine* e = new ProgressEngine(0);  // never registered with (start() is not called)
  return *e;
}

void drain(int fd) {
  uint8_t sink[65536];
  while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
  }
}

void writeAll(int fd, const uint8_t* p, size_t n, tcp::TcpConnection& conn, int far[2], size_t streams) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;  // the connection closed its end
    // Full: let the connection read (and what it writes be taken).
    const bool moved = conn.progress();
    for (size_t i = 0; i < streams; ++i) drain(far[i]);
    if (!moved && conn.progress() == false) {
      // Nothing read: the reader holds back (a DATA frame waiting for its PUSH); give up this chunk.
      return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  size_t at = 1;
  const size_t streams = (flags & 1) ? 2 : 1;
  const int receives = (flags >> 1) & 3;
  const bool postSend = (flags & 8) != 0;

  int far[2] = {-1, -1};
  std::vector<Socket> near;
  for (size_t i = 0; i < streams; ++i) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    near.emplace_back(sv[0]);
    far[i] = sv[1];
  }

  auto failure = std::make_shared<FailureState>();
  tcp::TcpOptions options;
  options.eagerBytes = 1024;  // small limits so that short inputs reach every path
  options.stripeMinBytes = 512;
  options.pushBytes = 64 * 1024;
  options.readyBytes = 64 * 1024;
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<RequestPtr> requests;
  {
    tcp::TcpConnection conn(0, 1, std::move(near), &engine(), &engine(), failure, options, "fuzz peer");
    engine().pollBegin(conn, false);
    for (int r = 0; r < receives && at + 2 <= size; ++r, at += 2) {
      const uint32_t tag = (data[at] & 3) | ((data[at] & 4) ? kCollectiveTagBit : 0u);
      const size_t bytes = static_cast<size_t>(data[at + 1]) * 257;
      buffers.emplace_back(bytes);
      auto req = std::make_shared<detail::Request>(0, 1, "fuzz recv", std::chrono::milliseconds(1000), failure);
      RecvSpec spec{buffers.back().data(), bytes, tag, 0, nullptr};
      if ((data[at] & 8) != 0) {
        auto consumer = std::make_shared<CheckingConsumer>(bytes, size_t{1} << ((data[at] >> 4) & 3));
        consumer->done_ = req.get();
        req->consumer = consumer;
        req->consumerBuffer = buffers.back().data();
        spec.consumer = consumer;
      }
      requests.push_back(req);
      conn.irecv(req, spec);
    }
    static const std::vector<uint8_t> payload(4096, 0x5a);
    if (postSend) {
      auto req = std::make_shared<detail::Request>(0, 1, "fuzz send", std::chrono::milliseconds(1000), failure);
      requests.push_back(req);
      conn.isend(req, SendSpec{payload.data(), payload.size(), kCollectiveTagBit | 1, 0});
    }
    while (at < size) {
      const uint8_t c = data[at++];
      const size_t stream = (c & 1) % streams;
      const size_t len = std::min<size_t>((c >> 1) + 1, size - at);
      writeAll(far[stream], data + at, len, conn, far, streams);
      at += len;
      conn.progress();
      for (size_t i = 0; i < streams; ++i) drain(far[i]);
    }
    for (size_t i = 0; i < streams; ++i) {
      close(far[i]);
      far[i] = -1;
    }
    for (int i = 0; i < 4; ++i) conn.progress();
    engine().pollEnd(conn, false);
  }  // destroying the connection fails what is still pending
  for (const auto& r : requests)
    if (!r->done()) __builtin_trap();  // every request ends, one way or the other
  return 0;
}
