// ddp_overlap: how much of the gradient all-reduce GradSync hides behind the backward pass.
//
//   loomrun -n 4 build/bench/ddp_overlap [--params 100M] [--layers 50] [--compute-ms LAYER_MS|auto]
//                                        [--steps 5] [--bucket-mb 25] [--view] [--busy]
//
// A synthetic model of --params float32 parameters in --layers equal layers. Its "backward pass"
// visits the layers from the last to the first and spends --compute-ms on each: asleep by default,
// as the CPU is while a GPU computes, or spinning with --busy. `auto` makes the whole backward as
// long as the communication alone, where overlap matters most. Four step times are measured, each
// the median of --steps steps started together (a barrier):
//   backward alone         the compute, no communication
//   communication alone    every gradient marked at once, then synchronize()
//   sync after backward    the compute, then every gradient marked, then synchronize()
//   overlapped             each layer's gradient marked as soon as its compute ends (buckets start
//                          during backward), then synchronize()
// and the ratio overlapped / max(compute, communication), which is 1 when the communication is
// hidden entirely (the target is at most 1.15).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "loom/ddp.hpp"
#include "loom/loom.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  size_t params = 100u * 1000 * 1000;
  size_t layers = 50;
  double computeMs = -1;  // per layer; < 0: auto
  int steps = 5;
  size_t bucketMb = 25;
  bool view = false, busy = false;
};

size_t parseCount(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1e3;
  if (*end == 'M' || *end == 'm') v *= 1e6;
  if (*end == 'G' || *end == 'g') v *= 1e9;
  return static_cast<size_t>(v);
}

void compute(double ms, bool busy) {
  if (ms <= 0) return;
  const auto until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
  if (!busy) {
    std::this_thread::sleep_until(until);
    return;
  }
  while (Clock::now() < until) {
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--params") {
      s.params = parseCount(v), ++i;
    } else if (a == "--layers") {
      s.layers = std::max<size_t>(1, parseCount(v)), ++i;
    } else if (a == "--compute-ms") {
      s.computeMs = std::string(v) == "auto" ? -1 : std::atof(v), ++i;
    } else if (a == "--steps") {
      s.steps = std::max(1, std::atoi(v)), ++i;
    } else if (a == "--bucket-mb") {
      s.bucketMb = std::max<size_t>(1, parseCount(v)), ++i;
    } else if (a == "--view") {
      s.view = true;
    } else if (a == "--busy") {
      s.busy = true;
    } else {
      std::fprintf(stderr,
                   "usage: ddp_overlap [--params N] [--layers N] [--compute-ms MS|auto] [--steps N] [--bucket-mb MB] "
                   "[--view] [--busy]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  try {
    loom::Communicator comm = loom::Communicator::fromEnv();
    const bool root = comm.rank() == 0;
    const size_t perLayer = std::max<size_t>(1, s.params / s.layers);
    std::vector<std::vector<float>> weights(s.layers), grads(s.layers);
    std::vector<loom::ddp::Parameter> params;
    for (size_t l = 0; l < s.layers; ++l) {
      weights[l].assign(perLayer, 0.0f);
      grads[l].assign(perLayer, 1.0f);
      params.push_back({weights[l].data(), grads[l].data(), perLayer, loom::DataType::Float32, ""});
    }
    loom::ddp::GradSyncOptions o;
    o.bucketCapBytes = s.bucketMb << 20;
    o.gradientAsBucketView = s.view;
    loom::ddp::GradSync sync(comm, params, o);
    if (s.view)
      for (size_t l = 0; l < s.layers; ++l) std::fill_n(static_cast<float*>(sync.gradient(l)), perLayer, 1.0f);

    // One step of a mode; returns its milliseconds (the slowest rank's: ranks start together
    // and each step ends with synchronize(), which no rank passes before the last bucket).
    enum Mode { BackwardOnly, CommOnly, SyncAfter, Overlapped };
    auto step = [&](Mode mode, double computeMs) {
      comm.barrier();
      const auto t0 = Clock::now();
      if (mode != CommOnly) {
        for (size_t l = s.layers; l-- > 0;) {
          compute(computeMs, s.busy);
          if (mode == Overlapped) sync.markReady(l);
        }
      }
      if (mode != BackwardOnly) {
        if (mode != Overlapped)
          for (size_t l = s.layers; l-- > 0;) sync.markReady(l);
        sync.synchronize();
      }
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      comm.allReduce(&ms, &ms, 1, loom::DataType::Float64, loom::ReduceOp::Max);
      return ms;
    };
    auto measure = [&](Mode mode, double computeMs) {
      step(mode, computeMs);  // warm: buffers touched, connections at speed
      std::vector<double> t;
      for (int k = 0; k < s.steps; ++k) t.push_back(step(mode, computeMs));
      return median(t);
    };

    const double comm1 = measure(CommOnly, 0);
    const double perLayerMs = s.computeMs >= 0 ? s.computeMs : comm1 / static_cast<double>(s.layers);
    const double backward = measure(BackwardOnly, perLayerMs);
    const double after = measure(SyncAfter, perLayerMs);
    const double overlapped = measure(Overlapped, perLayerMs);
    if (root) {
      std::printf(
          "# ddp_overlap: %d ranks, %.1f M float32 parameters in %zu layers (%.0f MB), %zu buckets (%zu MiB cap, 1 "
          "MiB first)%s\n",
          comm.size(), static_cast<double>(perLayer * s.layers) / 1e6, s.layers,
          static_cast<double>(perLayer * s.layers * 4) / 1e6, sync.buckets().size(), s.bucketMb,
          s.view ? ", gradients as bucket views" : "");
      std::printf("# backward: %.2f ms per layer (%s)%s; median of %d steps\n", perLayerMs,
                  s.busy ? "spinning" : "asleep, as the CPU is while a GPU computes",
                  s.computeMs < 0 ? ", auto: the backward as long as the communication" : "", s.steps);
      std::printf("%-24s %10s\n", "# mode", "step ms");
      std::printf("%-24s %10.1f\n", "backward alone", backward);
      std::printf("%-24s %10.1f\n", "communication alone", comm1);
      std::printf("%-24s %10.1f\n", "sync after backward", after);
      std::printf("%-24s %10.1f\n", "overlapped", overlapped);
      const double ideal = std::max(backward, comm1);
      std::printf(
          "overlapped / max(compute, communication) = %.3f (target <= 1.15); hidden: %.0f%% of the "
          "communication\n",
          overlapped / ideal, 100.0 * std::clamp((after - overlapped) / std::max(comm1, 1e-9), 0.0, 1.0));
    }
    return 0;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
