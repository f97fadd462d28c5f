#include "collectives/select.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "collectives/context.hpp"
#include "collectives/plan.hpp"
#include "core/param.hpp"

namespace loom {
namespace coll {
namespace {

LOOM_PARAM_STR(algoParam, "LOOM_ALGO", "",
               "force algorithms: ring, rd, hd, dbtree, tree, chain, pairwise, hier (node-aware), direct (one node "
               "only), or per collective, e.g. allreduce:rd,broadcast:chain (default: the cost model's choice; "
               "loom-info --algos prints it)");
LOOM_PARAM_INT(directMinParam, "LOOM_SHM_DIRECT_MIN_BYTES", 16 * 1024,
               "all-reduces of this many bytes and more (and the small ones of its one-barrier form), with every "
               "rank on one node, read the peers' data in place (the direct algorithm)");
LOOM_PARAM_INT(reduceParam, "LOOM_REDUCE_MBPS", 10000, "cost model: MB/s of the CPU reduction kernel");

std::vector<Algo> candidates(Coll c) {
  switch (c) {
    case Coll::AllReduce:
      return {Algo::Ring,       Algo::RecursiveDoubling, Algo::HalvingDoubling,
              Algo::DoubleTree, Algo::Hierarchical,      Algo::Direct};
    case Coll::Broadcast:
      return {Algo::Chain, Algo::Binomial, Algo::Hierarchical, Algo::Direct};
    case Coll::Reduce:
      return {Algo::Ring, Algo::Binomial, Algo::Hierarchical};
    case Coll::AllGather:
      return {Algo::Ring, Algo::RecursiveDoubling, Algo::Direct, Algo::Pairwise};
    case Coll::ReduceScatter:
      return {Algo::Ring};
    case Coll::AllToAll:
      return {Algo::Pairwise};
  }
  return {Algo::Ring};
}

const char* overrideKey(Coll c) {
  switch (c) {
    case Coll::AllReduce:
      return "allreduce";
    case Coll::Broadcast:
      return "broadcast";
    case Coll::Reduce:
      return "reduce";
    case Coll::AllGather:
      return "allgather";
    case Coll::ReduceScatter:
      return "reducescatter";
    case Coll::AllToAll:
      return "alltoall";
  }
  return "";
}

bool parseAlgo(const std::string& s, Algo* out) {
  for (Algo a : {Algo::Ring, Algo::RecursiveDoubling, Algo::Binomial, Algo::Chain, Algo::Pairwise, Algo::DoubleTree,
                 Algo::Hierarchical, Algo::Direct, Algo::HalvingDoubling}) {
    if (s == algoName(a)) {
      *out = a;
      return true;
    }
  }
  if (s == "recursive_doubling") return *out = Algo::RecursiveDoubling, true;
  if (s == "binomial") return *out = Algo::Binomial, true;
  if (s == "halving_doubling") return *out = Algo::HalvingDoubling, true;
  if (s == "hierarchical") return *out = Algo::Hierarchical, true;
  return false;
}

}  // namespace

const char* collName(Coll c) {
  switch (c) {
    case Coll::AllReduce:
      return "all_reduce";
    case Coll::Broadcast:
      return "broadcast";
    case Coll::Reduce:
      return "reduce";
    case Coll::AllGather:
      return "all_gather";
    case Coll::ReduceScatter:
      return "reduce_scatter";
    case Coll::AllToAll:
      return "all_to_all";
  }
  return "?";
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::Ring:
      return "ring";
    case Algo::RecursiveDoubling:
      return "rd";
    case Algo::Binomial:
      return "tree";
    case Algo::Chain:
      return "chain";
    case Algo::Pairwise:
      return "pairwise";
    case Algo::DoubleTree:
      return "dbtree";
    case Algo::Hierarchical:
      return "hier";
    case Algo::Direct:
      return "direct";
    case Algo::HalvingDoubling:
      return "hd";
  }
  return "?";
}

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

double modelUs(Coll c, Algo a, size_t bytes, int n, const CostModel& m) {
  const double S = static_cast<double>(bytes), N = n;
  const double a_ = m.latencyUs, b = 1e-3 / m.gbps;  // b: us per byte
  const double g = 1e-3 / m.reduceGbps;              // us per byte reduced, not overlapped
  double logn = 0;
  while ((1 << static_cast<int>(logn)) < n) logn += 1;
  if (n == 1) return 0;
  switch (a) {
    case Algo::Hierarchical:
    case Algo::Direct:
      return 1e300;  // modelled by Selector, which knows the nodes
    case Algo::Ring: {
      // Every step moves one segment per channel; each channel's message pays the per-message
      // latency, and the last chunk's reduction of a reducing step is not hidden by the pipeline.
      double steps = c == Coll::AllReduce ? 2 * (N - 1) : (N - 1);
      double channels = planChannelCount(bytes, n, m.ringChannels, m.channelMinBytes);
      double per = S / N;
      double reduceSteps = c == Coll::AllGather ? 0 : N - 1;
      double tail = std::min(per / channels, static_cast<double>(m.chunkBytes)) * g;
      double extra = c == Coll::Reduce ? channels * a_ + per * b : 0;  // gather to the root
      return steps * (channels * a_ + per * b) + reduceSteps * tail + extra;
    }
    case Algo::RecursiveDoubling: {
      if (c == Coll::AllGather) {
        // Bruck's: ceil(log2 n) messages, each rank receiving the n - 1 blocks once, then one
        // pass over the whole buffer to rotate it into place.
        return logn * a_ + (N - 1) / N * S * b + S * g;
      }
      // Each step reduces the whole buffer after it has arrived.
      int p = 1;
      while (p * 2 <= n) p *= 2;
      double fold = p == n ? 0 : 2 * (a_ + S * b) + S * g;
      double steps = 0;
      while ((1 << static_cast<int>(steps)) < p) steps += 1;
      return steps * (a_ + S * b + S * g) + fold;
    }
    case Algo::HalvingDoubling: {
      // The ring's bytes in 2 log2(p) steps (each chunk's reduction overlaps the next chunk's
      // arrival but for the last of a step); a non-power of two first moves the whole buffer to
      // and from the ranks that sit out. Below 4 ranks it has no fewer steps than the ring.
      // It streams one connection per step in tree-sized chunks, where the ring streams large
      // chunks over several channels once its segments are large, so its bytes count slower then
      // (docs/performance.md, "Why the defaults").
      if (n < 4 || !m.halvingDoubling) return 1e300;
      const bool ringStreams = planChannelCount(bytes, n, m.ringChannels, m.channelMinBytes) > 1 ||
                               S / N > static_cast<double>(m.chunkBytes);
      const double slowdown = ringStreams ? 1.2 : 1.0;
      int p = 1, steps = 0;
      while (p * 2 <= n) p *= 2, ++steps;
      const double P = p, chunk = std::min(S / 2, static_cast<double>(m.treeChunkBytes));
      double fold = p == n ? 0 : 2 * (a_ + S * b) + chunk * g;
      return 2 * steps * a_ + slowdown * 2 * (P - 1) / P * S * b + steps * chunk * g + fold;
    }
    case Algo::Binomial: {
      // Pipelined in chunks down (or up) a tree of depth log2(n); the root's link carries the data
      // once per child, log2(n) times (and a reducing root adds that many passes).
      double chunks = std::max(1.0, std::ceil(S / static_cast<double>(m.pipeChunkBytes)));
      return (logn + chunks - 1) * a_ + logn * S * b + (c == Coll::Reduce ? logn * S * g : 0);
    }
    case Algo::Chain: {
      double chunks = std::max(1.0, std::ceil(S / static_cast<double>(m.pipeChunkBytes)));
      double chunk = S / chunks;
      return (N - 2 + chunks) * (a_ + chunk * b);
    }
    case Algo::Pairwise:
      return (N - 1) * (a_ + S / N * b);
    case Algo::DoubleTree: {
      // Up and down trees of depth log2(n), pipelined in chunks: filling the pipeline costs 2 log2(n)
      // chunk steps; then the busiest rank (interior in one tree, a leaf in the other) sends and
      // receives 2S in all, and pays the per-message latency once per chunk.
      double chunks = std::max(1.0, std::ceil(S / 2 / static_cast<double>(m.treeChunkBytes)));
      double chunk = S / 2 / chunks;
      return 2 * logn * (a_ + chunk * b) + 2 * S * b + chunks * a_ + S / 2 * g;
    }
  }
  return 0;
}

bool forcedAlgo(Coll c, const std::string& override, Algo* out) {
  auto cands = candidates(c);
  // LOOM_ALGO: a bare name applies everywhere it exists; "coll:name" entries apply to one.
  const std::string& text = override;
  size_t pos = 0;
  while (!text.empty() && pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    std::string name = item;
    size_t colon = item.find(':');
    if (colon != std::string::npos) {
      if (item.substr(0, colon) != overrideKey(c))
        name.clear();
      else
        name = item.substr(colon + 1);
    }
    Algo forced;
    if (!name.empty() && parseAlgo(name, &forced)) {
      for (Algo x : cands)
        if (x == forced) {
          *out = forced;
          return true;
        }
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return false;
}

Algo selectAlgo(Coll c, size_t bytes, int n, const CostModel& m, const std::string& override) {
  Algo forced;
  if (forcedAlgo(c, override, &forced)) return forced;
  auto cands = candidates(c);
  Algo best = cands.front();
  double bestUs = modelUs(c, best, bytes, n, m);
  for (Algo x : cands) {
    if (x == Algo::Hierarchical || x == Algo::Direct) continue;  // need the node shape: Selector::pick
    if (c == Coll::AllGather && x == Algo::Pairwise) continue;   // over shared memory only: Selector::pick
    double t = modelUs(c, x, bytes, n, m);
    if (t < bestUs) {
      best = x;
      bestUs = t;
    }
  }
  return best;
}

Selector::Selector(const CostModel& m, const std::string& override, const NodeShape& shape) : m_(m), shape_(shape) {
  for (int c = 0; c < 6; ++c) {
    Algo a;
    forced_[c] = forcedAlgo(static_cast<Coll>(c), override, &a) ? static_cast<int>(a) : -1;
  }
}

double Selector::hierarchicalUs(Coll c, size_t bytes) const {
  auto bestAt = [&](Coll k, size_t b, int n, const CostModel& m) {
    return modelUs(k, selectAlgo(k, b, n, m, ""), b, n, m);
  };
  auto best = [&](Coll k, int n, const CostModel& m) { return bestAt(k, bytes, n, m); };
  const int L = shape_.maxLocal, N = shape_.nodes;
  switch (c) {
    case Coll::AllReduce: {
      const double leaders =
          best(Coll::Reduce, L, shape_.intra) + best(Coll::AllReduce, N, m_) + best(Coll::Broadcast, L, shape_.intra);
      // The 2D form (nodes of equal size): a ring within the node around L all-reduces of a slice
      // across nodes, at once (hierarchical.cc).
      if (!shape_.evenNodes || L < 2 || bytes < static_cast<size_t>(L) * 64 * 1024) return leaders;
      const double twoD = modelUs(Coll::AllReduce, Algo::Ring, bytes, L, shape_.intra) +
                          bestAt(Coll::AllReduce, bytes / static_cast<size_t>(L), N, m_);
      return std::min(leaders, twoD);
    }
    case Coll::Broadcast:
      return best(Coll::Broadcast, N, m_) + best(Coll::Broadcast, L, shape_.intra);
    case Coll::Reduce:
      return best(Coll::Reduce, L, shape_.intra) + best(Coll::Reduce, N, m_);
    default:
      return 1e300;
  }
}

Algo Selector::pick(Coll c, size_t bytes, int ranks) const {
  const int f = forced_[static_cast<int>(c)];
  if (f >= 0) return static_cast<Algo>(f);
  // One communicator, one world size: the memo needs only the size.
  auto& memo = last_[static_cast<int>(c)];
  const uint64_t seen = memo.load(std::memory_order_relaxed);
  if (seen != 0 && (seen >> 8) == bytes) return static_cast<Algo>((seen & 0xff) - 1);
  Algo a = selectAlgo(c, bytes, ranks, m_, "");
  if (direct() && c == Coll::AllReduce && (bytes <= shape_.directSmallMaxBytes || bytes >= shape_.directMinBytes))
    a = Algo::Direct;
  // Broadcast and all-gather on one node: the direct forms (the one-barrier form for small
  // buffers, per rank's block for all-gather, then chunks staged in the shared areas), but for
  // large ones with two ranks: there the chain and the pairwise all-gather read the root's or the
  // peer's buffer in one copy (process_vm_readv) while the other rank works in parallel, where the
  // direct forms stage each chunk and copy it out in turn. From three ranks the readers all take
  // a staged chunk at once, and the direct forms win at every size (docs/performance.md, "Why the
  // defaults").
  if (direct() && (c == Coll::Broadcast || c == Coll::AllGather) && (ranks >= 3 || bytes <= kDirectPairMaxBytes))
    a = Algo::Direct;
  else if (direct() && c == Coll::AllGather)
    a = Algo::Pairwise;
  if (hierarchical() && (c == Coll::AllReduce || c == Coll::Broadcast || c == Coll::Reduce) &&
      hierarchicalUs(c, bytes) < modelUs(c, a, bytes, ranks, m_))
    a = Algo::Hierarchical;
  if (bytes < (uint64_t{1} << 56))
    memo.store(static_cast<uint64_t>(bytes) << 8 | (static_cast<uint64_t>(a) + 1), std::memory_order_relaxed);
  return a;
}

std::string algoOverrideFromEnv() { return algoParam(); }

}  // namespace coll
}  // namespace loom
