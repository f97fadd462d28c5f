// Recursive-doubling all-reduce: log2(n) exchanges of the whole buffer with partners at distance
// 1, 2, 4, ...; non-powers of two fold the extra ranks in first and hand them the result last
// (planRecursiveDoubling). Latency-bound sizes: fewest steps, the whole buffer on every step.
#include "collectives/context.hpp"
#include "collectives/reduce_on_arrival.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {

void allReduceRecursiveDoubling(Context& c, const Args& a) {
  const int r = c.rank();
  const size_t bytesTotal = a.count * a.elem;
  uint8_t* out = bytes(a.recv);
  // This rank's running value: its input until the first combination writes it to `out` (no
  // separate copy of the input on the way).
  const uint8_t* cur = cbytes(a.send);
  uint8_t* tmp = c.scratch(bytesTotal, 0);
  DoublingPlan plan = planRecursiveDoubling(r, c.size());
  // Operands go in rank order (lower rank's data first) so that both partners compute the same bits.
  auto combine = [&](int partner) {
    if (partner < r)
      kernels::reduce(out, tmp, cur, a.count, a.type, a.op);
    else
      kernels::reduce(out, cur, tmp, a.count, a.type, a.op);
    cur = out;
  };
  if (plan.foldTo >= 0) {
    // 1'. Sit out: hand the data to the odd neighbour, take the result back at the end.
    c.wait(c.send(plan.foldTo, cur, bytesTotal));
    c.wait(c.recv(plan.foldTo, out, bytesTotal));
    return;
  }
  // A receive that combines its data as it lands (ReduceOnArrival), where nothing reads `out`
  // meanwhile: the fold, and an exchange that sends from the input while out is another buffer.
  auto combining = [&](int partner) {
    return c.recv(partner, tmp, bytesTotal, 0, ReduceOnArrival::make(out, cur, a.type, a.op, a.elem, partner < r));
  };
  if (plan.foldFrom >= 0) {
    // 1. Take the even neighbour's data.
    c.wait(combining(plan.foldFrom));
    cur = out;
  }
  // 2. Exchange with a partner at distance 1, 2, 4, ...
  for (int partner : plan.partners) {
    const bool onArrival = cur != out;
    auto rq = onArrival ? combining(partner) : c.recv(partner, tmp, bytesTotal);
    auto sq = c.send(partner, cur, bytesTotal);
    c.wait(sq);
    c.wait(rq);
    if (onArrival)
      cur = out;
    else
      combine(partner);
  }
  copyIfDistinct(out, cur, bytesTotal);  // one rank alone: nothing was combined
  if (a.op == ReduceOp::Avg) kernels::divide(out, a.count, a.type, c.size());
  // 3. Hand the result back to the neighbour that sat out.
  if (plan.foldFrom >= 0) c.wait(c.send(plan.foldFrom, out, bytesTotal));
}

}  // namespace coll
}  // namespace loom
