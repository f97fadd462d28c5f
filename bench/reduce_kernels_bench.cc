// Google Benchmark micro-benchmarks of the CPU reduction kernels: GB/s per datatype and op, beside
// memcpy on the same buffers. bytes_per_second counts the output bytes (what an all-reduce step
// produces), as the anchor does: a[i] += b[i] against memcpy(a, b); each kernel's
// vs_memcpy counter is that ratio, with memcpy timed on its buffers just before it.
//   build/bench/reduce_kernels_bench [--benchmark_filter=float32/sum]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/reduce.hpp"

namespace {

constexpr size_t kBytes = 64u << 20;  // larger than any cache here: memory bandwidth, as in all-reduce

using Clock = std::chrono::steady_clock;

// Median GB/s of memcpy(a, b, bytes) over a few runs: the anchor each kernel benchmark reports its
// own rate against (counter vs_memcpy), on its own buffers, just before it runs.
double memcpyGBs(uint8_t* a, const uint8_t* b, size_t bytes) {
  const int reps = static_cast<int>(std::max<size_t>(3, (256u << 20) / bytes));
  std::vector<double> rates;
  for (int k = 0; k < 5; ++k) {
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      std::memcpy(a, b, bytes);
      benchmark::ClobberMemory();
    }
    rates.push_back(static_cast<double>(bytes) * reps / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(a.data(), b.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_Memcpy)->Arg(256 << 10)->Arg(2 << 20)->Arg(kBytes)->Unit(benchmark::kMillisecond)->UseRealTime();

// a[i] = op(a[i], b[i]) over `bytes`, the in-place step of an all-reduce; vs_memcpy is this rate
// over memcpy's on the same buffers. At 64 MiB both run from memory, where the reduction moves
// three streams (two reads, one write) to memcpy's two; a run the size of a TCP read (256 KiB) or
// of a ring chunk (2 MiB) stays in cache.
void BM_Reduce(benchmark::State& state, loom::DataType type, loom::ReduceOp op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / loom::sizeOf(type);
  std::vector<uint8_t> a(bytes, 1), b(bytes, 1);  // small values: no NaN or denormal slow paths
  const double anchor = memcpyGBs(a.data(), b.data(), bytes);
  std::fill(a.begin(), a.end(), uint8_t{1});
  const auto t0 = Clock::now();
  for (auto _ : state) {
    loom::kernels::reduce(a.data(), a.data(), b.data(), count, type, op);
    benchmark::ClobberMemory();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.counters["memcpy_GBps"] = anchor;
  if (secs > 0)
    state.counters["vs_memcpy"] =
        static_cast<double>(bytes) * static_cast<double>(state.iterations()) / secs / 1e9 / anchor;
  state.SetLabel(loom::kernels::isaName());
}

void registerAll() {
  const loom::DataType types[] = {loom::DataType::Float32, loom::DataType::Bfloat16, loom::DataType::Float16,
                                  loom::DataType::Float64, loom::DataType::Int32,    loom::DataType::Int8,
                                  loom::DataType::Int64,   loom::DataType::Uint8};
  const loom::ReduceOp ops[] = {loom::ReduceOp::Sum, loom::ReduceOp::Prod, loom::ReduceOp::Max, loom::ReduceOp::Min};
  for (auto t : types)
    for (auto op : ops) {
      std::string name = std::string("BM_Reduce/") + loom::toString(t) + "/" + loom::toString(op);
      auto* b =
          benchmark::RegisterBenchmark(name.c_str(), BM_Reduce, t, op)->Unit(benchmark::kMillisecond)->UseRealTime();
      // Every kernel from memory; float32 sum, the all-reduce's common case, from cache too.
      if (t == loom::DataType::Float32 && op == loom::ReduceOp::Sum) b->Arg(256 << 10)->Arg(2 << 20);
      b->Arg(kBytes);
    }
}

}  // namespace

int main(int argc, char** argv) {
  registerAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
