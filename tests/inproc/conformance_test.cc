// The transport conformance suite: what every Connection must do, run over every link of
// loomtest::kConformanceLinks (common/ranks.hpp), ranks as threads. A new transport adds its name
// there and passes these (and the link-parameterised tests of p2p_test.cc):
//   - sizes from 0 to 100 MB, across every protocol boundary, both directions at once, receives
//     posted before and after their messages;
//   - buffers at odd addresses on both sides;
//   - many tags at once, matched per tag in send order whatever order the receives come in;
//   - memory registered and deregistered while messages flow (registration.hpp): a registration
//     covers what was asked and names it for the peer, and the traffic is unharmed, also through
//     buffers freed and allocated again between messages;
//   - a peer that fails: every pending request (receives on several tags, announced sends not
//     yet taken) fails with an error naming that peer, and none hangs.
// The self link (a rank's messages to itself) is checked alike where it applies.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_impl.hpp"
#include "common/ranks.hpp"

using loom::DataType;
using loomtest::pattern;
using loomtest::runOk;

namespace {

class Conformance : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Links, Conformance, ::testing::ValuesIn(loomtest::kConformanceLinks),
                         [](const auto& info) { return std::string(info.param); });

// Around every protocol boundary the transports have (eager 64 KiB, collective push and ring
// chunks 512 KiB to 2 MiB, shared-memory ring 1 MiB, stripe 256 KiB), and up to 100 MB.
const size_t kSizes[] = {
    0, 1, 7, 4095, 65535, 65536, 65537, 262145, 1048575, 1048577, (2u << 20) + 9, (16u << 20) + 3, 100u * 1000 * 1000};

bool samePattern(const std::vector<uint8_t>& v, size_t off, size_t n, int src, int dst, int msg) {
  for (size_t i = 0; i < n; ++i)
    if (v[off + i] != pattern(src, dst, msg, i)) return false;
  return true;
}

TEST_P(Conformance, EverySizeBothDirectionsPostedBeforeAndAfter) {
  loomtest::TransportSetup links(GetParam());
  runOk(2, [&](loom::Communicator& c) {
    const int peer = 1 - c.rank();
    for (size_t k = 0; k < std::size(kSizes); ++k) {
      const size_t n = kSizes[k];
      const int msg = static_cast<int>(k);
      std::vector<uint8_t> out(n), in(n + 16, 0xEE);
      for (size_t i = 0; i < n; ++i) out[i] = pattern(c.rank(), peer, msg, i);
      // Even sizes: the receive is posted first; odd: the message is sent first (rank 0 waits
      // for it to have gone before posting), so both the posted and the unexpected paths run.
      const bool recvFirst = k % 2 == 0;
      loom::Work r;
      if (recvFirst) r = c.irecv(in.data(), n + 16, DataType::Uint8, peer, 3);
      c.barrier();
      auto s = c.isend(out.data(), n, DataType::Uint8, peer, 3);
      if (!recvFirst) {
        if (n <= 65536) s.wait();  // an eager message is gone; a larger one waits for its receive
        r = c.irecv(in.data(), n + 16, DataType::Uint8, peer, 3);
      }
      r.wait();
      s.wait();
      ASSERT_EQ(r.bytes(), n) << "size " << n;
      ASSERT_TRUE(samePattern(in, 0, n, peer, c.rank(), msg)) << "size " << n;
      for (size_t i = n; i < n + 16; ++i) ASSERT_EQ(in[i], 0xEE) << "written past the message, size " << n;
    }
  });
}

TEST_P(Conformance, BuffersAtOddAddresses) {
  loomtest::TransportSetup links(GetParam());
  runOk(2, [&](loom::Communicator& c) {
    const int peer = 1 - c.rank();
    int msg = 0;
    for (size_t n : {size_t{1}, size_t{1027}, size_t{100005}, (size_t{3} << 20) + 1}) {
      for (size_t sendOff : {1, 3}) {
        for (size_t recvOff : {5, 7}) {
          std::vector<uint8_t> out(n + 8), in(n + 8, 0);
          for (size_t i = 0; i < n; ++i) out[sendOff + i] = pattern(c.rank(), peer, msg, i);
          auto r = c.irecv(in.data() + recvOff, n, DataType::Uint8, peer, 11);
          auto s = c.isend(out.data() + sendOff, n, DataType::Uint8, peer, 11);
          r.wait();
          s.wait();
          ASSERT_TRUE(samePattern(in, recvOff, n, peer, c.rank(), msg))
              << "size " << n << " offsets " << sendOff << "/" << recvOff;
          ++msg;
        }
      }
    }
  });
}

TEST_P(Conformance, ManyTagsMatchPerTagInSendOrder) {
  loomtest::TransportSetup links(GetParam());
  // 300 tags, two messages each (one small, one announced), sent in tag order; the receiver posts
  // half its receives (the high tags, in reverse) before the sends and the rest after.
  const int kTags = 300;
  runOk(2, [&](loom::Communicator& c) {
    const int peer = 1 - c.rank();
    auto sizeOf = [](int tag, int which) { return which == 0 ? size_t(tag % 50) : size_t(70000 + tag); };
    std::vector<std::vector<uint8_t>> out(2 * kTags), in(2 * kTags);
    std::vector<loom::Work> works;
    auto post = [&](int tag) {
      for (int w = 0; w < 2; ++w) {
        auto& b = in[static_cast<size_t>(2 * tag + w)];
        b.assign(sizeOf(tag, w), 0);
        works.push_back(c.irecv(b.data(), b.size(), DataType::Uint8, peer, static_cast<uint32_t>(tag)));
      }
    };
    for (int tag = kTags - 1; tag >= kTags / 2; --tag) post(tag);
    c.barrier();
    for (int tag = 0; tag < kTags; ++tag)
      for (int w = 0; w < 2; ++w) {
        auto& b = out[static_cast<size_t>(2 * tag + w)];
        b.resize(sizeOf(tag, w));
        for (size_t i = 0; i < b.size(); ++i) b[i] = pattern(c.rank(), peer, 2 * tag + w, i);
        works.push_back(c.isend(b.data(), b.size(), DataType::Uint8, peer, static_cast<uint32_t>(tag)));
      }
    for (int tag = 0; tag < kTags / 2; ++tag) post(tag);
    loom::waitAll(works);
    for (int m = 0; m < 2 * kTags; ++m)
      ASSERT_TRUE(samePattern(in[static_cast<size_t>(m)], 0, in[static_cast<size_t>(m)].size(), peer, c.rank(), m))
          << "message " << m % 2 << " of tag " << m / 2;
  });
}

TEST_P(Conformance, RegistrationAndDeregistrationUnderTraffic) {
  loomtest::TransportSetup links(GetParam());
  runOk(2, [&](loom::Communicator& c) {
    const int peer = 1 - c.rank();
    loom::detail::CommImpl& impl = *c.impl();
    // Another thread of the rank registers and drops buffers it allocates and frees, all along.
    std::atomic<bool> stop{false};
    std::atomic<int> churned{0};
    std::thread churn([&] {
      for (size_t k = 0; !stop.load() || churned.load() < 50; ++k) {
        std::vector<uint8_t> b(((k % 7) + 1) << 18);
        loom::Registration r = impl.registerMemory(peer, b.data() + k % 5, b.size() - 5);
        if (!r->covers(b.data() + k % 5, b.size() - 5)) ADD_FAILURE() << "a registration misses its range";
        churned.fetch_add(1);
      }
    });
    int msg = 0;
    for (size_t n : {size_t{1}, size_t{65537}, (size_t{3} << 20) + 5, size_t{1} << 20, (size_t{3} << 20) + 5}) {
      // Fresh buffers each time: the large ones are freed and most likely handed out again at the
      // same addresses, where a stale registration would show.
      auto out = std::make_unique<uint8_t[]>(n);
      auto in = std::make_unique<uint8_t[]>(n);
      for (size_t i = 0; i < n; ++i) out[i] = pattern(c.rank(), peer, msg, i);
      loom::Registration rs = impl.registerMemory(peer, out.get(), n);
      loom::Registration rr = impl.registerMemory(peer, in.get(), n);
      ASSERT_TRUE(rs->covers(out.get(), n));
      ASSERT_TRUE(rr->covers(in.get(), n));
      // The receiver names its buffer for the peer, as a one-sided write would need.
      const loom::RemoteMemory mine = rr->remote(in.get(), n);
      loom::RemoteMemory theirs;
      auto rm = c.irecv(&theirs, sizeof theirs, DataType::Uint8, peer, 30);
      c.isend(&mine, sizeof mine, DataType::Uint8, peer, 30).wait();
      rm.wait();
      EXPECT_EQ(theirs.bytes, n);
      EXPECT_NE(theirs.addr, 0u);
      auto r = c.irecv(in.get(), n, DataType::Uint8, peer, 31);
      auto s = c.isend(out.get(), n, DataType::Uint8, peer, 31);
      rs.reset();  // dropped while its message may still move: a transport holds its own for that
      r.wait();
      s.wait();
      rr.reset();
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(in[i], pattern(peer, c.rank(), msg, i)) << "size " << n << " byte " << i;
      ++msg;
    }
    stop.store(true);
    churn.join();
    // Bad input is refused, not crashed on.
    try {
      impl.registerMemory(peer, nullptr, 8);
      ADD_FAILURE() << "a null address was registered";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
    }
    EXPECT_THROW(impl.registerMemory(7, &stop, 8), loom::Error);
    EXPECT_NE(impl.registerMemory(c.rank(), &msg, sizeof msg), nullptr);  // its own rank: no keys needed
  });
}

TEST_P(Conformance, AFailedPeerIsNamedOnEveryPendingRequest) {
  loomtest::TransportSetup links(GetParam());
  // Rank 1 has receives pending on five tags and two large sends announced but never taken when
  // rank 0 aborts: each of the seven fails, naming rank 0, well within the communicator's timeout.
  std::atomic<int> named{0};
  auto results = loomtest::runRanks(2, [&](loom::Communicator& c) {
    if (c.rank() == 0) {
      c.barrier();
      c.barrier();
      c.abort();
      return;
    }
    std::vector<int32_t> small(5 * 16);
    std::vector<uint8_t> big(2 * (4u << 20), 1);
    std::vector<loom::Work> pending;
    for (int t = 0; t < 5; ++t) pending.push_back(c.irecv(small.data() + 16 * t, 16, DataType::Int32, 0, 20 + t));
    c.barrier();
    for (int k = 0; k < 2; ++k)
      pending.push_back(c.isend(big.data() + k * (4u << 20), 4u << 20, DataType::Uint8, 0, 40));
    c.barrier();
    for (auto& w : pending) {
      try {
        w.wait(std::chrono::seconds(20));
        ADD_FAILURE() << "a request to a failed peer succeeded";
      } catch (const loom::Error& e) {
        EXPECT_NE(e.code(), loom::ErrorCode::Timeout) << e.what();
        const std::string what = e.what();
        if (e.peer() == 0 || what.find("rank 0") != std::string::npos) {
          ++named;
        } else {
          ADD_FAILURE() << "the error does not name rank 0: " << what;
        }
      }
    }
  });
  EXPECT_EQ(results[0].error, "");
  EXPECT_EQ(named.load(), 7);
}

// The self link: a rank's messages to itself, in 1- and 3-rank communicators, on every size up to
// the large ones, per tag in send order, and a message larger than its receive refused.
TEST(SelfLink, ConformsLikeAnyLink) {
  for (int n : {1, 3}) {
    runOk(n, [&](loom::Communicator& c) {
      const int me = c.rank();
      int msg = 0;
      for (size_t size : {size_t{0}, size_t{1}, size_t{65537}, (size_t{16} << 20) + 3}) {
        std::vector<uint8_t> a(size + 3), b(size + 3), ra(size + 5, 0), rb(size + 5, 0);
        for (size_t i = 0; i < size; ++i) {
          a[1 + i] = pattern(me, me, msg, i);
          b[1 + i] = pattern(me, me, msg + 1, i);
        }
        // Two sends on one tag before any receive, a receive on another tag in between.
        auto s1 = c.isend(a.data() + 1, size, DataType::Uint8, me, 4);
        auto s2 = c.isend(b.data() + 1, size, DataType::Uint8, me, 4);
        int32_t other = 0, one = 9;
        auto ro = c.irecv(&other, 1, DataType::Int32, me, 5);
        auto so = c.isend(&one, 1, DataType::Int32, me, 5);
        auto r1 = c.irecv(ra.data() + 3, size + 2, DataType::Uint8, me, 4);
        auto r2 = c.irecv(rb.data() + 3, size + 2, DataType::Uint8, me, 4);
        for (auto* w : {&s1, &s2, &ro, &so, &r1, &r2}) w->wait();
        EXPECT_EQ(other, 9);
        ASSERT_EQ(r1.bytes(), size);
        ASSERT_TRUE(samePattern(ra, 3, size, me, me, msg)) << size;
        ASSERT_TRUE(samePattern(rb, 3, size, me, me, msg + 1)) << size;
        msg += 2;
      }
      std::vector<uint8_t> big(100, 1), small(10, 0);
      auto s = c.isend(big.data(), big.size(), DataType::Uint8, me, 6);
      try {
        c.irecv(small.data(), small.size(), DataType::Uint8, me, 6).wait();
        ADD_FAILURE() << "a receive smaller than its message succeeded";
      } catch (const loom::Error& e) {
        EXPECT_EQ(e.code(), loom::ErrorCode::InvalidUsage);
        EXPECT_NE(std::string(e.what()).find("larger than the receive buffer of 10 bytes"), std::string::npos)
            << e.what();
      }
      EXPECT_EQ(small, std::vector<uint8_t>(10, 0));
      EXPECT_THROW(s.wait(), loom::Error);  // the send fails with it
    });
  }
}

}  // namespace
