// Ring algorithms over parallel channels: all-reduce (reduce-scatter then all-gather), reduce
// (reduce-scatter then a gather at the root), all-gather and reduce-scatter.
//
// A collective's buffer is split between `ringChannels` channels. Each channel is its own ring
// (planRing: even channels run r -> r+1, odd ones r -> r-1, so both directions of every link carry
// data) with its own tag and staging buffers, and its own share of the data, cut into one segment
// per ring position. One thread drives all channels: every step posts the next step's receives
// of every channel first, then reduces and forwards chunk k of each channel in turn, so that the
// channels' transfers overlap each other and the reductions.
#include <algorithm>
#include <cstring>

#include "collectives/context.hpp"
#include "collectives/reduce_on_arrival.hpp"
#include "kernels/copy.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {
namespace {

// One channel: its ring, and its segments indexed by ring position (element offsets in the
// collective's buffer).
struct Lane {
  int channel;
  RingView ring;
  std::vector<Segment> segs;
};

size_t largest(const std::vector<Segment>& segs) {
  size_t m = 0;
  for (const auto& s : segs) m = std::max(m, s.count);
  return m;
}

// Lanes for a buffer of `count` elements: channel ch takes part ch of the buffer, cut into n
// segments by ring position.
std::vector<Lane> lanesOverBuffer(const Context& c, size_t count, int channels) {
  std::vector<Lane> lanes;
  auto parts = planSegments(count, channels);
  for (int ch = 0; ch < channels; ++ch) {
    Lane l{ch, planRing(c.rank(), c.size(), ch), planSegments(parts[static_cast<size_t>(ch)].count, c.size())};
    for (auto& s : l.segs) s.offset += parts[static_cast<size_t>(ch)].offset;
    lanes.push_back(std::move(l));
  }
  return lanes;
}

// Lanes for n blocks of `block` elements (block p belongs to rank p): channel ch takes part ch of
// every block; the segment at ring position q is that part of the block of the rank at q.
std::vector<Lane> lanesOverBlocks(const Context& c, size_t block, int channels) {
  const int n = c.size();
  std::vector<Lane> lanes;
  auto parts = planSegments(block, channels);
  for (int ch = 0; ch < channels; ++ch) {
    Lane l{ch, planRing(c.rank(), n, ch), {}};
    for (int q = 0; q < n; ++q) {
      size_t owner = static_cast<size_t>(ringRankAt(q, n, ch));
      l.segs.push_back({owner * block + parts[static_cast<size_t>(ch)].offset, parts[static_cast<size_t>(ch)].count});
    }
    lanes.push_back(std::move(l));
  }
  return lanes;
}

// Ring reduce-scatter: `in` is this rank's input, `work` receives the partial sums of each
// segment this rank reduces (work may equal in). Each lane's owned segment ends fully reduced in
// `work`, or, when finalOut is given, at finalOut + (offset - finalBase). Chunks are pipelined: a
// chunk is forwarded as soon as it is reduced, and the receives of the next step are posted one
// step ahead into the other of two staging buffers. Each receive reduces its chunk as it lands
// (ReduceOnArrival: the operands are this rank's input, final from the start, and a range of the
// destination nothing else touches until the chunk is forwarded); staging holds the chunk only
// over links that cannot hand the bytes on.
void ringReduceScatter(Context& c, const Args& a, const std::vector<Lane>& lanes, const uint8_t* in, uint8_t* work,
                       int shift, uint8_t* finalOut, size_t finalBase) {
  const int n = c.size();
  const size_t E = a.elem, chunk = c.ringChunkElems(E), L = lanes.size();
  std::vector<size_t> stagingAt(L);
  size_t stagingBytes = 0;
  for (size_t i = 0; i < L; ++i) {
    stagingAt[i] = stagingBytes;
    stagingBytes += largest(lanes[i].segs) * E;
  }
  uint8_t* staging[2] = {c.scratch(stagingBytes, 0), c.scratch(stagingBytes, 1)};
  std::vector<RequestPtr> sends;
  std::vector<std::vector<RequestPtr>> recvs[2] = {std::vector<std::vector<RequestPtr>>(L),
                                                   std::vector<std::vector<RequestPtr>>(L)};
  auto recvSeg = [&](size_t i, int step) -> const Segment& {
    return lanes[i].segs[static_cast<size_t>(ringRecvSegment(lanes[i].ring.pos, n, step, shift))];
  };
  // Where a chunk received at `step` ends up reduced.
  auto dstOf = [&](int step, const Segment& ch) -> uint8_t* {
    return (step == n - 2 && finalOut != nullptr) ? finalOut + (ch.offset - finalBase) * E : work + ch.offset * E;
  };
  auto postRecvs = [&](size_t i, int step) {
    const Segment& seg = recvSeg(i, step);
    uint8_t* base = staging[step % 2] + stagingAt[i];
    for (const auto& ch : planChunks(seg, chunk))
      recvs[step % 2][i].push_back(c.recv(lanes[i].ring.prev, base + (ch.offset - seg.offset) * E, ch.count * E,
                                          lanes[i].channel,
                                          ReduceOnArrival::make(dstOf(step, ch), in + ch.offset * E, a.type, a.op, E)));
  };
  // 1. Step 0 sends this rank's own input for its first segment, on every lane.
  for (size_t i = 0; i < L; ++i) {
    const Segment& first = lanes[i].segs[static_cast<size_t>(ringSendSegment(lanes[i].ring.pos, n, 0, shift))];
    for (const auto& ch : planChunks(first, chunk))
      sends.push_back(c.send(lanes[i].ring.next, in + ch.offset * E, ch.count * E, lanes[i].channel));
    postRecvs(i, 0);
  }
  std::vector<std::vector<Segment>> chunks(L);
  for (int step = 0; step < n - 1; ++step) {
    // 2. Post the next step's receives before reducing this one.
    size_t most = 0;
    for (size_t i = 0; i < L; ++i) {
      if (step + 1 < n - 1) postRecvs(i, step + 1);
      chunks[i] = planChunks(recvSeg(i, step), chunk);
      most = std::max(most, chunks[i].size());
    }
    const bool last = step == n - 2;
    // 3. Forward each chunk once it has landed, reduced; the lanes take turns.
    for (size_t k = 0; k < most; ++k)
      for (size_t i = 0; i < L; ++i) {
        if (k >= chunks[i].size()) continue;
        const Segment& ch = chunks[i][k];
        c.wait(recvs[step % 2][i][k]);
        if (!last) sends.push_back(c.send(lanes[i].ring.next, dstOf(step, ch), ch.count * E, lanes[i].channel));
      }
    for (auto& q : recvs[step % 2]) q.clear();
  }
  c.waitAll(sends);
}

// Ring all-gather of every lane's segments in `buf`, after a reduce-scatter with the same shift
// (each lane's owned segment is in place). Every receive lands in its final place; chunks are
// forwarded as they come.
void ringAllGather(Context& c, const std::vector<Lane>& lanes, uint8_t* buf, size_t E, int shift) {
  const int n = c.size();
  const size_t chunk = c.ringChunkElems(E), L = lanes.size();
  // recvs[i][step]: lane i's receives of that step, all posted up front.
  std::vector<std::vector<std::vector<RequestPtr>>> recvs(L, std::vector<std::vector<RequestPtr>>(n));
  std::vector<RequestPtr> sends;
  auto gatherSeg = [&](size_t i, int step) -> const Segment& {
    return lanes[i].segs[static_cast<size_t>(ringGatherRecv(lanes[i].ring.pos, n, step, shift))];
  };
  for (size_t i = 0; i < L; ++i) {
    for (int step = 0; step < n - 1; ++step)
      for (const auto& ch : planChunks(gatherSeg(i, step), chunk))
        recvs[i][static_cast<size_t>(step)].push_back(
            c.recv(lanes[i].ring.prev, buf + ch.offset * E, ch.count * E, lanes[i].channel));
    const Segment& own = lanes[i].segs[static_cast<size_t>(ringGatherSend(lanes[i].ring.pos, n, 0, shift))];
    for (const auto& ch : planChunks(own, chunk))
      sends.push_back(c.send(lanes[i].ring.next, buf + ch.offset * E, ch.count * E, lanes[i].channel));
  }
  std::vector<std::vector<Segment>> chunks(L);
  for (int step = 0; step < n - 1; ++step) {
    size_t most = 0;
    for (size_t i = 0; i < L; ++i) {
      chunks[i] = planChunks(gatherSeg(i, step), chunk);
      most = std::max(most, chunks[i].size());
    }
    for (size_t k = 0; k < most; ++k)
      for (size_t i = 0; i < L; ++i) {
        if (k >= chunks[i].size()) continue;
        c.wait(recvs[i][static_cast<size_t>(step)][k]);
        if (step + 1 < n - 1)
          sends.push_back(
              c.send(lanes[i].ring.next, buf + chunks[i][k].offset * E, chunks[i][k].count * E, lanes[i].channel));
      }
  }
  c.waitAll(sends);
}

}  // namespace

void allReduceRing(Context& c, const Args& a) { allReduceRingAround(c, a, nullptr); }

void allReduceRingAround(Context& c, const Args& a, const OwnedStep& between) {
  const int n = c.size();
  const size_t E = a.elem;
  uint8_t* out = bytes(a.recv);
  if (n == 1) {
    copyIfDistinct(out, a.send, a.count * E);
    if (between) between(std::vector<Segment>{Segment{0, a.count}});
    if (a.op == ReduceOp::Avg && !between) kernels::divide(out, a.count, a.type, n);
    return;
  }
  auto lanes = lanesOverBuffer(c, a.count, c.ringChannels(a.count * E));
  // 1. Reduce-scatter: on every lane this rank ends with one segment fully reduced in `out`.
  ringReduceScatter(c, a, lanes, cbytes(a.send), out, 0, nullptr, 0);
  std::vector<Segment> owned;
  for (const auto& l : lanes) owned.push_back(l.segs[static_cast<size_t>(ringOwnedSegment(l.ring.pos, n, 0))]);
  // 2. The caller's step on the owned segments; else avg scales them once, before anyone copies them.
  if (between) {
    between(owned);
  } else if (a.op == ReduceOp::Avg) {
    for (const auto& own : owned) kernels::divide(out + own.offset * E, own.count, a.type, n);
  }
  // 3. All-gather the reduced segments.
  ringAllGather(c, lanes, out, E, 0);
}

void reduceRing(Context& c, const Args& a) {
  // 1. Ring reduce-scatter into scratch; 2. every rank sends its reduced segments to the root.
  const int n = c.size(), r = c.rank();
  const size_t E = a.elem;
  if (n == 1) {
    copyIfDistinct(a.recv, a.send, a.count * E);
    if (a.op == ReduceOp::Avg) kernels::divide(a.recv, a.count, a.type, n);
    return;
  }
  auto lanes = lanesOverBuffer(c, a.count, c.ringChannels(a.count * E));
  uint8_t* work = c.scratch(a.count * E, 2);
  ringReduceScatter(c, a, lanes, cbytes(a.send), work, 0, nullptr, 0);
  std::vector<RequestPtr> reqs;
  for (const auto& l : lanes) {
    const Segment& own = l.segs[static_cast<size_t>(ringOwnedSegment(l.ring.pos, n, 0))];
    if (a.op == ReduceOp::Avg) kernels::divide(work + own.offset * E, own.count, a.type, n);
    if (r != a.root) {
      reqs.push_back(c.send(a.root, work + own.offset * E, own.count * E, l.channel));
      continue;
    }
    // The root: its own segment by copy, everyone else's by receive, straight into place.
    uint8_t* out = bytes(a.recv);
    for (int p = 0; p < n; ++p) {
      const Segment& s = l.segs[static_cast<size_t>(ringOwnedSegment(planRing(p, n, l.channel).pos, n, 0))];
      if (p != r)
        reqs.push_back(c.recv(p, out + s.offset * E, s.count * E, l.channel));
      else if (s.count > 0)
        kernels::copy(out + s.offset * E, work + s.offset * E, s.count * E);
    }
  }
  c.waitAll(reqs);
}

void allGatherRing(Context& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t E = a.elem;
  uint8_t* out = bytes(a.recv);
  copyIfDistinct(out + static_cast<size_t>(r) * a.count * E, a.send, a.count * E);
  if (n == 1) return;
  // Shift n-1: every rank starts by sending (its part of) its own block.
  ringAllGather(c, lanesOverBlocks(c, a.count, c.ringChannels(a.count * E * static_cast<size_t>(n))), out, E, n - 1);
}

void reduceScatterRing(Context& c, const Args& a) {
  const int n = c.size(), r = c.rank();
  const size_t E = a.elem;
  if (n == 1) {
    copyIfDistinct(a.recv, a.send, a.count * E);
    if (a.op == ReduceOp::Avg) kernels::divide(a.recv, a.count, a.type, 1);
    return;
  }
  auto lanes = lanesOverBlocks(c, a.count, c.ringChannels(a.count * E * static_cast<size_t>(n)));
  uint8_t* work = c.scratch(static_cast<size_t>(n) * a.count * E, 2);
  // Shift n-1: this rank ends owning (every lane's part of) block r, reduced straight into recv.
  ringReduceScatter(c, a, lanes, cbytes(a.send), work, n - 1, bytes(a.recv), static_cast<size_t>(r) * a.count);
  if (a.op == ReduceOp::Avg) kernels::divide(a.recv, a.count, a.type, n);
}

}  // namespace coll
}  // namespace loom
