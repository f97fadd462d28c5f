// Google Benchmark micro-benchmarks of the CPU reduction kernels: GB/s per datatype and op, beside
// memcpy on the same buffers. bytes_per_second counts the output bytes (what an all-reduce step
// produces), as the anchor does: a[i] += b[i] against memcpy(a, b).
//   build/bench/reduce_kernels_bench [--benchmark_filter=float32]
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "kernels/reduce.hpp"

namespace {

constexpr size_t kBytes = 64u << 20;  // larger than any cache here: memory bandwidth, as in all-reduce

void BM_Memcpy(benchmark::State& state) {
  std::vector<uint8_t> a(kBytes, 1), b(kBytes, 2);
  for (auto _ : state) {
    std::memcpy(a.data(), b.data(), kBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kBytes));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Reduce(benchmark::State& state, loom::DataType type, loom::ReduceOp op) {
  const size_t count = kBytes / loom::sizeOf(type);
  std::vector<uint8_t> a(kBytes, 1), b(kBytes, 1);  // small values: no NaN or denormal slow paths
  for (auto _ : state) {
    loom::kernels::reduce(a.data(), a.data(), b.data(), count, type, op);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kBytes));
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
      benchmark::RegisterBenchmark(name.c_str(), BM_Reduce, t, op)->Unit(benchmark::kMillisecond)->UseRealTime();
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
