// Every collective on CUDA device buffers, 1 to 4 ranks sharing one GPU, against the independent
// reference: as threads of one process through CUDA IPC (pointers used as they are), staged over
// shared memory (CUDA IPC left out) and over TCP, on two virtual nodes ("mixed": with 4 ranks the
// node-aware path); as processes through CUDA IPC (handles opened
// for real, loomrun and the device worker of the multiproc suite). And the stream semantics with
// real CUDA streams, on both paths.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "common/collective_check.hpp"
#include "common/ranks.hpp"
#include "cuda_buffers.hpp"

namespace {

using loom::DataType;
using loom::ReduceOp;

using GpuParam = std::tuple<int, const char*>;
class GpuMatrix : public ::testing::TestWithParam<GpuParam> {};

TEST_P(GpuMatrix, EveryCollectiveOnDeviceBuffers) {
  LOOM_REQUIRE_GPU();
  loomtest::TransportSetup links(std::get<1>(GetParam()));
  loomtest::CudaBuffers buffers;
  loomtest::runOk(std::get<0>(GetParam()), [&](loom::Communicator& c) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    loomtest::runMatrix(c, {0, 1, 7, 1021, (1u << 20) + 3}, [&](const std::string& m) { ADD_FAILURE() << m; });
  });
}

INSTANTIATE_TEST_SUITE_P(Links, GpuMatrix,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values("shm", "noipc", "tcp", "mixed")),
                         [](const ::testing::TestParamInfo<GpuParam>& i) {
                           return std::to_string(std::get<0>(i.param)) + "ranks_" + std::get<1>(i.param);
                         });

// Buffers from the device's stream-ordered pool (cudaMallocAsync), which cudaIpcGetMemHandle
// refuses: every collective still works through CUDA IPC (by a device copy) and staged.
TEST(GpuPool, EveryCollectiveOnBuffersFromAStreamOrderedPool) {
  LOOM_REQUIRE_GPU();
  for (const char* links : {"shm", "noipc"}) {
    SCOPED_TRACE(links);
    loomtest::TransportSetup setup(links);
    loomtest::CudaBuffers buffers(true);
    loomtest::runOk(3, [&](loom::Communicator& c) {
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      loomtest::runMatrix(c, {0, 1, 1021, (1u << 18) + 3}, [&](const std::string& m) { ADD_FAILURE() << m; });
    });
  }
}

// A host function queued before the collective holds the stream until the call has returned;
// the collective must still read the input written after it, and a copy queued after the call
// must see the result.
void CUDART_CB releaseWhenSet(void* p) { static_cast<std::shared_future<void>*>(p)->wait(); }

class GpuStreams : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuStreams, CollectiveIsOrderedOnTheStreamAndDoesNotBlockTheHost) {
  LOOM_REQUIRE_GPU();
  loomtest::TransportSetup links(GetParam());
  constexpr size_t kCount = 1 << 20;
  loomtest::runOk(2, [&](loom::Communicator& c) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaStream_t s;
    LOOM_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* d = nullptr;
    LOOM_CUDA_OK(cudaMalloc(&d, kCount * 4));
    // Pinned host memory: a copy to or from pageable memory waits on the host for the stream, which
    // the gate holds until after the call.
    float *host = nullptr, *out = nullptr;
    LOOM_CUDA_OK(cudaMallocHost(&host, kCount * 4));
    LOOM_CUDA_OK(cudaMallocHost(&out, kCount * 4));
    std::fill(host, host + kCount, static_cast<float>(c.rank() + 1));
    std::promise<void> go;
    std::shared_future<void> gate = go.get_future().share();
    LOOM_CUDA_OK(cudaLaunchHostFunc(s, releaseWhenSet, &gate));
    LOOM_CUDA_OK(cudaMemcpyAsync(d, host, kCount * 4, cudaMemcpyHostToDevice, s));
    loom::Work w = c.iallReduce(d, d, kCount, DataType::Float32, ReduceOp::Sum, s);
    LOOM_CUDA_OK(cudaMemcpyAsync(out, d, kCount * 4, cudaMemcpyDeviceToHost, s));
    EXPECT_FALSE(w.test());
    go.set_value();
    LOOM_CUDA_OK(cudaStreamSynchronize(s));
    w.wait();
    EXPECT_EQ(out[0], 3.0f);
    EXPECT_EQ(out[kCount - 1], 3.0f);
    (void)cudaFreeHost(host);
    (void)cudaFreeHost(out);
    (void)cudaFree(d);
    (void)cudaStreamDestroy(s);
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, GpuStreams, ::testing::Values("shm", "noipc"));

// Ranks as processes sharing the GPU: CUDA IPC handles exported, opened and cached for real.
TEST(GpuProcesses, EveryCollectiveThroughCudaIpcBetweenProcesses) {
  LOOM_REQUIRE_GPU();
  const char* loomrun = std::getenv("LOOMRUN");
  const char* worker = std::getenv("LOOM_DEVICE_WORKER");
  ASSERT_TRUE(loomrun != nullptr && worker != nullptr) << "run through meson test (LOOMRUN, LOOM_DEVICE_WORKER)";
  for (int n : {2, 4}) {
    const std::string cmd =
        std::string("timeout 600 ") + loomrun + " -n " + std::to_string(n) + " " + worker + " cuda 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
    const int status = pclose(p);
    EXPECT_EQ(status, 0) << out;
    for (int r = 0; r < n; ++r)
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": device worker ok"), std::string::npos) << out;
  }
}

}  // namespace
