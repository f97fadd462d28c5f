// GPUDirect RDMA over the ib transport (transport/ib/gpu_direct.hpp), with the emulated device
// (common/fake_device.hpp) and the tests' verbs provider, which registers the device's memory only
// as a real adapter would: through the dma-buf the device exports, or by pointer where a
// peer-memory module is loaded (LOOM_TEST_VERBS_PEERMEM=1), and refuses it by pointer otherwise.
// Device send/recv must then go from device buffer to device buffer by RDMA, with no copy through
// host memory (the device counts its copies), and registrations made once per allocation.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/comm_impl.hpp"
#include "common/env_guard.hpp"
#include "common/fake_device.hpp"
#include "common/ranks.hpp"
#include "device/runtime.hpp"
#include "loom_config.h"
#include "verbs_provider/counters.h"

#if LOOM_HAVE_IBVERBS

namespace {

using loom::DataType;

const LoomTestVerbsCounters* (*providerCounters())() {
  const char* path = std::getenv("LOOM_TEST_VERBS_PROVIDER");
  void* h = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  return h != nullptr ? reinterpret_cast<const LoomTestVerbsCounters* (*)()>(dlsym(h, "loom_test_verbs_counters"))
                      : nullptr;
}

// The emulated device as the process's runtime, ib links through the provider, streams per rank.
class GpuDirectScope {
 public:
  explicit GpuDirectScope(const char* mode = "auto") : links_("ib"), mode_("LOOM_IB_GPU_DIRECT", mode) {
    loom::device::setRuntimeForTesting(&dev);
    for (auto& s : streams_) s = dev.createStream();
  }
  ~GpuDirectScope() {
    EXPECT_EQ(dev.ruleBreaks(), 0) << dev.ruleBreakReport();
    loom::device::setRuntimeForTesting(nullptr);
  }
  void* stream(int rank) { return streams_[rank]; }

  loomtest::FakeDevice dev;  // first: destroyed after the communicators

 private:
  loomtest::TransportSetup links_;
  loomtest::EnvGuard mode_;
  void* streams_[4] = {};
};

int32_t value(int from, int msg, size_t i) { return from * 1000003 + msg * 7919 + static_cast<int32_t>(i % 10007); }

// Counts of every kind: empty, one element, odd and prime ones far under the eager limit, one at
// it, and large ones of several RDMA chunks.
const size_t kCounts[] = {0, 1, 7, 1021, 16384, (size_t{1} << 19) + 3};

#define NEED_PROVIDER()                                                                                              \
  auto counters = providerCounters();                                                                                \
  if (counters == nullptr)                                                                                           \
  GTEST_SKIP() << "LOOM_TEST_VERBS_PROVIDER does not name the tests' verbs provider (meson sets it where the verbs " \
                  "headers are; by hand: LOOM_TEST_VERBS_PROVIDER=build/tests/libloom_test_verbs.so)"

// Each rank sends every count to the next rank and receives from the one before, as one group
// on its stream, from and into device buffers; `rounds` times over the same buffers.
void ringOnDevice(GpuDirectScope& g, loom::Communicator& c, int rounds) {
  const int r = c.rank(), n = c.size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<int32_t*> out, in;
  for (size_t count : kCounts) {
    out.push_back(static_cast<int32_t*>(g.dev.alloc((count + 1) * 4)));
    in.push_back(static_cast<int32_t*>(g.dev.alloc((count + 1) * 4)));
  }
  for (int round = 0; round < rounds; ++round) {
    std::vector<loom::PointToPoint> ops;
    for (size_t k = 0; k < std::size(kCounts); ++k) {
      for (size_t i = 0; i < kCounts[k]; ++i) out[k][i] = value(r, round * 10 + static_cast<int>(k), i);
      in[k][kCounts[k]] = -7;  // one past the message: must stay as it is
      ops.push_back({true, out[k], kCounts[k], DataType::Int32, next, static_cast<uint32_t>(k)});
      ops.push_back({false, in[k], kCounts[k], DataType::Int32, prev, static_cast<uint32_t>(k)});
    }
    loom::Work w = c.igroup(ops, g.stream(r));
    w.wait();
    g.dev.synchronize(g.stream(r));
    for (size_t k = 0; k < std::size(kCounts); ++k) {
      for (size_t i = 0; i < kCounts[k]; ++i)
        ASSERT_EQ(in[k][i], value(prev, round * 10 + static_cast<int>(k), i))
            << "count " << kCounts[k] << ", element " << i << ", rank " << r << ", round " << round;
      ASSERT_EQ(in[k][kCounts[k]], -7) << "written past the message of " << kCounts[k];
    }
  }
  c.barrier();
  for (size_t k = 0; k < std::size(kCounts); ++k) g.dev.free(out[k]), g.dev.free(in[k]);
}

TEST(IbGpuDirect, DeviceMessagesGoByRdmaFromDeviceMemoryToDeviceMemory) {
  NEED_PROVIDER();
  GpuDirectScope g;
  const LoomTestVerbsCounters before = *counters();
  LoomTestVerbsCounters warm{};
  loomtest::runOk(3, [&](loom::Communicator& c) {
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank()) {
        ASSERT_TRUE(c.impl()->link(p).deviceBuffers) << "the link to rank " << p;
      }
    ringOnDevice(g, c, 1);
    if (c.rank() == 0) warm = *counters();
    c.barrier();
    ringOnDevice(g, c, 3);
  });
  const LoomTestVerbsCounters after = *counters();
  EXPECT_EQ(g.dev.copies(), 0) << "a device message was staged through host memory";
  EXPECT_EQ(after.device_registrations - before.device_registrations, 0u) << "device memory registered by pointer";
  EXPECT_GT(warm.dmabuf_registrations - before.dmabuf_registrations, 0u);
  EXPECT_EQ(after.unmapped_accesses - before.unmapped_accesses, 0u);
  uint64_t payload = 0;
  for (size_t count : kCounts) payload += count * 4;
  // Every payload byte of the last three rounds went by RDMA write (no eager copy), and
  // registrations were made per allocation (at most one per buffer in the second call's buffers).
  EXPECT_GE(after.write_bytes - warm.write_bytes, 3 * 3 * payload);
  EXPECT_LE(after.dmabuf_registrations - warm.dmabuf_registrations, 3 * 2 * std::size(kCounts));
  std::printf("[ ib gdr   ] %llu device allocation(s) registered as dma-bufs, %llu bytes written in place\n",
              static_cast<unsigned long long>(after.dmabuf_registrations - before.dmabuf_registrations),
              static_cast<unsigned long long>(after.write_bytes - before.write_bytes));
}

// A training loop's device buffers: registered in the first step, found registered in every
// later one; memory freed and allocated again (maybe at the same address) registered anew.
TEST(IbGpuDirect, RegistrationsPerAllocationAreReusedAndRenewedWhenTheMemoryIs) {
  NEED_PROVIDER();
  GpuDirectScope g;
  constexpr size_t kCount = 300000;
  loomtest::runOk(2, [&](loom::Communicator& c) {
    const int r = c.rank(), peer = 1 - r;
    auto* buf = static_cast<int32_t*>(g.dev.alloc(kCount * 4));
    auto exchange = [&](int step) {
      if (r == 0) {
        for (size_t i = 0; i < kCount; i += 97) buf[i] = value(0, step, i);
        c.send(buf, kCount, DataType::Int32, peer, 1, g.stream(r));
      } else {
        c.recv(buf, kCount, DataType::Int32, peer, 1, g.stream(r));
        g.dev.synchronize(g.stream(r));
        for (size_t i = 0; i < kCount; i += 97) ASSERT_EQ(buf[i], value(0, step, i)) << "step " << step;
      }
      g.dev.synchronize(g.stream(r));
      c.barrier();
    };
    exchange(0);
    const uint64_t made = counters()->dmabuf_registrations;
    for (int s = 1; s <= 20; ++s) exchange(s);
    if (r == 0) {
      EXPECT_EQ(counters()->dmabuf_registrations, made) << "a registration made again in the loop";
    }
    c.barrier();
    g.dev.free(buf);
    buf = static_cast<int32_t*>(g.dev.alloc(kCount * 4));
    exchange(21);  // correct only if the new allocation's pages were registered, not the old ones'
    g.dev.free(buf);
  });
  EXPECT_EQ(g.dev.copies(), 0);
}

// The other way machines allow: ibv_reg_mr on device pointers where a peer-memory module is loaded.
TEST(IbGpuDirect, PeerMemoryWhereTheModuleIsLoaded) {
  NEED_PROVIDER();
  loomtest::EnvGuard module("LOOM_TEST_VERBS_PEERMEM", "1");
  GpuDirectScope g("peermem");
  const LoomTestVerbsCounters before = *counters();
  loomtest::runOk(2, [&](loom::Communicator& c) { ringOnDevice(g, c, 2); });
  const LoomTestVerbsCounters after = *counters();
  EXPECT_GT(after.device_registrations - before.device_registrations, 0u);
  EXPECT_EQ(after.dmabuf_registrations - before.dmabuf_registrations, 0u);
  EXPECT_EQ(g.dev.copies(), 0);
}

// Asked for peer memory where no module lends device pages: the adapter refuses, and the send
// fails saying what to do (before anything reaches the peer, which posts nothing here).
TEST(IbGpuDirect, PeerMemoryWithoutTheModuleFailsSayingWhy) {
  NEED_PROVIDER();
  GpuDirectScope g("peermem");
  std::atomic<bool> tried{false};
  loomtest::runOk(2, [&](loom::Communicator& c) {
    if (c.rank() == 1) {
      while (!tried.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // stays until then
    } else {
      auto* buf = static_cast<int32_t*>(g.dev.alloc(1 << 20));
      try {
        c.isend(buf, 1 << 18, DataType::Int32, 1, 3, g.stream(0)).wait();
        ADD_FAILURE() << "a send from unregistrable device memory succeeded";
      } catch (const loom::Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("device memory"), std::string::npos) << what;
        EXPECT_NE(what.find("to rank 1"), std::string::npos) << what;
        EXPECT_NE(what.find("nvidia-peermem"), std::string::npos) << what;
        EXPECT_NE(what.find("LOOM_IB_GPU_DIRECT=off"), std::string::npos) << what;
      }
      g.dev.synchronize(g.stream(0));
      g.dev.free(buf);
      tried = true;
    }
  });
}

// Where GPUDirect is off (or the device exports no dma-buf and no module is loaded), device
// buffers are staged through pinned host memory, as before, and arrive the same.
TEST(IbGpuDirect, WithoutItDeviceBuffersAreStaged) {
  NEED_PROVIDER();
  for (const char* how : {"off", "auto-no-dmabuf"}) {
    SCOPED_TRACE(how);
    GpuDirectScope g(std::strcmp(how, "off") == 0 ? "off" : "auto");
    g.dev.dmabuf = std::strcmp(how, "off") == 0;
    loomtest::runOk(2, [&](loom::Communicator& c) {
      EXPECT_FALSE(c.impl()->link(1 - c.rank()).deviceBuffers);
      ringOnDevice(g, c, 1);
    });
    EXPECT_GT(g.dev.copies(), 0) << "nothing was staged";
  }
}

// One rank's buffer in host memory, the other's on the device: a small message from host memory
// (eager) copied into device memory by the runtime, a large one from device memory written into
// host memory in place.
TEST(IbGpuDirect, HostAndDeviceBuffersMeet) {
  NEED_PROVIDER();
  GpuDirectScope g;
  constexpr size_t kSmall = 100, kLarge = 200000;
  loomtest::runOk(2, [&](loom::Communicator& c) {
    if (c.rank() == 0) {
      std::vector<int32_t> small(kSmall), large(kLarge, -1);
      for (size_t i = 0; i < kSmall; ++i) small[i] = value(0, 1, i);
      c.send(small.data(), kSmall, DataType::Int32, 1, 1);
      c.recv(large.data(), kLarge, DataType::Int32, 1, 2);
      for (size_t i = 0; i < kLarge; ++i) ASSERT_EQ(large[i], value(1, 2, i)) << i;
    } else {
      auto* small = static_cast<int32_t*>(g.dev.alloc(kSmall * 4));
      auto* large = static_cast<int32_t*>(g.dev.alloc(kLarge * 4));
      for (size_t i = 0; i < kLarge; ++i) large[i] = value(1, 2, i);
      c.recv(small, kSmall, DataType::Int32, 0, 1, g.stream(1));
      c.send(large, kLarge, DataType::Int32, 0, 2, g.stream(1));
      g.dev.synchronize(g.stream(1));
      for (size_t i = 0; i < kSmall; ++i) ASSERT_EQ(small[i], value(0, 1, i)) << i;
      g.dev.free(small);
      g.dev.free(large);
    }
  });
}

}  // namespace

#endif  // LOOM_HAVE_IBVERBS
