// The barrier on a node's shared arena (collectives/arena_sync.cc), on an arena the test makes
// itself, so that who arrives when is fixed: a rank that reached the barrier's step and then
// left (closed its communicator) does not fail the ranks still waiting there for a slower one; a
// rank that left before it reached the step does, and the error names it; a long wait naps.
#include "collectives/arena_sync.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/context.hpp"
#include "comm/comm_impl.hpp"
#include "common/ranks.hpp"
#include "core/progress_policy.hpp"

namespace {

// A sequence number no real collective of the test's communicator uses.
constexpr int64_t kSeq = 1000000;

// Step counters and departure words for `n` ranks; this rank is index 0.
struct TestArena {
  std::vector<std::unique_ptr<std::atomic<uint64_t>>> words;
  std::vector<std::string> why;  // "" while that rank can take part
  loom::LocalArena arena;

  explicit TestArena(int n) : why(static_cast<size_t>(n)) {
    for (int i = 0; i < n; ++i) {
      words.push_back(std::make_unique<std::atomic<uint64_t>>(0));
      arena.steps.push_back(words.back().get());
      arena.ranks.push_back(i);
    }
    arena.gone = [this](int q) { return why[static_cast<size_t>(q)]; };
  }
  void step(int q, uint64_t s) { words[static_cast<size_t>(q)]->store(s, std::memory_order_release); }
};

TEST(ArenaBarrier, RankThatReachedTheStepAndLeftDoesNotFailTheOthers) {
  loomtest::runOk(1, [](loom::Communicator& c) {
    TestArena t(3);
    t.step(1, 5);  // rank 1 passed step 5 (everyone had published it) and closed ...
    t.why[1] = "it closed its communicator";
    t.step(2, 4);  // ... while rank 2, seen here late, is still on its way
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      t.step(2, 5);
    });
    loom::coll::Context ctx(*c.impl(), kSeq, "all_gather", "direct");
    EXPECT_NO_THROW(loom::coll::barrier(ctx, t.arena, 5));
    late.join();
    EXPECT_EQ(t.words[0]->load(), 5u) << "this rank published its step";
  });
}

TEST(ArenaBarrier, RankThatLeftBeforeTheStepFailsTheCollectiveNamingIt) {
  loomtest::runOk(1, [](loom::Communicator& c) {
    TestArena t(3);
    t.step(1, 4);  // rank 1 left one step short
    t.why[1] = "it closed its communicator";
    t.step(2, 5);
    loom::coll::Context ctx(*c.impl(), kSeq, "all_gather", "direct");
    try {
      loom::coll::barrier(ctx, t.arena, 5);
      ADD_FAILURE() << "the barrier passed without rank 1";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::Remote);
      EXPECT_NE(std::string(e.what()).find("rank 1 will not take part: it closed its communicator"), std::string::npos)
          << e.what();
    }
  });
}

// A rank held for long (another writing a checkpoint before the next collective) does not keep
// its core busy: past 50 ms its wait naps, and it still passes once the other comes.
TEST(ArenaBarrier, ALongWaitLeavesTheCoreToOthers) {
  loomtest::runOk(1, [](loom::Communicator& c) {
    TestArena t(2);
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      t.step(1, 1);
    });
    loom::coll::Context ctx(*c.impl(), kSeq, "all_gather", "direct");
    const auto cpu0 = loom::progress::threadCpuTime();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_NO_THROW(loom::coll::barrier(ctx, t.arena, 1));
    const auto cpu = loom::progress::threadCpuTime() - cpu0;
    const auto wall = std::chrono::steady_clock::now() - t0;
    late.join();
    EXPECT_GE(wall, std::chrono::milliseconds(790));
    // Yielding all along took the whole 800 ms of a core here; napping, about the first 50.
    EXPECT_LT(cpu, std::chrono::milliseconds(250))
        << "CPU while waiting: " << std::chrono::duration<double, std::milli>(cpu).count() << " ms";
  });
}

}  // namespace
