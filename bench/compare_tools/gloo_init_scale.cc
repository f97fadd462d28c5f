// Gloo's full mesh as the job grows, for bench/scale: N ranks as threads of this process, each
// with its own TCP device on 127.0.0.1, rendezvous through one in-memory HashStore; the time to
// connect the full mesh (Gloo's init), a first 8-byte all-reduce (ring), and the descriptors per
// rank. Prints the line init_scale prints, "gloo threads N init_ms first_ms - links fds ok", or
// "gloo threads N failed <why>".
//   gloo_init_scale N
#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/descriptors.hpp"

namespace {

using Clock = std::chrono::steady_clock;

int openDescriptors() { return static_cast<int>(loom::openDescriptors()); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::atoi(argv[1]) < 1) {
    std::fprintf(stderr, "usage: %s N\n", argv[0]);
    return 2;
  }
  const int size = std::atoi(argv[1]);
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) == 0 && l.rlim_cur < l.rlim_max) {
    l.rlim_cur = l.rlim_max;
    setrlimit(RLIMIT_NOFILE, &l);
  }
  const int fds0 = openDescriptors();
  gloo::rendezvous::HashStore store;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0, generation = 0, fdsAtInit = 0;
  Clock::time_point released;
  auto barrier = [&] {
    std::unique_lock<std::mutex> lock(mu);
    const int gen = generation;
    if (++arrived == size) {
      if (gen == 0) fdsAtInit = openDescriptors();
      arrived = 0;
      ++generation;
      released = Clock::now();
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
    return released;
  };
  std::vector<double> init(static_cast<size_t>(size)), first(static_cast<size_t>(size));
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  const Clock::time_point t0 = Clock::now();
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      std::shared_ptr<gloo::rendezvous::Context> context;
      try {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        context = std::make_shared<gloo::rendezvous::Context>(r, size);
        context->connectFullMesh(store, dev);
        init[i] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      } catch (const std::exception& e) {
        errors[i] = std::string("init: ") + e.what();
      }
      // Every rank reaches each barrier, failed or not, so that none waits for ever.
      const Clock::time_point t1 = barrier();
      bool ok = true;
      for (const auto& e : errors) ok = ok && e.empty();
      if (ok) {
        try {
          std::vector<float> v{1.0f};
          gloo::AllreduceRing<float> op(context, {v.data()}, 1);
          op.run();
          first[i] = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
          if (v[0] != static_cast<float>(size)) errors[i] = "first all-reduce: wrong sum";
        } catch (const std::exception& e) {
          errors[i] = std::string("first all-reduce: ") + e.what();
        }
      }
      barrier();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r)
    if (!errors[static_cast<size_t>(r)].empty()) {
      std::printf("gloo threads %d failed rank %d: %s\n", size, r, errors[static_cast<size_t>(r)].c_str());
      std::fflush(stdout);
      std::_Exit(0);  // Gloo's threads may still hold pairs that throw when torn down
    }
  std::printf("gloo threads %d %.1f %.2f - %d %.1f ok\n", size, *std::max_element(init.begin(), init.end()),
              *std::max_element(first.begin(), first.end()), size - 1,
              static_cast<double>(std::max(0, fdsAtInit - fds0)) / size);
  std::fflush(stdout);
  std::_Exit(0);
}
