// The program the multi-node tests start on every "node" of a virtual cluster (tools/vcluster run,
// which sets VCLUSTER_NODE). Ranks join from loomrun's environment. Exits 0 when every check
// passed, 1 otherwise, printing what failed ("FAIL rank R: ...").
//
//   net_worker matrix [COUNT...]     every collective x type x op x placement x root at each count
//                                    (default 0 1 2 7 1021 and world size - 1), as LOOM_ALGO says
//   net_worker large                 a few collectives at (2^20 + 3) elements
//   net_worker links                 each pair's transport: shared memory within a node, TCP
//                                    between nodes, never the other way; prints rank 0's links
//   net_worker algo COLL BYTES NAME  the algorithm chosen for COLL of BYTES is NAME on every rank
//   net_worker loop                  all-reduces until one fails (prints "looping", then the error
//                                    and how long after the last success it came)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/collective_check.hpp"
#include "loom/loom.hpp"

namespace {

int failures = 0;

void fail(int rank, const std::string& what) {
  if (++failures <= 20) std::fprintf(stderr, "FAIL rank %d: %s\n", rank, what.c_str());
}

int vnode() {
  const char* v = std::getenv("VCLUSTER_NODE");
  return v != nullptr ? std::atoi(v) : -1;
}

void checkLinks(loom::Communicator& c) {
  const int n = c.size(), me = c.rank();
  int32_t mine = vnode();
  std::vector<int32_t> nodes(static_cast<size_t>(n));
  c.allGather(&mine, nodes.data(), 1, loom::DataType::Int32);
  const char* forced = std::getenv("LOOM_TRANSPORT");
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const bool together = nodes[static_cast<size_t>(p)] == mine;
    if ((c.nodeOf(p) == c.nodeOf(me)) != together)
      fail(me, "rank " + std::to_string(p) +
                   (together ? " shares this virtual node but Loom puts it on node "
                             : " is on another virtual node but Loom puts it on node ") +
                   std::to_string(c.nodeOf(p)));
    const std::string want = forced != nullptr ? forced : (together ? "shm" : "tcp");
    if (c.transportOf(p) != want)
      fail(me, "rank " + std::to_string(p) + " is linked by " + c.transportOf(p) + ", expected " + want + " (" +
                   c.describeLink(p) + ")");
  }
  if (me == 0) {
    std::printf("nodes %d\n", c.nodeCount());
    for (int p = 1; p < n; ++p) std::printf("link %s\n", c.describeLink(p).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "matrix";
  try {
    loom::Communicator c = loom::Communicator::fromEnv();
    const int me = c.rank(), n = c.size();
    auto report = [&](const std::string& what) { fail(me, what); };
    if (mode == "matrix") {
      std::vector<size_t> counts;
      for (int a = 2; a < argc; ++a) counts.push_back(std::strtoull(argv[a], nullptr, 10));
      if (counts.empty()) counts = {0, 1, 2, 7, 1021, static_cast<size_t>(n - 1)};
      size_t cases = loomtest::runMatrix(c, counts, report);
      if (me == 0) std::printf("matrix: %zu cases on %d ranks, %d node(s)\n", cases, n, c.nodeCount());
    } else if (mode == "large") {
      const size_t big = (1u << 20) + 3, perRank = (1u << 18) + 3;
      for (const char* coll : loomtest::kColls)
        for (auto [t, op] : {std::pair{loom::DataType::Float32, loom::ReduceOp::Sum},
                             std::pair{loom::DataType::Bfloat16, loom::ReduceOp::Avg}}) {
          const std::string name = coll;
          const bool blocks = name == "all_gather" || name == "all_to_all" || name == "reduce_scatter" ||
                              name == "gather" || name == "scatter";
          loomtest::runCase(c, coll, loomtest::Case{t, op, blocks ? perRank : big, false, n - 1}, report);
        }
      if (me == 0) std::printf("large: done on %d ranks\n", n);
    } else if (mode == "loop") {
      std::vector<float> v(1 << 18, 1.0f);
      auto last = std::chrono::steady_clock::now();
      for (long i = 0;; ++i) {
        if (i == 3) {
          std::printf("rank %d looping\n", me);
          std::fflush(stdout);
        }
        try {
          c.allReduce(v.data(), v.data(), v.size(), loom::DataType::Float32, loom::ReduceOp::Max);
          last = std::chrono::steady_clock::now();
        } catch (const loom::Error& e) {
          const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
          std::printf("rank %d failed %.1f s after its last all-reduce: %s\n", me, after, e.what());
          return 1;
        }
      }
    } else if (mode == "links") {
      checkLinks(c);
    } else if (mode == "algo" && argc == 5) {
      const std::string got = c.algorithmFor(argv[2], std::strtoull(argv[3], nullptr, 10));
      if (got != argv[4]) fail(me, std::string(argv[2]) + " of " + argv[3] + " bytes runs " + got + ", not " + argv[4]);
      if (me == 0) std::printf("algo: %s of %s bytes runs %s\n", argv[2], argv[3], got.c_str());
    } else {
      std::fprintf(stderr, "net_worker: unknown mode %s\n", mode.c_str());
      return 2;
    }
    // Everyone's verdict, so that a failure anywhere fails every rank's exit status.
    double bad = failures;
    c.allReduce(&bad, &bad, 1, loom::DataType::Float64, loom::ReduceOp::Sum);
    c.barrier();
    if (me == 0) std::printf("net_worker %s: %s\n", mode.c_str(), bad == 0 ? "OK" : "FAILED");
    return bad == 0 ? 0 : 1;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
}
