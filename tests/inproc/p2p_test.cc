// Point-to-point over shared memory, TCP and both, ranks as threads: every datatype, sizes from 0 to beyond the eager
// limit, world sizes 1 to 8, both directions at once, many messages in flight, tags, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "comm/comm_impl.hpp"
#include "common/env_guard.hpp"
#include "common/ranks.hpp"
#include "core/progress_policy.hpp"
#include "core/request.hpp"
#include "net/socket.hpp"

using loom::DataType;
using loomtest::pattern;
using loomtest::runOk;

namespace {

// Every rank exchanges one message with every other rank (and itself), all posted at once.
void allPairs(loom::Communicator& c, size_t count, DataType type, int msg) {
  const int n = c.size(), me = c.rank();
  const size_t bytes = count * loom::sizeOf(type);
  std::vector<std::vector<uint8_t>> out(n), in(n);
  std::vector<loom::Work> works;
  for (int p = 0; p < n; ++p) {
    out[p].resize(bytes);
    for (size_t i = 0; i < bytes; ++i) out[p][i] = pattern(me, p, msg, i);
    in[p].assign(bytes, 0xEE);
    works.push_back(c.irecv(in[p].data(), count, type, p, static_cast<uint32_t>(msg)));
  }
  for (int p = 0; p < n; ++p) works.push_back(c.isend(out[p].data(), count, type, p, static_cast<uint32_t>(msg)));
  loom::waitAll(works);
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < bytes; ++i) {
      if (in[p][i] != pattern(p, me, msg, i)) {
        FAIL() << "rank " << me << " byte " << i << " of " << bytes << " from rank " << p << " is wrong";
      }
    }
  }
}

}  // namespace

// World size and links ("shm", "tcp", "mixed": common/ranks.hpp).
class WorldSize : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(WorldSize, EveryPairEveryTypeAndSize) {
  const size_t counts[] = {0, 1, 2, 7, 13, 1021, 65537, (1u << 18) + 3};
  loomtest::TransportSetup links(std::get<1>(GetParam()));
  runOk(std::get<0>(GetParam()), [&](loom::Communicator& c) {
    int msg = 0;
    for (DataType t : loomtest::kAllTypes)
      for (size_t n : counts) allPairs(c, n, t, msg++);
  });
}

std::string worldName(const ::testing::TestParamInfo<std::tuple<int, const char*>>& info) {
  return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
}
INSTANTIATE_TEST_SUITE_P(Shm, WorldSize, ::testing::Combine(::testing::Range(1, 9), ::testing::Values("shm")),
                         worldName);
INSTANTIATE_TEST_SUITE_P(Tcp, WorldSize, ::testing::Combine(::testing::Values(2, 3, 8), ::testing::Values("tcp")),
                         worldName);
INSTANTIATE_TEST_SUITE_P(Mixed, WorldSize, ::testing::Combine(::testing::Values(3, 8), ::testing::Values("mixed")),
                         worldName);

// The point-to-point cases below run over each kind of link.
class P2PLinks : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Links, P2PLinks, ::testing::ValuesIn(loomtest::kConformanceLinks),
                         [](const auto& info) { return std::string(info.param); });

TEST_P(P2PLinks, LargeBothDirectionsAtOnce) {
  loomtest::TransportSetup links(GetParam());
  // 80 MiB each way at once between two ranks (above the 64 MiB the suite promises).
  const size_t bytes = (80u << 20) + 5;
  runOk(2, [&](loom::Communicator& c) {
    const int peer = 1 - c.rank();
    std::vector<uint8_t> out(bytes), in(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) out[i] = pattern(c.rank(), peer, 0, i);
    auto r = c.irecv(in.data(), bytes, DataType::Uint8, peer);
    auto s = c.isend(out.data(), bytes, DataType::Uint8, peer);
    s.wait();
    r.wait();
    EXPECT_EQ(r.bytes(), bytes);
    for (size_t i = 0; i < bytes; ++i)
      if (in[i] != pattern(peer, c.rank(), 0, i)) FAIL() << "byte " << i;
  });
}

TEST_P(P2PLinks, ManyInFlightArriveInOrder) {
  loomtest::TransportSetup links(GetParam());
  // 2000 messages of mixed sizes on one tag: they must match in send order.
  runOk(3, [&](loom::Communicator& c) {
    const int to = (c.rank() + 1) % 3, from = (c.rank() + 2) % 3;
    const int kMsgs = 2000;
    std::vector<std::vector<uint8_t>> out(kMsgs), in(kMsgs);
    std::vector<loom::Work> works;
    for (int m = 0; m < kMsgs; ++m) {
      size_t len = (m % 10 == 0) ? 100000 + m : (m % 97);
      out[m].resize(len);
      for (size_t i = 0; i < len; ++i) out[m][i] = pattern(c.rank(), to, m, i);
      in[m].assign(len, 0);
    }
    // Post half the receives before and half after the sends: both the posted and the
    // unexpected paths are taken.
    for (int m = 0; m < kMsgs / 2; ++m) works.push_back(c.irecv(in[m].data(), in[m].size(), DataType::Uint8, from));
    for (int m = 0; m < kMsgs; ++m) works.push_back(c.isend(out[m].data(), out[m].size(), DataType::Uint8, to));
    for (int m = kMsgs / 2; m < kMsgs; ++m) works.push_back(c.irecv(in[m].data(), in[m].size(), DataType::Uint8, from));
    loom::waitAll(works);
    for (int m = 0; m < kMsgs; ++m)
      for (size_t i = 0; i < in[m].size(); ++i)
        if (in[m][i] != pattern(from, c.rank(), m, i)) FAIL() << "message " << m << " byte " << i;
  });
}

// With more ranks than cores, a TCP socket receiving a long payload wakes its reader only once a
// low-water mark of bytes has come (SO_RCVLOWAT, LOOM_TCP_LOWAT). The mark never asks for more
// than the payload still owes: messages around it and its multiples, posted before and after
// they arrive, both directions at once, arrive whole (a mark left too high would hold back a
// message's tail until the deadline).
TEST(P2P, TcpLowWaterMarkNeverHoldsBackATail) {
  loomtest::TransportSetup links("tcp");
  const size_t kMark = 4096;
  loomtest::EnvGuard mark("LOOM_TCP_LOWAT", std::to_string(kMark));
  loomtest::EnvGuard eager("LOOM_EAGER_BYTES", "1024");  // larger messages go after a CTS, into the receive
  loom::progress::noteRanksOnThisMachine(1 << 20);       // crowded, whatever this machine has
  const size_t sizes[] = {kMark - 1, kMark,    kMark + 1,      2 * kMark + 3, 65537,
                          300001,    1u << 20, (1u << 20) + 7, 3 * kMark,     (5u << 20) + 11};
  loom::Options o;
  o.timeout = std::chrono::seconds(20);  // a held-back tail shows as a timeout, not a hang
  runOk(
      2,
      [&](loom::Communicator& c) {
        const int peer = 1 - c.rank();
        const int n = static_cast<int>(sizeof sizes / sizeof sizes[0]);
        std::vector<std::vector<uint8_t>> out(n), in(n);
        std::vector<loom::Work> works;
        for (int m = 0; m < n; ++m) {
          out[m].resize(sizes[m]);
          for (size_t i = 0; i < sizes[m]; ++i) out[m][i] = pattern(c.rank(), peer, m, i);
          in[m].assign(sizes[m], 0);
        }
        // Half the receives before the sends (their bytes go straight in), half after (the
        // unexpected path), each on its own tag.
        for (int m = 0; m < n; m += 2) works.push_back(c.irecv(in[m].data(), sizes[m], DataType::Uint8, peer, m));
        for (int m = 0; m < n; ++m) works.push_back(c.isend(out[m].data(), sizes[m], DataType::Uint8, peer, m));
        for (int m = 1; m < n; m += 2) works.push_back(c.irecv(in[m].data(), sizes[m], DataType::Uint8, peer, m));
        loom::waitAll(works);
        for (int m = 0; m < n; ++m)
          for (size_t i = 0; i < sizes[m]; ++i)
            if (in[m][i] != pattern(peer, c.rank(), m, i)) FAIL() << "message " << m << " byte " << i;
      },
      o);
}

TEST_P(P2PLinks, TagsMatchIndependently) {
  loomtest::TransportSetup links(GetParam());
  runOk(2, [&](loom::Communicator& c) {
    if (c.rank() == 0) {
      std::vector<int32_t> a(10, 1), b(100000, 2);
      c.send(a.data(), a.size(), DataType::Int32, 1, 5);
      c.send(b.data(), b.size(), DataType::Int32, 1, 9);
    } else {
      // Receive tag 9 first (its RTS waits behind the tag-5 message), then tag 5.
      std::vector<int32_t> a(10), b(100000);
      auto wb = c.irecv(b.data(), b.size(), DataType::Int32, 0, 9);
      auto wa = c.irecv(a.data(), a.size(), DataType::Int32, 0, 5);
      wb.wait();
      wa.wait();
      EXPECT_EQ(a, std::vector<int32_t>(10, 1));
      EXPECT_EQ(b, std::vector<int32_t>(100000, 2));
    }
  });
}

// Receives posted before the sends tell the sender so (READY hints), and large messages then skip
// the RTS/CTS round trip. The hints must follow the matching order exactly: several receives
// waiting on one tag, a small message consuming a large receive, a message too large for the
// hint, receives posted late (no hint) and a hint racing its send.
TEST(P2P, ReadyHintsFollowMatchingOrder) {
  loomtest::TransportSetup links("tcp");  // READY hints are TCP's
  auto fill = [](std::vector<uint8_t>& v, int seed) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  };
  const size_t sizes[] = {100, 280 << 10, 300 << 10, 1536 << 10, 200 << 10, 500 << 10};
  const uint32_t tags[] = {7, 7, 7, 8, 7, 9};
  runOk(2, [&](loom::Communicator& c) {
    std::vector<std::vector<uint8_t>> msg(6);
    for (int m = 0; m < 6; ++m) {
      msg[m].resize(sizes[m]);
      fill(msg[m], m);
    }
    if (c.rank() == 0) {
      c.barrier();  // 1. the first four receives are posted (and hinted) by now
      for (int m = 0; m < 4; ++m) c.send(msg[m].data(), sizes[m], DataType::Uint8, 1, tags[m]);
      auto early = c.isend(msg[4].data(), sizes[4], DataType::Uint8, 1, tags[4]);  // 2. before its receive
      c.barrier();
      c.send(msg[5].data(), sizes[5], DataType::Uint8, 1, tags[5]);  // 3. races its hint
      early.wait();
    } else {
      std::vector<std::vector<uint8_t>> in(6);
      const size_t capacity[] = {300 << 10, 300 << 10, 300 << 10, 2 << 20, 200 << 10, 500 << 10};
      std::vector<loom::Work> w;
      for (int m = 0; m < 4; ++m) {
        in[m].assign(capacity[m], 0);
        w.push_back(c.irecv(in[m].data(), capacity[m], DataType::Uint8, 0, tags[m]));
      }
      c.barrier();
      c.barrier();
      for (int m = 4; m < 6; ++m) {
        in[m].assign(capacity[m], 0);
        w.push_back(c.irecv(in[m].data(), capacity[m], DataType::Uint8, 0, tags[m]));
      }
      for (int m = 0; m < 6; ++m) {
        w[m].wait();
        ASSERT_EQ(w[m].bytes(), sizes[m]) << "message " << m;
        EXPECT_TRUE(std::equal(msg[m].begin(), msg[m].end(), in[m].begin())) << "message " << m;
      }
    }
  });
}

TEST_P(P2PLinks, SmallerMessageIsAcceptedAndReported) {
  loomtest::TransportSetup links(GetParam());
  runOk(2, [&](loom::Communicator& c) {
    if (c.rank() == 0) {
      std::vector<float> v(10, 1.0f);
      c.send(v.data(), v.size(), DataType::Float32, 1);
    } else {
      std::vector<float> v(20, 0.0f);
      auto w = c.irecv(v.data(), v.size(), DataType::Float32, 0);
      w.wait();
      EXPECT_EQ(w.bytes(), 40u);
      EXPECT_EQ(v[9], 1.0f);
      EXPECT_EQ(v[10], 0.0f);
    }
  });
}

TEST_P(P2PLinks, LargerMessageThanReceiveIsAnErrorNotATruncation) {
  loomtest::TransportSetup links(GetParam());
  for (size_t count : {size_t{100}, size_t{1} << 20}) {  // eager, then RTS/CTS
    runOk(2, [&](loom::Communicator& c) {
      std::vector<uint8_t> big(count, 7), small(count / 2, 0), next(4, 0);
      if (c.rank() == 0) {
        auto w = c.isend(big.data(), big.size(), DataType::Uint8, 1);
        if (count > 1000) {  // the receiver refuses the announced message: the sender hears it
          try {
            w.wait();
            ADD_FAILURE() << "send of a too-large message succeeded";
          } catch (const loom::Error& e) {
            EXPECT_EQ(e.code(), loom::ErrorCode::InvalidUsage);
            // The same words over every link.
            EXPECT_NE(std::string(e.what()).find("is larger than the receive buffer rank 1 posted"), std::string::npos)
                << e.what();
          }
        } else {
          w.wait();
        }
        uint8_t ok[4] = {1, 2, 3, 4};
        c.send(ok, 4, DataType::Uint8, 1);  // the link is still usable
      } else {
        try {
          c.recv(small.data(), small.size(), DataType::Uint8, 0);
          ADD_FAILURE() << "receive of a too-large message succeeded";
        } catch (const loom::Error& e) {
          EXPECT_EQ(e.code(), loom::ErrorCode::InvalidUsage);
          EXPECT_NE(std::string(e.what()).find("larger than the receive buffer"), std::string::npos) << e.what();
        }
        for (uint8_t b : small) EXPECT_TRUE(b == 0 || b == 7);  // never written past its end
        c.recv(next.data(), 4, DataType::Uint8, 0);
        EXPECT_EQ(next, (std::vector<uint8_t>{1, 2, 3, 4}));
      }
    });
  }
}

// A receive posted and not waited on still completes in the background: the sender's blocking send
// of more than the sockets can buffer returns only once the receiver's progress thread has
// answered its announcement and read the bytes, while the receiver's own thread never looks.
TEST_P(P2PLinks, UnwaitedReceiveProgressesInTheBackground) {
  loomtest::TransportSetup links(GetParam());
  const size_t bytes = (64u << 20) + 3;
  std::atomic<bool> sent{false};
  runOk(2, [&](loom::Communicator& c) {
    std::vector<uint8_t> buf(bytes, 0);
    if (c.rank() == 1) {
      for (size_t i = 0; i < bytes; ++i) buf[i] = pattern(1, 0, 0, i);
      c.send(buf.data(), bytes, DataType::Uint8, 0);
      sent = true;
      return;
    }
    auto w = c.irecv(buf.data(), bytes, DataType::Uint8, 1);
    while (!sent) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // no wait(), no test()
    w.wait();
    EXPECT_EQ(w.bytes(), bytes);
    for (size_t i = 0; i < bytes; ++i)
      if (buf[i] != pattern(1, 0, 0, i)) FAIL() << "byte " << i;
  });
}

// A waiter whose peer comes late gives up spinning and sleeps; the progress threads then finish
// its receive (announced, large) and its send, and wake it.
TEST_P(P2PLinks, SleepingWaitersAreCompletedByTheProgressThreads) {
  loomtest::TransportSetup links(GetParam());
  const size_t bytes = (16u << 20) + 1;
  runOk(2, [&](loom::Communicator& c) {
    const int peer = 1 - c.rank();
    std::vector<uint8_t> out(bytes), in(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) out[i] = pattern(c.rank(), peer, 1, i);
    if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto r = c.irecv(in.data(), bytes, DataType::Uint8, peer, 1);
    auto s = c.isend(out.data(), bytes, DataType::Uint8, peer, 1);
    r.wait();
    s.wait();
    for (size_t i = 0; i < bytes; ++i)
      if (in[i] != pattern(peer, c.rank(), 1, i)) FAIL() << "byte " << i;
  });
}

TEST(P2P, BadArgumentsAreRejected) {
  runOk(2, [&](loom::Communicator& c) {
    auto expectCode = [](loom::ErrorCode code, const std::function<void()>& f) {
      try {
        f();
        ADD_FAILURE() << "no error";
      } catch (const loom::Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
      }
    };
    int x = 0;
    expectCode(loom::ErrorCode::InvalidArgument, [&] { c.isend(nullptr, 4, DataType::Int32, 1); });
    expectCode(loom::ErrorCode::InvalidArgument, [&] { c.isend(&x, 1, DataType::Int32, 2); });
    expectCode(loom::ErrorCode::InvalidArgument, [&] { c.isend(&x, 1, DataType::Int32, -1); });
    expectCode(loom::ErrorCode::InvalidArgument, [&] { c.isend(&x, static_cast<size_t>(-1), DataType::Int32, 1); });
    expectCode(loom::ErrorCode::InvalidArgument, [&] { c.isend(&x, 1, static_cast<DataType>(42), 1); });
    expectCode(loom::ErrorCode::InvalidArgument, [&] { c.irecv(&x, 1, DataType::Int32, 1, 0x80000000u); });
    c.send(nullptr, 0, DataType::Int32, 1 - c.rank());  // zero elements need no buffer
    c.recv(nullptr, 0, DataType::Int32, 1 - c.rank());
  });
}

TEST(Barrier, NobodyLeavesBeforeEveryoneEntered) {
  for (int n : {1, 2, 3, 5, 8}) {
    std::vector<std::atomic<int>> entered(30);
    for (auto& e : entered) e = 0;
    runOk(n, [&](loom::Communicator& c) {
      for (int it = 0; it < 30; ++it) {
        if ((it + c.rank()) % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        entered[it]++;
        c.barrier();
        EXPECT_EQ(entered[it].load(), n) << "iteration " << it;
      }
    });
  }
}

// Every rank on one node's arena (threads share memory): a barrier is a step on the arena's
// counters, which makes no link (12 ranks: links on first use), and a rank in another collective
// under the same number is named at once, not at the deadline.
TEST(Barrier, OnOneNodeItLinksNoOneAndAMismatchIsNamed) {
  std::vector<std::atomic<int>> entered(10);
  for (auto& e : entered) e = 0;
  runOk(12, [&](loom::Communicator& c) {
    for (int it = 0; it < 10; ++it) {
      if ((it + c.rank()) % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      entered[it]++;
      c.barrier();
      EXPECT_EQ(entered[it].load(), 12) << "iteration " << it;
    }
    EXPECT_EQ(c.linkCount(), 0) << "rank " << c.rank();
  });
  loom::Options o;
  o.timeout = std::chrono::seconds(20);
  const auto t0 = std::chrono::steady_clock::now();
  auto results = loomtest::runRanks(
      3,
      [&](loom::Communicator& c) {
        int32_t x = 1;
        if (c.rank() == 1)
          c.allReduce(&x, &x, 1, DataType::Int32, loom::ReduceOp::Sum);
        else
          c.barrier();
        c.barrier();
      },
      o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_NE(results[r].error.find("all_reduce of 1 int32 (sum)"), std::string::npos) << r << ": " << results[r].error;
    EXPECT_NE(results[r].error.find("barrier"), std::string::npos) << r << ": " << results[r].error;
  }
}

// The barrier's rows of the algorithm table: forced to the dissemination on one node, it goes over
// the links (ceil(log2 12) = 4 rounds: each rank linked to at most 8 peers), and still waits for
// every rank; loom-info's names for it parse.
TEST(Barrier, ForcedToTheDisseminationItGoesOverTheLinks) {
  loomtest::EnvGuard forced("LOOM_ALGO", "barrier:dissemination");
  std::vector<std::atomic<int>> entered(5);
  for (auto& e : entered) e = 0;
  runOk(12, [&](loom::Communicator& c) {
    EXPECT_EQ(c.algorithmFor("barrier", 0), "dissemination");
    for (int it = 0; it < 5; ++it) {
      if ((it + c.rank()) % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      entered[it]++;
      c.barrier();
      EXPECT_EQ(entered[it].load(), 12) << "iteration " << it;
    }
    EXPECT_GE(c.linkCount(), 1);
    EXPECT_LE(c.linkCount(), 8);
  });
  loomtest::EnvGuard unforced("LOOM_ALGO", "");
  runOk(3, [&](loom::Communicator& c) { EXPECT_EQ(c.algorithmFor("barrier", 0), "direct"); });
}

TEST(Barrier, AsynchronousBarriersCompleteInOrder) {
  runOk(4, [&](loom::Communicator& c) {
    std::vector<loom::Work> w;
    for (int i = 0; i < 50; ++i) w.push_back(c.ibarrier());
    c.barrier();  // queued behind the 50
    for (auto& x : w) EXPECT_TRUE(x.test());
  });
}

TEST(Communicator, AbortUnblocksAWaitingReceive) {
  auto results = loomtest::runRanks(2, [&](loom::Communicator& c) {
    if (c.rank() == 1) {
      int x = 0;
      auto w = c.irecv(&x, 1, DataType::Int32, 0);
      std::thread t([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        c.abort();
      });
      try {
        w.wait();
        ADD_FAILURE() << "wait returned after abort";
      } catch (const loom::Error& e) {
        EXPECT_EQ(e.code(), loom::ErrorCode::Aborted);
      }
      t.join();
      EXPECT_THROW(c.barrier(), loom::Error);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));  // stay connected meanwhile
    }
  });
  EXPECT_EQ(results[1].error, "");
}

TEST(Communicator, TimeoutNamesWhatWasAwaited) {
  loom::Options o;
  o.timeout = std::chrono::milliseconds(300);
  auto results = loomtest::runRanks(
      2,
      [&](loom::Communicator& c) {
        if (c.rank() == 1) {
          int x = 0;
          try {
            c.recv(&x, 1, DataType::Int32, 0, 3);
            ADD_FAILURE() << "no timeout";
          } catch (const loom::Error& e) {
            EXPECT_EQ(e.code(), loom::ErrorCode::Timeout);
            EXPECT_NE(std::string(e.what()).find("recv of 1 int32 from rank 0 (tag 3)"), std::string::npos) << e.what();
            EXPECT_EQ(e.peer(), 0);
          }
          // The communicator is failed now: every later call reports the original cause, after its
          // own name (a failure a progress thread found between two calls is still said by the call).
          try {
            c.barrier();
            ADD_FAILURE() << "no error after timeout";
          } catch (const loom::Error& e) {
            EXPECT_EQ(e.code(), loom::ErrorCode::Timeout);
            EXPECT_EQ(e.peer(), 0);
            const std::string what = e.what();
            EXPECT_NE(what.find("barrier: this communicator had already failed"), std::string::npos) << what;
            EXPECT_NE(what.find("recv of 1 int32 from rank 0 (tag 3)"), std::string::npos) << what;
          }
          float f = 1;
          try {
            c.allReduce(&f, &f, 1, DataType::Float32, loom::ReduceOp::Sum);
            ADD_FAILURE() << "no error after timeout";
          } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find("all_reduce: this communicator had already failed"), std::string::npos)
                << e.what();
          }
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // alive, but silent
        }
      },
      o);
  EXPECT_EQ(results[1].error, "");
}

// abort() from another thread on rank 0, while collectives of every kind of wait are pending (a
// blocking all-reduce in a direct barrier or a message wait, an asynchronous one queued behind it,
// a receive): every wait on rank 0 returns promptly with ErrorCode::Aborted, and rank 1's waits
// fail promptly too, saying rank 0 aborted. Calling it twice, and destroying the communicator
// right after, is safe.
TEST_P(P2PLinks, AbortFromAnotherThreadUnblocksEveryWaitPromptly) {
  loomtest::TransportSetup links(GetParam());
  auto results = loomtest::runRanks(3, [&](loom::Communicator& c) {
    std::vector<float> v(1 << 16, 1.0f), w(1 << 16, 1.0f);
    if (c.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // never joins the all-reduce
      return;
    }
    int x = 0;
    auto recv = c.irecv(&x, 1, DataType::Int32, 2, 5);
    auto queued = c.iallReduce(w.data(), w.data(), w.size(), DataType::Float32, loom::ReduceOp::Sum);
    const auto t0 = std::chrono::steady_clock::now();
    std::thread killer([&] {
      if (c.rank() != 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c.abort();
      c.abort();  // twice: no effect
    });
    auto expectAborted = [&](const loom::Error& e) {
      if (c.rank() == 0) {
        EXPECT_EQ(e.code(), loom::ErrorCode::Aborted) << e.what();
      } else {
        EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
      }
    };
    try {
      c.allReduce(v.data(), v.data(), v.size(), DataType::Float32, loom::ReduceOp::Sum);
      ADD_FAILURE() << "the all-reduce returned after abort";
    } catch (const loom::Error& e) {
      expectAborted(e);
    }
    for (loom::Work* work : {&queued, &recv}) {
      try {
        work->wait();
        ADD_FAILURE() << "a wait returned after abort";
      } catch (const loom::Error& e) {
        expectAborted(e);
      }
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "rank " << c.rank();
    killer.join();
  });
  EXPECT_EQ(results[0].error, "");
  EXPECT_EQ(results[1].error, "");
}

// After a rank died, the survivors shrink the communicator and go on without it.
TEST_P(P2PLinks, SurvivorsShrinkAndGoOn) {
  loomtest::TransportSetup links(GetParam());
  auto results = loomtest::runRanks(4, [&](loom::Communicator& c) {
    const int original = c.rank();
    try {
      c.barrier();  // every rank has finished joining (and measuring links)
    } catch (const loom::Error&) {
      // rank 1 may abort while a peer still finishes the barrier: that peer fails below too
    }
    if (original == 1) {
      c.abort();  // as good as dead for the others: its links close
      return;
    }
    std::vector<int32_t> v(1000, original);
    try {
      c.allReduce(v.data(), v.data(), v.size(), DataType::Int32, loom::ReduceOp::Sum);
      ADD_FAILURE() << "all-reduce with a dead rank succeeded";
    } catch (const loom::Error&) {
    }
    loom::Communicator s = c.shrink(std::chrono::seconds(2));
    EXPECT_EQ(s.size(), 3);
    EXPECT_EQ(s.rank(), original == 0 ? 0 : original - 1);
    std::vector<int32_t> u(1000, original);
    s.allReduce(u.data(), u.data(), u.size(), DataType::Int32, loom::ReduceOp::Sum);
    EXPECT_EQ(u[999], 0 + 2 + 3);
    s.barrier();
  });
  for (int r : {0, 2, 3}) EXPECT_EQ(results[static_cast<size_t>(r)].error, "") << r;
}

// LOOM_PORT_RANGE: every peer link listens inside the range; a range with no free port left is a
// clear error naming it. Links are probed with keepalives (the heartbeat on idle links).
// A receive that fails because its peer's communicator failed reaches a communicator already
// marked failed: the waiting thread may destroy it at once, and its goodbye to its other peers
// must then carry that cause, not "destroyed" (a third rank waiting on it reported the goodbye
// instead of the hang that started it, once in CI). Rank 0 fails its communicator by aborting it.
TEST_P(P2PLinks, AFailedReceiveFindsItsCommunicatorFailed) {
  loomtest::TransportSetup setup(GetParam());
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> failedBefore{-1};
    auto results = loomtest::runRanks(2, [&](loom::Communicator& c) {
      if (c.rank() == 0) {
        c.barrier();
        c.abort();
        return;
      }
      int x = 0;
      auto w = c.irecv(&x, 1, DataType::Int32, 0, 7);
      c.barrier();
      try {
        w.wait(std::chrono::seconds(20));
      } catch (const loom::Error&) {
        failedBefore = c.impl()->failureState()->failed() ? 1 : 0;
        throw;
      }
    });
    ASSERT_EQ(failedBefore.load(), 1) << "round " << round << ": rank 0: " << results[0].error
                                      << "; rank 1: " << results[1].error;
  }
}

TEST(P2P, ListenersStayInsideLoomPortRange) {
  loomtest::TransportSetup links("tcp");
  // A range of ports the kernel is not handing out now: bound to, then released.
  std::vector<loom::Socket> held;
  int lo = 0;
  for (int base = 41000; base < 60000 && lo == 0; base += 100) {
    held.clear();
    bool free = true;
    for (int p = base; p < base + 8 && free; ++p) {
      int err = 0;
      loom::SockAddr a = loom::SockAddr::any(AF_INET, p);
      held.push_back(loom::listenOn(a, 1, &err));
      free = held.back().valid();
    }
    if (free) lo = base;
  }
  ASSERT_NE(lo, 0);
  held.clear();
  const std::string range = std::to_string(lo) + "-" + std::to_string(lo + 7);
  setenv("LOOM_PORT_RANGE", range.c_str(), 1);
  loomtest::runOk(3, [&](loom::Communicator& c) {
    int32_t mine[3] = {0, 1, 2}, theirs[3];
    c.allToAll(mine, theirs, 1, DataType::Int32);  // links every pair (TCP links are made on first use)
    for (int p = c.rank() + 1; p < c.size(); ++p) {
      const std::string d = c.describeLink(p);  // "... -> 192.0.2.2:41003"
      const int port = std::atoi(d.substr(d.rfind(':') + 1).c_str());
      EXPECT_GE(port, lo) << d;
      EXPECT_LE(port, lo + 7) << d;
    }
    int x = c.rank();
    c.allReduce(&x, &x, 1, DataType::Int32, loom::ReduceOp::Sum);
    EXPECT_EQ(x, 3);
  });
  // Full: a range of one port someone holds.
  int err = 0;
  loom::Socket taken = loom::listenOn(loom::SockAddr::any(AF_INET, lo), 1, &err);
  ASSERT_TRUE(taken.valid());
  setenv("LOOM_PORT_RANGE", (std::to_string(lo) + "-" + std::to_string(lo)).c_str(), 1);
  std::string error;
  try {
    error = loomtest::runRanks(2, [](loom::Communicator&) {})[0].error;
  } catch (const loom::Error& e) {
    error = e.what();  // the unique id's store listens in the range too
  }
  unsetenv("LOOM_PORT_RANGE");
  EXPECT_NE(error.find("every port of LOOM_PORT_RANGE=" + std::to_string(lo) + "-"), std::string::npos) << error;
}
