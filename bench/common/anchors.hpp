// Anchors measured in the same run as a benchmark, to compare Loom against what the machine
// itself can do: single-thread memcpy, and raw TCP sockets shaped like a ring (each rank streams
// to rank+1 while receiving from rank-1, plain blocking sockets on the interface Loom uses, a
// thread per direction, no Loom on the data path).
#pragma once

#include <cstddef>

#include "loom/loom.hpp"

namespace loom {
namespace bench {

/// Median GB/s of memcpy of `bytes` on one thread.
double memcpyGBs(size_t bytes);
/// Median GB/s per rank of `reps` ring transfers of `bytes`; every rank of `c` must call it.
double rawRingGBs(Communicator& c, size_t bytes, int reps);

}  // namespace bench
}  // namespace loom
