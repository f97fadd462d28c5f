#include "collectives/plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

// After the dissemination rounds, every rank must have heard (transitively) from every rank, and
// the rounds of senders and receivers must pair up exactly.
TEST(Plan, DisseminationBarrierCoversEveryRank) {
  for (int n = 1; n <= 64; ++n) {
    std::vector<std::vector<loom::coll::BarrierRound>> plans;
    for (int r = 0; r < n; ++r) plans.push_back(loom::coll::planDisseminationBarrier(r, n));
    size_t rounds = plans[0].size();
    size_t expect = 0;
    while ((1 << expect) < n) ++expect;
    EXPECT_EQ(rounds, expect) << n;
    std::vector<std::set<int>> heard(n);
    for (int r = 0; r < n; ++r) heard[r].insert(r);
    for (size_t k = 0; k < rounds; ++k) {
      auto next = heard;
      for (int r = 0; r < n; ++r) {
        const auto& round = plans[r][k];
        EXPECT_EQ(plans[round.to][k].from, r) << "n=" << n << " round " << k;
        next[round.to].insert(heard[r].begin(), heard[r].end());
      }
      heard = next;
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(heard[r].size(), static_cast<size_t>(n)) << "n=" << n << " rank " << r;
  }
}

TEST(Plan, SegmentsAndChunksCoverEveryElementOnce) {
  for (size_t count : {0, 1, 2, 7, 1021, 1048579})
    for (int parts = 1; parts <= 9; ++parts) {
      auto segs = loom::coll::planSegments(count, parts);
      ASSERT_EQ(segs.size(), static_cast<size_t>(parts));
      size_t next = 0;
      for (const auto& s : segs) {
        EXPECT_EQ(s.offset, next);
        EXPECT_LE(s.count, count / parts + 1);
        size_t inner = s.offset;
        for (const auto& ch : loom::coll::planChunks(s, 1000)) {
          EXPECT_EQ(ch.offset, inner);
          EXPECT_LE(ch.count, 1000u);
          inner += ch.count;
        }
        EXPECT_EQ(inner, s.offset + s.count);
        next += s.count;
      }
      EXPECT_EQ(next, count);
    }
}

// In every step, what a rank sends is what its right neighbour receives; every segment is
// reduced by every rank exactly once and ends owned by exactly one rank.
TEST(Plan, RingScheduleIsConsistent) {
  for (int n = 2; n <= 64; ++n)
    for (int shift : {0, n - 1}) {
      std::vector<int> owners(n, 0);
      for (int r = 0; r < n; ++r) {
        std::vector<int> reduced(n, 0);
        for (int s = 0; s < n - 1; ++s) {
          EXPECT_EQ(loom::coll::ringSendSegment(r, n, s, shift), loom::coll::ringRecvSegment((r + 1) % n, n, s, shift));
          EXPECT_EQ(loom::coll::ringGatherSend(r, n, s, shift), loom::coll::ringGatherRecv((r + 1) % n, n, s, shift));
          if (s > 0) {
            EXPECT_EQ(loom::coll::ringSendSegment(r, n, s, shift), loom::coll::ringRecvSegment(r, n, s - 1, shift));
          }
          reduced[loom::coll::ringRecvSegment(r, n, s, shift)]++;
        }
        int own = loom::coll::ringOwnedSegment(r, n, shift);
        EXPECT_EQ(own, loom::coll::ringRecvSegment(r, n, n - 2, shift));
        EXPECT_EQ(loom::coll::ringGatherSend(r, n, 0, shift), own);
        owners[own]++;
        EXPECT_EQ(reduced[loom::coll::ringSendSegment(r, n, 0, shift)], 0);  // its own first segment: input only
      }
      for (int o : owners) EXPECT_EQ(o, 1);
      if (shift == n - 1) {
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(loom::coll::ringOwnedSegment(r, n, shift), r);
        }
      }
    }
}

// Every channel's ring visits every rank once; neighbours agree (my next's prev is me); positions
// are consecutive along the ring; odd channels run the other way round from even ones.
TEST(Plan, ChannelRingsAreRingsInAlternatingDirections) {
  for (int n = 1; n <= 64; ++n)
    for (int ch = 0; ch < 4; ++ch) {
      std::vector<int> seen(n, 0);
      for (int r = 0; r < n; ++r) {
        loom::coll::RingView v = loom::coll::planRing(r, n, ch);
        ASSERT_GE(v.pos, 0);
        ASSERT_LT(v.pos, n);
        seen[v.pos]++;
        EXPECT_EQ(loom::coll::ringRankAt(v.pos, n, ch), r);
        EXPECT_EQ(loom::coll::planRing(v.next, n, ch).prev, r);
        EXPECT_EQ(loom::coll::planRing(v.next, n, ch).pos, (v.pos + 1) % n);
        EXPECT_EQ(v.next, ch % 2 == 0 ? (r + 1) % n : (r + n - 1) % n);
      }
      for (int s : seen) EXPECT_EQ(s, 1);
    }
}

TEST(Plan, ChannelCountKeepsSegmentsLargeEnough) {
  EXPECT_EQ(loom::coll::planChannelCount(1 << 20, 4, 1, 64 << 10), 1);
  EXPECT_EQ(loom::coll::planChannelCount(1 << 20, 1, 4, 64 << 10), 1);
  EXPECT_EQ(loom::coll::planChannelCount(0, 4, 4, 64 << 10), 1);
  EXPECT_EQ(loom::coll::planChannelCount(256 << 10, 4, 4, 64 << 10), 1);  // 64 KiB per rank: one channel
  EXPECT_EQ(loom::coll::planChannelCount(512 << 10, 4, 4, 64 << 10), 2);  // 128 KiB per rank: two of 64 KiB
  EXPECT_EQ(loom::coll::planChannelCount(64 << 20, 4, 4, 64 << 10), 4);   // capped
  EXPECT_EQ(loom::coll::planChannelCount(64 << 20, 8, 16, 0), 16);        // no minimum
}

TEST(Plan, BinomialTreeParentsAndChildrenAgree) {
  for (int n = 1; n <= 64; ++n)
    for (int root : {0, n / 2, n - 1}) {
      std::vector<int> parentOf(n, -2);
      for (int r = 0; r < n; ++r) {
        auto node = loom::coll::planBinomialTree(r, n, root);
        EXPECT_EQ(node.parent == -1, r == root);
        for (int child : node.children) {
          EXPECT_EQ(parentOf[child], -2) << "two parents";
          parentOf[child] = r;
        }
      }
      for (int r = 0; r < n; ++r) {
        if (r == root) continue;
        EXPECT_EQ(parentOf[r], loom::coll::planBinomialTree(r, n, root).parent) << "n=" << n << " r=" << r;
      }
    }
}

TEST(Plan, RecursiveDoublingPartnersArePaired) {
  for (int n = 1; n <= 64; ++n) {
    std::vector<loom::coll::DoublingPlan> plans;
    for (int r = 0; r < n; ++r) plans.push_back(loom::coll::planRecursiveDoubling(r, n));
    int active = 0;
    for (int r = 0; r < n; ++r) {
      const auto& p = plans[r];
      if (p.foldTo >= 0) {
        EXPECT_EQ(plans[p.foldTo].foldFrom, r);
        EXPECT_TRUE(p.partners.empty());
        continue;
      }
      ++active;
      for (size_t k = 0; k < p.partners.size(); ++k) EXPECT_EQ(plans[p.partners[k]].partners[k], r);
    }
    EXPECT_EQ(active & (active - 1), 0) << "active ranks form a power of two";
  }
}

// Halving-doubling: partners agree on every step; each step's receives are the partner's sends,
// message by message; keep and give split the range both hold; the owned ranges of the active
// ranks cover the buffer exactly once; the all-gather's sends cover what the rank keeps, with the
// early ones inside the next step's keep and the rest exactly the next step's receives.
TEST(Plan, HalvingDoublingExchangesMatchAndCoverTheBuffer) {
  auto same = [](const std::vector<loom::coll::Segment>& x, const std::vector<loom::coll::Segment>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].offset != y[i].offset || x[i].count != y[i].count) return false;
    return true;
  };
  auto covers = [](const std::vector<loom::coll::Segment>& parts, const loom::coll::Segment& whole) {
    std::vector<int> seen(whole.count, 0);
    for (const auto& p : parts) {
      if (p.offset < whole.offset || p.offset + p.count > whole.offset + whole.count) return false;
      for (size_t e = 0; e < p.count; ++e) ++seen[p.offset - whole.offset + e];
    }
    for (int s : seen)
      if (s != 1) return false;
    return true;
  };
  for (int n = 1; n <= 33; ++n)
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1021}, size_t{100003}})
      for (size_t chunk : {size_t{1}, size_t{3}, size_t{64}, size_t{1} << 20}) {
        if (chunk == 1 && count > 1021) continue;
        std::vector<loom::coll::HalvingPlan> plans;
        for (int r = 0; r < n; ++r) plans.push_back(loom::coll::planHalvingDoubling(r, n, count, chunk));
        std::vector<int> owner(count, 0);
        for (int r = 0; r < n; ++r) {
          const auto& p = plans[r];
          SCOPED_TRACE("n=" + std::to_string(n) + " r=" + std::to_string(r) + " count=" + std::to_string(count) +
                       " chunk=" + std::to_string(chunk));
          if (p.foldTo >= 0) {
            EXPECT_EQ(plans[p.foldTo].foldFrom, r);
            EXPECT_TRUE(p.steps.empty());
            continue;
          }
          loom::coll::Segment range{0, count};
          for (size_t k = 0; k < p.steps.size(); ++k) {
            const auto& s = p.steps[k];
            const auto& q = plans[s.partner].steps[k];
            EXPECT_EQ(q.partner, r);
            EXPECT_TRUE(same(s.rsRecv, q.rsSend));
            EXPECT_TRUE(same(s.agRecv, q.agSend));
            EXPECT_TRUE(covers({s.keep, s.give}, range));
            EXPECT_TRUE(covers(s.rsRecv, s.keep));
            EXPECT_TRUE(covers(s.rsSend, s.give));
            EXPECT_TRUE(covers(s.agSend, s.keep));
            EXPECT_TRUE(covers(s.agRecv, s.give));
            if (k + 1 < p.steps.size()) {
              const auto& next = p.steps[k + 1];
              std::vector<loom::coll::Segment> early(s.rsRecv.begin(), s.rsRecv.begin() + static_cast<long>(s.rsEarly));
              EXPECT_TRUE(covers(early, next.give));
              std::vector<loom::coll::Segment> ready(s.agSend.begin(), s.agSend.begin() + static_cast<long>(s.agEarly));
              EXPECT_TRUE(covers(ready, next.keep));
              std::vector<loom::coll::Segment> forwarded(s.agSend.begin() + static_cast<long>(s.agEarly),
                                                         s.agSend.end());
              EXPECT_TRUE(same(forwarded, next.agRecv));
            } else {
              EXPECT_EQ(s.rsEarly, 0u);
              EXPECT_EQ(s.agEarly, s.agSend.size());
            }
            for (const auto& ch : s.rsRecv) EXPECT_LE(ch.count, chunk);
            range = s.keep;
          }
          EXPECT_EQ(p.owned.offset, range.offset);
          EXPECT_EQ(p.owned.count, range.count);
          for (size_t e = 0; e < p.owned.count; ++e) ++owner[p.owned.offset + e];
        }
        for (size_t e = 0; e < count; ++e) ASSERT_EQ(owner[e], 1) << "n=" << n << " element " << e;
      }
}

// Both trees of the double binary tree span every rank: one root, consistent parents and
// children, no cycles; and most ranks that are leaves in one tree are interior in the other.
TEST(Plan, DoubleBinaryTreesAreSpanningTrees) {
  for (int n = 1; n <= 64; ++n) {
    int leafInBoth = 0;
    std::vector<int> leaves(n, 0);
    for (int t = 0; t < 2; ++t) {
      int roots = 0;
      for (int r = 0; r < n; ++r) {
        auto node = loom::coll::planDoubleTree(r, n, t);
        if (node.parent < 0)
          ++roots;
        else {
          auto p = loom::coll::planDoubleTree(node.parent, n, t);
          EXPECT_TRUE(p.children[0] == r || p.children[1] == r) << "n=" << n << " tree " << t << " rank " << r;
        }
        for (int child : node.children) {
          if (child >= 0) {
            EXPECT_EQ(loom::coll::planDoubleTree(child, n, t).parent, r);
          }
        }
        if (node.children[0] < 0 && node.children[1] < 0) leaves[r]++;
        // Walking up reaches the root within n steps: no cycles.
        int cur = r, steps = 0;
        while (cur >= 0 && steps <= n) {
          cur = loom::coll::planDoubleTree(cur, n, t).parent;
          ++steps;
        }
        EXPECT_LE(steps, n) << "cycle";
      }
      EXPECT_EQ(roots, 1) << "n=" << n << " tree " << t;
    }
    for (int r = 0; r < n; ++r) leafInBoth += leaves[r] == 2 ? 1 : 0;
    if (n >= 4) {
      EXPECT_LE(leafInBoth, 1) << "n=" << n;  // the shifted tree of an odd size shares one
    }
  }
}

TEST(Plan, HierarchyLeadersAndGroups) {
  // Nodes {0,2,4}, {1,3}, {5}: leaders are the lowest ranks, unless the root is on the node.
  const std::vector<std::vector<int>> nodes = {{0, 2, 4}, {1, 3}, {5}};
  auto h = loom::coll::planHierarchy(nodes, 2, 0);
  EXPECT_EQ(h.local, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(h.localIndex, 1);
  EXPECT_EQ(h.localRoot, 0);
  EXPECT_EQ(h.leaders, (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(h.leaderIndex, -1);
  EXPECT_EQ(h.leaderRoot, 0);
  // Root 3: node 1 is led by 3; this rank (3) leads it and is the leaders' root.
  h = loom::coll::planHierarchy(nodes, 3, 3);
  EXPECT_EQ(h.leaders, (std::vector<int>{0, 3, 5}));
  EXPECT_EQ(h.leaderIndex, 1);
  EXPECT_EQ(h.leaderRoot, 1);
  EXPECT_EQ(h.localRoot, 1);
  EXPECT_EQ(h.localIndex, 1);
  // Every rank finds itself exactly once, and every leader is on its node.
  for (int root = 0; root < 6; ++root)
    for (int r = 0; r < 6; ++r) {
      auto x = loom::coll::planHierarchy(nodes, r, root);
      EXPECT_EQ(x.local[static_cast<size_t>(x.localIndex)], r);
      EXPECT_EQ(x.leaders[static_cast<size_t>(x.leaderRoot)], root);
      const int myLeader = x.local[static_cast<size_t>(x.localRoot)];
      EXPECT_NE(std::find(x.leaders.begin(), x.leaders.end(), myLeader), x.leaders.end());
      EXPECT_EQ(x.leaderIndex >= 0, myLeader == r);
    }
}
