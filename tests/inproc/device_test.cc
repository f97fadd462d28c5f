// Collectives on device buffers, stream-ordered, on an emulated device (common/fake_device.hpp):
// both paths (CUDA IPC among the ranks of one node, pinned host staging otherwise), stream
// semantics, argument checks and failure handling, on machines without a GPU. The ranks here are
// threads of one process, so CUDA IPC uses the peers' pointers as they are; the multiproc suite
// maps them across processes. The gpu suite runs the same matrix on a real CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
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
#include "kernels/reduce.hpp"
#include "loom/ddp.hpp"
#include "loom/loom.h"

namespace {

using loom::DataType;
using loom::ReduceOp;
using loomtest::Case;
using loomtest::FakeDevice;

// Installs an emulated device for a test: Loom's runtime, runCase's buffers, a stream per rank.
// Without `ipc`, and unless the test chose its transports, CUDA IPC is left out
// (LOOM_TRANSPORT=^cuda_ipc), so that device buffers take the staging path.
class FakeDeviceScope : public loomtest::DeviceBuffers {
 public:
  explicit FakeDeviceScope(size_t stagingBytes = 0, bool ipc = false) {
    if (stagingBytes != 0) setenv("LOOM_DEVICE_STAGING_BYTES", std::to_string(stagingBytes).c_str(), 1);
    if (!ipc && std::getenv("LOOM_TRANSPORT") == nullptr) {
      setenv("LOOM_TRANSPORT", "^cuda_ipc", 1);
      setTransport_ = true;
    }
    loom::device::setRuntimeForTesting(&dev);
    loomtest::setDeviceBuffers(this);
    for (auto& s : streams_) s = dev.createStream();
  }
  ~FakeDeviceScope() override {
    // Every test on the emulated device: nothing that would hang a real GPU.
    EXPECT_EQ(dev.ruleBreaks(), 0) << dev.ruleBreakReport();
    loomtest::setDeviceBuffers(nullptr);
    loom::device::setRuntimeForTesting(nullptr);
    unsetenv("LOOM_DEVICE_STAGING_BYTES");
    if (setTransport_) unsetenv("LOOM_TRANSPORT");
  }
  void* alloc(size_t bytes) override { return dev.alloc(bytes, pooled); }
  void free(void* p) override { dev.free(p); }
  void upload(void* d, const void* h, size_t bytes) override { std::memcpy(d, h, bytes); }
  void download(void* h, const void* d, size_t bytes) override { std::memcpy(h, d, bytes); }
  void* stream(int rank) override { return streams_[static_cast<size_t>(rank)]; }
  void synchronize(void* s) override { dev.synchronize(s); }

  // Declared first: destroyed last, after the communicators of the test are gone.
  FakeDevice dev;
  /// Buffers as from a stream-ordered pool (cudaMallocAsync), which CUDA IPC cannot share.
  bool pooled = false;

 private:
  void* streams_[8] = {};
  bool setTransport_ = false;
};

// The tests that run on both paths: "staged" or "ipc".
class DevicePath : public ::testing::TestWithParam<const char*> {
 protected:
  bool ipc() const { return std::string(GetParam()) == "ipc"; }
  // After a test with peers: CUDA IPC exported buffers exactly when it was the path.
  void expectPath(const FakeDevice& dev) const {
    if (ipc()) {
      EXPECT_GT(dev.ipcExports(), 0) << "the collectives did not go through CUDA IPC";
    } else {
      EXPECT_EQ(dev.ipcExports(), 0) << "the collectives did not go through the staging path";
    }
  }
};

// ---- The collectives matrix on device buffers: through CUDA IPC on one node ("ipc"), and staged
// over every link, with staging slots small enough that every count above a few elements takes
// several pipelined chunks. ----
using DeviceParam = std::tuple<int, const char*>;  // ranks, links
class DeviceMatrix : public ::testing::TestWithParam<DeviceParam> {};

TEST_P(DeviceMatrix, EveryCollectiveTypeOpAndPlacement) {
  const int n = std::get<0>(GetParam());
  std::string links = std::get<1>(GetParam());
  // "ipc": one node; "mixed-ipc", "mixed3-ipc": 2 or 3 nodes, CUDA IPC within each (node-aware
  // all-reduce, the other collectives staged).
  const bool ipc = links.size() >= 3 && links.compare(links.size() - 3, 3, "ipc") == 0;
  if (ipc) links = links == "ipc" ? "shm" : links.substr(0, links.size() - 4);
  loomtest::TransportSetup setup(links);
  FakeDeviceScope device(4096, ipc);
  loomtest::runOk(n, [&](loom::Communicator& c) {
    EXPECT_GT(loomtest::runMatrix(c, {0, 1, 7, 1021}, [&](const std::string& m) { ADD_FAILURE() << m; }), 0u);
  });
  EXPECT_EQ(device.dev.stuckWaits(), 0);
  if (n > 1) {
    EXPECT_EQ(device.dev.ipcExports() > 0, ipc) << "the path taken is not the one meant";
  }
}

INSTANTIATE_TEST_SUITE_P(Links, DeviceMatrix,
                         ::testing::Values(DeviceParam{1, "ipc"}, DeviceParam{2, "ipc"}, DeviceParam{3, "ipc"},
                                           DeviceParam{4, "ipc"}, DeviceParam{5, "ipc"}, DeviceParam{2, "shm"},
                                           DeviceParam{3, "tcp"}, DeviceParam{4, "mixed"}, DeviceParam{4, "mixed-ipc"},
                                           DeviceParam{6, "mixed3-ipc"}),
                         [](const ::testing::TestParamInfo<DeviceParam>& i) {
                           std::string name = std::to_string(std::get<0>(i.param)) + "ranks_" + std::get<1>(i.param);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Node-aware collectives on device buffers (2 nodes of 2, 3 nodes of 2): CUDA IPC within each
// node, the steps across nodes in many chunks of the 4 KiB staging slot. All-reduce of datatypes
// and ops that end differently (avg divides once), broadcast from roots on either node and in
// either column, all-gather of blocks of many chunks and of one element, reduce-scatter, reduce to
// roots anywhere; in place and not, from
// a stream-ordered pool too. Only these run, so the n-input reductions counted are the node steps'.
TEST(DeviceNodes, CollectivesAreNodeAwareThroughManyChunks) {
  for (const char* layout : {"mixed", "mixed3"}) {
    for (bool pooled : {false, true}) {
      SCOPED_TRACE(std::string(layout) + (pooled ? ", pooled" : ""));
      loomtest::TransportSetup setup(layout);
      FakeDeviceScope device(4096, true);
      device.pooled = pooled;
      const int n = std::string(layout) == "mixed" ? 4 : 6;
      loomtest::runOk(n, [&](loom::Communicator& c) {
        auto fail = [&](const std::string& m) { ADD_FAILURE() << m; };
        for (bool inPlace : {false, true}) {
          loomtest::runCase(c, "all_reduce", Case{DataType::Float32, ReduceOp::Avg, 100003, inPlace, 0}, fail);
          loomtest::runCase(c, "all_reduce", Case{DataType::Int64, ReduceOp::Sum, 7919, inPlace, 0}, fail);
          loomtest::runCase(c, "all_reduce", Case{DataType::Bfloat16, ReduceOp::Max, 3001, inPlace, 0}, fail);
          for (int root : {0, 1, n - 1})
            loomtest::runCase(c, "broadcast", Case{DataType::Int32, ReduceOp::Sum, 20011, inPlace, root}, fail);
          loomtest::runCase(c, "all_gather", Case{DataType::Float64, ReduceOp::Sum, 3001, inPlace, 0}, fail);
          loomtest::runCase(c, "all_gather", Case{DataType::Int8, ReduceOp::Sum, 1, inPlace, 0}, fail);
          loomtest::runCase(c, "reduce_scatter", Case{DataType::Float32, ReduceOp::Avg, 2503, inPlace, 0}, fail);
          loomtest::runCase(c, "reduce_scatter", Case{DataType::Int32, ReduceOp::Prod, 7, inPlace, 0}, fail);
          for (int root : {0, 1, n - 1})
            loomtest::runCase(c, "reduce", Case{DataType::Float16, ReduceOp::Avg, 30011, inPlace, root}, fail);
          loomtest::runCase(c, "reduce", Case{DataType::Uint8, ReduceOp::Min, 1, inPlace, n - 1}, fail);
        }
      });
      EXPECT_GT(device.dev.reductions(), 0) << "the node-aware path did not run";
      EXPECT_GT(device.dev.ipcExports(), 0);
      EXPECT_EQ(device.dev.stuckWaits(), 0);
    }
  }
}

// Large counts with the default 4 MiB slots: a pipeline of several chunks at full size.
TEST_P(DevicePath, LargeCountsWithDefaultSlots) {
  FakeDeviceScope device(0, ipc());
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
  expectPath(device.dev);
}

// Buffers from a stream-ordered pool (PyTorch's cudaMallocAsync backend), which CUDA IPC cannot
// export: every collective still works, in place and out of place, through CUDA IPC by way of a
// device copy, or staged.
TEST_P(DevicePath, BuffersFromAStreamOrderedPoolWork) {
  FakeDeviceScope device(4096, ipc());
  device.pooled = true;
  loomtest::runOk(3, [&](loom::Communicator& c) {
    EXPECT_GT(loomtest::runMatrix(c, {0, 1, 7, 1021}, [&](const std::string& m) { ADD_FAILURE() << m; }), 0u);
  });
  EXPECT_EQ(device.dev.stuckWaits(), 0);
  expectPath(device.dev);
}

// ---- Stream semantics. ----

// The call returns at once; the collective reads its input only after the work queued on the
// stream before the call (here held until after the call returned), and work queued after the
// call sees the result. The host call returns before a late peer has joined.
TEST_P(DevicePath, OrderedOnTheCallersStreamWithoutBlockingTheHost) {
  FakeDeviceScope device(0, ipc());
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
  expectPath(device.dev);
}

// Device and host collectives in flight together on one communicator complete in call order.
TEST_P(DevicePath, InterleavedWithHostCollectivesInCallOrder) {
  FakeDeviceScope device(8192, ipc());
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
  expectPath(device.dev);
}

// All-to-all with a count per peer on device buffers: uneven blocks at displacements with gaps,
// which the copy back must leave untouched.
TEST_P(DevicePath, AllToAllvWithUnevenBlocks) {
  FakeDeviceScope device(0, ipc());
  loomtest::runOk(3, [&](loom::Communicator& c) {
    const int r = c.rank(), n = c.size();
    void* s = device.stream(r);
    // Rank r sends (r + 1) * (j + 1) elements to rank j.
    std::vector<size_t> sc(3), sd(3), rc(3), rd(3);
    size_t so = 0, ro = 0;
    for (int j = 0; j < n; ++j) {
      sc[j] = static_cast<size_t>((r + 1) * (j + 1));
      sd[j] = so;
      so += sc[j] + 2;  // gaps between blocks
      rc[j] = static_cast<size_t>((j + 1) * (r + 1));
      rd[j] = ro;
      ro += rc[j] + 3;
    }
    auto* in = static_cast<int32_t*>(device.alloc(so * 4));
    auto* out = static_cast<int32_t*>(device.alloc(ro * 4));
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < sc[j]; ++i) in[sd[j] + i] = 1000 * r + 100 * j + static_cast<int32_t>(i);
    for (size_t i = 0; i < ro; ++i) out[i] = -7;
    c.allToAllv(in, sc, sd, out, rc, rd, DataType::Int32, s);
    device.dev.synchronize(s);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < rc[j]; ++i)
        ASSERT_EQ(out[rd[j] + i], 1000 * j + 100 * r + static_cast<int32_t>(i))
            << "from rank " << j << " element " << i;
      for (size_t g = rd[j] + rc[j]; g < rd[j] + rc[j] + 3; ++g) ASSERT_EQ(out[g], -7) << "gap at " << g;
    }
    device.free(in);
    device.free(out);
  });
  expectPath(device.dev);
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
TEST_P(DevicePath, MismatchedCountsFailEveryRankAndReleaseTheStreams) {
  FakeDeviceScope device(4096, ipc());
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
  expectPath(device.dev);
}

// One rank passes device buffers where its peers pass host memory (on one node, where the device
// rank goes through CUDA IPC and its peers through shared memory, or staged): every rank fails at
// once, well inside the 30 s timeout, saying which rank passed which kind; the stream goes on.
void expectPlacementMismatchFailsAtOnce(FakeDeviceScope& device) {
  for (const auto& ranksAndCount : {std::pair<int, size_t>{2, 10000}, {3, 10000}, {2, 100}, {3, 1}}) {
    const int n = ranksAndCount.first;
    const size_t kCount = ranksAndCount.second;
    const auto start = std::chrono::steady_clock::now();
    auto results = loomtest::runRanks(n, [&](loom::Communicator& c) {
      const int r = c.rank();
      std::vector<float> host(kCount, 1.0f);
      try {
        if (r == 0) {
          void* s = device.stream(r);
          auto* d = static_cast<float*>(device.alloc(kCount * 4));
          loom::Work w = c.iallReduce(d, d, kCount, DataType::Float32, ReduceOp::Sum, s);
          std::atomic<bool> after{false};
          device.dev.launch(s, [&] { after = true; });
          try {
            w.wait();
          } catch (const loom::Error&) {
            device.dev.synchronize(s);
            EXPECT_TRUE(after.load()) << "the stream stayed held after the failure";
            device.free(d);
            throw;
          }
          device.free(d);
        } else {
          c.allReduce(host.data(), host.data(), kCount, DataType::Float32, ReduceOp::Sum);
        }
        ADD_FAILURE() << "rank " << r << ": device and host buffers were mixed across ranks unnoticed";
      } catch (const loom::Error& e) {
        const std::string m = e.what();
        EXPECT_TRUE(m.find("device buffers") != std::string::npos && m.find("host buffers") != std::string::npos)
            << "rank " << r << ": " << m;
        EXPECT_NE(m.find("all_reduce"), std::string::npos) << m;
      }
    });
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(took, 15.0) << n << " ranks took " << took << " s to fail: the timeout, not the check";
    (void)results;
  }
  EXPECT_EQ(device.dev.stuckWaits(), 0);
}

TEST_P(DevicePath, MismatchedPlacementFailsEveryRankAtOnce) {
  FakeDeviceScope device(4096, ipc());
  expectPlacementMismatchFailsAtOnce(device);
}

// The same where the check is the signature in every message's header: over TCP, and on two
// nodes (staged: shared memory within each, TCP between).
TEST(DeviceStaged, MismatchedPlacementFailsEveryRankAtOnceOverTcpAndAcrossNodes) {
  for (const char* links : {"tcp", "mixed"}) {
    SCOPED_TRACE(links);
    loomtest::TransportSetup setup(links);
    FakeDeviceScope device(4096);
    expectPlacementMismatchFailsAtOnce(device);
  }
}

// A peer that leaves instead of calling: the collective fails on the other rank, naming it, and
// that rank's stream goes on.
TEST_P(DevicePath, ADepartedPeerFailsTheCollectiveAndReleasesTheStream) {
  FakeDeviceScope device(0, ipc());
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
  expectPath(device.dev);
}

// The C API: a collective and a grouped exchange on device buffers with a stream return at once
// and are ordered on it; loomCommGetAsyncError stays clean; a barrier with a stream is refused.
TEST_P(DevicePath, CApiOrdersCollectivesOnTheStream) {
  FakeDeviceScope device(0, ipc());
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
      // A grouped exchange on device buffers: returns once queued, ordered on the stream.
      auto* in = static_cast<double*>(device.alloc(8 * 10));
      for (int i = 0; i < 10; ++i) d[i] = 10.0 * r + i;
      EXPECT_EQ(loomGroupStart(), loomSuccess);
      EXPECT_EQ(loomSend(d, 10, loomFloat64, 1 - r, comm, s), loomSuccess) << loomGetLastError(comm);
      EXPECT_EQ(loomRecv(in, 10, loomFloat64, 1 - r, comm, s), loomSuccess) << loomGetLastError(comm);
      EXPECT_EQ(loomGroupEnd(), loomSuccess) << loomGetLastError(comm);
      device.dev.synchronize(s);
      EXPECT_EQ(in[3], 10.0 * (1 - r) + 3);
      EXPECT_EQ(loomBarrier(comm, s), loomInvalidArgument);
      EXPECT_NE(std::string(loomGetLastError(comm)).find("takes no stream"), std::string::npos)
          << loomGetLastError(comm);
      device.free(in);
      EXPECT_EQ(loomCommDestroy(comm), loomSuccess);
      device.free(d);
    });
  for (auto& t : threads) t.join();
  expectPath(device.dev);
}

// loomCommFinalize waits for what the rank queued: a collective on device buffers returns once
// ordered on its stream, its peer joins it late, and finalize returns only once it has completed.
TEST_P(DevicePath, CApiFinalizeWaitsForTheQueuedOperations) {
  FakeDeviceScope device(0, ipc());
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  const auto late = std::chrono::milliseconds(400);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      loomComm_t comm = nullptr;
      ASSERT_EQ(loomCommInitRank(&comm, 2, id, r), loomSuccess) << loomGetLastError(nullptr);
      EXPECT_EQ(loomCommFinalize(comm), loomSuccess) << "nothing queued yet: " << loomGetLastError(comm);
      void* s = device.stream(r);
      auto* d = static_cast<int32_t*>(device.alloc(4 * 1000));
      for (int i = 0; i < 1000; ++i) d[i] = r + i;
      if (r == 1) std::this_thread::sleep_for(late);
      const auto start = std::chrono::steady_clock::now();
      EXPECT_EQ(loomAllReduce(d, d, 1000, loomInt32, loomSum, comm, s), loomSuccess) << loomGetLastError(comm);
      EXPECT_EQ(loomCommFinalize(comm), loomSuccess) << loomGetLastError(comm);
      if (r == 0) {
        EXPECT_GE(std::chrono::steady_clock::now() - start, late - std::chrono::milliseconds(50));
      }
      device.dev.synchronize(s);
      EXPECT_EQ(d[999], 1 + 2 * 999);
      EXPECT_EQ(loomCommDestroy(comm), loomSuccess);
      device.free(d);
    });
  for (auto& t : threads) t.join();
  expectPath(device.dev);
}

// ---- Point-to-point on device buffers. ----

// A ring shift of large device messages as one group (it would deadlock as blocking calls), then
// single sends and receives, in order on one tag, all ordered on the stream: through CUDA IPC with
// no copy through host memory, or staged through pinned memory. With `pooled`, the buffers are from
// a stream-ordered pool, which CUDA IPC cannot share.
void sendAndReceiveOnTheStream(bool ipc, bool pooled) {
  FakeDeviceScope device(0, ipc);
  device.pooled = pooled;
  loomtest::runOk(3, [&](loom::Communicator& c) {
    const int r = c.rank(), n = c.size();
    void* s = device.stream(r);
    const size_t count = (1u << 20) + 7;
    auto* out = static_cast<int32_t*>(device.alloc(count * 4));
    auto* in = static_cast<int32_t*>(device.alloc(count * 4));
    for (size_t i = 0; i < count; ++i) out[i] = r * 1000 + static_cast<int32_t>(i % 977);
    loom::Work w = c.igroup(
        {{true, out, count, DataType::Int32, (r + 1) % n, 5}, {false, in, count, DataType::Int32, (r + n - 1) % n, 5}},
        s);
    w.wait();
    EXPECT_EQ(w.bytes(), count * 4) << "the group's Work counts the bytes received";
    device.dev.synchronize(s);
    const int from = (r + n - 1) % n;
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(in[i], from * 1000 + static_cast<int32_t>(i % 977)) << "element " << i << " on rank " << r;
    // Rank 0 sends rank 1 three messages on one tag, each changed on the stream after its send was
    // queued; rank 1 receives them in order on its stream, into a larger buffer.
    if (r == 0) {
      for (int k = 0; k < 3; ++k) {
        device.dev.launch(s, [out, k] { out[0] = 100 + k; });
        c.send(out, 100 - static_cast<size_t>(k), DataType::Int32, 1, 9, s);
      }
    }
    if (r == 1) {
      for (int k = 0; k < 3; ++k) {
        loom::Work one = c.irecv(in, 200, DataType::Int32, 0, 9, s);
        one.wait();
        EXPECT_EQ(one.bytes(), (100u - static_cast<size_t>(k)) * 4);
        EXPECT_EQ(one.source(), 0);
        device.dev.synchronize(s);
        EXPECT_EQ(in[0], 100 + k) << "message " << k << " out of order";
        EXPECT_EQ(in[99 - k], 99 - k);
      }
    }
    device.dev.synchronize(s);
    device.free(out);
    device.free(in);
  });
  EXPECT_EQ(device.dev.stuckWaits(), 0);
  if (ipc) {
    EXPECT_EQ(device.dev.hostCopies(), 0) << "a message went through host memory";
    EXPECT_GT(device.dev.ipcExports(), 0);
  } else {
    EXPECT_GT(device.dev.hostCopies(), 0);
    EXPECT_EQ(device.dev.ipcExports(), 0);
  }
}

TEST_P(DevicePath, SendAndReceiveOnTheStream) { sendAndReceiveOnTheStream(ipc(), false); }
TEST_P(DevicePath, SendAndReceiveFromAStreamOrderedPool) { sendAndReceiveOnTheStream(ipc(), true); }

// A device message larger than its receive: both ends fail, saying so, as on host buffers; the
// streams go on and the link still works.
TEST_P(DevicePath, AReceiveTooSmallFailsBothEnds) {
  FakeDeviceScope device(0, ipc());
  loomtest::runOk(2, [&](loom::Communicator& c) {
    const int r = c.rank();
    void* s = device.stream(r);
    auto* buf = static_cast<int32_t*>(device.alloc(100000 * 4));
    try {
      // Blocking calls on a stream return once queued: the Work carries the error.
      loom::Work w =
          r == 0 ? c.isend(buf, 100000, DataType::Int32, 1, 3, s) : c.irecv(buf, 10, DataType::Int32, 0, 3, s);
      w.wait();
      ADD_FAILURE() << "rank " << r << ": a message larger than its receive went unnoticed";
    } catch (const loom::Error& e) {
      EXPECT_NE(std::string(e.what()).find("larger than the receive buffer"), std::string::npos) << e.what();
    }
    device.dev.synchronize(s);
    for (int i = 0; i < 10; ++i) buf[i] = r;
    if (r == 0) c.send(buf, 10, DataType::Int32, 1, 4, s);
    if (r == 1) c.recv(buf, 10, DataType::Int32, 0, 4, s);
    device.dev.synchronize(s);
    EXPECT_EQ(buf[9], 0);
    device.free(buf);
  });
  expectPath(device.dev);
}

// A group whose one receive fails (a host message larger than a device receive from any source)
// still reads and answers its other receives: their senders through CUDA IPC complete, not time out.
TEST(DeviceIpc, AFailedReceiveInAGroupStillAnswersTheOthers) {
  FakeDeviceScope device(0, true);
  loom::Options o;
  o.timeout = std::chrono::milliseconds(20000);
  auto results = loomtest::runRanks(
      3,
      [&](loom::Communicator& c) {
        const int r = c.rank();
        void* s = device.stream(r);
        auto* d = static_cast<int32_t*>(device.alloc(4096 * 4));
        std::vector<int32_t> h(4096, 7);
        for (int i = 0; i < 4096; ++i) d[i] = r;
        const auto start = std::chrono::steady_clock::now();
        if (r == 0) {
          loom::Work w = c.igroup(
              {{false, d, 16, DataType::Int32, loom::kAnySource, 1}, {false, d + 1024, 1024, DataType::Int32, 2, 2}},
              s);
          try {
            w.wait();
            ADD_FAILURE() << "the receive too small went unnoticed";
          } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find("larger than the receive buffer"), std::string::npos) << e.what();
          }
          device.dev.synchronize(s);
          EXPECT_EQ(d[1024 + 1023], 2) << "the other receive was not read";
        } else if (r == 1) {
          c.send(h.data(), 4096, DataType::Int32, 0, 1);
        } else {
          loom::Work w = c.isend(d, 1024, DataType::Int32, 0, 2, s);
          w.wait();
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << "it waited for its timeout";
        }
        device.dev.synchronize(s);
        device.free(d);
      },
      o);
  for (int r = 1; r < 3; ++r) EXPECT_EQ(results[static_cast<size_t>(r)].error, "") << "rank " << r;
}

// Between ranks of one node, a device send and a host receive (or the reverse) is an error that
// names both kinds, not bytes of a descriptor taken as data. The device sender, whose receive
// never comes, fails at its timeout.
TEST(DeviceIpc, MixedPlacementOfASendAndItsReceiveIsNamed) {
  FakeDeviceScope device(0, true);
  loom::Options o;
  o.timeout = std::chrono::milliseconds(2000);
  for (bool deviceSends : {true, false}) {
    SCOPED_TRACE(deviceSends ? "device send, host receive" : "host send, device receive");
    auto results = loomtest::runRanks(
        2,
        [&](loom::Communicator& c) {
          const int r = c.rank();
          void* s = device.stream(r);
          auto* d = static_cast<int32_t*>(device.alloc(64 * 4));
          std::vector<int32_t> h(64, 5);
          const bool onDevice = (r == 0) == deviceSends;
          try {
            loom::Work w;
            if (r == 0) {
              w = onDevice ? c.isend(d, 64, DataType::Int32, 1, 2, s) : c.isend(h.data(), 64, DataType::Int32, 1, 2);
            } else {
              w = onDevice ? c.irecv(d, 64, DataType::Int32, 0, 2, s) : c.irecv(h.data(), 64, DataType::Int32, 0, 2);
            }
            w.wait();
            if (r == 1) ADD_FAILURE() << "the receive took a message of the other kind";
          } catch (const loom::Error& e) {
            const std::string m = e.what();
            if (r == 1) {
              EXPECT_NE(m.find(deviceSends ? "rank 0 sent from device buffers where rank 1 receives into host buffers"
                                           : "rank 0 sent from host buffers where rank 1 receives into device buffers"),
                        std::string::npos)
                  << m;
            } else {
              EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
            }
          }
          device.dev.synchronize(s);
          device.free(d);
        },
        o);
    (void)results;
  }
}

// ---- The data-parallel layer on device gradients. ----

// A model's parameters and gradients in (emulated) device memory, freed with it; the data of
// parameter k on rank r is r * 10 + k.
struct DeviceModel {
  DeviceModel(FakeDeviceScope& d, const std::vector<size_t>& sizes, int rank) : device(d) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      data.push_back(static_cast<float*>(device.alloc(sizes[k] * 4)));
      grad.push_back(static_cast<float*>(device.alloc(sizes[k] * 4)));
      for (size_t i = 0; i < sizes[k]; ++i) data[k][i] = static_cast<float>(rank * 10 + static_cast<int>(k));
      params.push_back({data[k], grad[k], sizes[k], DataType::Float32, "p" + std::to_string(k)});
    }
  }
  ~DeviceModel() {
    for (size_t k = 0; k < data.size(); ++k) device.free(data[k]), device.free(grad[k]);
  }
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;
  FakeDeviceScope& device;
  std::vector<float*> data, grad;
  std::vector<loom::ddp::Parameter> params;
};

// Parameters and gradients in device memory, the backward pass's stream given: after
// synchronize() (and the stream), every gradient is the average over the ranks, exactly (small
// integers in float32); the parameters start as rank 0's. Packed into device buckets, all in
// place, and as bucket views.
TEST_P(DevicePath, GradSyncAveragesDeviceGradientsOnTheStream) {
  FakeDeviceScope device(0, ipc());
  const std::vector<size_t> sizes = {5, 1000, 300001};
  for (const char* how : {"packed", "direct", "view"}) {
    const std::string mode = how;
    loomtest::runOk(3, [&](loom::Communicator& c) {
      const int r = c.rank();
      void* s = device.stream(r);
      DeviceModel model(device, sizes, r);
      auto& data = model.data;
      auto& params = model.params;
      loom::ddp::GradSyncOptions o;
      o.cudaStream = s;
      o.firstBucketCapBytes = 64;
      o.bucketCapBytes = 4096;
      o.directMinBytes = mode == "direct" ? 1 : (64u << 20);
      o.gradientAsBucketView = mode == "view";
      loom::ddp::GradSync sync(c, params, o);
      device.dev.synchronize(s);
      for (size_t k = 0; k < sizes.size(); ++k) ASSERT_EQ(data[k][sizes[k] - 1], static_cast<float>(k)) << mode;
      for (int step = 0; step < 3; ++step) {
        for (size_t k = sizes.size(); k-- > 0;) {
          auto* g = static_cast<float*>(sync.gradient(k));
          // The "backward kernel" of layer k, queued on the stream, then marked ready.
          device.dev.launch(s, [g, n = sizes[k], r, step] {
            for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7) + step);
          });
          sync.markReady(k);
        }
        sync.synchronize();
        device.dev.synchronize(s);
        for (size_t k = 0; k < sizes.size(); ++k) {
          auto* g = static_cast<float*>(sync.gradient(k));
          for (size_t i = 0; i < sizes[k]; ++i)
            ASSERT_EQ(g[i], static_cast<float>(2 * static_cast<int>(i % 7) + step))
                << mode << " step " << step << " parameter " << k << " element " << i << " rank " << r;
        }
      }
    });
  }
  EXPECT_EQ(device.dev.stuckWaits(), 0);
  expectPath(device.dev);
}

TEST(DeviceStaged, GradSyncRefusesMixedParameters) {
  FakeDeviceScope device;
  loomtest::runOk(1, [&](loom::Communicator& c) {
    auto* d = static_cast<float*>(device.alloc(64));
    std::vector<float> h(16), hg(16);
    auto* dg = static_cast<float*>(device.alloc(64));
    loom::ddp::GradSyncOptions o;
    o.cudaStream = device.stream(0);
    EXPECT_EQ(loomtest::errorCodeOf([&] {
                loom::ddp::GradSync sync(
                    c, {{d, dg, 16, DataType::Float32, "a"}, {h.data(), hg.data(), 16, DataType::Float32, "b"}}, o);
              }),
              loom::ErrorCode::InvalidArgument);
    device.free(d);
    device.free(dg);
  });
}

// Compressed device gradients: converted to float16 / bfloat16 on the stream (after a division
// by the world size), summed in half precision, converted back; averages within half precision's
// rounding (relative 2^-8 for bfloat16, 2^-11 for float16, per step of the sum).
TEST_P(DevicePath, GradSyncCompressesDeviceGradients) {
  FakeDeviceScope device(0, ipc());
  const std::vector<size_t> sizes = {3, 5000, 70001};
  for (auto comp : {loom::ddp::Compression::Float16, loom::ddp::Compression::Bfloat16}) {
    const double tol = comp == loom::ddp::Compression::Float16 ? 4.0 / 2048 : 4.0 / 256;
    loomtest::runOk(3, [&](loom::Communicator& c) {
      const int r = c.rank();
      void* s = device.stream(r);
      DeviceModel model(device, sizes, r);
      auto& grad = model.grad;
      loom::ddp::GradSyncOptions o;
      o.cudaStream = s;
      o.compression = comp;
      o.bucketCapBytes = 8192;
      loom::ddp::GradSync sync(c, model.params, o);
      for (int step = 0; step < 2; ++step) {
        for (size_t k = sizes.size(); k-- > 0;) {
          float* g = grad[k];
          device.dev.launch(s, [g, n = sizes[k], r, step] {
            for (size_t i = 0; i < n; ++i) g[i] = 0.37f * static_cast<float>((r + 1) * static_cast<int>(i % 13) - step);
          });
          sync.markReady(k);
        }
        sync.synchronize();
        device.dev.synchronize(s);
        size_t rounded = 0;  // elements off the float32 average: the half precision went on the wire
        for (size_t k = 0; k < sizes.size(); ++k)
          for (size_t i = 0; i < sizes[k]; ++i) {
            // Mean over ranks of 0.37 * ((r + 1) * (i % 13) - step): 0.37 * (2 * (i % 13) - step).
            const double want = 0.37 * (2.0 * static_cast<double>(i % 13) - step);
            ASSERT_NEAR(grad[k][i], want, tol * (std::abs(want) + 0.37 * 13))
                << "parameter " << k << " element " << i << " rank " << r << " step " << step;
            if (std::abs(grad[k][i] - want) > 1e-5) ++rounded;
          }
        EXPECT_GT(rounded, 0u) << "the gradients were not compressed";
      }
    });
  }
  EXPECT_EQ(device.dev.stuckWaits(), 0);
  expectPath(device.dev);
}

// igroup on host buffers: the same exchange, its Work completing when all parts have.
TEST(DeviceStaged, HostGroupOfSendsAndReceives) {
  loomtest::runOk(4, [&](loom::Communicator& c) {
    const int r = c.rank(), n = c.size();
    std::vector<float> out(300001, static_cast<float>(r)), a(300001), b(300001);
    loom::Work w = c.igroup({{true, out.data(), out.size(), DataType::Float32, (r + 1) % n, 0},
                             {true, out.data(), out.size(), DataType::Float32, (r + n - 1) % n, 0},
                             {false, a.data(), a.size(), DataType::Float32, (r + n - 1) % n, 0},
                             {false, b.data(), b.size(), DataType::Float32, (r + 1) % n, 0}});
    w.wait();
    EXPECT_EQ(w.bytes(), 2 * a.size() * 4);
    EXPECT_EQ(a.back(), static_cast<float>((r + n - 1) % n));
    EXPECT_EQ(b.front(), static_cast<float>((r + 1) % n));
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, DevicePath, ::testing::Values("staged", "ipc"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Reproducible mode on device buffers: the same bits as the same call on host buffers (which
// tests/inproc/reproducible_test.cc checks against the canonical tree): through CUDA IPC with the
// canonical kernel on one node, staged through host memory across nodes and over TCP (never the
// node-aware device path, which reduces in another order).
TEST(DeviceReproducible, DeviceBuffersGiveTheHostsBits) {
  for (const char* layout : {"shm", "mixed", "tcp"}) {
    SCOPED_TRACE(layout);
    loomtest::TransportSetup setup(layout);
    FakeDeviceScope device(4096, true);
    loom::Options o;
    o.reproducible = 1;
    loomtest::runOk(
        4,
        [&](loom::Communicator& c) {
          for (auto [type, op] :
               {std::pair{DataType::Float32, ReduceOp::Sum}, std::pair{DataType::Bfloat16, ReduceOp::Avg},
                std::pair{DataType::Float64, ReduceOp::Prod}}) {
            const size_t count = 30011, bytes = count * loom::sizeOf(type);
            std::vector<uint8_t> in(bytes), host(bytes), dev(bytes);
            // Wide-ranging values (every byte pattern but NaN-prone exponents would do; keep them finite).
            for (size_t i = 0; i < count; ++i) {
              const uint64_t h = (i * 0x9e3779b97f4a7c15ull) ^ (static_cast<uint64_t>(c.rank()) << 50);
              const double v = (1.0 + static_cast<double>(h % 1000003) / 1000003.0) *
                               (op == ReduceOp::Prod ? 1.0 : std::ldexp(1.0, static_cast<int>((h >> 20) % 31) - 15)) *
                               ((h >> 40) & 1 ? -1.0 : 1.0);
              uint8_t* p = in.data() + i * loom::sizeOf(type);
              if (type == DataType::Float64) {
                std::memcpy(p, &v, 8);
              } else if (type == DataType::Float32) {
                const auto f = static_cast<float>(v);
                std::memcpy(p, &f, 4);
              } else {
                const uint16_t b = loom::kernels::floatToBf16(static_cast<float>(v));
                std::memcpy(p, &b, 2);
              }
            }
            c.allReduce(in.data(), host.data(), count, type, op);
            void* dIn = device.alloc(bytes);
            void* dOut = device.alloc(bytes);
            device.upload(dIn, in.data(), bytes);
            void* stream = device.stream(c.rank());
            c.allReduce(dIn, dOut, count, type, op, stream);
            device.synchronize(stream);
            device.download(dev.data(), dOut, bytes);
            EXPECT_EQ(std::memcmp(dev.data(), host.data(), bytes), 0) << "type " << static_cast<int>(type);
            device.free(dIn);
            device.free(dOut);
          }
        },
        o);
    const bool ipc = std::string(layout) == "shm";
    EXPECT_EQ(device.dev.ipcExports() > 0, ipc) << "the path taken is not the one meant";
    EXPECT_EQ(device.dev.canonicalReductions() > 0, ipc);
    EXPECT_EQ(device.dev.reductions(), device.dev.canonicalReductions()) << "a reduction in another order";
    EXPECT_EQ(device.dev.stuckWaits(), 0);
  }
}

}  // namespace
