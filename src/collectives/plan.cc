#include "collectives/plan.hpp"

namespace loom {

std::vector<BarrierRound> planDisseminationBarrier(int rank, int size) {
  std::vector<BarrierRound> rounds;
  for (int dist = 1; dist < size; dist *= 2) {
    rounds.push_back({(rank + dist) % size, (rank - dist % size + size) % size});
  }
  return rounds;
}

}  // namespace loom
