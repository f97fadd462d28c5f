// Communicator::monitoredBarrier (Gloo's monitored_barrier): every rank passes when all arrive;
// where some do not, rank 0 names them, in Gloo's words and with where each one is (the hang
// report), and the others do not hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "common/ranks.hpp"

namespace {

using namespace std::chrono_literals;

TEST(MonitoredBarrier, EveryRankPassesWhenAllArrive) {
  loomtest::runOk(3, [](loom::Communicator& c) {
    for (int i = 0; i < 5; ++i) {
      if (c.rank() == i % 3) std::this_thread::sleep_for(20ms);  // a late rank, within the timeout
      c.monitoredBarrier(5000ms, i % 2 == 0);
    }
    c.barrier();
  });
}

// Ranks 2 and 3 never come: rank 2 waits inside Loom for a message from rank 3, which is busy in
// its own code, until rank 0 has spoken. Rank 0 names both, and where rank 2 is.
void missingRanks(bool waitAll, const char* want) {
  std::atomic<bool> spoken{false};
  loom::Options o;
  o.timeout = 20000ms;
  auto results = loomtest::runRanks(
      4,
      [&](loom::Communicator& c) {
        c.barrier();  // the last op every rank completed
        int x = 0;
        try {
          if (c.rank() == 2) {
            c.recv(&x, 1, loom::DataType::Int32, 3, 77);
            return;
          }
          if (c.rank() == 3) {
            while (!spoken.load()) std::this_thread::sleep_for(5ms);
            return;
          }
        } catch (const loom::Error&) {
          return;  // rank 0's failure reached it
        }
        const auto t0 = std::chrono::steady_clock::now();
        try {
          c.monitoredBarrier(600ms, waitAll);
          ADD_FAILURE() << "rank " << c.rank() << " passed a barrier two ranks never came to";
        } catch (const loom::Error& e) {
          const std::string what = e.what();
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          EXPECT_LT(secs, 10.0) << what;
          if (c.rank() == 0) {
            EXPECT_EQ(e.code(), loom::ErrorCode::Timeout) << what;
            EXPECT_NE(what.find(want), std::string::npos) << what;
            EXPECT_NE(what.find("rank 2 has not entered barrier #1"), std::string::npos) << what;
            EXPECT_NE(what.find("rank 3 did not answer"), std::string::npos) << what;
            std::printf("[ monitor  ] rank 0 after %.2f s: %s\n", secs, what.c_str());
          } else {
            // Rank 0's reason reaches the others as it leaves.
            EXPECT_NE(what.find("failed to pass monitoredBarrier"), std::string::npos) << what;
          }
          spoken = true;
        }
      },
      o);
  spoken = true;
  for (const auto& r : results) EXPECT_EQ(r.error, "");
}

TEST(MonitoredBarrier, RankZeroNamesEveryMissingRankAndWhereItIs) {
  missingRanks(true, "Ranks 2, 3 failed to pass monitoredBarrier in 600 ms");
}

TEST(MonitoredBarrier, WithoutWaitAllRanksTheFirstMissingOne) {
  missingRanks(false, "Rank 2 failed to pass monitoredBarrier in 600 ms");
}

}  // namespace
