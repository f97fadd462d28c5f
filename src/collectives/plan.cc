#include "collectives/plan.hpp"

#include <algorithm>

namespace loom {
namespace coll {

namespace {
int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

std::vector<BarrierRound> planDisseminationBarrier(int rank, int size) {
  std::vector<BarrierRound> rounds;
  for (int dist = 1; dist < size; dist *= 2) {
    rounds.push_back({(rank + dist) % size, (rank - dist % size + size) % size});
  }
  return rounds;
}

std::vector<Segment> planSegments(size_t count, int parts) {
  std::vector<Segment> segs;
  const size_t n = static_cast<size_t>(parts);
  const size_t base = count / n, extra = count % n;
  size_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t c = base + (i < extra ? 1 : 0);
    segs.push_back({off, c});
    off += c;
  }
  return segs;
}

std::vector<Segment> planChunks(const Segment& seg, size_t chunk) {
  std::vector<Segment> out;
  if (chunk == 0) chunk = 1;
  if (seg.count == 0) {
    out.push_back({seg.offset, 0});
    return out;
  }
  for (size_t off = 0; off < seg.count; off += chunk) {
    out.push_back({seg.offset + off, seg.count - off < chunk ? seg.count - off : chunk});
  }
  return out;
}

int ringSendSegment(int rank, int size, int step, int shift) { return mod(rank - step + shift, size); }
int ringRecvSegment(int rank, int size, int step, int shift) { return mod(rank - step - 1 + shift, size); }
int ringOwnedSegment(int rank, int size, int shift) { return mod(rank + 1 + shift, size); }
int ringGatherSend(int rank, int size, int step, int shift) { return mod(rank + 1 - step + shift, size); }
int ringGatherRecv(int rank, int size, int step, int shift) { return mod(rank - step + shift, size); }

RingView planRing(int rank, int size, int channel) {
  if (channel % 2 == 0) return {rank, mod(rank + 1, size), mod(rank - 1, size)};
  return {mod(size - rank, size), mod(rank - 1, size), mod(rank + 1, size)};
}

int ringRankAt(int pos, int size, int channel) { return channel % 2 == 0 ? mod(pos, size) : mod(size - pos, size); }

int planChannelCount(size_t bytes, int size, int maxChannels, size_t minSegmentBytes) {
  if (maxChannels <= 1 || size <= 1) return 1;
  const size_t perRank = bytes / static_cast<size_t>(size);
  const size_t fit = minSegmentBytes == 0 ? static_cast<size_t>(maxChannels) : perRank / minSegmentBytes;
  return static_cast<int>(std::max<size_t>(1, std::min<size_t>(fit, static_cast<size_t>(maxChannels))));
}

TreeNode planBinomialTree(int rank, int size, int root) {
  TreeNode node;
  const int vr = mod(rank - root, size);
  int mask = 1;
  node.parent = -1;
  while (mask < size) {
    if (vr & mask) {
      node.parent = mod(vr - mask + root, size);
      break;
    }
    mask <<= 1;
  }
  // Children: vr + m for every power of two m below this rank's lowest set bit (or below size at
  // the root), largest first.
  for (int m = mask >> 1; m > 0; m >>= 1) {
    if (vr + m < size) node.children.push_back(mod(vr + m + root, size));
  }
  return node;
}

DoublingPlan planRecursiveDoubling(int rank, int size) {
  DoublingPlan plan;
  int p = 1;
  while (p * 2 <= size) p *= 2;
  const int rem = size - p;
  int newRank;
  if (rank < 2 * rem) {
    if (rank % 2 == 0) {
      plan.foldTo = rank + 1;
      return plan;
    }
    plan.foldFrom = rank - 1;
    newRank = rank / 2;
  } else {
    newRank = rank - rem;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    int pn = newRank ^ mask;
    plan.partners.push_back(pn < rem ? pn * 2 + 1 : pn + rem);
  }
  return plan;
}

namespace {

// Halving-doubling over the p active ranks, numbered v = 0..p-1 (the "new ranks" of the fold).
// Step k pairs v with v ^ 2^k; the range both hold is split at its middle, and the rank whose bit
// k is clear keeps the lower half.
struct Halves {
  Segment keep, give;
};
Halves halvesAt(int v, int step, size_t count) {
  Segment r{0, count};
  Halves h{r, r};
  for (int k = 0; k <= step; ++k) {
    Segment lo{r.offset, r.count / 2}, hi{r.offset + r.count / 2, r.count - r.count / 2};
    const bool lower = (v & (1 << k)) == 0;
    h = {lower ? lo : hi, lower ? hi : lo};
    r = h.keep;
  }
  return h;
}

void appendChunks(std::vector<Segment>& to, const Segment& seg, size_t chunk) {
  for (const auto& c : planChunks(seg, chunk)) to.push_back(c);
}

// The reduce-scatter receives of virtual rank v at `step`: the next step's give first.
std::vector<Segment> rsRecvOf(int v, int step, int steps, size_t count, size_t chunk) {
  std::vector<Segment> out;
  if (step + 1 < steps) {
    Halves next = halvesAt(v, step + 1, count);
    appendChunks(out, next.give, chunk);
    appendChunks(out, next.keep, chunk);
  } else {
    appendChunks(out, halvesAt(v, step, count).keep, chunk);
  }
  return out;
}

// The all-gather sends of virtual rank v at `step`: the next step's keep, then what the next
// step's all-gather receives, in the order it arrives.
std::vector<Segment> agSendOf(int v, int step, int steps, size_t count, size_t chunk) {
  std::vector<Segment> out;
  if (step + 1 == steps) {
    appendChunks(out, halvesAt(v, step, count).keep, chunk);
    return out;
  }
  appendChunks(out, halvesAt(v, step + 1, count).keep, chunk);
  auto tail = agSendOf(v ^ (1 << (step + 1)), step + 1, steps, count, chunk);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

}  // namespace

HalvingPlan planHalvingDoubling(int rank, int size, size_t count, size_t chunk) {
  HalvingPlan plan;
  DoublingPlan d = planRecursiveDoubling(rank, size);
  plan.foldTo = d.foldTo;
  plan.foldFrom = d.foldFrom;
  if (d.foldTo >= 0) return plan;
  plan.owned = {0, count};
  const int steps = static_cast<int>(d.partners.size());
  int p = 1;
  while (p * 2 <= size) p *= 2;
  const int rem = size - p;
  const int v = rank < 2 * rem ? rank / 2 : rank - rem;
  for (int k = 0; k < steps; ++k) {
    HalvingStep s;
    s.partner = d.partners[static_cast<size_t>(k)];
    const int pv = v ^ (1 << k);
    Halves h = halvesAt(v, k, count);
    s.keep = h.keep;
    s.give = h.give;
    s.rsRecv = rsRecvOf(v, k, steps, count, chunk);
    s.rsSend = rsRecvOf(pv, k, steps, count, chunk);
    s.rsEarly = k + 1 < steps ? planChunks(halvesAt(v, k + 1, count).give, chunk).size() : 0;
    s.agSend = agSendOf(v, k, steps, count, chunk);
    s.agRecv = agSendOf(pv, k, steps, count, chunk);
    s.agEarly = k + 1 < steps ? planChunks(halvesAt(v, k + 1, count).keep, chunk).size() : s.agSend.size();
    plan.owned = h.keep;
    plan.steps.push_back(std::move(s));
  }
  return plan;
}

namespace {

// The in-order tree over 1-based positions 1..n: position p with lowest set bit b has children
// p - b/2 and p + b/2 (the right one moved closer when p + b/2 is past n) and its natural parent
// is p - b or p + b, whichever has bit 2b set. Leaves are the odd positions (even ranks).
int lowbit(int p) { return p & -p; }
int naturalParent(int p) {
  const int b = lowbit(p);
  return (p & (2 * b)) != 0 ? p - b : p + b;
}

}  // namespace

BinaryNode planInOrderTree(int rank, int size) {
  BinaryNode node;
  const int p = rank + 1, b = lowbit(p);
  // Parent: climb past positions beyond the end (their subtrees are cut off there).
  int top = 1;
  while (top * 2 <= size) top *= 2;  // the root: the largest power of two <= size
  if (p != top) {
    int q = naturalParent(p);
    while (q > size) q = naturalParent(q);
    node.parent = q - 1;
  }
  if (b > 1) {
    node.children[0] = p - b / 2 - 1;
    int off = b / 2;
    while (off > 0 && p + off > size) off /= 2;
    node.children[1] = off > 0 ? p + off - 1 : -1;
  }
  return node;
}

BinaryNode planDoubleTree(int rank, int size, int tree) {
  if (tree == 0 || size <= 1) return planInOrderTree(rank, size);
  // Relabel: tree 1 is tree 0 over positions pos(rank); map positions back to ranks.
  const bool odd = size % 2 == 1;
  auto toPos = [&](int r) { return odd ? (r + size - 1) % size : size - 1 - r; };
  auto toRank = [&](int p) { return p < 0 ? -1 : (odd ? (p + 1) % size : size - 1 - p); };
  BinaryNode at = planInOrderTree(toPos(rank), size);
  BinaryNode node;
  node.parent = toRank(at.parent);
  node.children[0] = toRank(at.children[0]);
  node.children[1] = toRank(at.children[1]);
  return node;
}

Hierarchy planHierarchy(const std::vector<std::vector<int>>& nodes, int rank, int root) {
  Hierarchy h;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const auto& ranks = nodes[k];
    const bool hasRoot = std::find(ranks.begin(), ranks.end(), root) != ranks.end();
    const int leader = hasRoot ? root : ranks.front();
    if (hasRoot) h.leaderRoot = static_cast<int>(h.leaders.size());
    if (leader == rank) h.leaderIndex = static_cast<int>(h.leaders.size());
    h.leaders.push_back(leader);
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) {
      h.local = ranks;
      h.localIndex = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
      h.localRoot = static_cast<int>(std::find(ranks.begin(), ranks.end(), leader) - ranks.begin());
    }
  }
  return h;
}

}  // namespace coll
}  // namespace loom
