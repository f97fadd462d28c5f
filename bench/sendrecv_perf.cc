// sendrecv_perf: point-to-point bandwidth and latency, nccl-tests style. Every rank sends to
// rank+1 and receives from rank-1 at once (for 2 ranks: both directions at once). busbw equals
// algbw for send/recv, as in nccl-tests.
//
//   loomrun -n 2 build/bench/sendrecv_perf -b 8 -e 64M -f 2
//
// After the table, the same run measures two anchors for comparison: single-thread memcpy
// bandwidth, and raw TCP sockets shaped like the benchmark (each rank streams to rank+1 while
// receiving from rank-1, plain blocking sockets on the same interface, no Loom in the path).
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/anchors.hpp"
#include "loom/loom.hpp"
#include "transport/interfaces.hpp"
#include "transport/socket.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  size_t minBytes = 8, maxBytes = 64u << 20;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1;
  bool baselines = true;
};

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    default:
      break;
  }
  return static_cast<size_t>(v);
}

Args parseArgs(int argc, char** argv) {
  Args a;
  static option longOpts[] = {{"no-baselines", no_argument, nullptr, 'B'}, {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "b:e:f:n:w:c:h", longOpts, nullptr)) != -1) {
    switch (c) {
      case 'b':
        a.minBytes = parseSize(optarg);
        break;
      case 'e':
        a.maxBytes = parseSize(optarg);
        break;
      case 'f':
        a.factor = std::atof(optarg);
        break;
      case 'n':
        a.iters = std::max(1, std::atoi(optarg));
        break;
      case 'w':
        a.warmup = std::max(0, std::atoi(optarg));
        break;
      case 'c':
        a.check = std::atoi(optarg);
        break;
      case 'B':
        a.baselines = false;
        break;
      default:
        std::printf(
            "usage: sendrecv_perf [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-c 0|1] "
            "[--no-baselines]\n");
        std::exit(c == 'h' ? 0 : 2);
    }
  }
  if (a.factor <= 1.0) a.factor = 2;
  return a;
}

float valueAt(int rank, size_t i) { return static_cast<float>((rank * 7 + i % 1009) % 1024); }

// The maximum of a double over ranks, on rank 0 (collectives land later: p2p does it).
double maxOnRoot(loom::Communicator& c, double v) {
  if (c.rank() != 0) {
    c.send(&v, 1, loom::DataType::Float64, 0, 77);
    return v;
  }
  for (int r = 1; r < c.size(); ++r) {
    double x = 0;
    c.recv(&x, 1, loom::DataType::Float64, r, 77);
    v = std::max(v, x);
  }
  return v;
}

double sumOnRoot(loom::Communicator& c, double v) {
  if (c.rank() != 0) {
    c.send(&v, 1, loom::DataType::Float64, 0, 78);
    return v;
  }
  for (int r = 1; r < c.size(); ++r) {
    double x = 0;
    c.recv(&x, 1, loom::DataType::Float64, r, 78);
    v += x;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parseArgs(argc, argv);
  try {
    loom::Communicator c = loom::Communicator::fromEnv();
    const int n = c.size(), me = c.rank(), to = (me + 1) % n, from = (me + n - 1) % n;
    if (me == 0) {
      std::printf("# Loom sendrecv_perf: %d ranks, each sends to rank+1 and receives from rank-1\n", n);
      std::printf("# minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d validation: %d\n",
                  a.minBytes, a.maxBytes, a.factor, a.warmup, a.iters, a.check);
      std::printf("#\n#%12s %12s %8s %6s %6s %10s %8s %8s %8s\n", "size", "count", "type", "redop", "root", "time",
                  "algbw", "busbw", "#wrong");
      std::printf("#%12s %12s %8s %6s %6s %10s %8s %8s %8s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
                  "(GB/s)", "");
    }
    std::vector<float> sendbuf(a.maxBytes / 4 + 1), recvbuf(a.maxBytes / 4 + 1);
    double busSum = 0, wrongTotal = 0, lastBus = 0, firstTime = 0;
    int rows = 0;
    size_t lastBytes = 0;
    for (size_t bytes = a.minBytes; bytes <= a.maxBytes;
         bytes = std::max(bytes + 4, static_cast<size_t>(static_cast<double>(bytes) * a.factor))) {
      const size_t count = bytes / 4;
      for (size_t i = 0; i < count; ++i) sendbuf[i] = valueAt(me, i);
      auto once = [&] {
        auto r = c.irecv(recvbuf.data(), count, loom::DataType::Float32, from);
        auto s = c.isend(sendbuf.data(), count, loom::DataType::Float32, to);
        s.wait();
        r.wait();
      };
      for (int i = 0; i < a.warmup; ++i) once();
      c.barrier();
      auto t0 = Clock::now();
      for (int i = 0; i < a.iters; ++i) once();
      double sec = std::chrono::duration<double>(Clock::now() - t0).count() / a.iters;
      double wrong = 0;
      if (a.check) {
        std::fill(recvbuf.begin(), recvbuf.begin() + static_cast<long>(count), -1.0f);
        once();
        for (size_t i = 0; i < count; ++i) wrong += recvbuf[i] != valueAt(from, i) ? 1 : 0;
      }
      lastBytes = count * 4;
      sec = maxOnRoot(c, sec);
      wrong = sumOnRoot(c, wrong);
      if (me == 0) {
        double algbw = static_cast<double>(count * 4) / sec / 1e9;
        std::printf(" %12zu %12zu %8s %6s %6s %10.2f %8.2f %8.2f %8.0f\n", count * 4, count, "float", "none", "-1",
                    sec * 1e6, algbw, algbw, wrong);
        std::fflush(stdout);
        busSum += algbw;
        wrongTotal += wrong;
        lastBus = algbw;
        if (rows == 0) firstTime = sec * 1e6;
        ++rows;
      }
    }
    if (me == 0) {
      std::printf("# Out of bounds values : %.0f %s\n", wrongTotal, wrongTotal == 0 ? "OK" : "WRONG");
      std::printf("# Avg bus bandwidth    : %.4f\n#\n", rows > 0 ? busSum / rows : 0.0);
    }
    if (a.baselines && n > 1 && lastBytes > 0) {
      double raw = loom::bench::rawRingGBs(c, lastBytes, 5);
      if (me == 0) {
        double mem = loom::bench::memcpyGBs(lastBytes);
        std::printf("# Anchors measured in this run, at %zu bytes:\n", lastBytes);
        std::printf("#   memcpy, one thread              : %8.2f GB/s\n", mem);
        std::printf("#   raw TCP sockets, same pattern   : %8.2f GB/s per rank\n", raw);
        std::printf("#   Loom send/recv                  : %8.2f GB/s = %.0f%% of raw TCP, %.0f%% of memcpy\n", lastBus,
                    100.0 * lastBus / raw, 100.0 * lastBus / mem);
        std::printf("#   Loom latency at %zu bytes        : %8.2f us (one send and one receive per rank)\n", a.minBytes,
                    firstTime);
      }
    }
    // Barrier latency: the median of 5 batches of 200 barriers.
    std::vector<double> batches;
    for (int b = 0; b < 5; ++b) {
      c.barrier();
      auto t0 = Clock::now();
      for (int i = 0; i < 200; ++i) c.barrier();
      batches.push_back(maxOnRoot(c, std::chrono::duration<double>(Clock::now() - t0).count() / 200));
    }
    std::sort(batches.begin(), batches.end());
    if (me == 0) std::printf("#   barrier latency (%d ranks)        : %8.2f us\n", n, batches[2] * 1e6);
    c.barrier();
    return wrongTotal == 0 ? 0 : 1;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
