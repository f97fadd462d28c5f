#include "collectives/cost.hpp"

#include <algorithm>
#include <cmath>

#include "collectives/algorithms.hpp"
#include "collectives/context.hpp"
#include "collectives/plan.hpp"
#include "core/param.hpp"

namespace loom {
namespace coll {
namespace {

LOOM_PARAM_INT(directMinParam, "LOOM_SHM_DIRECT_MIN_BYTES", 16 * 1024,
               "all-reduces of this many bytes and more (and the small ones of its one-barrier form), with every "
               "rank on one node, read the peers' data in place (the direct algorithm)");
LOOM_PARAM_INT(reduceParam, "LOOM_REDUCE_MBPS", 10000, "cost model: MB/s of the CPU reduction kernel");

// The terms every formula uses: S bytes, N ranks, a the latency per message (us), b the time per
// byte on a link, g per byte reduced where the reduction cannot overlap the network.
struct Terms {
  double S, N, a, b, g, logn;
  const CostModel& m;
};

Terms termsOf(const Call& c) {
  const CostModel& m = *c.model;
  double logn = 0;
  while ((1 << static_cast<int>(logn)) < c.ranks) logn += 1;
  return Terms{static_cast<double>(c.bytes),
               static_cast<double>(c.ranks),
               m.latencyUs,
               1e-3 / m.gbps,
               1e-3 / m.reduceGbps,
               logn,
               m};
}

// The lowest modelled cost among the flat rows (no node shape) of `k` for `bytes` on `n` ranks.
double flatBestUs(Coll k, size_t bytes, int n, const CostModel& m) {
  const Call call = Call::flat(k, bytes, n, m);
  return chooseRow(call, Mode::Default).cost(call);
}

}  // namespace

size_t directMinBytesFromEnv() {
  // Every world size, two ranks included: once its copies out of the shared areas stepped around
  // memcpy's slow distance (kernels/copy.hpp), the direct algorithm beat the ring's single-copy
  // reads at every size (docs/performance.md, "Why the defaults").
  return static_cast<size_t>(std::max<int64_t>(0, directMinParam()));
}

CostModel costModelFor(const LinkProperties& link) {
  CostModel m;
  m.latencyUs = link.latencyUs;
  m.gbps = link.gbps;
  m.reduceGbps = static_cast<double>(std::max<int64_t>(1, reduceParam())) / 1000.0;
  m.chunkBytes = ringChunkBytesFor(link);
  m.pipeChunkBytes = ringChunkBytes();
  m.treeChunkBytes = treeChunkBytes();
  // Several rings help where the link has several streams in flight (sockets); where one thread
  // drives every link (shared memory), the default is one.
  m.ringChannels = !link.parallelChannels && !ringChannelsSet() ? 1 : maxRingChannels();
  m.channelMinBytes = ringChannelMinBytes();
  return m;
}

double ringUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  // Every step moves one segment per channel; each channel's message pays the per-message
  // latency, and the last chunk's reduction of a reducing step is not hidden by the pipeline.
  const double steps = c.coll == Coll::AllReduce ? 2 * (t.N - 1) : (t.N - 1);
  const double channels = planChannelCount(c.bytes, c.ranks, t.m.ringChannels, t.m.channelMinBytes);
  const double per = t.S / t.N;
  const double reduceSteps = c.coll == Coll::AllGather ? 0 : t.N - 1;
  const double tail = std::min(per / channels, static_cast<double>(t.m.chunkBytes)) * t.g;
  const double extra = c.coll == Coll::Reduce ? channels * t.a + per * t.b : 0;  // gather to the root
  return steps * (channels * t.a + per * t.b) + reduceSteps * tail + extra;
}

double recursiveDoublingUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  // Each step reduces the whole buffer after it has arrived.
  int p = 1;
  while (p * 2 <= c.ranks) p *= 2;
  const double fold = p == c.ranks ? 0 : 2 * (t.a + t.S * t.b) + t.S * t.g;
  double steps = 0;
  while ((1 << static_cast<int>(steps)) < p) steps += 1;
  return steps * (t.a + t.S * t.b + t.S * t.g) + fold;
}

double bruckUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  // ceil(log2 n) messages, each rank receiving the n - 1 blocks once, then one pass over the whole
  // buffer to rotate it into place.
  return t.logn * t.a + (t.N - 1) / t.N * t.S * t.b + t.S * t.g;
}

double halvingDoublingUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  // The ring's bytes in 2 log2(p) steps (each chunk's reduction overlaps the next chunk's arrival
  // but for the last of a step); a non-power of two first moves the whole buffer to and from the
  // ranks that sit out. Below 4 ranks it has no fewer steps than the ring. It streams one
  // connection per step in tree-sized chunks, where the ring streams large chunks over several
  // channels once its segments are large, so its bytes count slower then (docs/performance.md,
  // "Why the defaults").
  if (c.ranks < 4 || !t.m.halvingDoubling) return kNever;
  const bool ringStreams = planChannelCount(c.bytes, c.ranks, t.m.ringChannels, t.m.channelMinBytes) > 1 ||
                           t.S / t.N > static_cast<double>(t.m.chunkBytes);
  const double slowdown = ringStreams ? 1.2 : 1.0;
  int p = 1, steps = 0;
  while (p * 2 <= c.ranks) p *= 2, ++steps;
  const double P = p, chunk = std::min(t.S / 2, static_cast<double>(t.m.treeChunkBytes));
  const double fold = p == c.ranks ? 0 : 2 * (t.a + t.S * t.b) + chunk * t.g;
  return 2 * steps * t.a + slowdown * 2 * (P - 1) / P * t.S * t.b + steps * chunk * t.g + fold;
}

double binomialUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  // Pipelined in chunks down (or up) a tree of depth log2(n); the root's link carries the data
  // once per child, log2(n) times (and a reducing root adds that many passes).
  const double chunks = std::max(1.0, std::ceil(t.S / static_cast<double>(t.m.pipeChunkBytes)));
  return (t.logn + chunks - 1) * t.a + t.logn * t.S * t.b + (c.coll == Coll::Reduce ? t.logn * t.S * t.g : 0);
}

double chainUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  const double chunks = std::max(1.0, std::ceil(t.S / static_cast<double>(t.m.pipeChunkBytes)));
  const double chunk = t.S / chunks;
  return (t.N - 2 + chunks) * (t.a + chunk * t.b);
}

double pairwiseUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  return (t.N - 1) * (t.a + t.S / t.N * t.b);
}

double linearUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  // The root's link carries every other rank's block; the messages are all in flight at once.
  return (t.N - 1) * (t.a + t.S / t.N * t.b);
}

double disseminationUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  return t.logn * t.a;  // one message of no bytes per round, sent and received at once
}

double doubleTreeUs(const Call& c) {
  if (c.ranks == 1) return 0;
  const Terms t = termsOf(c);
  // Up and down trees of depth log2(n), pipelined in chunks: filling the pipeline costs 2 log2(n)
  // chunk steps; then the busiest rank (interior in one tree, a leaf in the other) sends and
  // receives 2S in all, and pays the per-message latency once per chunk.
  const double chunks = std::max(1.0, std::ceil(t.S / 2 / static_cast<double>(t.m.treeChunkBytes)));
  const double chunk = t.S / 2 / chunks;
  return 2 * t.logn * (t.a + chunk * t.b) + 2 * t.S * t.b + chunks * t.a + t.S / 2 * t.g;
}

double hierarchicalUs(const Call& c) {
  const NodeShape& s = *c.shape;
  const CostModel& across = *c.model;
  const int L = s.maxLocal, N = s.nodes;
  const size_t bytes = c.bytes;
  switch (c.coll) {
    case Coll::AllReduce: {
      const double leaders = flatBestUs(Coll::Reduce, bytes, L, s.intra) +
                             flatBestUs(Coll::AllReduce, bytes, N, across) +
                             flatBestUs(Coll::Broadcast, bytes, L, s.intra);
      // The 2D form (nodes of equal size): a ring within the node around L all-reduces of a slice
      // across nodes, at once (hierarchical.cc).
      if (!s.evenNodes || L < 2 || bytes < static_cast<size_t>(L) * 64 * 1024) return leaders;
      Call ring = c;
      ring.ranks = L;
      ring.model = &s.intra;
      ring.shape = nullptr;
      const double twoD = ringUs(ring) + flatBestUs(Coll::AllReduce, bytes / static_cast<size_t>(L), N, across);
      return std::min(leaders, twoD);
    }
    case Coll::Broadcast:
      return flatBestUs(Coll::Broadcast, bytes, N, across) + flatBestUs(Coll::Broadcast, bytes, L, s.intra);
    case Coll::Reduce:
      return flatBestUs(Coll::Reduce, bytes, L, s.intra) + flatBestUs(Coll::Reduce, bytes, N, across);
    default:
      return kNever;
  }
}

double directAllReduceUs(const Call& c) {
  // Reading the peers' staged data in place beats messages through the same memory: from
  // LOOM_SHM_DIRECT_MIN_BYTES up, and in its one-barrier form for small buffers; between the two,
  // messages over the node's links are faster than its barrier.
  const NodeShape& s = *c.shape;
  return c.bytes <= s.directSmallMaxBytes || c.bytes >= s.directMinBytes ? kAlways : kNever;
}

double directSpreadUs(const Call& c) {
  // Broadcast and all-gather on one node: the direct forms (one barrier for small buffers, per
  // rank's block for all-gather, then chunks staged in the shared areas), but for large ones with
  // two ranks: there the chain and the pairwise all-gather read the root's or the peer's buffer in
  // one copy (process_vm_readv) while the other rank works in parallel, where the direct forms
  // stage each chunk and copy it out in turn. From three ranks the readers all take a staged chunk
  // at once, and the direct forms win at every size (docs/performance.md, "Why the defaults").
  return c.ranks >= 3 || c.bytes <= kDirectPairMaxBytes ? kAlways : kNever;
}

double directBarrierUs(const Call&) {
  // Every rank steps the arena's counters: no link, no message, where every rank shares it.
  return kAlways;
}

double pairwiseOnOneNodeUs(const Call& c) {
  // Two ranks of one node, large all-gathers (directSpreadUs): each reads the other's block in one
  // copy. Elsewhere the ring or Bruck's forward fewer messages; LOOM_ALGO may still take it.
  return c.shape != nullptr && c.shape->direct ? kAlways : kNever;
}

double canonicalDirectUs(const Call& c) {
  // Where the default mode reads in place on one node (from LOOM_SHM_DIRECT_MIN_BYTES up), so does
  // the canonical all-reduce, reducing along the canonical tree.
  return c.defaultAlgo == Algo::Direct ? kAlways : kNever;
}

double canonicalDoublingUs(const Call& c) {
  // The latency-bound sizes, where the default mode's model picks recursive doubling.
  return c.defaultAlgo == Algo::RecursiveDoubling ? kAlways : kNever;
}

double canonicalUs(const Call&) { return 0; }

}  // namespace coll
}  // namespace loom
