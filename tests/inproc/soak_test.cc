// Soak: thousands of random collectives (kind, datatype, op, count, root, placement), several in
// flight at once, on 4 to 8 ranks over shared memory and over mixed links, each result checked
// against the reference (common/collective_check.hpp); and two communicators driven from two
// threads of every rank at once. The seed is printed (LOOM_SOAK_SEED replays a run; LOOM_SOAK_OPS
// sets the length). File descriptors, threads and heap memory in use must not grow over the second round.
#include <dirent.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "common/collective_check.hpp"
#include "common/ranks.hpp"

using loom::DataType;
using loom::ReduceOp;

namespace {

size_t countEntries(const char* dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir)) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// Heap bytes in use (all malloc arenas and mmapped blocks). Resident memory is no measure of a
// leak here: glibc keeps freed blocks in the arenas of the exited rank threads, tens of MiB with
// 7 ranks and megabyte buffers, whichever seed drew the largest.
size_t heapInUseKiB() {
  const struct mallinfo2 m = mallinfo2();
  return (m.uordblks + m.hblkhd) / 1024;
}

uint64_t soakSeed() {
  static const uint64_t seed = [] {
    const char* s = std::getenv("LOOM_SOAK_SEED");
    return s != nullptr ? std::strtoull(s, nullptr, 10) : std::random_device{}();
  }();
  return seed;
}

int soakOps(int fallback) {
  const char* s = std::getenv("LOOM_SOAK_OPS");
  return s != nullptr ? std::max(1, std::atoi(s)) : fallback;
}

constexpr DataType kTypes[] = {DataType::Int8,    DataType::Uint8,   DataType::Int32,   DataType::Uint32,
                               DataType::Int64,   DataType::Uint64,  DataType::Float16, DataType::Float32,
                               DataType::Float64, DataType::Bfloat16};

// One asynchronous all-reduce or all-gather kept in flight with its buffers, checked once done.
struct InFlight {
  loom::Work work;
  bool gather = false;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  size_t count = 0;
  std::vector<uint8_t> in, out;
};

// Every rank draws the same sequence from the seed, so that all call the same collectives.
// Returns the bytes of results checked on this rank.
size_t soak(loom::Communicator& c, uint64_t seed, int ops) {
  std::mt19937_64 rng(seed);
  const int n = c.size(), r = c.rank();
  size_t checked = 0;
  auto fail = [&](const std::string& what) { ADD_FAILURE() << "seed " << seed << ": " << what; };
  std::vector<InFlight> flying;
  auto settle = [&] {
    for (auto& f : flying) {
      f.work.wait();
      const size_t E = loom::sizeOf(f.type);
      if (f.gather) {
        for (size_t g = 0; g < f.count * static_cast<size_t>(n); ++g) {
          uint8_t one[8];
          loomtest::store(one, 0, f.type,
                          loomtest::inputValue(static_cast<int>(g / f.count), g % f.count, f.type, ReduceOp::Sum));
          if (loomtest::load(f.out.data(), g, f.type) != loomtest::load(one, 0, f.type)) {
            fail("async all_gather element " + std::to_string(g));
            break;
          }
        }
        checked += f.count * static_cast<size_t>(n) * E;
      } else {
        for (size_t i = 0; i < f.count; ++i) {
          const double want = loomtest::expected(n, i, f.type, f.op), got = loomtest::load(f.out.data(), i, f.type);
          if (std::fabs(got - want) > loomtest::tolerance(f.type, f.op, want)) {
            fail("async all_reduce element " + std::to_string(i));
            break;
          }
        }
        checked += f.count * E;
      }
    }
    flying.clear();
  };
  for (int k = 0; k < ops; ++k) {
    const DataType t = kTypes[rng() % 10];
    const ReduceOp op = loomtest::kOps[rng() % 5];
    // Mostly small, some medium, a few large counts; 0 and 1 included.
    const uint64_t pick = rng() % 100;
    const size_t count = pick < 5    ? 0
                         : pick < 10 ? 1
                         : pick < 80 ? rng() % 2048
                         : pick < 97 ? rng() % 65536
                                     : (rng() % (1u << 20)) + 1;
    const int root = static_cast<int>(rng() % static_cast<uint64_t>(n));
    const bool inPlace = (rng() & 1) != 0;
    if (rng() % 4 == 0 && flying.size() < 4) {
      // Asynchronous, in flight with whatever else is.
      InFlight f;
      f.gather = (rng() & 1) != 0;
      f.type = t;
      f.op = op;
      f.count = std::min<size_t>(count, 70000);
      const size_t E = loom::sizeOf(t);
      f.in.resize(f.count * E + 8);
      for (size_t i = 0; i < f.count; ++i)
        loomtest::store(f.in.data(), i, t, loomtest::inputValue(r, i, t, f.gather ? ReduceOp::Sum : op));
      f.out.resize((f.gather ? static_cast<size_t>(n) : 1) * f.count * E + 8);
      f.work = f.gather ? c.iallGather(f.in.data(), f.out.data(), f.count, t)
                        : c.iallReduce(f.in.data(), f.out.data(), f.count, t, op);
      flying.push_back(std::move(f));
      continue;
    }
    settle();
    const char* coll = loomtest::kColls[rng() % (sizeof loomtest::kColls / sizeof loomtest::kColls[0])];
    const std::string name = coll;
    const bool blocks = name == "all_gather" || name == "reduce_scatter" || name == "all_to_all" ||
                        name == "gather" || name == "scatter";
    loomtest::runCase(c, coll, loomtest::Case{t, op, blocks ? std::min<size_t>(count, 40000) : count, inPlace, root},
                      fail);
    checked += (blocks ? std::min<size_t>(count, 40000) * static_cast<size_t>(n) : count) * loom::sizeOf(t);
  }
  settle();
  return checked;
}

}  // namespace

class Soak : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(Soak, RandomCollectivesCheckedWithNoGrowth) {
  const int n = std::get<0>(GetParam());
  loomtest::TransportSetup links(std::get<1>(GetParam()));
  const uint64_t seed = soakSeed() + static_cast<uint64_t>(n);
  const int ops = soakOps(1000);
  std::printf("[ soak     ] %d ranks over %s: 2 x %d random collectives, seed %llu (LOOM_SOAK_SEED=%llu replays)\n", n,
              std::get<1>(GetParam()), ops, static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(soakSeed()));
  std::atomic<size_t> bytes{0};
  // A first round of the same length (checked too): allocators, scratch buffers and the op
  // queue's thread reach their working size, so that the second round shows growth, not warm-up.
  loomtest::runOk(n, [&](loom::Communicator& c) { bytes += soak(c, seed ^ 0x5eed, ops); });
  const size_t fds = countEntries("/proc/self/fd"), threads = countEntries("/proc/self/task"), heap = heapInUseKiB();
  loomtest::runOk(n, [&](loom::Communicator& c) { bytes += soak(c, seed, ops); });
  std::printf(
      "[ soak     ] %d ranks over %s: 2 x %d collectives, %zu result bytes verified on rank threads, 0 wrong "
      "unless reported above\n",
      n, std::get<1>(GetParam()), ops, bytes.load());
  EXPECT_EQ(countEntries("/proc/self/fd"), fds) << "file descriptors leaked";
  EXPECT_EQ(countEntries("/proc/self/task"), threads) << "threads leaked";
  const size_t after = heapInUseKiB();
  std::printf("[ soak     ] heap in use: %zu KiB after the first round, %zu KiB after the second\n", heap, after);
  EXPECT_LT(after, heap + 32) << "heap in use grew by more than 32 KiB over the second round (a leak per call?)";
}

INSTANTIATE_TEST_SUITE_P(Links, Soak, ::testing::Combine(::testing::Values(4, 7), ::testing::Values("shm", "mixed")),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
                         });

// Two communicators of the same ranks, each driven by its own thread of every rank at once.
TEST(Soak, TwoCommunicatorsFromTwoThreadsAtOnce) {
  const uint64_t seed = soakSeed();
  std::printf("[ soak     ] two communicators from two threads, seed %llu\n", static_cast<unsigned long long>(seed));
  const int n = 4;
  const loom::UniqueId second = loom::UniqueId::create();
  auto results = loomtest::runRanks(n, [&](loom::Communicator& c) {
    std::string otherError;
    std::thread other([&] {
      try {
        loom::Communicator d(c.rank(), n, second);
        soak(d, seed + 1000, soakOps(600) / 2);
      } catch (const std::exception& e) {
        otherError = e.what();
      }
    });
    soak(c, seed, soakOps(600) / 2);
    other.join();
    EXPECT_EQ(otherError, "");
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(results[static_cast<size_t>(r)].error, "") << r;
}
