// The C API: unique id, init, grouped send/recv (a ring shift of large messages cannot deadlock),
// error codes and messages, handles used after destroy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "loom/loom.h"

namespace {

void runC(int n, const std::function<void(loomComm_t, int, int)>& fn) {
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  std::vector<std::thread> threads;
  std::vector<int> failures(n, 0);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      loomConfig_t config = LOOM_CONFIG_INITIALIZER;
      config.timeoutMs = 30000;
      config.name = "c-test";
      loomComm_t comm = nullptr;
      if (loomCommInitRankConfig(&comm, n, id, r, &config) != loomSuccess) {
        failures[r] = 1;
        ADD_FAILURE() << loomGetLastError(nullptr);
        return;
      }
      fn(comm, r, n);
      EXPECT_EQ(loomCommDestroy(comm), loomSuccess);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

TEST(CApi, GroupedRingShiftOfLargeMessages) {
  runC(5, [](loomComm_t comm, int rank, int n) {
    const size_t count = (1u << 20) + 17;  // 4 MiB of float: RTS/CTS on every link
    std::vector<float> out(count, static_cast<float>(rank)), in(count, -1.0f);
    ASSERT_EQ(loomGroupStart(), loomSuccess);
    ASSERT_EQ(loomSend(out.data(), count, loomFloat32, (rank + 1) % n, comm, nullptr), loomSuccess);
    ASSERT_EQ(loomRecv(in.data(), count, loomFloat32, (rank + n - 1) % n, comm, nullptr), loomSuccess);
    ASSERT_EQ(loomGroupEnd(), loomSuccess) << loomGetLastError(comm);
    EXPECT_EQ(in.front(), static_cast<float>((rank + n - 1) % n));
    EXPECT_EQ(in.back(), static_cast<float>((rank + n - 1) % n));
    EXPECT_EQ(loomBarrier(comm, nullptr), loomSuccess);
  });
}

TEST(CApi, QueriesAndBadArguments) {
  runC(2, [](loomComm_t comm, int rank, int n) {
    int v = 0;
    EXPECT_EQ(loomCommCount(comm, &v), loomSuccess);
    EXPECT_EQ(v, n);
    EXPECT_EQ(loomCommUserRank(comm, &v), loomSuccess);
    EXPECT_EQ(v, rank);
    int local = -1, localSize = -1, nodes = -1;
    EXPECT_EQ(loomCommLocalRank(comm, &local, &localSize), loomSuccess);
    EXPECT_EQ(local, rank);  // both ranks in this process: one node
    EXPECT_EQ(localSize, n);
    EXPECT_EQ(loomCommNodeCount(comm, &nodes), loomSuccess);
    EXPECT_EQ(nodes, 1);
    EXPECT_EQ(loomCommLocalRank(comm, nullptr, &localSize), loomInvalidArgument);
    EXPECT_EQ(loomCommNodeCount(comm, nullptr), loomInvalidArgument);
    loomResult_t async = loomInternalError;
    EXPECT_EQ(loomCommGetAsyncError(comm, &async), loomSuccess);
    EXPECT_EQ(async, loomSuccess);
    int x = 0;
    EXPECT_EQ(loomSend(nullptr, 3, loomInt32, 1 - rank, comm, nullptr), loomInvalidArgument);
    EXPECT_NE(std::string(loomGetLastError(nullptr)).find("null buffer"), std::string::npos);
    EXPECT_EQ(loomSend(&x, 1, loomInt32, 9, comm, nullptr), loomInvalidArgument);
    EXPECT_NE(std::string(loomGetLastError(nullptr)).find("out of range"), std::string::npos);
    EXPECT_EQ(loomSend(&x, 1, static_cast<loomDataType_t>(99), 1 - rank, comm, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomSend(&x, static_cast<size_t>(-4), loomInt32, 1 - rank, comm, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomSend(&x, 1, loomInt32, 1 - rank, comm, &x), loomInvalidArgument);  // a stream without CUDA
    EXPECT_EQ(loomAllReduce(&x, &x, 1, loomInt32, static_cast<loomRedOp_t>(17), comm, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomBroadcast(&x, &x, 1, loomInt32, 5, comm, nullptr), loomInvalidArgument);
    EXPECT_EQ(loomBarrier(comm, nullptr), loomSuccess);
  });
}

TEST(CApi, HandlesAfterDestroyAndNull) {
  int x = 0;
  EXPECT_EQ(loomSend(&x, 1, loomInt32, 0, nullptr, nullptr), loomInvalidArgument);
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  loomComm_t comm = nullptr;
  ASSERT_EQ(loomCommInitRank(&comm, 1, id, 0), loomSuccess);
  EXPECT_EQ(loomSend(&x, 1, loomInt32, 0, comm, nullptr), loomInvalidUsage);  // would wait forever: only grouped
  ASSERT_EQ(loomCommDestroy(comm), loomSuccess);
  EXPECT_EQ(loomBarrier(comm, nullptr), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError(comm)).find("not a live communicator"), std::string::npos);
  EXPECT_EQ(loomCommDestroy(comm), loomInvalidArgument);
  EXPECT_EQ(loomGroupEnd(), loomInvalidUsage);
  EXPECT_STREQ(loomGetErrorString(loomTimeout), "timeout");
  loomUniqueId junk;
  std::memset(&junk, 0, sizeof(junk));
  EXPECT_EQ(loomCommInitRank(&comm, 2, junk, 0), loomInvalidArgument);
  EXPECT_EQ(loomCommInitRank(&comm, 2, id, 2), loomInvalidArgument);
  EXPECT_EQ(comm, nullptr);
}

TEST(CApi, SelfExchangeInAGroup) {
  runC(1, [](loomComm_t comm, int, int) {
    double a[3] = {1, 2, 3}, b[3] = {0, 0, 0};
    ASSERT_EQ(loomGroupStart(), loomSuccess);
    ASSERT_EQ(loomSend(a, 3, loomFloat64, 0, comm, nullptr), loomSuccess);
    ASSERT_EQ(loomRecv(b, 3, loomFloat64, 0, comm, nullptr), loomSuccess);
    ASSERT_EQ(loomGroupEnd(), loomSuccess);
    EXPECT_EQ(b[2], 3.0);
  });
}

// Receives from any rank: loomRecvAny says who sent and how much; loomRecv takes LOOM_ANY_SOURCE.
TEST(CApi, ReceivesFromAnyRank) {
  runC(3, [](loomComm_t comm, int rank, int n) {
    if (rank != 0) {
      std::vector<int32_t> out(static_cast<size_t>(rank) * 10, rank);
      ASSERT_EQ(loomSend(out.data(), out.size(), loomInt32, 0, comm, nullptr), loomSuccess);
      ASSERT_EQ(loomBarrier(comm, nullptr), loomSuccess);
      ASSERT_EQ(loomSend(out.data(), 1, loomInt32, 0, comm, nullptr), loomSuccess);
    } else {
      std::vector<int> seen;
      for (int k = 0; k < n - 1; ++k) {
        std::vector<int32_t> in(100, -1);
        int source = -1;
        size_t received = 0;
        ASSERT_EQ(loomRecvAny(in.data(), in.size(), loomInt32, comm, &source, &received), loomSuccess)
            << loomGetLastError(comm);
        ASSERT_GE(source, 1);
        EXPECT_EQ(received, static_cast<size_t>(source) * 10);
        EXPECT_EQ(in[0], source);
        seen.push_back(source);
      }
      std::sort(seen.begin(), seen.end());
      EXPECT_EQ(seen, (std::vector<int>{1, 2}));
      ASSERT_EQ(loomBarrier(comm, nullptr), loomSuccess);
      for (int k = 0; k < n - 1; ++k) {
        int32_t x = -1;
        ASSERT_EQ(loomRecv(&x, 1, loomInt32, LOOM_ANY_SOURCE, comm, nullptr), loomSuccess) << loomGetLastError(comm);
        EXPECT_GE(x, 1);
      }
      int32_t x = 0;
      EXPECT_EQ(loomSend(&x, 1, loomInt32, LOOM_ANY_SOURCE, comm, nullptr), loomInvalidArgument);
    }
    EXPECT_EQ(loomBarrier(comm, nullptr), loomSuccess);
  });
}
