// Pure planning functions of the collective algorithms: index arithmetic only, no I/O, so that
// unit tests check them for every rank and world size without a network.
#pragma once

#include <cstddef>
#include <vector>

namespace loom {
namespace coll {

/// One round of the dissemination barrier: send to `to`, receive from `from`.
struct BarrierRound {
  int to;
  int from;
};

/// Dissemination barrier (Hensgen, Finkel and Manber): ceil(log2(size)) rounds; in round k rank r
/// signals r + 2^k and waits for r - 2^k (mod size). Every rank has heard, directly or through
/// others, from every rank once all rounds are done. Empty for size 1.
std::vector<BarrierRound> planDisseminationBarrier(int rank, int size);

/// A contiguous range of elements.
struct Segment {
  size_t offset;
  size_t count;
};

/// Splits `count` elements into `parts` contiguous segments whose sizes differ by at most one
/// (the first `count % parts` get one more). Covers [0, count) exactly once, in order.
std::vector<Segment> planSegments(size_t count, int parts);

/// Splits a segment into chunks of at most `chunk` elements (at least one chunk, possibly empty).
std::vector<Segment> planChunks(const Segment& seg, size_t chunk);

/// Ring reduce-scatter: at step s (0 .. n-2) rank r sends segment ringSendSegment and receives
/// (and reduces) segment ringRecvSegment, to and from its ring neighbours. After the last step
/// rank r holds the fully reduced segment ringOwnedSegment. `shift` rotates which segment each
/// rank ends with: shift 0 gives r + 1, shift n - 1 gives r (as reduce-scatter needs).
int ringSendSegment(int rank, int size, int step, int shift);
int ringRecvSegment(int rank, int size, int step, int shift);
int ringOwnedSegment(int rank, int size, int shift);

/// One ring of a multi-channel ring algorithm. Even channels run in rank order (r sends to r + 1),
/// odd channels in reverse (r sends to r - 1), so that both directions of every link carry data.
/// `pos` is the rank's place in this ring: the ring functions above and below take it as "rank".
struct RingView {
  int pos;
  int next;  ///< the rank this one sends to
  int prev;  ///< the rank this one receives from
};
RingView planRing(int rank, int size, int channel);
/// The rank at place `pos` of channel `channel`'s ring.
int ringRankAt(int pos, int size, int channel);
/// How many channels a ring collective moving `bytes` (the whole buffer) on `size` ranks uses: up
/// to `maxChannels`, while every channel's per-rank segment keeps at least `minSegmentBytes`.
int planChannelCount(size_t bytes, int size, int maxChannels, size_t minSegmentBytes);

/// Ring all-gather after a reduce-scatter with the same shift: at step s rank r sends segment
/// ringGatherSend and receives ringGatherRecv.
int ringGatherSend(int rank, int size, int step, int shift);
int ringGatherRecv(int rank, int size, int step, int shift);

/// A binomial tree rooted at `root`: the parent (-1 at the root) and the children in the order
/// they are served (farthest subtree first, so the largest subtree starts earliest).
struct TreeNode {
  int parent;
  std::vector<int> children;
};
TreeNode planBinomialTree(int rank, int size, int root);

/// Recursive doubling for any world size. With p the largest power of two <= size and
/// rem = size - p, the first 2 * rem ranks pair up: the even one hands its data to the odd one
/// (`foldTo`) and sits out; the odd one takes it (`foldFrom`). The p remaining ranks exchange with
/// `partners` (one per step) and the odd ranks hand the result back to their even neighbour.
struct DoublingPlan {
  int foldTo = -1;    ///< this rank sends its data here first and waits for the result (sits out)
  int foldFrom = -1;  ///< this rank first receives and reduces the data of this rank
  std::vector<int> partners;
};
DoublingPlan planRecursiveDoubling(int rank, int size);

/// One step of the halving-doubling (Rabenseifner) all-reduce, among the power-of-two ranks that
/// stay after planRecursiveDoubling's fold. The reduce-scatter halves this rank's range at every
/// step: it keeps `keep` (the partner's partial sums for it arrive and are reduced) and gives
/// `give` (its partial sums go to the partner, which keeps them). The all-gather runs the steps
/// backwards: this rank sends `keep`, complete by then, and receives `give`. Messages are cut
/// into chunks, listed in the order they go: a rank's receives of a step are exactly its
/// partner's sends of that step.
struct HalvingStep {
  int partner = -1;  ///< the rank exchanged with (a global rank)
  Segment keep{0, 0};
  Segment give{0, 0};
  std::vector<Segment> rsSend, rsRecv;  ///< reduce-scatter: rsSend covers give, rsRecv covers keep
  /// The first rsEarly receives cover the next step's give, reduced first so that the next step's
  /// sends leave before this step's reductions end (0 at the last step).
  size_t rsEarly = 0;
  std::vector<Segment> agSend, agRecv;  ///< all-gather: agSend covers keep, agRecv covers give
  /// The first agEarly sends cover the next step's keep, complete before this step starts; the
  /// others are the next step's all-gather receives, sent on as they land, in that order.
  size_t agEarly = 0;
};
struct HalvingPlan {
  int foldTo = -1;    ///< as DoublingPlan: this rank hands its data to foldTo and sits out
  int foldFrom = -1;  ///< as DoublingPlan: this rank first reduces foldFrom's data into its own
  std::vector<HalvingStep> steps;
  Segment owned{0, 0};  ///< the range this rank holds fully reduced after the reduce-scatter
};
/// The plan for `count` elements, messages of at most `chunk` elements.
HalvingPlan planHalvingDoubling(int rank, int size, size_t count, size_t chunk);

/// A node of a binary tree: its parent (-1 at the root) and up to two children (-1 when absent).
struct BinaryNode {
  int parent = -1;
  int children[2] = {-1, -1};
};

/// A balanced binary tree over ranks 0..size-1 laid out in order by the bits of rank + 1: the even
/// ranks are the leaves, and the root is the largest power of two <= size, minus one.
BinaryNode planInOrderTree(int rank, int size);

/// The two trees of the double binary tree (tree 0 or 1). Tree 1 is tree 0 with every rank moved
/// one place on (odd sizes) or mirrored (even sizes), so that most ranks that are leaves in one
/// tree are interior in the other, and the two halves of the data use different links.
BinaryNode planDoubleTree(int rank, int size, int tree);

/// The two levels of a node-aware (hierarchical) collective: this rank's node, and one leader per
/// node. A node's leader is the root when the root is on it, else its lowest rank.
struct Hierarchy {
  std::vector<int> local;    ///< the ranks of this rank's node, ascending
  int localIndex = 0;        ///< this rank's place in `local`
  int localRoot = 0;         ///< the node leader's place in `local`
  std::vector<int> leaders;  ///< every node's leader, in node order
  int leaderIndex = -1;      ///< this rank's place in `leaders`, -1 unless it leads its node
  int leaderRoot = 0;        ///< the root's node's place in `leaders`
};
/// `nodes[k]` lists node k's ranks ascending; every rank is on exactly one node.
Hierarchy planHierarchy(const std::vector<std::vector<int>>& nodes, int rank, int root);

}  // namespace coll
}  // namespace loom
