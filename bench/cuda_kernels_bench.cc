// cuda_kernels_bench: GB/s of Loom's CUDA reduction kernels per datatype and op, beside a
// device-to-device cudaMemcpy of the same bytes measured in the same run. Traffic counts bytes
// read plus bytes written (two-input: 3 x buffer; n-input: (n + 1) x buffer; copy: 2 x buffer).
//   cuda_kernels_bench [-b bytes] [-n iters] [-i inputs]     (defaults: 256M, 20, 4)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "device/runtime.hpp"
#include "kernels/reduce_cuda.hpp"

namespace {

using loom::DataType;
using loom::ReduceOp;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Seconds per call of `fn`, median-free but warmed up: the mean of `iters` back-to-back calls.
template <typename F>
double timeIt(int iters, F fn) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  fn();
  check(cudaDeviceSynchronize(), "warm-up");
  check(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) fn();
  check(cudaEventRecord(b), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return ms / 1e3 / iters;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 256u << 20;
  int iters = 20, inputs = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "-b") bytes = std::strtoull(argv[i + 1], nullptr, 10) << 20;
    if (a == "-n") iters = std::atoi(argv[i + 1]);
    if (a == "-i") inputs = std::atoi(argv[i + 1]);
  }
  if (loom::device::startRuntime() == nullptr) {
    std::printf("cuda_kernels_bench: %s\n", loom::device::unavailableReason().c_str());
    return 0;
  }
  inputs = std::max(2, std::min(inputs, loom::kernels::cuda::kMaxInputs));
  std::vector<void*> buf(static_cast<size_t>(inputs) + 1);
  for (auto& p : buf) {
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    check(cudaMemset(p, 0, bytes), "cudaMemset");
  }
  const double copy =
      2.0 * static_cast<double>(bytes) /
      timeIt(iters, [&] { check(cudaMemcpyAsync(buf[0], buf[1], bytes, cudaMemcpyDeviceToDevice), "copy"); }) / 1e9;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# %s, %zu MiB buffers, %d iterations; device-to-device cudaMemcpy: %.1f GB/s (read + write)\n",
              prop.name, bytes >> 20, iters, copy);
  std::printf("# %10s %6s %14s %8s %14s %8s\n", "type", "op", "2-input GB/s", "vs copy",
              (std::to_string(inputs) + "-input GB/s").c_str(), "vs copy");
  const char* ops[] = {"sum", "prod", "max", "min", "avg"};
  for (int t = 0; t < 10; ++t)
    for (int o = 0; o < 5; ++o) {
      const auto type = static_cast<DataType>(t);
      const auto op = static_cast<ReduceOp>(o);
      const size_t count = bytes / loom::sizeOf(type);
      const double two = 3.0 * static_cast<double>(bytes) /
                         timeIt(iters,
                                [&] {
                                  loom::kernels::cuda::reduce2(buf[0], buf[0], buf[1], count, type, op,
                                                               op == ReduceOp::Avg ? 2 : 0, nullptr);
                                }) /
                         1e9;
      std::vector<const void*> srcs(buf.begin() + 1, buf.end());
      const double many = static_cast<double>(inputs + 1) * static_cast<double>(bytes) /
                          timeIt(iters,
                                 [&] {
                                   loom::kernels::cuda::reduceN(buf[0], srcs.data(), inputs, count, type, op,
                                                                op == ReduceOp::Avg ? inputs : 0, nullptr);
                                 }) /
                          1e9;
      std::printf("  %10s %6s %14.1f %7.0f%% %14.1f %7.0f%%\n", loom::toString(type), ops[o], two, 100 * two / copy,
                  many, 100 * many / copy);
    }
  for (auto* p : buf) (void)cudaFree(p);
  return 0;
}
