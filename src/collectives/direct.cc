// Intra-node direct all-reduce: the ranks of one node share memory, so instead of passing copies
// around a ring, every rank stages its input in its direct area (shm/segment.hpp) and reads its
// peers' in place. Per chunk of at most the area's size, three steps separated by barriers on the
// ranks' step counters (no messages):
//   1. stage: copy this rank's chunk of input into its own area, all but its own slice;
//   2. reduce: reduce this rank's slice of the chunk from its input and every other rank's area
//      into the receive buffer, and put the result in its own area at that slice;
//   3. gather: copy every other rank's reduced slice from its area into the receive buffer;
// and a last barrier before an area is written again. Small all-reduces (up to 16 KiB) take one
// barrier: each rank stages its whole buffer in one of two alternating halves and reduces all of
// it itself, which for a few kilobytes costs less than two more barriers. Each element is reduced once, by one rank,
// in one order, so every rank holds the same bits (in reproducible mode, Args::canonical, the
// canonical tree over rank order, whatever the chunk or slice). A rank stages all but its own slice, which it
// reduces straight from its input: about 5 - 2/n bytes of memory traffic per byte of message,
// against 2 + 7(n-1)/n for the ring with single-copy reads, and no syscall.
// Broadcast and all-gather work the same way without the reduction: the root (every rank, for
// all-gather) stages chunks in two alternating halves of its area, one barrier per chunk, and the
// others copy them out (halvedExchange below). A barrier is the small exchange with nothing staged.
// Before reading a peer's area, a rank checks that the peer is in the same collective (sequence
// number, size, type and op); a mismatch fails the communicator instead of reading garbage.
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/arena_sync.hpp"
#include "collectives/context.hpp"
#include "collectives/select.hpp"
#include "core/format.hpp"
#include "core/signature.hpp"
#include "kernels/copy.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {
namespace {

enum class Kind { AllReduce, Broadcast, AllGather };

// What a rank's collective is, for the same-call check: its signature (core/signature.hpp), of
// this part of it where the call is staged from device buffers in parts, marked as the call is.
uint64_t callWord(const Context& c, Kind kind, const Args& a) {
  const SigKind k = kind == Kind::AllReduce   ? SigKind::AllReduce
                    : kind == Kind::Broadcast ? SigKind::Broadcast
                                              : SigKind::AllGather;
  uint64_t word = makeSignature(k, a.type, a.op, a.root, a.count);
  if (isInReproducibleMode(c.signature())) word = inReproducibleMode(word);
  return isOnDeviceBuffers(c.signature()) ? onDeviceBuffers(word) : word;
}

void publishCall(const Context& c, const LocalArena& ar, uint64_t bytes, uint64_t word, int set) {
  std::atomic<uint64_t>* w = ar.calls[static_cast<size_t>(ar.me)] + 3 * set;
  w[0].store(static_cast<uint64_t>(c.seq()), std::memory_order_relaxed);
  w[1].store(bytes, std::memory_order_relaxed);
  w[2].store(word, std::memory_order_relaxed);
}

void checkSameCall(const Context& c, const LocalArena& ar, uint64_t bytes, uint64_t word, int set) {
  for (size_t p = 0; p < ar.calls.size(); ++p) {
    if (static_cast<int>(p) == ar.me) continue;
    const std::atomic<uint64_t>* d = ar.calls[p] + 3 * set;
    const uint64_t seq = d[0].load(std::memory_order_relaxed);
    const uint64_t b = d[1].load(std::memory_order_relaxed);
    const uint64_t w = d[2].load(std::memory_order_relaxed);
    if (seq == static_cast<uint64_t>(c.seq()) && b == bytes && w == word) continue;
    // The calls the ranks published on entry say more where they can: a peer on another path
    // (device buffers through CUDA IPC) wrote no record here.
    if (Status m = c.comm().localCallMismatch(c.seq(), c.signature()); !m.ok) {
      m.message = strFormat("%s #%lld (direct): %s", c.name(), static_cast<long long>(c.seq()), m.message.c_str());
      c.comm().failureState()->fail(m);
      throw m.toError(c.comm().rank());
    }
    Status s = Status::error(
        ErrorCode::InvalidUsage,
        strFormat("%s #%lld (direct): rank %d is in collective #%llu, %s (%llu bytes), where this rank is in %s "
                  "(%llu bytes): the ranks called this collective with different counts, datatypes, ops or roots",
                  c.name(), static_cast<long long>(c.seq()), ar.ranks[p], static_cast<unsigned long long>(seq),
                  describeSignature(w).c_str(), static_cast<unsigned long long>(b), describeSignature(word).c_str(),
                  static_cast<unsigned long long>(bytes)),
        ar.ranks[p], c.seq());
    c.comm().failureState()->fail(s);
    throw s.toError(c.comm().rank());
  }
}

// The one-barrier exchange of small buffers: every rank stages `stage` bytes (possibly none) in
// the half of its area the step count's parity picks, one barrier, then `consume` reads every
// rank's half. A rank writes a half again two small calls on, which it reaches only after the
// next barrier, which every rank passes only once it has finished reading: no second barrier.
template <typename Consume>
void smallExchange(Context& c, const LocalArena& ar, uint64_t bytes, uint64_t word, const void* stage,
                   size_t stageBytes, Consume consume) {
  const size_t small = directSmallMaxBytes(ar.bytes);
  uint64_t step = ar.steps[static_cast<size_t>(ar.me)]->load(std::memory_order_relaxed);
  const int parity = static_cast<int>(step & 1);
  const size_t half = static_cast<size_t>(parity) * small;
  if (stageBytes > 0) backOwn(ar, 2 * small);
  publishCall(c, ar, bytes, word, parity);
  if (stageBytes > 0) kernels::copy(ar.buffers[static_cast<size_t>(ar.me)] + half, stage, stageBytes);
  barrier(c, ar, ++step);
  checkSameCall(c, ar, bytes, word, parity);
  consume(half);
}

}  // namespace

void allReduceDirect(Context& c, const Args& a) {
  const LocalArena& ar = *c.comm().arena();
  const int n = static_cast<int>(ar.ranks.size()), me = ar.me;
  const size_t E = a.elem;
  const size_t small = directSmallMaxBytes(ar.bytes);  // (select.hpp)
  // The area: two halves for small calls, then the rest for chunks of large ones.
  const size_t largeAt = 2 * small;
  const size_t chunk = std::max<size_t>(1, (ar.bytes - largeAt) / E);
  const uint8_t* in = cbytes(a.send);
  uint8_t* out = bytes(a.recv);
  uint8_t* mine = ar.buffers[static_cast<size_t>(me)];
  uint64_t step = ar.steps[static_cast<size_t>(me)]->load(std::memory_order_relaxed);
  const size_t total = a.count * E;
  if (total == 0) return;
  if (total <= small) {
    // Small: every rank reduces the whole buffer from all areas itself, in rank order.
    smallExchange(c, ar, total, callWord(c, Kind::AllReduce, a), in, total, [&](size_t half) {
      if (a.canonical) {
        const void* few[16];  // no allocation on the latency path for up to 16 local ranks
        std::vector<const void*> many(n > 16 ? static_cast<size_t>(n) : 0);
        const void** srcs = n > 16 ? many.data() : few;
        for (int p = 0; p < n; ++p) srcs[p] = ar.buffers[static_cast<size_t>(p)] + half;
        kernels::reduceCanonical(out, srcs, n, a.count, a.type, a.op);
        return;
      }
      if (n == 1) {
        kernels::copy(out, ar.buffers[0] + half, total);
      } else {
        kernels::reduce(out, ar.buffers[0] + half, ar.buffers[1] + half, a.count, a.type, a.op);
        for (int p = 2; p < n; ++p)
          kernels::reduce(out, out, ar.buffers[static_cast<size_t>(p)] + half, a.count, a.type, a.op);
      }
      if (a.op == ReduceOp::Avg) kernels::divide(out, a.count, a.type, n);
    });
    return;
  }
  backOwn(ar, ar.bytes);
  mine += largeAt;
  // Large calls describe themselves in a set of their own: a peer may still be checking the
  // small calls' sets while this rank has moved on.
  publishCall(c, ar, total, callWord(c, Kind::AllReduce, a), 2);
  bool checked = false;
  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (size_t off = 0; off < a.count; off += chunk) {
    const size_t len = std::min(chunk, a.count - off);
    const auto slices = planSegments(len, n);
    // 1. Stage this rank's chunk, but for its own slice: the reduction reads that from the input.
    const Segment& s = slices[static_cast<size_t>(me)];
    const size_t ownEnd = s.offset + s.count;
    kernels::copy(mine, in + off * E, s.offset * E);
    kernels::copy(mine + ownEnd * E, in + (off + ownEnd) * E, (len - ownEnd) * E);
    barrier(c, ar, ++step);
    if (!checked) {
      checkSameCall(c, ar, total, callWord(c, Kind::AllReduce, a), 2);
      checked = true;
    }
    // 2. Reduce this rank's slice: its own input first, then every other area in rank order (one
    // order per slice, so every rank receives the same bits); publish it in this rank's area. In
    // place, `dst` is the input itself, read at each element before it is written.
    if (s.count > 0) {
      const size_t at = largeAt + s.offset * E;
      const uint8_t* own = in + (off + s.offset) * E;
      uint8_t* dst = out + (off + s.offset) * E;
      if (a.canonical) {
        // Reproducible mode: every input at once, along the canonical tree over rank order.
        for (int p = 0; p < n; ++p)
          srcs[static_cast<size_t>(p)] = p == me ? own : ar.buffers[static_cast<size_t>(p)] + at;
        kernels::reduceCanonical(dst, srcs.data(), n, s.count, a.type, a.op);
      } else {
        const uint8_t* acc = own;
        for (int p = 0; p < n; ++p) {
          if (p == me) continue;
          kernels::reduce(dst, acc, ar.buffers[static_cast<size_t>(p)] + at, s.count, a.type, a.op);
          acc = dst;
        }
        if (n == 1) copyIfDistinct(dst, own, s.count * E);
        if (a.op == ReduceOp::Avg) kernels::divide(dst, s.count, a.type, n);
      }
      kernels::copy(mine + s.offset * E, dst, s.count * E);
    }
    barrier(c, ar, ++step);
    // 3. Gather the other slices.
    for (int p = 0; p < n; ++p) {
      const Segment& t = slices[static_cast<size_t>(p)];
      if (p == me || t.count == 0) continue;
      kernels::copy(out + (off + t.offset) * E, ar.buffers[static_cast<size_t>(p)] + largeAt + t.offset * E,
                    t.count * E);
    }
    barrier(c, ar, ++step);  // every area read: the next chunk (or collective) may overwrite it
  }
}

namespace {

// Broadcast and all-gather beyond the one-barrier size: the large part of the area in two halves,
// chunks staged in them by turns, one barrier per chunk and one at the end. A writer fills a half
// again two chunks on, after the barrier that every reader passes only once it has read that
// half's previous chunk; the last barrier lets the next collective write anywhere.
// `stage(at, off, len)` writes this rank's part of chunk [off, off + len) at area offset `at`;
// `take(at, off, len)` copies what this rank needs of it from the areas.
template <typename Stage, typename Take>
void halvedExchange(Context& c, const LocalArena& ar, uint64_t bytes, uint64_t word, size_t length, Stage stage,
                    Take take) {
  const size_t largeAt = 2 * directSmallMaxBytes(ar.bytes);
  const size_t half = std::max<size_t>(64, ((ar.bytes - largeAt) / 2) & ~size_t{63});
  uint64_t step = ar.steps[static_cast<size_t>(ar.me)]->load(std::memory_order_relaxed);
  publishCall(c, ar, bytes, word, 2);
  size_t k = 0;
  for (size_t off = 0; off < length; off += half, ++k) {
    const size_t len = std::min(half, length - off), at = largeAt + (k & 1) * half;
    stage(at, off, len);
    barrier(c, ar, ++step);
    if (k == 0) checkSameCall(c, ar, bytes, word, 2);
    take(at, off, len);
  }
  barrier(c, ar, ++step);
}

}  // namespace

void barrierDirect(Context& c) {
  smallExchange(c, *c.comm().arena(), 0, c.signature(), nullptr, 0, [](size_t) {});
}

void exchangeDirect(Context& c, const void* send, size_t block, FunctionRef<void(int, const uint8_t*)> take) {
  const LocalArena& ar = *c.comm().arena();
  if (block > directSmallMaxBytes(ar.bytes)) {
    throw Status::error(ErrorCode::Internal,
                        strFormat("%s: an exchange of %zu bytes a rank through the arena (at most %zu)", c.name(),
                                  block, directSmallMaxBytes(ar.bytes)))
        .toError(c.comm().rank());
  }
  smallExchange(c, ar, block, c.signature(), send, block, [&](size_t half) {
    for (size_t p = 0; p < ar.buffers.size(); ++p)
      take(ar.ranks[p], static_cast<int>(p) == ar.me ? cbytes(send) : ar.buffers[p] + half);
  });
}

void broadcastDirect(Context& c, const Args& a) {
  const LocalArena& ar = *c.comm().arena();
  const size_t total = a.count * a.elem;
  if (total == 0) return;
  const bool root = c.rank() == a.root;
  const int rootIndex = static_cast<int>(std::find(ar.ranks.begin(), ar.ranks.end(), a.root) - ar.ranks.begin());
  const uint8_t* rootArea = ar.buffers[static_cast<size_t>(rootIndex)];
  const uint64_t word = callWord(c, Kind::Broadcast, a);
  if (total <= directSmallMaxBytes(ar.bytes)) {
    smallExchange(c, ar, total, word, root ? a.send : nullptr, root ? total : 0, [&](size_t half) {
      if (root) {
        copyIfDistinct(a.recv, a.send, total);
      } else {
        kernels::copy(a.recv, rootArea + half, total);
      }
    });
    return;
  }
  const uint8_t* in = cbytes(a.send);
  uint8_t* out = bytes(a.recv);
  uint8_t* mine = ar.buffers[static_cast<size_t>(ar.me)];
  if (root) backOwn(ar, ar.bytes);
  halvedExchange(
      c, ar, total, word, total,
      [&](size_t at, size_t off, size_t len) {
        if (root) kernels::copy(mine + at, in + off, len);
      },
      [&](size_t at, size_t off, size_t len) {
        if (root) {
          copyIfDistinct(out + off, in + off, len);
        } else {
          kernels::copy(out + off, rootArea + at, len);
        }
      });
}

void allGatherDirect(Context& c, const Args& a) {
  const LocalArena& ar = *c.comm().arena();
  const size_t block = a.count * a.elem;
  if (block == 0) return;
  const uint8_t* in = cbytes(a.send);
  uint8_t* out = bytes(a.recv);
  const uint64_t word = callWord(c, Kind::AllGather, a);
  if (block <= directSmallMaxBytes(ar.bytes)) {
    smallExchange(c, ar, block, word, a.send, block, [&](size_t half) {
      for (size_t p = 0; p < ar.buffers.size(); ++p) {
        if (static_cast<int>(p) == ar.me) {
          copyIfDistinct(out + p * block, in, block);
        } else {
          kernels::copy(out + p * block, ar.buffers[p] + half, block);
        }
      }
    });
    return;
  }
  // Each rank's block in chunks: stage this rank's chunk, then copy every peer's.
  uint8_t* mine = ar.buffers[static_cast<size_t>(ar.me)];
  backOwn(ar, ar.bytes);
  halvedExchange(
      c, ar, block, word, block, [&](size_t at, size_t off, size_t len) { kernels::copy(mine + at, in + off, len); },
      [&](size_t at, size_t off, size_t len) {
        for (size_t p = 0; p < ar.buffers.size(); ++p) {
          if (static_cast<int>(p) == ar.me) {
            copyIfDistinct(out + p * block + off, in + off, len);
          } else {
            kernels::copy(out + p * block + off, ar.buffers[p] + at, len);
          }
        }
      });
}

}  // namespace coll
}  // namespace loom
