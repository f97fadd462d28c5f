// The data-parallel layer's pure parts: how gradients are grouped into buckets, and how a dataset
// is sharded across ranks (include/loom/ddp.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "loom/ddp.hpp"

using loom::ddp::DistributedSampler;
using loom::ddp::planBuckets;
using Buckets = std::vector<std::vector<size_t>>;

TEST(BucketPlan, ReverseOrderAndCaps) {
  EXPECT_EQ(planBuckets({4, 4, 4, 4}, {0, 0, 0, 0}, 8, 8), (Buckets{{3, 2}, {1, 0}}));
  EXPECT_EQ(planBuckets({4, 4, 4, 4}, {0, 0, 0, 0}, 100, 100), (Buckets{{3, 2, 1, 0}}));
  EXPECT_EQ(planBuckets({}, {}, 8, 8), Buckets{});
}

TEST(BucketPlan, SmallFirstBucketThenTheCap) {
  // PyTorch's defaults: 1 MiB first, 25 MiB after; ten 512 KiB gradients.
  std::vector<size_t> bytes(10, 512u << 10);
  const Buckets b = planBuckets(bytes, std::vector<int>(10, 0), 1u << 20, 25u << 20);
  EXPECT_EQ(b, (Buckets{{9, 8}, {7, 6, 5, 4, 3, 2, 1, 0}}));
  // With a 2 MiB cap the rest splits in fours.
  EXPECT_EQ(planBuckets(bytes, std::vector<int>(10, 0), 1u << 20, 2u << 20),
            (Buckets{{9, 8}, {7, 6, 5, 4}, {3, 2, 1, 0}}));
}

TEST(BucketPlan, ATensorLargerThanTheCapIsAloneInItsBucket) {
  EXPECT_EQ(planBuckets({100, 10, 10}, {0, 0, 0}, 50, 50), (Buckets{{2, 1}, {0}}));
  EXPECT_EQ(planBuckets({10, 100, 10}, {0, 0, 0}, 50, 50), (Buckets{{2}, {1}, {0}}));
  EXPECT_EQ(planBuckets({100}, {0}, 50, 50), (Buckets{{0}}));
  // Zero-size gradients go along with their neighbours.
  EXPECT_EQ(planBuckets({0, 8, 0}, {0, 0, 0}, 8, 8), (Buckets{{2, 1, 0}}));
}

TEST(BucketPlan, DatatypesNeverShareABucket) {
  // float32 (kind 7) and float16 (kind 6) alternating: each kind fills its own buckets.
  const Buckets b = planBuckets({4, 2, 4, 2}, {7, 6, 7, 6}, 100, 100);
  EXPECT_EQ(b, (Buckets{{3, 1}, {2, 0}}));
  // Each kind has its own first bucket.
  EXPECT_EQ(planBuckets({4, 4, 4, 4}, {1, 2, 1, 2}, 4, 100), (Buckets{{3}, {2}, {1}, {0}}));
}

TEST(BucketPlan, EveryParameterExactlyOnceInAnyPlan) {
  std::vector<size_t> bytes;
  std::vector<int> kinds;
  for (size_t i = 0; i < 200; ++i) {
    bytes.push_back((i * 7919) % 5000);
    kinds.push_back(static_cast<int>(i % 3));
  }
  const Buckets b = planBuckets(bytes, kinds, 3000, 9000);
  std::vector<int> seen(200, 0);
  for (const auto& bucket : b) {
    size_t total = 0;
    for (size_t i : bucket) {
      ++seen[i];
      total += bytes[i];
      EXPECT_EQ(kinds[i], kinds[bucket.front()]);
    }
    if (bucket.size() > 1) {
      EXPECT_LE(total, 9000u);
    }
    EXPECT_TRUE(std::is_sorted(bucket.rbegin(), bucket.rend()));  // reverse registration order
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
}

namespace {

std::vector<std::vector<size_t>> shards(size_t n, int world, bool shuffle, uint64_t seed, bool dropLast,
                                        uint64_t epoch) {
  std::vector<std::vector<size_t>> all;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, r, world, shuffle, seed, dropLast);
    s.setEpoch(epoch);
    all.push_back(s.indices());
    EXPECT_EQ(all.back().size(), s.size());
  }
  return all;
}

}  // namespace

TEST(Sampler, PaddedShardsCoverTheDatasetAndAreEqualInSize) {
  for (int world : {1, 2, 3, 4, 7}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{10}, size_t{97}}) {
      const auto s = shards(n, world, true, 42, false, 3);
      std::multiset<size_t> all;
      for (const auto& shard : s) {
        EXPECT_EQ(shard.size(), (n + static_cast<size_t>(world) - 1) / static_cast<size_t>(world));
        all.insert(shard.begin(), shard.end());
      }
      for (size_t i = 0; i < n; ++i) EXPECT_GE(all.count(i), 1u) << "index " << i << " world " << world;
      EXPECT_EQ(all.size() - std::set<size_t>(all.begin(), all.end()).size(),
                all.size() - std::min(all.size(), n))  // only the padding repeats
          << "world " << world << " n " << n;
    }
  }
}

TEST(Sampler, DropLastGivesDisjointShards) {
  const auto s = shards(10, 3, true, 1, true, 0);
  std::set<size_t> all;
  for (const auto& shard : s) {
    EXPECT_EQ(shard.size(), 3u);
    all.insert(shard.begin(), shard.end());
  }
  EXPECT_EQ(all.size(), 9u);
}

TEST(Sampler, ReshuffledPerEpochTheSameOnEveryRank) {
  const auto a = shards(100, 4, true, 7, false, 0), again = shards(100, 4, true, 7, false, 0),
             b = shards(100, 4, true, 7, false, 1), c = shards(100, 4, true, 8, false, 0);
  EXPECT_EQ(a, again);  // every rank (and every run) computes the same partition
  EXPECT_NE(a, b);      // another epoch, another order
  EXPECT_NE(a, c);      // another seed, another order
  // Without shuffling: rank, rank + world, ...
  const auto plain = shards(10, 4, false, 0, false, 5);
  EXPECT_EQ(plain[1], (std::vector<size_t>{1, 5, 9}));
  EXPECT_EQ(plain[3], (std::vector<size_t>{3, 7, 1}));  // padded from the start
}

TEST(Sampler, RankOutOfRangeIsRejected) {
  EXPECT_THROW(DistributedSampler(10, 4, 4), loom::Error);
  EXPECT_THROW(DistributedSampler(10, -1, 4), loom::Error);
  EXPECT_THROW(DistributedSampler(10, 0, 0), loom::Error);
}
