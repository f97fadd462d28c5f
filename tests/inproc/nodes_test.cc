// Which ranks share a node: learnt at join from every rank's host identity (here set per rank
// through Options::hostId, as LOOM_HOST_ID would per process), numbered by lowest rank.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "loom/loom.hpp"

namespace {

struct Seen {
  int localRank = -1, localSize = -1, nodes = -1;
  std::vector<int> nodeOf;
  std::string error;
};

std::vector<Seen> joinWithHosts(const std::vector<std::string>& hosts) {
  const int n = static_cast<int>(hosts.size());
  auto id = loom::UniqueId::create();
  std::vector<Seen> seen(hosts.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        loom::Options o;
        o.timeout = o.initTimeout = std::chrono::seconds(30);
        o.hostId = hosts[static_cast<size_t>(r)];
        loom::Communicator c(r, n, id, o);
        Seen& s = seen[static_cast<size_t>(r)];
        s.localRank = c.localRank();
        s.localSize = c.localSize();
        s.nodes = c.nodeCount();
        for (int q = 0; q < n; ++q) s.nodeOf.push_back(c.nodeOf(q));
        c.barrier();
      } catch (const loom::Error& e) {
        seen[static_cast<size_t>(r)].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return seen;
}

}  // namespace

TEST(Nodes, RanksGroupByHostIdentity) {
  // Interleaved: node "b" holds ranks 1, 3 and 4; node "a" ranks 0 and 2.
  auto seen = joinWithHosts({"a", "b", "a", "b", "b"});
  const int node[] = {0, 1, 0, 1, 1}, local[] = {0, 0, 1, 1, 2}, localSize[] = {2, 3, 2, 3, 3};
  for (int r = 0; r < 5; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    ASSERT_EQ(s.error, "") << "rank " << r;
    EXPECT_EQ(s.nodes, 2);
    EXPECT_EQ(s.localRank, local[r]) << "rank " << r;
    EXPECT_EQ(s.localSize, localSize[r]) << "rank " << r;
    for (int q = 0; q < 5; ++q) EXPECT_EQ(s.nodeOf[static_cast<size_t>(q)], node[q]);
  }
}

TEST(Nodes, OneHostByDefault) {
  auto seen = joinWithHosts({"", "", ""});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(seen[static_cast<size_t>(r)].error, "");
    EXPECT_EQ(seen[static_cast<size_t>(r)].nodes, 1);
    EXPECT_EQ(seen[static_cast<size_t>(r)].localRank, r);
    EXPECT_EQ(seen[static_cast<size_t>(r)].localSize, 3);
  }
}

TEST(Nodes, NodeOfRejectsBadRanks) {
  auto id = loom::UniqueId::create();
  loom::Communicator c(0, 1, id);
  EXPECT_EQ(c.nodeOf(0), 0);
  EXPECT_THROW(c.nodeOf(1), loom::Error);
  EXPECT_THROW(c.nodeOf(-1), loom::Error);
}
