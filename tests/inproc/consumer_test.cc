// Receive consumers (core/receive_consumer.hpp), ranks as threads over TCP and shared memory:
// every byte of a message reaches the consumer exactly once, in runs of whole elements, before the
// receive completes, whichever way the message travelled (eager, pushed whole or striped, striped
// after a READY hint, through the unexpected queue); over TCP a receive posted before its message
// arrives is handed the bytes in several runs as they are read and never has its buffer written.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/context.hpp"
#include "comm/comm_impl.hpp"
#include "common/env_guard.hpp"
#include "common/ranks.hpp"

using loom::DataType;
using loomtest::pattern;

namespace {

// What a receive's consumer was handed: a count per byte, the bytes, the runs, and runs that
// broke the contract (not whole elements, or outside the message).
class Recorder : public loom::ReceiveConsumer {
 public:
  Recorder(size_t bytes, size_t granule) : ReceiveConsumer(granule), seen(bytes), got(bytes) {}

  void consume(const uint8_t* src, size_t offset, size_t len) noexcept override {
    runs.fetch_add(1);
    if (offset % granule() != 0 || (len % granule() != 0 && offset + len != seen.size())) misaligned.fetch_add(1);
    if (offset > seen.size() || len > seen.size() - offset) {
      outside.fetch_add(1);
      return;
    }
    for (size_t i = 0; i < len; ++i) {
      seen[offset + i].fetch_add(1, std::memory_order_relaxed);
      got[offset + i] = src[i];  // runs never overlap: each byte has one writer
    }
  }

  std::vector<std::atomic<uint8_t>> seen;
  std::vector<uint8_t> got;
  std::atomic<int> runs{0}, misaligned{0}, outside{0};
};

struct Shape {
  size_t elem;
  size_t count;
};

// 0 and 1 element; eager; just past the eager limit (pushed whole); about 1 MiB with an odd count
// (pushed, striped over both sockets); past the push limit (striped after the receiver's READY
// hint, or after RTS/CTS when the receive comes late); 2-byte elements with an odd slice length.
constexpr Shape kShapes[] = {{8, 0},      {8, 1},      {8, 3},      {8, 8191}, {8, 8193},
                             {8, 131071}, {8, 262147}, {2, 524289}, {4, 77777}};

constexpr int64_t kSeqBase = 1 << 20;  // tags of no real collective (none runs in this test)

// Rank 0 sends each shape to rank 1, whose receive has a Recorder. `late`: rank 1 posts its
// receive only after the message was sent (and has had time to arrive).
void exchange(loom::Communicator& c, bool late, bool tcp) {
  const int me = c.rank();
  uint8_t token = 0;
  int64_t seq = kSeqBase + (late ? 100 : 0);
  for (const Shape& s : kShapes) {
    ++seq;
    const size_t bytes = s.elem * s.count;
    const int msg = static_cast<int>(seq & 0xff);
    loom::coll::Context ctx(*c.impl(), seq, "consume_test", "p2p");
    if (me == 0) {
      std::vector<uint8_t> payload(bytes);
      for (size_t i = 0; i < bytes; ++i) payload[i] = pattern(0, 1, msg, i);
      if (!late) c.recv(&token, 1, DataType::Uint8, 1, 1);  // rank 1 has posted
      auto sent = ctx.send(1, payload.data(), bytes);
      if (late) c.send(&token, 1, DataType::Uint8, 1, 2);  // the message is on its way
      ctx.wait(sent);
      c.barrier();
      continue;
    }
    std::vector<uint8_t> staging(bytes, 0xEE);
    auto rec = std::make_shared<Recorder>(bytes, s.elem);
    loom::RequestPtr r;
    if (late) {
      c.recv(&token, 1, DataType::Uint8, 0, 2);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      r = ctx.recv(0, staging.data(), bytes, 0, rec);
    } else {
      r = ctx.recv(0, staging.data(), bytes, 0, rec);
      c.send(&token, 1, DataType::Uint8, 0, 1);
    }
    ctx.wait(r);
    const std::string what = std::to_string(bytes) + " bytes of " + std::to_string(s.elem) + (late ? ", late" : "");
    EXPECT_EQ(rec->misaligned.load(), 0) << what;
    EXPECT_EQ(rec->outside.load(), 0) << what;
    size_t wrongCount = 0, wrongByte = 0;
    for (size_t i = 0; i < bytes; ++i) {
      if (rec->seen[i].load() != 1) ++wrongCount;
      if (rec->got[i] != pattern(0, 1, msg, i)) ++wrongByte;
    }
    EXPECT_EQ(wrongCount, 0u) << what << ": bytes not handed on exactly once";
    EXPECT_EQ(wrongByte, 0u) << what << ": bytes handed on wrong";
    if (r->consumed) {
      // Handed on as read: the buffer was never written.
      size_t touched = 0;
      for (uint8_t b : staging) touched += b != 0xEE;
      EXPECT_EQ(touched, 0u) << what;
    }
    if (tcp && !late && bytes > 0) {
      EXPECT_TRUE(r->consumed) << what << ": a receive posted in time is handed its bytes as they are read";
      // The stream's 256 KiB read buffer bounds a run.
      EXPECT_GE(static_cast<size_t>(rec->runs.load()), bytes / (256 * 1024)) << what;
    }
    if (!tcp) {
      EXPECT_FALSE(r->consumed) << what << ": shared memory leaves the bytes in the buffer";
    }
    c.barrier();
  }
}

}  // namespace

class Consumer : public ::testing::TestWithParam<const char*> {};

TEST_P(Consumer, EveryByteOnceInWholeElementsBeforeCompletion) {
  const std::string links = GetParam();
  loomtest::TransportSetup setup(links);
  loomtest::runOk(2, [&](loom::Communicator& c) {
    exchange(c, false, links == "tcp");
    exchange(c, true, links == "tcp");
  });
}

INSTANTIATE_TEST_SUITE_P(Links, Consumer, ::testing::Values("tcp", "shm"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// The ring's reduce-scatter hands every chunk to a consumer; with the consumers switched off over
// TCP (LOOM_TCP_REDUCE_ON_ARRIVAL=0, read when the communicator joins) the chunks land in staging
// and are reduced from there. Both give the same bits.
TEST(Consumer, ReduceOnArrivalAndFromStagingAgree) {
  loomtest::TransportSetup setup("tcp");
  std::vector<std::vector<float>> results;
  loomtest::EnvGuard algo("LOOM_ALGO", "ring");
  for (const char* on : {"1", "0"}) {
    loomtest::EnvGuard arrival("LOOM_TCP_REDUCE_ON_ARRIVAL", on);
    std::vector<float> out0;
    std::mutex mu;
    loomtest::runOk(3, [&](loom::Communicator& c) {
      const size_t n = (3u << 20) + 5;  // several 2 MiB chunks per segment, and a ragged end
      std::vector<float> in(n), out(n);
      for (size_t i = 0; i < n; ++i)
        in[i] = static_cast<float>((i * 7 + static_cast<size_t>(c.rank()) * 13) % 1000) / 7.0f;
      c.allReduce(in.data(), out.data(), n, DataType::Float32, loom::ReduceOp::Sum);
      if (c.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        out0 = out;
      }
    });
    results.push_back(out0);
  }
  ASSERT_EQ(results.size(), 2u);
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)), 0);
}
