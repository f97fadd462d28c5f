// Work::onCompletion: completion callbacks run once, from Loom's own threads when nobody waits
// (collectives on the op queue, receives on the transports), inline when the work is already
// done, in the order they were added, and carry the loom::Error of a failed operation.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "common/ranks.hpp"

using loom::DataType;
using loom::ReduceOp;

namespace {

// Waits (sleeping, driving nothing) until `flag` is set or 20 s passed.
bool eventually(const std::atomic<bool>& flag) {
  for (int i = 0; i < 2000 && !flag.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return flag.load();
}

}  // namespace

class Callback : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Links, Callback, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return std::string(info.param); });

TEST_P(Callback, CollectiveCompletesWithNobodyWaiting) {
  loomtest::TransportSetup links(GetParam());
  loomtest::runOk(3, [](loom::Communicator& c) {
    std::vector<float> v(100003, 1.0f);
    std::atomic<bool> fired{false};
    std::atomic<int> calls{0};
    std::thread::id where;
    std::exception_ptr error;
    loom::Work w = c.iallReduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    w.onCompletion([&](std::exception_ptr e) {
      where = std::this_thread::get_id();
      error = e;
      calls.fetch_add(1);
      fired.store(true);
    });
    ASSERT_TRUE(eventually(fired)) << "the callback never ran while nobody waited";
    EXPECT_EQ(error, nullptr);
    EXPECT_NE(where, std::this_thread::get_id());
    EXPECT_EQ(v[0], 3.0f);
    EXPECT_EQ(v.back(), 3.0f);
    // Added after completion: runs at once, here; the first ran once only.
    bool inline_ran = false;
    w.onCompletion([&](std::exception_ptr e) { inline_ran = e == nullptr; });
    EXPECT_TRUE(inline_ran);
    w.wait();
    EXPECT_EQ(calls.load(), 1);
  });
}

TEST_P(Callback, ReceiveCompletesWithNobodyWaiting) {
  loomtest::TransportSetup links(GetParam());
  loomtest::runOk(2, [](loom::Communicator& c) {
    for (size_t count : {size_t{10}, size_t{1} << 20}) {  // eager and large
      std::vector<int32_t> buf(count, c.rank() == 0 ? 7 : 0);
      if (c.rank() == 0) {
        c.send(buf.data(), count, DataType::Int32, 1, 5);
      } else {
        std::atomic<bool> fired{false};
        loom::Work w = c.irecv(buf.data(), count, DataType::Int32, 0, 5);
        w.onCompletion([&](std::exception_ptr e) {
          EXPECT_EQ(e, nullptr);
          fired.store(true);
        });
        ASSERT_TRUE(eventually(fired)) << "receive of " << count << " never completed while nobody waited";
        EXPECT_EQ(buf[count - 1], 7);
      }
      c.barrier();
    }
  });
}

TEST(Callback, RunInOrderAdded) {
  loomtest::runOk(2, [](loom::Communicator& c) {
    std::vector<int64_t> v(1000, 1);
    std::mutex mu;
    std::vector<int> order;
    loom::Work w = c.iallReduce(v.data(), v.data(), v.size(), DataType::Int64, ReduceOp::Sum);
    for (int i = 0; i < 5; ++i) {
      w.onCompletion([&, i](std::exception_ptr) {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      });
    }
    w.wait();
    c.barrier();  // a callback may still be running on the queue's thread after wait() returned
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  });
}

TEST(Callback, FailureCarriesTheError) {
  loomtest::runOk(2, [](loom::Communicator& c) {
    if (c.rank() == 0) {
      std::vector<int32_t> buf(4);
      std::atomic<bool> fired{false};
      loom::ErrorCode code = loom::ErrorCode::Internal;
      loom::Work w = c.irecv(buf.data(), buf.size(), DataType::Int32, 1, 9);  // never sent
      w.onCompletion([&](std::exception_ptr e) {
        try {
          if (e) std::rethrow_exception(e);
        } catch (const loom::Error& err) {
          code = err.code();
        }
        fired.store(true);
      });
      c.abort();
      ASSERT_TRUE(eventually(fired));
      EXPECT_EQ(code, loom::ErrorCode::Aborted);
    }
  });
}

TEST(Callback, AThrowingCallbackIsContained) {
  loomtest::runOk(2, [](loom::Communicator& c) {
    std::vector<float> v(10, 1.0f);
    std::atomic<bool> second{false};
    loom::Work w = c.iallReduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    w.onCompletion([](std::exception_ptr) { throw std::runtime_error("from a callback"); });
    w.onCompletion([&](std::exception_ptr) { second.store(true); });
    w.wait();
    EXPECT_TRUE(eventually(second));
    c.barrier();
  });
}
