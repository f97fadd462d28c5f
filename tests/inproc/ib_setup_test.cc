// The ib transport's set-up at init, over the tests' verbs provider: every pair's queue pairs are
// brought up with a few requests to the store per rank, not a poll per peer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "bootstrap/tcp_store_server.hpp"
#include "common/env_guard.hpp"
#include "common/ranks.hpp"
#include "loom_config.h"

#if LOOM_HAVE_IBVERBS

namespace {

using loom::DataType;
using loom::ReduceOp;

// The store requests of an init of n ranks and an all-reduce, one rank late (the others wait for it
// on the store's side), with the ranks linked by `mode`, at init (`connect` eager) or on first use.
uint64_t initRequests(const std::string& mode, int n, const std::string& connect = "eager") {
  loomtest::EnvGuard links_made("LOOM_CONNECT", connect);
  loomtest::TransportSetup links(mode);
  const uint64_t before = loom::TcpStoreServer::servedInProcess();
  std::atomic<uint64_t> after{0};
  loomtest::PerRankOptions late([n](int r, loom::Options&) {
    if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  loomtest::runOk(n, [&](loom::Communicator& c) {
    EXPECT_EQ(c.transportOf((c.rank() + 1) % n), mode);
    int32_t x = c.rank();
    c.allReduce(&x, &x, 1, DataType::Int32, ReduceOp::Sum);  // every rank is past init
    EXPECT_EQ(x, n * (n - 1) / 2);
    if (c.rank() == 0) after = loom::TcpStoreServer::servedInProcess();
  });
  return after.load() - before;
}

// A full mesh of queue pairs costs each rank a write of its addresses for every peer, in one
// request, and a read of those meant for it, in a few (waits held on the store's side between);
// the links' "up" is the communicator's own meeting: about 6 requests per rank beyond the join. Reading
// each peer's key in turn, polling it every millisecond, and a second exchange saying "up" cost about
// 30 at 8 ranks.
TEST(IbSetUp, AsksTheStoreAFewTimesPerRank) {
  const int n = 8;
  const uint64_t tcp = initRequests("tcp", n);  // the join itself: TCP links read the records only
  const uint64_t ib = initRequests("ib", n);
  std::printf("[ requests ] %d ranks, a full mesh at init: ib %llu, tcp %llu\n", n, static_cast<unsigned long long>(ib),
              static_cast<unsigned long long>(tcp));
  EXPECT_LE(ib, tcp + 10 * n) << "ib: " << ib << " requests, tcp: " << tcp << ", for " << n << " ranks";
}

// Links made on first use swap their queue pairs' addresses over the side channel: not one
// request to the store beyond the join (the peers' side-channel addresses are in their records).
TEST(IbSetUp, LinksOnFirstUseAskTheStoreNothing) {
  const int n = 8;
  const uint64_t tcp = initRequests("tcp", n);
  const uint64_t ib = initRequests("ib", n, "lazy");
  std::printf("[ requests ] %d ranks, ib links on first use: ib %llu, tcp (a mesh at init) %llu\n", n,
              static_cast<unsigned long long>(ib), static_cast<unsigned long long>(tcp));
  EXPECT_LE(ib, tcp + n) << "ib: " << ib << " requests, tcp: " << tcp << ", for " << n << " ranks";
}

}  // namespace

#endif  // LOOM_HAVE_IBVERBS
