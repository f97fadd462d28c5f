// The memory-bandwidth anchor for bench/compare --links shm: THREADS threads at once each copy
// BYTES (memcpy, buffers of BYTES each, warm) and, separately, sum BYTES of float32 into an
// accumulator (a[i] += b[i]); prints "membw <threads> <bytes> <copy GB/s per thread> <sum GB/s
// of output per thread>", the median of several passes.
//   membw_bench THREADS BYTES [BYTES ...]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Runs fn(thread) on `threads` threads at once, `reps` times each; returns the median per-thread
// bytes per second for `bytes` moved per call.
template <typename Fn>
double perThread(int threads, size_t bytes, int reps, Fn fn) {
  std::vector<double> rates;
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  std::vector<std::vector<double>> per(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      fn(t);  // warm: pages touched, caches as they will be
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        fn(t);
        per[static_cast<size_t>(t)].push_back(static_cast<double>(bytes) /
                                              seconds(std::chrono::steady_clock::now() - t0));
      }
    });
  for (auto& t : ts) t.join();
  for (auto& v : per) rates.insert(rates.end(), v.begin(), v.end());
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2] / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: membw_bench THREADS BYTES [BYTES ...]\n");
    return 2;
  }
  const int threads = std::max(1, std::atoi(argv[1]));
  for (int a = 2; a < argc; ++a) {
    const size_t bytes = std::max<size_t>(64, std::strtoull(argv[a], nullptr, 10)) / 4 * 4;
    const int reps = bytes >= (16u << 20) ? 5 : (bytes >= (1u << 20) ? 20 : 200);
    std::vector<std::vector<float>> src(static_cast<size_t>(threads)), dst(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t) {
      src[static_cast<size_t>(t)].assign(bytes / 4, 1.0f);
      dst[static_cast<size_t>(t)].assign(bytes / 4, 2.0f);
    }
    const double copy = perThread(threads, bytes, reps, [&](int t) {
      std::memcpy(dst[static_cast<size_t>(t)].data(), src[static_cast<size_t>(t)].data(), bytes);
    });
    const double sum = perThread(threads, bytes, reps, [&](int t) {
      float* d = dst[static_cast<size_t>(t)].data();
      const float* s = src[static_cast<size_t>(t)].data();
      for (size_t i = 0; i < bytes / 4; ++i) d[i] += s[i];
    });
    std::printf("membw %d %zu %.4f %.4f\n", threads, bytes, copy, sum);
    std::fflush(stdout);
  }
  return 0;
}
