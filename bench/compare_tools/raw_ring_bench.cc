// The raw TCP ceiling for bench/compare: each rank streams BYTES to rank+1 while receiving BYTES
// from rank-1 over plain sockets (common/anchors.hpp). Prints "raw ring <ranks> <bytes> <GB/s>".
//   loomrun -n N raw_ring_bench BYTES [BYTES ...]
#include <cstdio>
#include <cstdlib>

#include "../common/anchors.hpp"

int main(int argc, char** argv) {
  loom::Communicator c = loom::Communicator::fromEnv();
  for (int a = 1; a < argc; ++a) {
    size_t bytes = std::strtoull(argv[a], nullptr, 10);
    double gbs = loom::bench::rawRingGBs(c, bytes, 5);
    if (c.rank() == 0) std::printf("raw ring %d %zu %.4f\n", c.size(), bytes, gbs);
  }
  c.barrier();
  return 0;
}
