#include "collectives/plan.hpp"

#include <gtest/gtest.h>

#include <set>

// After the dissemination rounds, every rank must have heard (transitively) from every rank, and
// the rounds of senders and receivers must pair up exactly.
TEST(Plan, DisseminationBarrierCoversEveryRank) {
  for (int n = 1; n <= 64; ++n) {
    std::vector<std::vector<loom::BarrierRound>> plans;
    for (int r = 0; r < n; ++r) plans.push_back(loom::planDisseminationBarrier(r, n));
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
