// Communicator::split and loomCommSplit: ranks grouped by color and ordered by key (ties by rank),
// each group working alone, ranks left out with kSplitNoColor, splits of splits, the parent gone
// first, and a split one rank does not call named as a mismatch. Communicator::group: made by its
// members alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bootstrap/tcp_store_server.hpp"
#include "comm/comm_impl.hpp"
#include "common/env_guard.hpp"
#include "common/ranks.hpp"
#include "loom/loom.h"
#include "loom/loom.hpp"

namespace {

using loom::DataType;
using loom::ReduceOp;

// The old ranks of a communicator's members, in its rank order.
std::vector<int32_t> members(loom::Communicator& c, int32_t oldRank) {
  std::vector<int32_t> all(static_cast<size_t>(c.size()));
  c.allGather(&oldRank, all.data(), 1, DataType::Int32);
  return all;
}

class SplitLinks : public ::testing::TestWithParam<const char*> {};

TEST_P(SplitLinks, RanksAreGroupedByColorAndOrderedByKey) {
  loomtest::TransportSetup links(GetParam());
  loomtest::runOk(7, [](loom::Communicator& c) {
    const int r = c.rank();
    // Ranks 2 and 5 take no part; the others split by parity, in reverse order of rank, except
    // ranks 3 and 6 that share a key (their old ranks order them).
    const int color = (r == 2 || r == 5) ? loom::kSplitNoColor : r % 2;
    const int key = (r == 3 || r == 6) ? -10 : -r;
    loom::Communicator part = c.split(color, key);
    if (color == loom::kSplitNoColor) {
      EXPECT_FALSE(part.valid());
      try {
        (void)part.rank();
        ADD_FAILURE() << "an empty communicator answered rank()";
      } catch (const loom::Error& e) {
        EXPECT_EQ(e.code(), loom::ErrorCode::InvalidUsage);
        EXPECT_NE(std::string(e.what()).find("kSplitNoColor"), std::string::npos) << e.what();
      }
    } else {
      ASSERT_TRUE(part.valid());
      // color 0: ranks 0, 4, 6 with keys 0, -4, -10: 6, 4, 0. Color 1: 1, 3 with keys -1, -10: 3, 1.
      const std::vector<int32_t> want = color == 0 ? std::vector<int32_t>{6, 4, 0} : std::vector<int32_t>{3, 1};
      EXPECT_EQ(part.size(), static_cast<int>(want.size()));
      EXPECT_EQ(members(part, r), want);
      std::vector<int64_t> v(1001, r);
      part.allReduce(v.data(), v.data(), v.size(), DataType::Int64, ReduceOp::Sum);
      EXPECT_EQ(v[1000], color == 0 ? 10 : 4);
      // A split of the split: each rank alone.
      loom::Communicator alone = part.split(part.rank(), 0);
      EXPECT_EQ(alone.size(), 1);
      EXPECT_EQ(alone.rank(), 0);
      int32_t x = r;
      alone.allReduce(&x, &x, 1, DataType::Int32, ReduceOp::Sum);
      EXPECT_EQ(x, r);
    }
    // The parent goes on, and a second split numbers its groups afresh.
    int32_t sum = 1;
    c.allReduce(&sum, &sum, 1, DataType::Int32, ReduceOp::Sum);
    EXPECT_EQ(sum, 7);
    loom::Communicator halves = c.split(r < 4 ? 0 : 1, r);
    EXPECT_EQ(halves.size(), r < 4 ? 4 : 3);
    EXPECT_EQ(halves.rank(), r < 4 ? r : r - 4);
    halves.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Links, SplitLinks, ::testing::Values("shm", "tcp", "mixed"));

// The new communicators live on after their parent is destroyed, whichever goes first.
TEST(Split, SubCommunicatorsOutliveTheirParent) {
  loomtest::runOk(4, [](loom::Communicator& c) {
    const int r = c.rank();
    loom::Communicator part = c.split(r / 2, r);
    {
      loom::Communicator parent = std::move(c);  // destroyed at the end of this scope
      parent.barrier();
    }
    std::vector<float> v(4099, 1.0f);
    part.allReduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    EXPECT_EQ(v[4098], 2.0f);
    part.barrier();
  });
}

// A rank that calls another collective where the others split is named at once, not at the
// deadline; a negative color other than kSplitNoColor is refused before anything is sent.
TEST(Split, MismatchAndBadColorAreErrors) {
  auto results = loomtest::runRanks(3, [](loom::Communicator& c) {
    try {
      (void)c.split(-2, 0);
      ADD_FAILURE() << "color -2 accepted";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("color -2"), std::string::npos) << e.what();
    }
    if (c.rank() == 2) {
      float x = 1;
      c.allReduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);
    } else {
      (void)c.split(0, 0);
    }
  });
  for (const auto& r : results) {
    EXPECT_NE(r.error.find("all_gather"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("all_reduce"), std::string::npos) << r.error;
  }
}

// A split meets through its parent's links: over TCP (links made on first use) neither the split
// nor the new communicators' first collectives send the store a single request.
TEST(Split, MeetsThroughTheParentNotTheStore) {
  loomtest::TransportSetup links("tcp");
  std::atomic<uint64_t> before{0}, after{0};
  loomtest::runOk(6, [&](loom::Communicator& c) {
    c.barrier();  // everyone is past init, which does use the store
    if (c.rank() == 0) before = loom::TcpStoreServer::servedInProcess();
    c.barrier();
    loom::Communicator part = c.split(c.rank() % 3 == 0 ? loom::kSplitNoColor : c.rank() % 2, c.rank());
    if (part.valid()) {
      int32_t x = 1;
      part.allReduce(&x, &x, 1, DataType::Int32, ReduceOp::Sum);
      EXPECT_EQ(x, 2);
    }
    c.barrier();
    if (c.rank() == 0) after = loom::TcpStoreServer::servedInProcess();
  });
  EXPECT_EQ(after.load() - before.load(), 0u);
}

// The sequence number the communicator's next collective takes (a no-op run in its place; every
// rank calls it, as a collective).
int64_t nextSeq(loom::Communicator& c) {
  std::atomic<int64_t> seen{-1};
  c.impl()->submit("probe", [&](int64_t seq) { seen = seq; })->wait();
  return seen.load();
}

// A split takes three of the parent's sequence numbers on every rank, kSplitNoColor's too, so that
// the parent stays in step: the colors (an all-gather of the parent), the records (swapped within
// each new group) and who set up its links (said within each group whose ranks link at init; a
// group whose links are all made on first use says nothing). Such a group's split makes no link.
TEST(Split, TakesThreeOfTheParentsCallsAndLinksNothingMadeOnFirstUse) {
  loomtest::TransportSetup links("tcp");
  for (const char* connect : {"lazy", "eager"}) {
    loomtest::EnvGuard mode("LOOM_CONNECT", connect);
    loomtest::Meet counted(5);
    loomtest::runOk(5, [&](loom::Communicator& c) {
      const int64_t before = nextSeq(c);
      loom::Communicator part = c.split(c.rank() == 4 ? loom::kSplitNoColor : c.rank() % 2, 0);
      EXPECT_EQ(nextSeq(c) - before - 1, 3) << "LOOM_CONNECT=" << connect;
      if (part.valid()) {
        EXPECT_EQ(part.linkCount(), std::string(connect) == "lazy" ? 0 : 1);
      }
      counted.arrive();  // before a peer's first all-reduce links this rank
      if (part.valid()) {
        int32_t x = c.rank();
        part.allReduce(&x, &x, 1, DataType::Int32, ReduceOp::Sum);
        EXPECT_EQ(x, c.rank() % 2 == 0 ? 2 : 4);
      }
      int32_t y = 1;
      c.allReduce(&y, &y, 1, DataType::Int32, ReduceOp::Sum);  // the parent still in step
      EXPECT_EQ(y, 5);
    });
  }
}

// Within one node the records are swapped through the parent's arena, one step for all the groups,
// and the split makes no link of the parent's (over the links, each group's swap linked its members
// to one another): groups that link at init (4 ranks: their links are made then) and groups whose
// links are made on first use (10 ranks), with ranks of no group, the parent in step after each.
TEST(Split, WithinANodeItSwapsThroughTheArenaAndLinksNoOne) {
  loomtest::TransportSetup links("shm");
  loomtest::runOk(12, [](loom::Communicator& c) {
    const int r = c.rank();
    int32_t y = 1;
    c.allReduce(&y, &y, 1, DataType::Int32, ReduceOp::Sum);  // through the arena: no link
    ASSERT_EQ(c.linkCount(), 0);
    const int64_t before = nextSeq(c);
    loom::Communicator fours = c.split(r == 11 ? loom::kSplitNoColor : r % 3, r);
    EXPECT_EQ(nextSeq(c) - before - 1, 3);
    EXPECT_EQ(c.linkCount(), 0) << "the split linked the parent";
    if (r != 11) {
      ASSERT_EQ(fours.size(), r % 3 == 2 ? 3 : 4);
      EXPECT_EQ(fours.linkCount(), fours.size() - 1);  // up to 8 ranks: linked at init
      std::vector<int32_t> want;
      for (int q = r % 3; q < 11; q += 3) want.push_back(q);
      EXPECT_EQ(members(fours, r), want);
    }
    loom::Communicator most = c.split(r < 10 ? 0 : loom::kSplitNoColor, -r);
    EXPECT_EQ(c.linkCount(), 0);
    if (r < 10) {
      ASSERT_EQ(most.size(), 10);
      EXPECT_EQ(most.rank(), 9 - r);
      std::vector<int64_t> v(777, r);
      most.allReduce(v.data(), v.data(), v.size(), DataType::Int64, ReduceOp::Sum);
      EXPECT_EQ(v[776], 45);
    } else {
      EXPECT_FALSE(most.valid());
    }
    c.allReduce(&y, &y, 1, DataType::Int32, ReduceOp::Sum);
    EXPECT_EQ(y, 12 * 12);
  });
}

// A record longer than its slot (a long host identity here) takes the second round of the swap.
TEST(Split, LongRecordsStillMeet) {
  loom::Options options;
  options.hostId = std::string(700, 'h');  // one node all the same, named at length
  loomtest::runOk(
      5,
      [](loom::Communicator& c) {
        loom::Communicator part = c.split(c.rank() % 2, -c.rank());
        EXPECT_EQ(part.size(), c.rank() % 2 == 0 ? 3 : 2);
        EXPECT_EQ(part.nodeCount(), 1);
        std::vector<int32_t> v(33, c.rank());
        part.allReduce(v.data(), v.data(), v.size(), DataType::Int32, ReduceOp::Sum);
        EXPECT_EQ(v[32], c.rank() % 2 == 0 ? 6 : 4);
      },
      options);
}

// A new communicator that cannot set up its links fails on every member, each with its own error,
// and the parent's collectives stay in step: it goes on working.
TEST(Split, AFailedSetUpLeavesTheParentWorking) {
  loomtest::TransportSetup links("tcp");
  loomtest::runOk(4, [](loom::Communicator& c) {
    c.barrier();
    const char* was = std::getenv("LOOM_CONNECT");
    const std::string before = was != nullptr ? was : "";
    c.barrier();
    if (c.rank() == 0) setenv("LOOM_CONNECT", "sometimes", 1);  // read as the new links are set up
    c.barrier();
    try {
      (void)c.split(c.rank() == 3 ? loom::kSplitNoColor : 0, 0);
      if (c.rank() != 3) ADD_FAILURE() << "the split succeeded";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("LOOM_CONNECT=sometimes"), std::string::npos) << e.what();
    }
    c.barrier();
    if (c.rank() == 0) setenv("LOOM_CONNECT", before.c_str(), 1);
    c.barrier();
    int32_t x = 1;
    c.allReduce(&x, &x, 1, DataType::Int32, ReduceOp::Sum);
    EXPECT_EQ(x, 4);
    loom::Communicator again = c.split(c.rank() % 2, 0);
    again.barrier();
  });
}

// Communicator::group: made by its members alone, ranked in the order listed; overlapping groups;
// a rank that is not listed is refused.
TEST(Group, MembersAloneMakeItInTheirOrder) {
  loomtest::runOk(5, [](loom::Communicator& c) {
    const int r = c.rank();
    try {
      (void)c.group({0, 1}, "not mine");
      if (r > 1) ADD_FAILURE() << "a rank outside the group made it";
    } catch (const loom::Error& e) {
      EXPECT_GT(r, 1) << e.what();
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("not among its ranks"), std::string::npos) << e.what();
    }
    if (r == 4 || r == 1 || r == 3) {
      loom::Communicator a = c.group({4, 1, 3}, "a");
      EXPECT_EQ(members(a, r), (std::vector<int32_t>{4, 1, 3}));
      std::vector<int32_t> v(333, r);
      a.allReduce(v.data(), v.data(), v.size(), DataType::Int32, ReduceOp::Max);
      EXPECT_EQ(v[332], 4);
    }
    if (r == 1 || r == 2) {  // overlaps "a" at rank 1, which makes "a" first
      loom::Communicator b = c.group({2, 1}, "b");
      EXPECT_EQ(members(b, r), (std::vector<int32_t>{2, 1}));
    }
    c.barrier();
  });
}

// The C API: loomCommSplit, NULL for LOOM_SPLIT_NOCOLOR.
TEST(Split, CApi) {
  static_assert(LOOM_SPLIT_NOCOLOR == loom::kSplitNoColor, "the C and C++ no-color values agree");
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  std::vector<std::thread> ranks;
  std::vector<std::string> errors(3);
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      loomComm_t comm = nullptr;
      if (loomCommInitRank(&comm, 3, id, r) != loomSuccess) {
        errors[static_cast<size_t>(r)] = "init failed";
        return;
      }
      loomComm_t part = reinterpret_cast<loomComm_t>(1);
      const loomResult_t res = loomCommSplit(comm, r == 1 ? LOOM_SPLIT_NOCOLOR : 0, 0, &part);
      if (res != loomSuccess) errors[static_cast<size_t>(r)] = loomGetErrorString(res);
      if (r == 1) {
        if (part != nullptr) errors[1] = "a rank with LOOM_SPLIT_NOCOLOR got a communicator";
      } else {
        int size = 0, rank = -1;
        if (part == nullptr || loomCommCount(part, &size) != loomSuccess ||
            loomCommUserRank(part, &rank) != loomSuccess || size != 2 || rank != r / 2) {
          errors[static_cast<size_t>(r)] = "size " + std::to_string(size) + " rank " + std::to_string(rank);
        }
        loomCommDestroy(part);
      }
      loomCommDestroy(comm);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace
