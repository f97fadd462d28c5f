// Receives from any source (transport/any_source.hpp, loom::kAnySource) over every link of
// loomtest::kConformanceLinks, ranks as threads: the earliest message on the tag from whichever
// rank (this one included), each rank's messages in the order it sent them, the earliest-posted of
// a receive from any source and one named for the sender taking a message, eager and announced
// messages, messages that arrived before the receive and after it, the sender reported, into
// device buffers (the emulated device), and the errors (too small a receive, a communicator that
// fails).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_impl.hpp"
#include "common/fake_device.hpp"
#include "common/ranks.hpp"
#include "device/runtime.hpp"

using loom::DataType;
using loom::kAnySource;
using loomtest::runOk;

namespace {

class AnySource : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Links, AnySource, ::testing::ValuesIn(loomtest::kConformanceLinks),
                         [](const auto& info) { return std::string(info.param); });

// Eager and announced (past every transport's eager limit) sizes, in int32 elements.
const size_t kCounts[] = {1, 1000, 100003};

int32_t value(int from, int msg, size_t i) { return from * 1000003 + msg * 7919 + static_cast<int32_t>(i % 9973); }

std::vector<int32_t> message(int from, int msg, size_t count) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(from, msg, i);
  return v;
}

// Whether `v` holds message `msg` of rank `from` in its first `count` elements.
bool holds(const std::vector<int32_t>& v, int from, int msg, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (v[i] != value(from, msg, i)) return false;
  return true;
}

// Every other rank sends rank 0 kPerRank messages on one tag; rank 0 takes them all with
// receives from any source (some posted before the messages come, some after): each exactly once,
// each sender's in the order it sent them, each Work naming its sender.
TEST_P(AnySource, EveryRanksMessagesOnceEachInItsOrder) {
  loomtest::TransportSetup links(GetParam());
  constexpr int kPerRank = 6;
  for (size_t count : kCounts) {
    SCOPED_TRACE(count);
    runOk(4, [&](loom::Communicator& c) {
      const int n = c.size();
      if (c.rank() != 0) {
        for (int m = 0; m < kPerRank; ++m) {
          std::vector<int32_t> out = message(c.rank(), m, count);
          c.send(out.data(), count, DataType::Int32, 0, 11);
        }
        c.barrier();
        return;
      }
      const int total = (n - 1) * kPerRank;
      std::vector<std::vector<int32_t>> in(static_cast<size_t>(total), std::vector<int32_t>(count, -1));
      std::vector<loom::Work> works;
      for (int k = 0; k < total / 2; ++k)  // half posted at once, before most messages arrive
        works.push_back(c.irecv(in[static_cast<size_t>(k)].data(), count, DataType::Int32, kAnySource, 11));
      for (int k = total / 2; k < total; ++k) {
        works[static_cast<size_t>(k - total / 2)].wait();
        works.push_back(c.irecv(in[static_cast<size_t>(k)].data(), count, DataType::Int32, kAnySource, 11));
      }
      std::map<int, int> next;  // per sender, the message it must come with next
      for (int k = 0; k < total; ++k) {
        loom::Work& w = works[static_cast<size_t>(k)];
        w.wait();
        const int from = w.source();
        ASSERT_GE(from, 1) << "receive " << k;
        ASSERT_LT(from, n) << "receive " << k;
        ASSERT_EQ(w.bytes(), count * 4);
        ASSERT_TRUE(holds(in[static_cast<size_t>(k)], from, next[from], count))
            << "receive " << k << " from rank " << from << " is not its message " << next[from];
        next[from]++;
      }
      for (int r = 1; r < n; ++r) EXPECT_EQ(next[r], kPerRank) << "rank " << r;
      c.barrier();
    });
  }
}

// Messages that arrived before the receive are taken in arrival order across ranks: rank 1's
// message is known to have arrived before rank 2's is sent.
TEST_P(AnySource, KeptMessagesAreTakenInArrivalOrder) {
  loomtest::TransportSetup links(GetParam());
  for (size_t count : kCounts) {
    SCOPED_TRACE(count);
    runOk(3, [&](loom::Communicator& c) {
      int token = 0;
      if (c.rank() == 1) {
        std::vector<int32_t> out = message(1, 0, count);
        loom::Work s = c.isend(out.data(), count, DataType::Int32, 0, 4);
        c.send(&token, 1, DataType::Int32, 0, 50);  // behind it on the link: rank 0 has it once this arrives
        s.wait();
      } else if (c.rank() == 2) {
        c.recv(&token, 1, DataType::Int32, 0, 51);
        std::vector<int32_t> out = message(2, 0, count);
        loom::Work s = c.isend(out.data(), count, DataType::Int32, 0, 4);
        c.send(&token, 1, DataType::Int32, 0, 52);
        s.wait();
      } else {
        c.recv(&token, 1, DataType::Int32, 1, 50);
        c.send(&token, 1, DataType::Int32, 2, 51);
        c.recv(&token, 1, DataType::Int32, 2, 52);
        for (int expect : {1, 2}) {
          std::vector<int32_t> in(count);
          loom::Work w = c.irecv(in.data(), count, DataType::Int32, kAnySource, 4);
          w.wait();
          EXPECT_EQ(w.source(), expect);
          EXPECT_TRUE(holds(in, expect, 0, count));
        }
      }
    });
  }
}

// Against a receive named for the sender, the one posted first takes the message, whichever kind.
TEST_P(AnySource, TheEarlierPostedReceiveTakesTheMessage) {
  loomtest::TransportSetup links(GetParam());
  for (size_t count : kCounts) {
    SCOPED_TRACE(count);
    runOk(2, [&](loom::Communicator& c) {
      if (c.rank() == 1) {
        c.barrier();
        for (int m = 0; m < 4; ++m) {
          std::vector<int32_t> out = message(1, m, count);
          c.send(out.data(), count, DataType::Int32, 0, 9);
        }
        return;
      }
      std::vector<std::vector<int32_t>> in(4, std::vector<int32_t>(count));
      // Posted in this order: any, named, named, any.
      loom::Work a = c.irecv(in[0].data(), count, DataType::Int32, kAnySource, 9);
      loom::Work b = c.irecv(in[1].data(), count, DataType::Int32, 1, 9);
      loom::Work d = c.irecv(in[2].data(), count, DataType::Int32, 1, 9);
      loom::Work e = c.irecv(in[3].data(), count, DataType::Int32, kAnySource, 9);
      c.barrier();
      for (loom::Work* w : {&a, &b, &d, &e}) w->wait();
      for (int k = 0; k < 4; ++k) EXPECT_TRUE(holds(in[static_cast<size_t>(k)], 1, k, count)) << "receive " << k;
      EXPECT_EQ(a.source(), 1);
      EXPECT_EQ(e.source(), 1);
      EXPECT_EQ(b.source(), 1);
    });
  }
}

// A rank's message to itself is a source too; a receive too small for the message it takes fails
// as a named one does, and the link goes on.
TEST_P(AnySource, ItsOwnRankAndTooSmallAReceive) {
  loomtest::TransportSetup links(GetParam());
  runOk(2, [&](loom::Communicator& c) {
    std::vector<int32_t> out = message(c.rank(), 0, 100), in(100);
    loom::Work s = c.isend(out.data(), 100, DataType::Int32, c.rank(), 3);
    loom::Work r = c.irecv(in.data(), 100, DataType::Int32, kAnySource, 3);
    r.wait();
    s.wait();
    EXPECT_EQ(r.source(), c.rank());
    EXPECT_TRUE(holds(in, c.rank(), 0, 100));
    c.barrier();
    if (c.rank() == 1) {
      c.send(out.data(), 100, DataType::Int32, 0, 5);
    } else {
      std::vector<int32_t> small(10);
      loom::Work w = c.irecv(small.data(), 10, DataType::Int32, kAnySource, 5);
      EXPECT_EQ(loomtest::errorCodeOf([&] { w.wait(); }), loom::ErrorCode::InvalidUsage);
    }
    c.barrier();  // the links still work
  });
}

// Into device memory, on the stream: each receive takes one rank's message and names its sender,
// whether it comes through CUDA IPC from a peer's device memory (ranks 1 and 2) or as bytes from
// its host memory (rank 3); a single named device receive names its peer.
TEST(AnySourceDevice, ReceivesIntoDeviceBuffersAndNamesTheSender) {
  loomtest::FakeDevice dev;
  loom::device::setRuntimeForTesting(&dev);
  const size_t count = 100003;
  runOk(4, [&](loom::Communicator& c) {
    void* s = dev.createStream();
    auto* buf = static_cast<int32_t*>(dev.alloc(3 * count * 4));
    if (c.rank() != 0) {
      std::vector<int32_t> out = message(c.rank(), 0, count);
      std::copy(out.begin(), out.end(), buf);
      if (c.rank() == 3) {
        c.send(out.data(), count, DataType::Int32, 0, 6);
      } else {
        c.send(buf, count, DataType::Int32, 0, 6, s);
      }
      c.send(buf, 10, DataType::Int32, 0, 7, s);
    } else {
      std::vector<loom::Work> works;
      for (int k = 0; k < 3; ++k) works.push_back(c.irecv(buf + k * count, count, DataType::Int32, kAnySource, 6, s));
      std::vector<int> from;
      for (int k = 0; k < 3; ++k) {
        works[static_cast<size_t>(k)].wait();
        const int src = works[static_cast<size_t>(k)].source();
        from.push_back(src);
        ASSERT_TRUE(src >= 1 && src <= 3) << src;
        dev.synchronize(s);
        std::vector<int32_t> got(buf + k * count, buf + (k + 1) * count);
        EXPECT_TRUE(holds(got, src, 0, count)) << "receive " << k << " from rank " << src;
      }
      std::sort(from.begin(), from.end());
      EXPECT_EQ(from, (std::vector<int>{1, 2, 3}));
      for (int peer = 1; peer < 4; ++peer) {
        loom::Work w = c.irecv(buf, 10, DataType::Int32, peer, 7, s);
        w.wait();
        EXPECT_EQ(w.source(), peer);
      }
    }
    dev.synchronize(s);
    dev.free(buf);
    dev.destroyStream(s);
  });
  EXPECT_EQ(dev.ruleBreaks(), 0) << dev.ruleBreakReport();
  EXPECT_GT(dev.ipcExports(), 0) << "no device send went through CUDA IPC";
  loom::device::setRuntimeForTesting(nullptr);
}

// A receive from any source that no message comes for fails when the communicator does, saying
// what it was.
TEST(AnySourceErrors, APendingReceiveFailsWithItsCommunicatorAndSaysWhatItWas) {
  loomtest::TransportSetup links("tcp");
  loom::Options o;
  o.timeout = std::chrono::milliseconds(1500);
  std::atomic<bool> done{false};
  auto results = loomtest::runRanks(
      2,
      [&](loom::Communicator& c) {
        if (c.rank() == 1) {  // never sends, and stays until rank 0 has its error
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;
        }
        int x = 0;
        try {
          c.recv(&x, 1, DataType::Int32, kAnySource, 8);
          ADD_FAILURE() << "a receive with no message completed";
        } catch (const loom::Error& e) {
          const std::string what = e.what();
          EXPECT_EQ(e.code(), loom::ErrorCode::Timeout) << what;
          EXPECT_NE(what.find("recv of 1 int32 from any rank (tag 8)"), std::string::npos) << what;
        }
        done = true;
      },
      o);
  EXPECT_EQ(results[1].error, "");
}

TEST(AnySourceErrors, SendsNameARank) {
  runOk(2, [&](loom::Communicator& c) {
    int x = 0;
    EXPECT_EQ(loomtest::errorCodeOf([&] { c.isend(&x, 1, DataType::Int32, kAnySource, 0); }),
              loom::ErrorCode::InvalidArgument);
    EXPECT_EQ(loomtest::errorCodeOf([&] { c.irecv(&x, 1, DataType::Int32, -2, 0); }), loom::ErrorCode::InvalidArgument);
  });
}

}  // namespace
