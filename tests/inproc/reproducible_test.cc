// Reproducible mode (docs/reproducibility.md): every float sum, avg and prod reduction returns, per
// element, the canonical tree over rank order of the ranks' inputs. Checked bit for bit against
// that tree computed here, independently of the library's kernel, on data of a large dynamic range
// (where the default mode's algorithms do differ: shown below), for every float type and op, counts
// 0 to 65537 (element i is a function of i alone, so one reference serves every size), in place
// and out of place, on shared memory, TCP and mixed node layouts, with forced algorithms and pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/canonical_tree.hpp"
#include "common/env_guard.hpp"
#include "common/ranks.hpp"
#include "kernels/reduce.hpp"
#include "loom/loom.h"
#include "loom/loom.hpp"

namespace {

using loom::DataType;
using loom::ReduceOp;
using loomtest::EnvGuard;
using loomtest::runOk;
using loomtest::TransportSetup;

constexpr DataType kFloatTypes[] = {DataType::Float16, DataType::Float32, DataType::Float64, DataType::Bfloat16};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Prod};
constexpr size_t kCounts[] = {0, 1, 7, 13, 4099, 65537};

// Rank r's element i: a signed mantissa in [1, 2) times 2^e, e spread wide (narrower for float16,
// whose range is small); near 1 for products, so that eight of them stay finite.
double value(int rank, size_t i, DataType t, ReduceOp op) {
  const uint64_t h = loomtest::mix64((static_cast<uint64_t>(rank) << 40) ^ i ^ (static_cast<uint64_t>(t) << 56));
  const double mant = 1.0 + static_cast<double>(h & 0xfffff) / 1048576.0;
  const double sign = (h >> 20) & 1 ? -1.0 : 1.0;
  if (op == ReduceOp::Prod) return sign * mant * (((h >> 21) & 1) ? 0.5 : 1.0);
  const int span = t == DataType::Float16 ? 6 : 20;
  const int e = static_cast<int>((h >> 24) % static_cast<uint64_t>(2 * span + 1)) - span;
  return sign * std::ldexp(mant, e);
}

size_t elemSize(DataType t) { return t == DataType::Float64 ? 8 : t == DataType::Float32 ? 4 : 2; }

// Writes v as type t (rounded to nearest even) at p[i].
void put(void* p, size_t i, DataType t, double v) {
  auto* b = static_cast<uint8_t*>(p) + i * elemSize(t);
  if (t == DataType::Float64) {
    std::memcpy(b, &v, 8);
  } else {
    const auto f = static_cast<float>(v);
    if (t == DataType::Float32) {
      std::memcpy(b, &f, 4);
    } else {
      const uint16_t h = t == DataType::Float16 ? loom::kernels::floatToFp16(f) : loom::kernels::floatToBf16(f);
      std::memcpy(b, &h, 2);
    }
  }
}
// Reads p[i] of type t, widened.
double get(const void* p, size_t i, DataType t) {
  const auto* b = static_cast<const uint8_t*>(p) + i * elemSize(t);
  if (t == DataType::Float64) {
    double v;
    std::memcpy(&v, b, 8);
    return v;
  }
  if (t == DataType::Float32) {
    float f;
    std::memcpy(&f, b, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b, 2);
  return t == DataType::Float16 ? loom::kernels::fp16ToFloat(h) : loom::kernels::bf16ToFloat(h);
}

// The expected bits of element i over n ranks whose element i is value(r, index).
void expected(void* out, size_t i, int n, size_t index, DataType t, ReduceOp op) {
  const bool mul = op == ReduceOp::Prod;
  if (t == DataType::Float64) {
    std::vector<double> x;
    for (int r = 0; r < n; ++r) x.push_back(value(r, index, t, op));
    double v = loomtest::canonicalTree(x, 0, x.size(), mul);
    if (op == ReduceOp::Avg) v /= n;
    return put(out, i, t, v);
  }
  // float32 accumulates float, float16 and bfloat16 too (their inputs rounded to their type first).
  std::vector<float> x;
  for (int r = 0; r < n; ++r) {
    uint8_t b[8];
    put(b, 0, t, value(r, index, t, op));
    x.push_back(static_cast<float>(get(b, 0, t)));
  }
  float v = loomtest::canonicalTree(x, 0, x.size(), mul);
  if (op == ReduceOp::Avg) v /= static_cast<float>(n);
  put(out, i, t, v);  // exact for float32; float16 and bfloat16 rounded once
}

std::string where(const char* coll, DataType t, ReduceOp op, size_t count, bool inPlace, size_t i) {
  return std::string(coll) + " type " + std::to_string(static_cast<int>(t)) + " op " +
         std::to_string(static_cast<int>(op)) + " count " + std::to_string(count) + (inPlace ? " in place" : "") +
         " element " + std::to_string(i);
}

// First element whose bits differ, or -1.
long firstDifference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, size_t elem) {
  for (size_t i = 0; i * elem < want.size(); ++i)
    if (std::memcmp(got.data() + i * elem, want.data() + i * elem, elem) != 0) return static_cast<long>(i);
  return -1;
}

// All-reduce, reduce (to the last rank) and reduce-scatter of every float type and op, every count,
// in place and out of place, each element checked bit for bit against the canonical tree.
void checkEverything(loom::Communicator& c) {
  const int n = c.size(), me = c.rank();
  ASSERT_TRUE(c.reproducible());
  for (DataType t : kFloatTypes) {
    const size_t E = elemSize(t);
    for (ReduceOp op : kOps) {
      for (size_t count : kCounts) {
        std::vector<uint8_t> want(count * E);
        for (size_t i = 0; i < count; ++i) expected(want.data(), i, n, i, t, op);
        for (bool inPlace : {false, true}) {
          std::vector<uint8_t> in(count * E), out(count * E, 0xee);
          for (size_t i = 0; i < count; ++i) put(in.data(), i, t, value(me, i, t, op));
          void* dst = inPlace ? in.data() : out.data();
          c.allReduce(in.data(), dst, count, t, op);
          std::vector<uint8_t> got(static_cast<uint8_t*>(dst), static_cast<uint8_t*>(dst) + count * E);
          long bad = firstDifference(got, want, E);
          ASSERT_EQ(bad, -1) << where("all_reduce", t, op, count, inPlace, static_cast<size_t>(bad));
          // Reduce to the last rank.
          for (size_t i = 0; i < count; ++i) put(in.data(), i, t, value(me, i, t, op));
          std::fill(out.begin(), out.end(), 0xee);
          c.reduce(in.data(), dst, count, t, op, n - 1);
          if (me == n - 1) {
            got.assign(static_cast<uint8_t*>(dst), static_cast<uint8_t*>(dst) + count * E);
            bad = firstDifference(got, want, E);
            ASSERT_EQ(bad, -1) << where("reduce", t, op, count, inPlace, static_cast<size_t>(bad));
          }
        }
        // Reduce-scatter: block q of the input is elements q * count ..; this rank gets block me.
        if (count > 4099) continue;
        std::vector<uint8_t> in(count * E * static_cast<size_t>(n)), out(count * E), mine(count * E);
        for (size_t i = 0; i < count * static_cast<size_t>(n); ++i) put(in.data(), i, t, value(me, i, t, op));
        for (size_t i = 0; i < count; ++i) expected(mine.data(), i, n, static_cast<size_t>(me) * count + i, t, op);
        c.reduceScatter(in.data(), out.data(), count, t, op);
        const long bad = firstDifference(out, mine, E);
        ASSERT_EQ(bad, -1) << where("reduce_scatter", t, op, count, false, static_cast<size_t>(bad));
      }
    }
  }
}

loom::Options reproducible() {
  loom::Options o;
  o.reproducible = 1;
  return o;
}

struct Layout {
  const char* links;
  int ranks;
};

class Reproducible : public ::testing::TestWithParam<Layout> {};

TEST_P(Reproducible, EveryFloatReductionIsTheCanonicalTree) {
  TransportSetup setup(GetParam().links);
  runOk(GetParam().ranks, checkEverything, reproducible());
}

const Layout kLayouts[] = {
    {"shm", 1}, {"shm", 2}, {"shm", 3}, {"shm", 4},   {"shm", 5},   {"shm", 8},    {"tcp", 2},
    {"tcp", 3}, {"tcp", 4}, {"tcp", 7}, {"mixed", 4}, {"mixed", 6}, {"mixed3", 5},
#if LOOM_HAVE_IBVERBS
    {"ib", 3},
#endif
};

INSTANTIATE_TEST_SUITE_P(Layouts, Reproducible, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& p) {
                           return std::string(p.param.links) + std::to_string(p.param.ranks);
                         });

// Nodes that hold aligned power-of-two blocks of ranks are the tree's subtrees: large float32 and
// float64 all-reduces take the node-aware form (within nodes, across, within again), with the same
// bits; an interleaved placement takes the flat form, with the same bits too.
TEST(Reproducible, NodeAwareWhereTheNodesAreSubtrees) {
  for (auto [n, perNode] : {std::pair{4, 2}, std::pair{6, 2}, std::pair{8, 4}}) {
    SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(perNode) + " per node");
    loomtest::PerRankOptions nodes(
        [perNode = perNode](int r, loom::Options& o) { o.hostId = "node-" + std::to_string(r / perNode); });
    runOk(
        n,
        [](loom::Communicator& c) {
          EXPECT_EQ(c.algorithmFor("all_reduce", 65537 * 4), "canonical-hier");
          checkEverything(c);
        },
        reproducible());
  }
  loomtest::PerRankOptions interleaved([](int r, loom::Options& o) { o.hostId = "node-" + std::to_string(r % 2); });
  runOk(
      4,
      [](loom::Communicator& c) {
        EXPECT_EQ(c.algorithmFor("all_reduce", 65537 * 4), "canonical");
        checkEverything(c);
      },
      reproducible());
}

// LOOM_ALGO, the pieces' size and the environment switch change nothing in the bits.
TEST(Reproducible, ForcedAlgorithmsAndPiecesChangeNothing) {
  for (const char* algo : {"ring", "rd", "hd", "dbtree", "direct", "hier", "tree"}) {
    SCOPED_TRACE(algo);
    EnvGuard forced("LOOM_ALGO", algo);
    TransportSetup setup("tcp");
    runOk(4, checkEverything, reproducible());
  }
  EnvGuard pieces("LOOM_CHUNK_BYTES", "4096");
  EnvGuard on("LOOM_REPRODUCIBLE", "1");
  TransportSetup setup("mixed");
  runOk(3, checkEverything);
}

// Without the mode, the same data gives other bits under some algorithm: the test above would see it.
TEST(Reproducible, TheDefaultModeDiffersOnTheSameData) {
  constexpr size_t kCount = 65537;
  const DataType t = DataType::Float32;
  std::vector<uint8_t> want(kCount * 4);
  for (size_t i = 0; i < kCount; ++i) expected(want.data(), i, 4, i, t, ReduceOp::Sum);
  int differing = 0;
  for (const char* algo : {"ring", "rd", "dbtree"}) {
    EnvGuard forced("LOOM_ALGO", algo);
    TransportSetup setup("tcp");
    std::vector<long> firstBad(4, -1);
    runOk(4, [&](loom::Communicator& c) {
      ASSERT_FALSE(c.reproducible());
      std::vector<uint8_t> in(kCount * 4), out(kCount * 4);
      for (size_t i = 0; i < kCount; ++i) put(in.data(), i, t, value(c.rank(), i, t, ReduceOp::Sum));
      c.allReduce(in.data(), out.data(), kCount, t, ReduceOp::Sum);
      firstBad[static_cast<size_t>(c.rank())] = firstDifference(out, want, 4);
    });
    if (firstBad[0] >= 0) ++differing;
  }
  EXPECT_GE(differing, 2) << "the data should tell the default mode's orders from the canonical one";
}

// Sub-communicators keep their parent's mode (what PyTorch's new_group makes, through group()).
TEST(Reproducible, SubCommunicatorsKeepTheMode) {
  runOk(
      4,
      [](loom::Communicator& c) {
        loom::Communicator half = c.split(c.rank() % 2, c.rank());
        EXPECT_TRUE(half.reproducible());
        checkEverything(half);
        if (c.rank() < 3) {
          loom::Communicator three = c.group({2, 0, 1}, "three");
          EXPECT_TRUE(three.reproducible());
        }
        loom::Options off;
        off.reproducible = 0;
        if (c.rank() < 2) {
          EXPECT_FALSE(c.group({0, 1}, "plain", &off).reproducible());
        }
      },
      reproducible());
}

// A rank in reproducible mode among ranks that are not: a clear error on every rank, not mixed bits.
TEST(Reproducible, RanksThatDisagreeFailClearly) {
  for (const char* links : {"tcp", "shm"}) {
    for (size_t count : {size_t{3}, size_t{1} << 16}) {  // the small and the chunked forms
      SCOPED_TRACE(std::string(links) + " count " + std::to_string(count));
      TransportSetup setup(links);
      loomtest::PerRankOptions half([](int r, loom::Options& o) { o.reproducible = r == 0 ? 1 : 0; });
      auto results = loomtest::runRanks(2, [&](loom::Communicator& c) {
        std::vector<float> in(count, 1.0f), out(count);
        c.allReduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
      });
      for (int r = 0; r < 2; ++r) {
        const std::string& e = results[static_cast<size_t>(r)].error;
        EXPECT_NE(e.find("reproducible mode"), std::string::npos) << "rank " << r << ": " << e;
      }
    }
  }
}

// The C API's flag, and a caller compiled before it (the shorter struct) taking LOOM_REPRODUCIBLE.
TEST(Reproducible, TheCApiConfigTurnsItOn) {
  constexpr size_t kCount = 4099;
  constexpr int kRanks = 3;
  const DataType t = DataType::Float32;
  std::vector<uint8_t> want(kCount * 4);
  for (size_t i = 0; i < kCount; ++i) expected(want.data(), i, kRanks, i, t, ReduceOp::Sum);
  TransportSetup setup("tcp");
  for (bool oldStruct : {false, true}) {
    SCOPED_TRACE(oldStruct ? "older struct, LOOM_REPRODUCIBLE=1" : "config.reproducible = 1");
    EnvGuard env("LOOM_REPRODUCIBLE", oldStruct ? "1" : "0");
    loomUniqueId id;
    ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
    std::vector<long> firstBad(kRanks, -2);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        loomConfig_t config = LOOM_CONFIG_INITIALIZER;
        config.timeoutMs = 30000;
        if (oldStruct) {
          config.size = offsetof(loomConfig_t, reproducible);
        } else {
          config.reproducible = 1;
        }
        loomComm_t comm = nullptr;
        if (loomCommInitRankConfig(&comm, kRanks, id, r, &config) != loomSuccess) {
          ADD_FAILURE() << loomGetLastError(nullptr);
          return;
        }
        std::vector<uint8_t> in(kCount * 4), out(kCount * 4);
        for (size_t i = 0; i < kCount; ++i) put(in.data(), i, t, value(r, i, t, ReduceOp::Sum));
        EXPECT_EQ(loomAllReduce(in.data(), out.data(), kCount, loomFloat32, loomSum, comm, nullptr), loomSuccess);
        firstBad[static_cast<size_t>(r)] = firstDifference(out, want, 4);
        EXPECT_EQ(loomCommDestroy(comm), loomSuccess);
      });
    }
    for (auto& th : threads) th.join();
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(firstBad[static_cast<size_t>(r)], -1) << "rank " << r;
  }
}

}  // namespace
