// Gloo's all-reduce (float32 sum) over its TCP transport, for bench/compare. Ranks come from
// RANK/WORLD_SIZE (start it with loomrun); rendezvous through Gloo's FileStore in
// $GLOO_STORE_DIR; the device listens on $GLOO_IFACE (an interface name) when set, else on
// 127.0.0.1. Prints one line per size: "gloo <algo> <ranks> <bytes> <time_us> <busbw>".
//   gloo_allreduce_bench ring_chunked|halving_doubling BYTES ITERS [BYTES ITERS ...]
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

// Set once this rank has all its figures, just before the ranks leave together. Gloo 0.5's TCP pairs throw on their
// event-loop thread when a peer closes its socket, even with nothing pending, and that aborts the process: a rank that
// exits first used to kill a peer still leaving (about one run in five with 2 ranks). After this,
// such an abort is an orderly exit.
std::atomic<bool> finished{false};

[[noreturn]] void onTerminate() {
  if (finished.load()) std::_Exit(0);
  std::abort();
}

}  // namespace

int main(int argc, char** argv) {
  std::set_terminate(onTerminate);
  if (argc < 4 || std::getenv("RANK") == nullptr || std::getenv("GLOO_STORE_DIR") == nullptr) {
    std::fprintf(stderr, "usage: GLOO_STORE_DIR=dir loomrun -n N %s ring_chunked|halving_doubling BYTES ITERS...\n",
                 argv[0]);
    return 2;
  }
  const std::string algo = argv[1];
  const int rank = std::atoi(std::getenv("RANK")), size = std::atoi(std::getenv("WORLD_SIZE"));
  gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("GLOO_IFACE")) {
    attr.iface = iface;
  } else {
    attr.hostname = "127.0.0.1";
  }
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore files(std::getenv("GLOO_STORE_DIR"));
  gloo::rendezvous::PrefixStore store(algo, files);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, dev);
  // Every algorithm object lives to the end: destroying one unregisters buffers a peer may still
  // address (a rank moving on to the next size while the other is finishing this one).
  std::vector<std::vector<float>> buffers;
  std::vector<std::unique_ptr<gloo::Algorithm>> ops;
  for (int a = 2; a + 1 < argc; a += 2) {
    const size_t bytes = std::strtoull(argv[a], nullptr, 10);
    const int iters = std::atoi(argv[a + 1]);
    const int count = static_cast<int>(std::max<size_t>(1, bytes / 4));
    buffers.emplace_back(static_cast<size_t>(count), 1.0f);
    std::vector<float*> ptrs{buffers.back().data()};
    if (algo == "ring_chunked")
      ops.emplace_back(new gloo::AllreduceRingChunked<float>(context, ptrs, count));
    else
      ops.emplace_back(new gloo::AllreduceHalvingDoubling<float>(context, ptrs, count));
    gloo::Algorithm* op = ops.back().get();
    gloo::BarrierAllToAll(context).run();  // every rank has registered this size's buffers
    for (int i = 0; i < std::max(2, iters / 5); ++i) op->run();
    // Line the ranks up with one more all-reduce, then time.
    op->run();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op->run();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    // The slowest rank's time, through Gloo itself.
    buffers.emplace_back(1, static_cast<float>(us));
    std::vector<float*> tp{buffers.back().data()};
    ops.emplace_back(new gloo::AllreduceRingChunked<float>(context, tp, 1, gloo::ReductionFunction<float>::max));
    ops.back()->run();
    const float slowest = buffers.back()[0];
    if (rank == 0) {
      double busbw = static_cast<double>(count) * 4 / (slowest * 1e-6) / 1e9 * 2.0 * (size - 1) / size;
      std::printf("gloo %s %d %zu %.2f %.4f\n", algo.c_str(), size, static_cast<size_t>(count) * 4, slowest, busbw);
      std::fflush(stdout);
    }
  }
  // Leave together: mark this rank done in the file store, wait for every rank's mark (no socket
  // involved), then exit without closing the pairs one by one.
  finished.store(true);
  files.set("exit/" + std::to_string(rank), std::vector<char>{'1'});
  std::vector<std::string> marks;
  for (int r = 0; r < size; ++r) marks.push_back("exit/" + std::to_string(r));
  files.wait(marks);
  std::fflush(nullptr);
  std::_Exit(0);
}
