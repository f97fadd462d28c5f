// Pure planning functions of the collective algorithms: index arithmetic only, no I/O, so that
// unit tests check them for every rank and world size without a network.
#pragma once

#include <vector>

namespace loom {

/// One round of the dissemination barrier: send to `to`, receive from `from`.
struct BarrierRound {
  int to;
  int from;
};

/// Dissemination barrier (Hensgen, Finkel and Manber): ceil(log2(size)) rounds; in round k rank r
/// signals r + 2^k and waits for r - 2^k (mod size). Every rank has heard, directly or through
/// others, from every rank once all rounds are done. Empty for size 1.
std::vector<BarrierRound> planDisseminationBarrier(int rank, int size);

}  // namespace loom
