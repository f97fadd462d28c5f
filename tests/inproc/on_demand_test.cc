// Links made on first use (LOOM_CONNECT=lazy, the default above 8 ranks; transport/on_demand_connection.hpp,
// transport/sockets/on_demand_links.hpp): a rank links only the peers its operations touch, either
// rank of a pair may need the link first (or both at once), operations posted before the link is
// up keep their order and their place against receives from any source, and a peer that is gone
// is named at once. LOOM_CONNECT=eager keeps the full mesh made at init.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/env_guard.hpp"
#include "common/ranks.hpp"
#include "loom_config.h"
#include "net/interfaces.hpp"
#include "net/socket.hpp"
#include "transport/sockets/handshake.hpp"

namespace {

using loom::DataType;

int log2Ceil(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

void nothingIsLinkedAtInitAndAnAllReduceLinksFewPeers(const std::string& mode) {
  loomtest::TransportSetup links(mode);
  for (int n : {2, 5, 16}) {
    SCOPED_TRACE(n);
    loomtest::Meet meet(n), counted(n);
    loomtest::runOk(n, [n, &mode, &meet, &counted](loom::Communicator& c) {
      EXPECT_EQ(c.linkCount(), 0);
      EXPECT_NE(c.describeLink((c.rank() + 1) % n).find("not linked"), std::string::npos)
          << c.describeLink((c.rank() + 1) % n);
      meet.arrive();
      for (size_t count : {size_t{1}, size_t{4099}}) {
        std::vector<int64_t> in(count), out(count);
        for (size_t i = 0; i < count; ++i) in[i] = c.rank() * 1000 + static_cast<int64_t>(i);
        c.allReduce(in.data(), out.data(), count, DataType::Int64, loom::ReduceOp::Sum);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], 1000 * n * (n - 1) / 2 + n * static_cast<int64_t>(i)) << i;
      }
      // (Within a node the all-reduce may read its peers' data in place: no link at all.)
      if (mode != "shm-lazy") {
        EXPECT_GE(c.linkCount(), 1);
      }
      EXPECT_LE(c.linkCount(), 2 * log2Ceil(n) + 2);
      counted.arrive();  // before any rank links more
      // A pattern that needs every peer links every peer.
      std::vector<int32_t> all(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) all[static_cast<size_t>(p)] = c.rank() * 100 + p;
      c.allToAll(all.data(), got.data(), 1, DataType::Int32);
      for (int p = 0; p < n; ++p) EXPECT_EQ(got[static_cast<size_t>(p)], p * 100 + c.rank());
      EXPECT_EQ(c.linkCount(), n - 1);
      const char* kind = mode == "ib" ? "ib over" : mode == "tcp" ? "tcp, 2 sockets" : "shm, rings";
      EXPECT_NE(c.describeLink((c.rank() + 1) % n).find(kind), std::string::npos) << c.describeLink((c.rank() + 1) % n);
    });
  }
}

// Both ranks of every pair send first, at once: the two dials cross, one link is kept, and every
// message arrives once, in order.
void dialsThatCrossMakeOneLink(const std::string& mode) {
  loomtest::TransportSetup links(mode);
  constexpr int kRanks = 4;
  constexpr int kMessages = 5;
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE(round);
    loomtest::runOk(kRanks, [](loom::Communicator& c) {
      std::vector<std::vector<int32_t>> out(kRanks * kMessages), in(kRanks * kMessages);
      std::vector<loom::Work> works;
      for (int p = 0; p < kRanks; ++p) {
        if (p == c.rank()) continue;
        for (int m = 0; m < kMessages; ++m) {
          auto& o = out[static_cast<size_t>(p * kMessages + m)];
          o.assign(1000 + 997 * static_cast<size_t>(m), c.rank() * 10 + m);
          works.push_back(c.isend(o.data(), o.size(), DataType::Int32, p, 7));
        }
      }
      for (int p = 0; p < kRanks; ++p) {
        if (p == c.rank()) continue;
        for (int m = 0; m < kMessages; ++m) {
          auto& i = in[static_cast<size_t>(p * kMessages + m)];
          i.assign(1000 + 997 * static_cast<size_t>(m), -1);
          works.push_back(c.irecv(i.data(), i.size(), DataType::Int32, p, 7));
        }
      }
      for (auto& w : works) w.wait();
      for (int p = 0; p < kRanks; ++p) {
        if (p == c.rank()) continue;
        for (int m = 0; m < kMessages; ++m)
          for (int32_t v : in[static_cast<size_t>(p * kMessages + m)]) ASSERT_EQ(v, p * 10 + m) << "from " << p;
      }
      EXPECT_EQ(c.linkCount(), kRanks - 1);
    });
  }
}

// Every rank sends to the next before it receives from the previous: no rank's send may wait for
// its peer's application thread to accept the link.
void aRingOfSendsBeforeReceives(const std::string& mode) {
  loomtest::TransportSetup links(mode);
  constexpr int kRanks = 6;
  loomtest::runOk(kRanks, [](loom::Communicator& c) {
    const int next = (c.rank() + 1) % kRanks, prev = (c.rank() + kRanks - 1) % kRanks;
    std::vector<int32_t> out(300000, c.rank()), in(300000, -1);  // beyond the eager size
    loom::Work s = c.isend(out.data(), out.size(), DataType::Int32, next, 3);
    c.recv(in.data(), in.size(), DataType::Int32, prev, 3);
    s.wait();
    for (int32_t v : in) ASSERT_EQ(v, prev);
    EXPECT_EQ(c.linkCount(), 2);
  });
}

// Receives from any source posted before any link is up take the first messages; a receive named
// for a peer keeps its place against them while its link is being made.
void receivesFromAnySourceBeforeAnyLink(const std::string& mode) {
  loomtest::TransportSetup links(mode);
  constexpr int kRanks = 4;
  loomtest::runOk(kRanks, [](loom::Communicator& c) {
    if (c.rank() != 0) {
      int32_t v = c.rank();
      c.send(&v, 1, DataType::Int32, 0, 11);
      c.send(&v, 1, DataType::Int32, 0, 12);
      return;
    }
    std::vector<int32_t> got(kRanks - 1, -1);
    std::vector<loom::Work> any;
    for (int k = 0; k < kRanks - 1; ++k)
      any.push_back(c.irecv(&got[static_cast<size_t>(k)], 1, DataType::Int32, loom::kAnySource, 11));
    std::vector<int> sources;
    for (int k = 0; k < kRanks - 1; ++k) {
      any[static_cast<size_t>(k)].wait();
      sources.push_back(any[static_cast<size_t>(k)].source());
      EXPECT_EQ(got[static_cast<size_t>(k)], sources.back());
    }
    std::sort(sources.begin(), sources.end());
    EXPECT_EQ(sources, (std::vector<int>{1, 2, 3}));
    // Posted in this order on tag 12: named for 1, any, any: rank 1's message is the named one's.
    int32_t fromOne = -1, a = -1, b = -1;
    loom::Work named = c.irecv(&fromOne, 1, DataType::Int32, 1, 12);
    loom::Work x = c.irecv(&a, 1, DataType::Int32, loom::kAnySource, 12);
    loom::Work y = c.irecv(&b, 1, DataType::Int32, loom::kAnySource, 12);
    named.wait();
    x.wait();
    y.wait();
    EXPECT_EQ(fromOne, 1);
    EXPECT_NE(x.source(), 1);
    EXPECT_NE(y.source(), 1);
  });
}

// A peer whose communicator is gone before its link was made: the first operation on it fails at
// once, naming it, not after the timeout.
void aPeerGoneBeforeItsLinkIsNamedAtOnce(const std::string& mode) {
  loomtest::TransportSetup links(mode);
  constexpr int kRanks = 3;
  std::atomic<int> gone{0};
  auto results = loomtest::runRanks(kRanks, [&](loom::Communicator& c) {
    if (c.rank() == 2) {
      gone = 1;
      return;  // destroys its communicator: its listener closes
    }
    while (gone.load() == 0) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    int32_t v = 1;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.send(&v, 1, DataType::Int32, 2, 5);
      ADD_FAILURE() << "rank " << c.rank() << ": a send to a rank that is gone succeeded";
    } catch (const loom::Error& e) {
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(results[2].error, "");
}

TEST(OnDemand, NothingIsLinkedAtInitAndAnAllReduceLinksFewPeers) {
  nothingIsLinkedAtInitAndAnAllReduceLinksFewPeers("tcp");
}
TEST(OnDemand, DialsThatCrossMakeOneLink) { dialsThatCrossMakeOneLink("tcp"); }
TEST(OnDemand, ARingOfSendsBeforeReceives) { aRingOfSendsBeforeReceives("tcp"); }
TEST(OnDemand, ReceivesFromAnySourceBeforeAnyLink) { receivesFromAnySourceBeforeAnyLink("tcp"); }
TEST(OnDemand, APeerGoneBeforeItsLinkIsNamedAtOnce) { aPeerGoneBeforeItsLinkIsNamedAtOnce("tcp"); }

// The same over shared memory: a rank links a peer of its node from its side alone (it backs the
// ring it writes in the peer's segment), and the peer's progress thread links back.
TEST(OnDemandShm, NothingIsLinkedAtInitAndAnAllReduceLinksFewPeers) {
  nothingIsLinkedAtInitAndAnAllReduceLinksFewPeers("shm-lazy");
}
TEST(OnDemandShm, DialsThatCrossMakeOneLink) { dialsThatCrossMakeOneLink("shm-lazy"); }
TEST(OnDemandShm, ARingOfSendsBeforeReceives) { aRingOfSendsBeforeReceives("shm-lazy"); }
TEST(OnDemandShm, ReceivesFromAnySourceBeforeAnyLink) { receivesFromAnySourceBeforeAnyLink("shm-lazy"); }
TEST(OnDemandShm, APeerGoneBeforeItsLinkIsNamedAtOnce) { aPeerGoneBeforeItsLinkIsNamedAtOnce("shm-lazy"); }

// A rank sent to, that posts nothing, links back by itself (its progress thread, woken by the
// sender's link request): what arrives is read, and the link is there for its replies.
TEST(OnDemandShm, APeerSentToLinksBackUnasked) {
  loomtest::TransportSetup links("shm-lazy");
  loomtest::Meet sent(3);
  loomtest::runOk(3, [&sent](loom::Communicator& c) {
    int32_t v = 42;
    if (c.rank() == 1) c.send(&v, 1, DataType::Int32, 0, 9);  // eager: done once in the ring
    sent.arrive();
    if (c.rank() != 0) {
      EXPECT_EQ(c.linkCount(), c.rank() == 1 ? 1 : 0);
      return;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (c.linkCount() == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(c.linkCount(), 1);
    EXPECT_NE(c.describeLink(1).find("shm, rings"), std::string::npos) << c.describeLink(1);
    EXPECT_NE(c.describeLink(2).find("not linked"), std::string::npos) << c.describeLink(2);
    int32_t got = 0;
    c.recv(&got, 1, DataType::Int32, loom::kAnySource, 9);
    EXPECT_EQ(got, 42);
  });
}

#if LOOM_HAVE_IBVERBS
// The same over ib (the tests' verbs provider): the side channel's socket is dialled and proved as
// TCP's, then the two ranks swap their queue pairs' addresses over it.
TEST(OnDemandIb, NothingIsLinkedAtInitAndAnAllReduceLinksFewPeers) {
  nothingIsLinkedAtInitAndAnAllReduceLinksFewPeers("ib");
}
TEST(OnDemandIb, DialsThatCrossMakeOneLink) { dialsThatCrossMakeOneLink("ib"); }
TEST(OnDemandIb, ARingOfSendsBeforeReceives) { aRingOfSendsBeforeReceives("ib"); }
TEST(OnDemandIb, ReceivesFromAnySourceBeforeAnyLink) { receivesFromAnySourceBeforeAnyLink("ib"); }
TEST(OnDemandIb, APeerGoneBeforeItsLinkIsNamedAtOnce) { aPeerGoneBeforeItsLinkIsNamedAtOnce("ib"); }
#endif

// Gather and scatter on 64 ranks: the root links its 63 peers, every other rank the root alone
// (no rank forwards another's block, as a tree would).
TEST(OnDemand, GatherAndScatterLinkTheRootToItsPeersOnly) {
  loomtest::TransportSetup links("tcp");
  constexpr int kRanks = 64, kRoot = 5;
  loomtest::runOk(kRanks, [](loom::Communicator& c) {
    const bool root = c.rank() == kRoot;
    std::vector<int32_t> mine(3, c.rank()), all(root ? 3 * kRanks : 0), back(3, -1);
    c.gather(mine.data(), root ? all.data() : nullptr, 3, DataType::Int32, kRoot);
    if (root) {
      for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<int32_t>(i / 3));
    }
    c.scatter(root ? all.data() : nullptr, back.data(), 3, DataType::Int32, kRoot);
    EXPECT_EQ(back, mine);
    EXPECT_EQ(c.linkCount(), root ? kRanks - 1 : 1);
  });
}

TEST(OnDemand, EagerLinksEveryPeerAtInit) {
  loomtest::TransportSetup tcp("tcp");
  loomtest::EnvGuard eager("LOOM_CONNECT", "eager");
  loomtest::runOk(5, [](loom::Communicator& c) {
    EXPECT_EQ(c.linkCount(), 4);
    int32_t v = c.rank(), sum = 0;
    c.allReduce(&v, &sum, 1, DataType::Int32, loom::ReduceOp::Sum);
    EXPECT_EQ(sum, 10);
  });
}

// The default (auto): a full mesh at init up to 8 ranks, where it is a few links and the first
// operation keeps its latency; links on first use above.
TEST(OnDemand, AutoLinksSmallJobsAtInitLargerOnFirstUse) {
  loomtest::TransportSetup tcp("tcp");
  loomtest::EnvGuard automatic("LOOM_CONNECT", "auto");
  for (int n : {8, 9}) {
    SCOPED_TRACE(n);
    loomtest::Meet meet(n);
    loomtest::runOk(n, [n, &meet](loom::Communicator& c) {
      EXPECT_EQ(c.linkCount(), n <= 8 ? n - 1 : 0);
      meet.arrive();  // before a peer's all-reduce links this rank
      int32_t v = 1, sum = 0;
      c.allReduce(&v, &sum, 1, DataType::Int32, loom::ReduceOp::Sum);
      EXPECT_EQ(sum, n);
    });
  }
}

// Across nodes both kinds are made on first use: shared memory's within a node, TCP's between.
TEST(OnDemand, AcrossNodesBothKindsOfLinkWait) {
  loomtest::TransportSetup mixed("mixed");      // even and odd ranks on two nodes
  loomtest::EnvGuard noTune("LOOM_TUNE", "0");  // (else init measures a link to a partner)
  loomtest::Meet meet(6);
  loomtest::runOk(6, [&meet](loom::Communicator& c) {
    EXPECT_EQ(c.linkCount(), 0);
    meet.arrive();
    std::vector<float> in(70000, 1.0f), out(70000);
    c.allReduce(in.data(), out.data(), in.size(), DataType::Float32, loom::ReduceOp::Sum);
    for (float v : out) ASSERT_EQ(v, 6.0f);
    EXPECT_GT(c.linkCount(), 0);
    std::vector<int32_t> all(6), got(6);
    for (int p = 0; p < 6; ++p) all[static_cast<size_t>(p)] = c.rank() * 10 + p;
    c.allToAll(all.data(), got.data(), 1, DataType::Int32);
    for (int p = 0; p < 6; ++p) EXPECT_EQ(got[static_cast<size_t>(p)], p * 10 + c.rank());
    EXPECT_EQ(c.linkCount(), 5);
    for (int p = 0; p < 6; ++p) {
      if (p == c.rank()) continue;
      EXPECT_NE(c.describeLink(p).find(p % 2 == c.rank() % 2 ? "shm, rings" : "tcp, 2 sockets"), std::string::npos)
          << c.describeLink(p);
    }
  });
}

TEST(OnDemand, AnUnknownSettingIsAClearError) {
  loomtest::TransportSetup tcp("tcp");
  loomtest::EnvGuard bad("LOOM_CONNECT", "sometimes");
  auto results = loomtest::runRanks(2, [](loom::Communicator&) {});
  for (const auto& r : results)
    EXPECT_NE(r.error.find("LOOM_CONNECT=sometimes: expected auto, lazy or eager"), std::string::npos) << r.error;
}

// A dialled socket is bound to its interface's address but leaves the port to connect(), which
// may give sockets to different peers the same one: a bind that picked the port reserved one per
// socket, and a large job beside the sockets its earlier runs left in TIME_WAIT ran the ephemeral
// range down (links then waited on the kernel's search for a free port).
TEST(OnDemand, DialsLeaveThePortToConnect) {
  const loom::SockAddr any = loom::SockAddr::resolve("127.0.0.1", 0).front();
  int err = 0;
  loom::Socket a = loom::listenOn(any, 4, &err), b = loom::listenOn(any, 4, &err);
  ASSERT_TRUE(a.valid() && b.valid()) << err;
  const loom::Interface lo{"lo", any};
  std::string why;
  for (const loom::Socket* to : {&a, &b}) {
    loom::Socket s = loom::sockets::dialFrom(lo, loom::localAddress(to->fd()), &why);
    ASSERT_TRUE(s.valid()) << why;
    int noPort = 0;
    socklen_t len = sizeof(noPort);
    ASSERT_EQ(getsockopt(s.fd(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &noPort, &len), 0);
    EXPECT_EQ(noPort, 1);
    EXPECT_EQ(loom::localAddress(s.fd()).host(), "127.0.0.1");  // still from its interface
  }
}

}  // namespace
