// Google Benchmark: glibc memcpy against kernels::copy (src/kernels/copy.hpp) for message-sized
// copies, with the destination at 0, 16 and 64 bytes past the source modulo 4096 (16: a buffer
// from malloc's mmap path meeting a page-aligned shared-memory area). bytes_per_second counts the
// bytes copied. Both buffers stay in cache between iterations, as a collective's chunks do.
//   build/bench/copy_bench [--benchmark_filter=/16/]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/copy.hpp"

namespace {

void runCopy(benchmark::State& state, bool loomCopy) {
  const size_t n = static_cast<size_t>(state.range(0)), distance = static_cast<size_t>(state.range(1));
  const size_t span = (n + 8192) / 4096 * 4096;
  auto* src = static_cast<uint8_t*>(std::aligned_alloc(4096, span));
  auto* dst = static_cast<uint8_t*>(std::aligned_alloc(4096, span));
  std::memset(src, 1, span);
  std::memset(dst, 2, span);
  for (auto _ : state) {
    if (loomCopy)
      loom::kernels::copy(dst + distance, src, n);
    else
      std::memcpy(dst + distance, src, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
  std::free(src);
  std::free(dst);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{4} << 10, int64_t{128} << 10, int64_t{1} << 20})
    for (int64_t d : {0, 16, 64}) b->Args({n, d});
  b->ArgNames({"bytes", "distance"});
}

void BM_Memcpy(benchmark::State& state) { runCopy(state, false); }
void BM_LoomCopy(benchmark::State& state) { runCopy(state, true); }
BENCHMARK(BM_Memcpy)->Apply(sizes);
BENCHMARK(BM_LoomCopy)->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
