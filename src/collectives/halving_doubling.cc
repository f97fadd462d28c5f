// Halving-doubling all-reduce (Rabenseifner): a reduce-scatter by recursive halving, then an
// all-gather by recursive doubling, among a power of two of ranks (non-powers of two fold the
// extra ranks in first and hand them the result last, as recursive doubling does). Each rank
// sends and receives 2(p-1)/p of the buffer, as in the ring, but in 2 log2(p) steps instead of
// 2(p-1): the medium sizes, where the ring's steps cost more than its bandwidth saves.
//
// Steps overlap: within a step, chunks are reduced as they land; the part of a step's result that
// the next step sends is reduced first and leaves at once; the all-gather sends what it already
// holds at once and forwards the rest chunk by chunk as it arrives (planHalvingDoubling).
#include "collectives/context.hpp"
#include "collectives/reduce_on_arrival.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {

void allReduceHalvingDoubling(Context& c, const Args& a) {
  const size_t E = a.elem, S = a.count * E;
  uint8_t* out = bytes(a.recv);
  const HalvingPlan plan = planHalvingDoubling(c.rank(), c.size(), a.count, c.treeChunkElems(E));
  const std::vector<Segment> whole = planChunks(Segment{0, a.count}, c.treeChunkElems(E));
  std::vector<RequestPtr> sends, recvs;
  if (plan.foldTo >= 0) {
    // 1'. Sit out: hand the data to the odd neighbour, take the result back at the end.
    for (const auto& ch : whole) recvs.push_back(c.recv(plan.foldTo, out + ch.offset * E, ch.count * E));
    for (const auto& ch : whole) sends.push_back(c.send(plan.foldTo, cbytes(a.send) + ch.offset * E, ch.count * E));
    c.waitAll(sends);
    c.waitAll(recvs);
    return;
  }
  // This rank's running value: its input until the first reduction writes `out`.
  const uint8_t* cur = cbytes(a.send);
  if (plan.foldFrom >= 0) {
    // 1. Take the even neighbour's data, reduced into out as it lands (ReduceOnArrival).
    uint8_t* folded = c.scratch(S, 2);
    for (const auto& ch : whole)
      recvs.push_back(c.recv(plan.foldFrom, folded + ch.offset * E, ch.count * E, 0,
                             ReduceOnArrival::make(out + ch.offset * E, cur + ch.offset * E, a.type, a.op, E)));
    c.waitAll(recvs);
    cur = out;
  }
  const auto& steps = plan.steps;
  const size_t K = steps.size();
  // 2. Reduce-scatter by recursive halving. Staging holds one step's incoming half; two slots, so
  // that the next step's receives are posted before this step's reductions. The first step's
  // chunks are reduced as they land (ReduceOnArrival: its local operand is final from the start);
  // a later step's local operand is still being reduced when its receives are posted.
  const size_t stagingBytes = K > 0 ? steps[0].keep.count * E : 0;
  uint8_t* staging[2] = {c.scratch(stagingBytes, 0), c.scratch(stagingBytes, 1)};
  std::vector<RequestPtr> rs[2];
  auto postRecvs = [&](size_t k) {
    for (const auto& ch : steps[k].rsRecv) {
      uint8_t* land = staging[k % 2] + (ch.offset - steps[k].keep.offset) * E;
      rs[k % 2].push_back(k == 0
                              ? c.recv(steps[k].partner, land, ch.count * E, 0,
                                       ReduceOnArrival::make(out + ch.offset * E, cur + ch.offset * E, a.type, a.op, E))
                              : c.recv(steps[k].partner, land, ch.count * E));
    }
  };
  auto postSends = [&](size_t k, const uint8_t* from) {
    for (const auto& ch : steps[k].rsSend)
      sends.push_back(c.send(steps[k].partner, from + ch.offset * E, ch.count * E));
  };
  if (K > 0) {
    postRecvs(0);
    postSends(0, cur);
  }
  for (size_t k = 0; k < K; ++k) {
    if (k + 1 < K) postRecvs(k + 1);
    const HalvingStep& s = steps[k];
    for (size_t j = 0; j < s.rsRecv.size(); ++j) {
      const Segment& ch = s.rsRecv[j];
      c.wait(rs[k % 2][j]);
      if (k > 0)
        kernels::reduce(out + ch.offset * E, cur + ch.offset * E, staging[k % 2] + (ch.offset - s.keep.offset) * E,
                        ch.count, a.type, a.op);
      if (k + 1 < K && j + 1 == s.rsEarly) postSends(k + 1, out);
    }
    rs[k % 2].clear();
    cur = out;
  }
  copyIfDistinct(out, cur, S);  // no step (one rank): nothing was reduced
  // Avg scales the owned range once, before anyone copies it.
  if (a.op == ReduceOp::Avg) kernels::divide(out + plan.owned.offset * E, plan.owned.count, a.type, c.size());
  // 3. All-gather by recursive doubling, the steps backwards; every receive lands in its place.
  std::vector<std::vector<RequestPtr>> ag(K);
  for (size_t k = 0; k < K; ++k)
    for (const auto& ch : steps[k].agRecv) ag[k].push_back(c.recv(steps[k].partner, out + ch.offset * E, ch.count * E));
  for (size_t k = K; k-- > 0;) {
    const HalvingStep& s = steps[k];
    for (size_t j = 0; j < s.agEarly; ++j)
      sends.push_back(c.send(s.partner, out + s.agSend[j].offset * E, s.agSend[j].count * E));
    if (k + 1 == K) continue;
    // What the later step brings in goes straight on, in the order it lands.
    for (size_t j = s.agEarly; j < s.agSend.size(); ++j) {
      c.wait(ag[k + 1][j - s.agEarly]);
      sends.push_back(c.send(s.partner, out + s.agSend[j].offset * E, s.agSend[j].count * E));
    }
  }
  if (K > 0) c.waitAll(ag[0]);
  // 4. Hand the result back to the neighbour that sat out.
  if (plan.foldFrom >= 0)
    for (const auto& ch : whole) sends.push_back(c.send(plan.foldFrom, out + ch.offset * E, ch.count * E));
  c.waitAll(sends);
}

}  // namespace coll
}  // namespace loom
