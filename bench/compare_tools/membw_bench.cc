// The memory-bandwidth anchor for bench/compare --links shm: THREADS threads at once each copy
// BYTES (memcpy, buffers of BYTES each, warm) and, separately, sum BYTES of float32 into an
// accumulator (a[i] += b[i]); prints "membw <threads> <bytes> <copy GB/s per thread> <sum GB/s
// of output per thread>", the median of several passes, each timed from the common start to the
// last thread's end (the aggregate rate over the threads, shared out among them).
//   membw_bench THREADS BYTES [BYTES ...]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A reusable barrier for the passes: every thread waits (yielding its core) until all have
// arrived, so that with more threads than cores none spins on a core another needs.
class Gate {
 public:
  explicit Gate(int threads) : threads_(threads) {}
  void arrive() {
    const int gen = gen_.load();
    if (count_.fetch_add(1) + 1 == threads_) {
      count_.store(0);
      gen_.fetch_add(1);
      return;
    }
    while (gen_.load() == gen) std::this_thread::yield();
  }

 private:
  const int threads_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};

// Runs fn(thread) on `threads` threads at once, `reps` passes; returns the median over passes of
// the per-thread bytes per second for `bytes` moved per call of fn. A pass lasts from the moment all
// threads are released together to the moment the last one finishes, so with more threads than
// cores (4 ranks on 2 cores) the rate is what each thread gets while all of them run, not what one
// gets in the time slices it has the core to itself.
template <typename Fn>
double perThread(int threads, size_t bytes, int reps, Fn fn) {
  // Small buffers: several calls per pass, so that a pass (about 16 MiB per thread) outlasts
  // the release and the gathering of the threads.
  const int calls = static_cast<int>(std::max<size_t>(1, (size_t{16} << 20) / std::max<size_t>(bytes, 1)));
  Gate gate(threads);
  std::vector<double> rates;
  std::chrono::steady_clock::time_point t0;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      fn(t);  // warm: pages touched, caches as they will be
      for (int r = 0; r < reps; ++r) {
        gate.arrive();
        if (t == 0) t0 = std::chrono::steady_clock::now();
        gate.arrive();
        for (int i = 0; i < calls; ++i) fn(t);
        gate.arrive();
        if (t == 0)
          rates.push_back(static_cast<double>(bytes) * calls / seconds(std::chrono::steady_clock::now() - t0));
      }
    });
  for (auto& t : ts) t.join();
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
    const int reps = bytes >= (16u << 20) ? 5 : 9;
    // Buffers placed on purpose: glibc's memcpy crawls when the destination lies 1 to 63 bytes
    // past the source modulo 4096 (docs/performance.md, "Why the defaults"), which malloc's placement can
    // hit, and a[i] += b[i] stalls on 4K aliasing when it lies exactly a multiple of 4096 past:
    // the destination starts kDstOffset floats (256 bytes) into a page, the source at a page.
    constexpr size_t kDstOffset = 64;
    const size_t alloc = (bytes + kDstOffset * sizeof(float) + 4095) / 4096 * 4096;
    std::vector<std::unique_ptr<float, decltype(&std::free)>> src, dst;
    for (int t = 0; t < threads; ++t) {
      src.emplace_back(static_cast<float*>(std::aligned_alloc(4096, alloc)), &std::free);
      dst.emplace_back(static_cast<float*>(std::aligned_alloc(4096, alloc)), &std::free);
      std::fill(src.back().get(), src.back().get() + bytes / 4, 1.0f);
      std::fill(dst.back().get() + kDstOffset, dst.back().get() + kDstOffset + bytes / 4, 2.0f);
    }
    const double copy = perThread(threads, bytes, reps, [&](int t) {
      std::memcpy(dst[static_cast<size_t>(t)].get() + kDstOffset, src[static_cast<size_t>(t)].get(), bytes);
    });
    const double sum = perThread(threads, bytes, reps, [&](int t) {
      float* d = dst[static_cast<size_t>(t)].get() + kDstOffset;
      const float* s = src[static_cast<size_t>(t)].get();
      for (size_t i = 0; i < bytes / 4; ++i) d[i] += s[i];
    });
    std::printf("membw %d %zu %.4f %.4f\n", threads, bytes, copy, sum);
    std::fflush(stdout);
  }
  return 0;
}
