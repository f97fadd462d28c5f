// The CUDA kernels against the CPU kernels on the same inputs: every datatype and op, two and n
// inputs, misaligned heads and tails, lengths 0, 1, 3, 4097 and 2^26 + 5; integers bit for bit,
// halves accumulated in float32 in the n-input form checked against a float32 reference.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/ranks.hpp"
#include "cuda_buffers.hpp"
#include "kernels/reduce.hpp"
#include "kernels/reduce_cuda.hpp"

namespace {

using loom::DataType;
using loom::ReduceOp;
namespace k = loom::kernels;

// Small values: exact sums and products in every type, so integer results are order-free.
std::vector<uint8_t> randomBuffer(DataType t, size_t count, uint32_t seed) {
  const size_t E = loom::sizeOf(t);
  std::vector<uint8_t> v(count * E);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-3, 3);
  for (size_t i = 0; i < count; ++i) {
    const int x = d(rng) == 0 ? 1 : d(rng);
    uint8_t* p = v.data() + i * E;
    switch (t) {
      case DataType::Int8:
        *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(x);
        break;
      case DataType::Uint8:
        *p = static_cast<uint8_t>(x + 3);
        break;
      case DataType::Int32:
        *reinterpret_cast<int32_t*>(p) = x;
        break;
      case DataType::Uint32:
        *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(x + 3);
        break;
      case DataType::Int64:
        *reinterpret_cast<int64_t*>(p) = x;
        break;
      case DataType::Uint64:
        *reinterpret_cast<uint64_t*>(p) = static_cast<uint64_t>(x + 3);
        break;
      case DataType::Float16:
        *reinterpret_cast<uint16_t*>(p) = k::floatToFp16(static_cast<float>(x) * 0.375f);
        break;
      case DataType::Bfloat16:
        *reinterpret_cast<uint16_t*>(p) = k::floatToBf16(static_cast<float>(x) * 0.375f);
        break;
      case DataType::Float32:
        *reinterpret_cast<float*>(p) = static_cast<float>(x) * 0.375f;
        break;
      case DataType::Float64:
        *reinterpret_cast<double*>(p) = x * 0.375;
        break;
    }
  }
  return v;
}

// Runs the two-input kernel at element offset `off` and compares with the CPU kernel.
void checkTwoInput(DataType t, ReduceOp op, size_t count, size_t off) {
  const size_t E = loom::sizeOf(t), bytes = (count + off) * E;
  auto a = randomBuffer(t, count + off, 1), b = randomBuffer(t, count + off, 2);
  std::vector<uint8_t> want(bytes), got(bytes);
  k::reduce(want.data() + off * E, a.data() + off * E, b.data() + off * E, count, t, op);
  const int divisor = op == ReduceOp::Avg ? 2 : 0;
  if (divisor) k::divide(want.data() + off * E, count, t, divisor);
  void *da = nullptr, *db = nullptr, *dd = nullptr;
  LOOM_CUDA_OK(cudaMalloc(&da, bytes + 1));
  LOOM_CUDA_OK(cudaMalloc(&db, bytes + 1));
  LOOM_CUDA_OK(cudaMalloc(&dd, bytes + 1));
  LOOM_CUDA_OK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  LOOM_CUDA_OK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
  auto at = [&](void* p) { return static_cast<uint8_t*>(p) + off * E; };
  k::cuda::reduce2(at(dd), at(da), at(db), count, t, op, divisor, nullptr);
  LOOM_CUDA_OK(cudaDeviceSynchronize());
  LOOM_CUDA_OK(cudaMemcpy(got.data(), dd, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(got.data() + off * E, want.data() + off * E, count * E), 0)
      << loom::toString(t) << " " << loom::toString(op) << " count " << count << " offset " << off;
  (void)cudaFree(da), (void)cudaFree(db), (void)cudaFree(dd);
}

TEST(GpuKernels, TwoInputMatchesTheCpuForEveryTypeOpAlignmentAndLength) {
  LOOM_REQUIRE_GPU();
  for (DataType t : loomtest::kAllTypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg})
      for (size_t count : {0, 1, 3, 4097})
        for (size_t off : {0, 1, 3}) checkTwoInput(t, op, count, off);
  checkTwoInput(DataType::Float32, ReduceOp::Sum, (1u << 26) + 5, 1);
  checkTwoInput(DataType::Bfloat16, ReduceOp::Sum, (1u << 26) + 5, 0);
}

TEST(GpuKernels, NInputMatchesAnIndependentReference) {
  LOOM_REQUIRE_GPU();
  for (DataType t : loomtest::kAllTypes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
      for (int n : {1, 3, 8})
        for (size_t count : {0, 1, 3, 4097}) {
          const size_t E = loom::sizeOf(t), bytes = count * E + 16;
          std::vector<std::vector<uint8_t>> in;
          std::vector<void*> dev(n);
          for (int i = 0; i < n; ++i) {
            in.push_back(randomBuffer(t, count + 1, 10 + i));
            LOOM_CUDA_OK(cudaMalloc(&dev[i], bytes));
            LOOM_CUDA_OK(cudaMemcpy(dev[i], in[i].data(), (count + 1) * E, cudaMemcpyHostToDevice));
          }
          // The reference: CPU kernels, pairwise in input order; the halves summed in float32.
          std::vector<uint8_t> want(in[0]);
          for (int i = 1; i < n; ++i) k::reduce(want.data(), want.data(), in[i].data(), count + 1, t, op);
          const bool half = t == DataType::Float16 || t == DataType::Bfloat16;
          void* out = nullptr;
          LOOM_CUDA_OK(cudaMalloc(&out, bytes));
          std::vector<const void*> srcs;
          for (int i = 0; i < n; ++i) srcs.push_back(static_cast<uint8_t*>(dev[i]) + E);  // misaligned by one element
          k::cuda::reduceN(static_cast<uint8_t*>(out) + E, srcs.data(), n, count, t, op, 0, nullptr);
          LOOM_CUDA_OK(cudaDeviceSynchronize());
          std::vector<uint8_t> got(count * E + E);
          LOOM_CUDA_OK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
          for (size_t i = 1; i <= count; ++i) {
            if (half && op == ReduceOp::Sum) {
              float acc = 0;
              for (int j = 0; j < n; ++j) {
                uint16_t bits;
                std::memcpy(&bits, in[j].data() + i * E, 2);
                acc += t == DataType::Float16 ? k::fp16ToFloat(bits) : k::bf16ToFloat(bits);
              }
              uint16_t g;
              std::memcpy(&g, got.data() + i * E, 2);
              const uint16_t w = t == DataType::Float16 ? k::floatToFp16(acc) : k::floatToBf16(acc);
              ASSERT_EQ(g, w) << loom::toString(t) << " n " << n << " element " << i;
            } else {
              ASSERT_EQ(std::memcmp(got.data() + i * E, want.data() + i * E, E), 0)
                  << loom::toString(t) << " " << loom::toString(op) << " n " << n << " element " << i;
            }
          }
          for (void* p : dev) (void)cudaFree(p);
          (void)cudaFree(out);
        }
}

// Reproducible mode's canonical reduction: the CUDA kernel gives the CPU's bits (kernels::
// reduceCanonical) for every float type, sum, avg and prod, 1 to 8 inputs, on wide-ranging data
// where any other order of operations gives other bits; output in place of the third input too.
TEST(GpuKernels, CanonicalMatchesTheCpuBitForBit) {
  LOOM_REQUIRE_GPU();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> e(-12, 12), sign(0, 1);
  const size_t count = 100003;
  for (DataType t : {DataType::Float16, DataType::Bfloat16, DataType::Float32, DataType::Float64}) {
    const size_t E = loom::sizeOf(t);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Prod}) {
      for (int n = 1; n <= k::cuda::kMaxInputs; ++n) {
        std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n), std::vector<uint8_t>(count * E));
        std::vector<const void*> host;
        std::vector<void*> dev(static_cast<size_t>(n));
        for (int s = 0; s < n; ++s) {
          for (size_t i = 0; i < count; ++i) {
            const float v =
                (op == ReduceOp::Prod ? mant(rng) * 0.75f : std::ldexp(mant(rng), e(rng))) * (sign(rng) ? -1.0f : 1.0f);
            uint8_t* p = in[static_cast<size_t>(s)].data() + i * E;
            if (t == DataType::Float64) {
              const double d = static_cast<double>(v) * (1.0 + 1e-10 * static_cast<double>(i % 97));
              std::memcpy(p, &d, 8);
            } else if (t == DataType::Float32) {
              std::memcpy(p, &v, 4);
            } else {
              const uint16_t h = t == DataType::Float16 ? k::floatToFp16(v) : k::floatToBf16(v);
              std::memcpy(p, &h, 2);
            }
          }
          host.push_back(in[static_cast<size_t>(s)].data());
          LOOM_CUDA_OK(cudaMalloc(&dev[static_cast<size_t>(s)], count * E));
          LOOM_CUDA_OK(cudaMemcpy(dev[static_cast<size_t>(s)], host.back(), count * E, cudaMemcpyHostToDevice));
        }
        std::vector<uint8_t> want(count * E), got(count * E);
        k::reduceCanonical(want.data(), host.data(), n, count, t, op);
        void* dst = dev[static_cast<size_t>(std::min(2, n - 1))];  // in place
        std::vector<const void*> srcs(dev.begin(), dev.end());
        k::cuda::reduceCanonicalN(dst, srcs.data(), n, count, t, op, nullptr);
        LOOM_CUDA_OK(cudaDeviceSynchronize());
        LOOM_CUDA_OK(cudaMemcpy(got.data(), dst, count * E, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(std::memcmp(got.data() + i * E, want.data() + i * E, E), 0)
              << loom::toString(t) << " " << loom::toString(op) << " n " << n << " element " << i;
        for (void* p : dev) (void)cudaFree(p);
      }
    }
  }
}

TEST(GpuKernels, StridedCopyMovesEveryRow) {
  LOOM_REQUIRE_GPU();
  for (size_t width : {1, 15, 16, 4097})
    for (size_t rows : {1, 3}) {
      const size_t sp = width + 7, dp = width + 32;
      std::vector<uint8_t> src(sp * rows), got(dp * rows, 0);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
      void *ds = nullptr, *dd = nullptr;
      LOOM_CUDA_OK(cudaMalloc(&ds, src.size()));
      LOOM_CUDA_OK(cudaMalloc(&dd, got.size()));
      LOOM_CUDA_OK(cudaMemcpy(ds, src.data(), src.size(), cudaMemcpyHostToDevice));
      LOOM_CUDA_OK(cudaMemset(dd, 0, got.size()));
      k::cuda::copy2D(dd, dp, ds, sp, width, rows, nullptr);
      LOOM_CUDA_OK(cudaDeviceSynchronize());
      LOOM_CUDA_OK(cudaMemcpy(got.data(), dd, got.size(), cudaMemcpyDeviceToHost));
      for (size_t r = 0; r < rows; ++r)
        ASSERT_EQ(std::memcmp(got.data() + r * dp, src.data() + r * sp, width), 0) << width << " x " << rows;
      (void)cudaFree(ds), (void)cudaFree(dd);
    }
}

// The compression kernel: float32 to float16 / bfloat16 with a scale, bit for bit as the CPU's
// round-to-nearest-even conversion, and back exactly.
TEST(GpuKernels, ConversionMatchesTheCpu) {
  LOOM_REQUIRE_GPU();
  const size_t count = 100003;
  std::vector<float> in(count);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1000.0f, 1000.0f);
  for (auto& x : in) x = d(rng);
  for (DataType half : {DataType::Float16, DataType::Bfloat16}) {
    void *df = nullptr, *dh = nullptr, *back = nullptr;
    LOOM_CUDA_OK(cudaMalloc(&df, count * 4));
    LOOM_CUDA_OK(cudaMalloc(&dh, count * 2));
    LOOM_CUDA_OK(cudaMalloc(&back, count * 4));
    LOOM_CUDA_OK(cudaMemcpy(df, in.data(), count * 4, cudaMemcpyHostToDevice));
    k::cuda::convert(dh, half, df, DataType::Float32, count, 0.25f, nullptr);
    k::cuda::convert(back, DataType::Float32, dh, half, count, 1.0f, nullptr);
    LOOM_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> h(count);
    std::vector<float> f(count);
    LOOM_CUDA_OK(cudaMemcpy(h.data(), dh, count * 2, cudaMemcpyDeviceToHost));
    LOOM_CUDA_OK(cudaMemcpy(f.data(), back, count * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) {
      const float x = in[i] * 0.25f;
      const uint16_t want = half == DataType::Float16 ? k::floatToFp16(x) : k::floatToBf16(x);
      ASSERT_EQ(h[i], want) << "element " << i << " (" << x << ")";
      ASSERT_EQ(f[i], half == DataType::Float16 ? k::fp16ToFloat(want) : k::bf16ToFloat(want)) << "element " << i;
    }
    (void)cudaFree(df), (void)cudaFree(dh), (void)cudaFree(back);
  }
}

}  // namespace
