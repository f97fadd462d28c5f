// The dissemination barrier (Hensgen, Finkel and Manber): in round k every rank tells the rank 2^k
// ahead and hears from the rank 2^k behind, so that after ceil(log2 n) rounds each has heard, at one
// remove or more, from every other. Messages of no bytes carry the call's signature: a rank in
// another call fails the barrier at once.
#include "collectives/context.hpp"

namespace loom {
namespace coll {

void barrierDissemination(Context& c, const Args&) {
  uint8_t token = 0, sink = 0;
  for (const auto& round : planDisseminationBarrier(c.rank(), c.size())) {
    RequestPtr in = c.recv(round.from, &sink, 0);
    c.wait(c.send(round.to, &token, 0));
    c.wait(in);
  }
}

}  // namespace coll
}  // namespace loom
