// The gpu suite's helpers: a skip when no CUDA device is usable (one line saying why), and
// runCase's buffers in CUDA device memory with a stream per rank.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/block_pool.hpp"
#include "common/collective_check.hpp"
#include "device/runtime.hpp"

namespace loomtest {

#define LOOM_REQUIRE_GPU()                                                                                             \
  do {                                                                                                                 \
    if (loom::device::startRuntime() == nullptr) GTEST_SKIP() << "no GPU here: " << loom::device::unavailableReason(); \
  } while (0)

#define LOOM_CUDA_OK(call)                                                 \
  do {                                                                     \
    cudaError_t e_ = (call);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_); \
  } while (0)

class CudaBuffers : public DeviceBuffers {
 public:
  /// `pooled`: the buffers come from the device's stream-ordered pool (cudaMallocAsync), which
  /// CUDA IPC cannot share, as with PyTorch's cudaMallocAsync allocator backend.
  explicit CudaBuffers(bool pooled = false) : pool_(allocator(pooled), releaser(pooled)) {
    for (auto& s : streams_) (void)cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    (void)cudaStreamCreateWithFlags(&copies_, cudaStreamNonBlocking);
    setDeviceBuffers(this);
  }
  ~CudaBuffers() override {
    setDeviceBuffers(nullptr);
    for (auto& s : streams_) (void)cudaStreamDestroy(s);
    (void)cudaStreamDestroy(copies_);
  }
  void* alloc(size_t bytes) override { return pool_.take(bytes); }
  void free(void* p) override { pool_.give(p); }  // cudaFree would wait for peers' held streams
  // Through a stream of their own, waited for: cudaMemcpy from pageable memory may return before
  // its copy has landed, and the ranks' streams are non-blocking, so a collective queued next
  // would not wait for it (a real H200 read stale inputs that way). The legacy stream is no
  // answer: it waits for blocking streams, which a peer's held collective may be.
  void upload(void* d, const void* h, size_t bytes) override {
    if (cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, copies_) != cudaSuccess ||
        cudaStreamSynchronize(copies_) != cudaSuccess)
      throw std::runtime_error("upload failed");
  }
  void download(void* h, const void* d, size_t bytes) override {
    if (cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, copies_) != cudaSuccess ||
        cudaStreamSynchronize(copies_) != cudaSuccess)
      throw std::runtime_error("download failed");
  }
  void* stream(int rank) override { return streams_[rank]; }
  void synchronize(void* s) override {
    if (cudaStreamSynchronize(static_cast<cudaStream_t>(s)) != cudaSuccess)
      throw std::runtime_error("cudaStreamSynchronize failed");
  }

 private:
  static std::function<void*(size_t)> allocator(bool pooled) {
    return [pooled](size_t bytes) -> void* {
      void* p = nullptr;
      if (!pooled) return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
      if (cudaMallocAsync(&p, bytes, nullptr) != cudaSuccess || cudaStreamSynchronize(nullptr) != cudaSuccess)
        return nullptr;
      return p;
    };
  }
  static std::function<void(void*)> releaser(bool pooled) {
    return [pooled](void* p) {
      if (!pooled) {
        (void)cudaFree(p);
        return;
      }
      (void)cudaFreeAsync(p, nullptr);
      (void)cudaStreamSynchronize(nullptr);
    };
  }

  cudaStream_t streams_[8] = {};
  cudaStream_t copies_ = nullptr;  // uploads and downloads
  BlockPool pool_;
};

}  // namespace loomtest
