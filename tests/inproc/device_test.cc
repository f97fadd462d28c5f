// Collectives on device buffers, stream-ordered, on an emulated device (common/fake_device.hpp):
// the staging pipeline, stream semantics, argument checks and failure handling, on machines
// without a GPU. The gpu suite runs the same matrix on a real CUDA device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/collective_check.hpp"
#include "common/fake_device.hpp"
#include "common/ranks.hpp"
#include "device/runtime.hpp"
#include "loom/loom.h"

namespace {

using loom::DataType;
using loom::ReduceOp;
using loomtest::Case;
using loomtest::FakeDevice;

// Installs an emulated device for a test: Loom's runtime, runCase's buffers, a stream per rank.
class FakeDeviceScope : public loomtest::DeviceBuffers {
 public:
  explicit FakeDeviceScope(size_t stagingBytes = 0) {
    if (stagingBytes != 0) setenv("LOOM_DEVICE_STAGING_BYTES", std::to_string(stagingBytes).c_str(), 1);
    loom::device::setRuntimeForTesting(&dev);
    loomtest::setDeviceBuffers(this);
    for (auto& s : streams_) s = dev.createStream();
  }
  ~FakeDeviceScope() override {
    loomtest::setDeviceBuffers(nullptr);
    loom::device::setRuntimeForTesting(nullptr);
    unsetenv("LOOM_DEVICE_STAGING_BYTES");
  }
  void* alloc(size_t bytes) override { return dev.alloc(bytes); }
  void free(void* p) override { dev.free(p); }
  void upload(void* d, const void* h, size_t bytes) override { std::memcpy(d, h, bytes); }
  void download(void* h, const void* d, size_t bytes) override { std::memcpy(h, d, bytes); }
  void* stream(int rank) override { return streams_[static_cast<size_t>(rank)]; }
  void synchronize(void* s) override { dev.synchronize(s); }

  // Declared first: destroyed last, after the communicators of the test are gone.
  FakeDevice dev;

 private:
  void* streams_[8] = {};
};

// ---- The collectives matrix on device buffers, every link, staging slots small enough that
// every count above a few elements takes several pipelined chunks. ----
using DeviceParam = std::tuple<int, const char*>;  // ranks, links
class DeviceMatrix : public ::testing::TestWithParam<DeviceParam> {};

TEST_P(DeviceMatrix, EveryCollectiveTypeOpAndPlacementThroughStaging) {
  const int n = std::get<0>(GetParam());
  loomtest::TransportSetup links(std::get<1>(GetParam()));
  FakeDeviceScope device(4096);
  loomtest::runOk(n, [&](loom::Communicator& c) {
    EXPECT_GT(loomtest::runMatrix(c, {0, 1, 7, 1021}, [&](const std::string& m) { ADD_FAILURE() << m; }), 0u);
  });
  EXPECT_EQ(device.dev.stuckWaits(), 0);
}

INSTANTIATE_TEST_SUITE_P(Links, DeviceMatrix,
                         ::testing::Values(DeviceParam{1, "shm"}, DeviceParam{2, "shm"}, DeviceParam{3, "tcp"},
                                           DeviceParam{4, "mixed"}),
                         [](const ::testing::TestParamInfo<DeviceParam>& i) {
                           return std::to_string(std::get<0>(i.param)) + "ranks_" + std::get<1>(i.param);
                         });

// Large counts with the default 4 MiB slots: a pipeline of several chunks at full size.
TEST(DeviceStaged, LargeCountsWithDefaultSlots) {
  FakeDeviceScope device;
  loomtest::runOk(3, [&](loom::Communicator& c) {
    auto fail = [&](const std::string& m) { ADD_FAILURE() << m; };
    for (const char* coll : loomtest::kColls)
      for (bool inPlace : {false, true}) {
        const std::string name = coll;
        const bool blocks = name == "all_gather" || name == "all_to_all" || name == "reduce_scatter";
        const size_t count = blocks ? (1u << 19) + 3 : (3u << 20) + 3;
        loomtest::runCase(c, coll, Case{DataType::Float32, ReduceOp::Sum, count, inPlace, 2}, fail);
      }
  });
  EXPECT_EQ(device.dev.stuckWaits(), 0);
}

// ---- Stream semantics. ----

// The call returns at once; the collective reads its input only after the work queued on the
// stream before the call (here held until after the call returned), and work queued after the
// call sees the result. The host call returns before a late peer has joined.
TEST(DeviceStaged, OrderedOnTheCallersStreamWithoutBlockingTheHost) {
  FakeDeviceScope device;
  static constexpr size_t kCount = 100003;
  std::promise<void> rank0Returned;
  std::shared_future<void> returned = rank0Returned.get_future().share();
  loomtest::runOk(2, [&](loom::Communicator& c) {
    const int r = c.rank();
    void* s = device.stream(r);
    auto* buf = static_cast<float*>(device.alloc(kCount * sizeof(float)));
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    // A "kernel" that writes the input, and cannot run before the call below has returned.
    device.dev.launch(s, [buf, released, r] {
      released.wait();
      for (size_t i = 0; i < kCount; ++i) buf[i] = static_cast<float>(r + 1) * static_cast<float>(i % 1000);
    });
    if (r == 1) returned.wait();  // the late peer joins only once rank 0's call has returned
    loom::Work w = c.iallReduce(buf, buf, kCount, DataType::Float32, ReduceOp::Sum, s);
    std::atomic<bool> after{false};
    std::vector<float> seen(kCount);
    device.dev.launch(s, [&] {
      std::memcpy(seen.data(), buf, kCount * sizeof(float));
      after = true;
    });
    EXPECT_FALSE(w.test()) << "the collective cannot have completed: its input is not written yet";
    EXPECT_FALSE(after.load()) << "work after the collective ran before it";
    if (r == 0) rank0Returned.set_value();
    release.set_value();
    device.dev.synchronize(s);
    w.wait();
    EXPECT_TRUE(after.load());
    for (size_t i = 0; i < kCount; ++i)
      if (seen[i] != 3.0f * static_cast<float>(i % 1000)) {
        ADD_FAILURE() << "rank " << r << " element " << i << " is " << seen[i];
        break;
      }
    device.free(buf);
  });
}

// Device and host collectives in flight together on one communicator complete in call order.
TEST(DeviceStaged, InterleavedWithHostCollectivesInCallOrder) {
  FakeDeviceScope device(8192);
  loomtest::runOk(3, [&](loom::Communicator& c) {
    const int r = c.rank();
    void* s = device.stream(r);
    constexpr size_t kN = 5000;
    std::vector<int32_t> host(kN, r + 1);
    auto* d1 = static_cast<int32_t*>(device.alloc(kN * 4));
    auto* d2 = static_cast<int32_t*>(device.alloc(kN * 4));
    for (size_t i = 0; i < kN; ++i) d1[i] = static_cast<int32_t>(i) * (r + 1), d2[i] = r;
    std::vector<loom::Work> works;
    works.push_back(c.iallReduce(d1, d1, kN, DataType::Int32, ReduceOp::Sum, s));
    works.push_back(c.iallReduce(host.data(), host.data(), kN, DataType::Int32, ReduceOp::Prod));
    works.push_back(c.ibroadcast(d2, d2, kN, DataType::Int32, 1, s));
    loom::waitAll(works);
    device.dev.synchronize(s);
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(d1[i], static_cast<int32_t>(i) * 6) << i;
      ASSERT_EQ(host[i], 6) << i;
      ASSERT_EQ(d2[i], 1) << i;
    }
    device.free(d1);
    device.free(d2);
  });
}

// ---- Bad input. ----

TEST(DeviceStaged, MixedBuffersStreamsWithHostMemoryAndGraphCaptureAreRejected) {
  FakeDeviceScope device;
  loomtest::runOk(1, [&](loom::Communicator& c) {
    void* s = device.stream(0);
    auto* d = static_cast<float*>(device.alloc(64));
    std::vector<float> h(16);
    try {
      c.allReduce(d, h.data(), 16, DataType::Float32, ReduceOp::Sum, s);
      ADD_FAILURE() << "a mix of host and device buffers was accepted";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
      EXPECT_NE(e.message().find("a mix of host and device"), std::string::npos) << e.what();
    }
    try {
      c.allReduce(h.data(), h.data(), 16, DataType::Float32, ReduceOp::Sum, s);
      ADD_FAILURE() << "a stream with host buffers was accepted";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
      EXPECT_NE(e.message().find("stream was given with host buffers"), std::string::npos) << e.what();
    }
    device.dev.setCapturing(s, true);
    try {
      c.allReduce(d, d, 16, DataType::Float32, ReduceOp::Sum, s);
      ADD_FAILURE() << "a capturing stream was accepted";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::ErrorCode::InvalidUsage);
      EXPECT_NE(e.message().find("captured into a CUDA graph"), std::string::npos) << e.what();
    }
    device.dev.setCapturing(s, false);
    // The communicator is still usable.
    for (int i = 0; i < 16; ++i) d[i] = 2.0f;
    c.allReduce(d, d, 16, DataType::Float32, ReduceOp::Sum, s);
    device.dev.synchronize(s);
    EXPECT_EQ(d[15], 2.0f);
    device.free(d);
  });
}

// Ranks that pass different counts get an error naming the collective and both calls; the
// streams are released, not left waiting.
TEST(DeviceStaged, MismatchedCountsFailEveryRankAndReleaseTheStreams) {
  FakeDeviceScope device(4096);
  auto results = loomtest::runRanks(2, [&](loom::Communicator& c) {
    const int r = c.rank();
    void* s = device.stream(r);
    const size_t n = r == 0 ? 3000 : 5000;
    auto* d = static_cast<float*>(device.alloc(n * 4));
    loom::Work w = c.iallReduce(d, d, n, DataType::Float32, ReduceOp::Sum, s);
    std::atomic<bool> after{false};
    device.dev.launch(s, [&] { after = true; });
    try {
      w.wait();
      ADD_FAILURE() << "rank " << r << ": mismatched counts went unnoticed";
    } catch (const loom::Error& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
    }
    device.dev.synchronize(s);
    EXPECT_TRUE(after.load()) << "rank " << r << ": the stream stayed held after the failure";
    device.free(d);
  });
  EXPECT_EQ(device.dev.stuckWaits(), 0);
}

// A peer that leaves instead of calling: the collective fails on the other rank, naming it, and
// that rank's stream goes on.
TEST(DeviceStaged, ADepartedPeerFailsTheCollectiveAndReleasesTheStream) {
  FakeDeviceScope device;
  std::promise<void> gone;
  std::shared_future<void> left = gone.get_future().share();
  auto results = loomtest::runRanks(2, [&](loom::Communicator& c) {
    if (c.rank() == 1) {
      c.abort();
      gone.set_value();
      return;
    }
    left.wait();
    void* s = device.stream(0);
    auto* d = static_cast<float*>(device.alloc(1 << 20));
    std::atomic<bool> after{false};
    try {
      loom::Work w = c.iallReduce(d, d, (1 << 20) / 4, DataType::Float32, ReduceOp::Sum, s);
      device.dev.launch(s, [&] { after = true; });
      w.wait();
      ADD_FAILURE() << "the collective succeeded without its peer";
    } catch (const loom::Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
    device.dev.synchronize(s);
    device.free(d);
  });
  EXPECT_EQ(device.dev.stuckWaits(), 0);
}

// The C API: a collective on device buffers with a stream returns at once and is ordered on it;
// loomCommGetAsyncError stays clean; point-to-point with a stream is refused with a clear message.
TEST(DeviceStaged, CApiOrdersCollectivesOnTheStream) {
  FakeDeviceScope device;
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      loomComm_t comm = nullptr;
      ASSERT_EQ(loomCommInitRank(&comm, 2, id, r), loomSuccess) << loomGetLastError(nullptr);
      void* s = device.stream(r);
      auto* d = static_cast<double*>(device.alloc(8 * 10));
      for (int i = 0; i < 10; ++i) d[i] = r + 0.5;
      EXPECT_EQ(loomAllReduce(d, d, 10, loomFloat64, loomMax, comm, s), loomSuccess) << loomGetLastError(comm);
      device.dev.synchronize(s);
      EXPECT_EQ(d[9], 1.5);
      loomResult_t async = loomInternalError;
      EXPECT_EQ(loomCommGetAsyncError(comm, &async), loomSuccess);
      EXPECT_EQ(async, loomSuccess);
      EXPECT_EQ(loomSend(d, 10, loomFloat64, 1 - r, comm, s), loomInvalidArgument);
      EXPECT_NE(std::string(loomGetLastError(comm)).find("host buffers only"), std::string::npos)
          << loomGetLastError(comm);
      EXPECT_EQ(loomCommDestroy(comm), loomSuccess);
      device.free(d);
    });
  for (auto& t : threads) t.join();
}

}  // namespace
