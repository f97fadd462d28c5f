// Collectives on device buffers among one node's ranks, their buffers mapped (see device_ipc.hpp).
#include "collectives/device_ipc.hpp"

#include "collectives/arena_sync.hpp"
#include "core/format.hpp"
#include "core/signature.hpp"

namespace loom {
namespace coll {
namespace {

// The steps of one call; each ends by draining the device work and a barrier on the arena.
struct IpcSteps {
  Context& ctx;
  const LocalArena& ar;
  const Args& a;
  DeviceIpcCall& c;
  uint64_t& step;
  const size_t N, ME, E;

  void endStep() {
    c.drain();
    barrier(ctx, ar, ++step);
  }
  // dst[i] = op over every rank's input at `offset` (reproducible mode: along the canonical tree).
  void reduceInto(void* dst, size_t offset, size_t count) {
    std::vector<const void*> srcs(N);
    for (size_t p = 0; p < N; ++p) srcs[p] = c.sendOf[p] + offset * E;
    const int n = static_cast<int>(N);
    if (isInReproducibleMode(ctx.signature())) {
      c.rt.reduceCanonicalAsync(dst, srcs.data(), n, count, a.type, a.op, c.work);
    } else {
      c.rt.reduceAsync(dst, srcs.data(), n, count, a.type, a.op, a.op == ReduceOp::Avg ? n : 1, c.work);
    }
  }
  // All-reduce and reduce: each rank reduces its slice into its output (the root's, for reduce);
  // an all-reduce then copies the other slices from their owners.
  void reduceSlices(bool all) {
    const auto slices = planSegments(a.count, static_cast<int>(N));
    const Segment& s = slices[ME];
    uint8_t* dst = all ? c.out : c.recvOf[static_cast<size_t>(a.root)];
    if (s.count > 0) reduceInto(dst + s.offset * E, s.offset, s.count);
    endStep();
    if (!all) return;
    gatherSlices(c.rt, c.out, c.recvOf, slices, ME, E, c.work);
    endStep();
  }
  // Copies block p of the output from `from(p)` for each rank p (skipped where it is in place).
  template <typename From>
  void copyBlocks(From from) {
    const size_t block = a.count * E;
    for (size_t p = 0; p < N; ++p)
      if (from(p) != c.out + p * block) c.rt.copyAsync(c.out + p * block, from(p), block, c.work);
  }
  void copyOne(const uint8_t* from) {
    if (from != c.out) c.rt.copyAsync(c.out, from, a.count * E, c.work);
  }
  // All-to-all with counts per peer: each rank's count for this one must be what this one expects.
  void allToAllv() {
    const auto& v = *a.counts;
    for (size_t p = 0; p < N; ++p) {
      const PeerCounts& r = c.counts[p];
      const uint64_t theirCount = r.n == N ? r.counts[ME] : 0, theirDispl = r.n == N ? r.counts[N + ME] : 0;
      if (r.n != N || theirCount != v[2 * N + p]) {
        failDeviceCall(
            ctx, Status::error(ErrorCode::InvalidUsage,
                               strFormat("%s: rank %zu sends this rank %llu elements, but this rank "
                                         "expects %zu from it: the ranks' counts do not match",
                                         c.label.c_str(), p, static_cast<unsigned long long>(theirCount), v[2 * N + p]),
                               static_cast<int>(p), ctx.seq()));
      }
      if (theirCount > 0)
        c.rt.copyAsync(c.out + v[3 * N + p] * E, c.sendOf[p] + theirDispl * E, theirCount * E, c.work);
    }
  }

  void run(Coll kind) {
    const size_t block = a.count * E;
    const auto root = static_cast<size_t>(a.root);
    switch (kind) {
      case Coll::AllReduce:
      case Coll::Reduce:
        return reduceSlices(kind == Coll::AllReduce);
      case Coll::ReduceScatter:
        reduceInto(c.out, ME * a.count, a.count);
        break;
      case Coll::Broadcast:
        copyOne(c.sendOf[root]);
        break;
      case Coll::AllGather:
        copyBlocks([&](size_t p) { return c.sendOf[p]; });
        break;
      case Coll::Gather:  // the root copies each rank's block from its input
        if (ME == root) copyBlocks([&](size_t p) { return c.sendOf[p]; });
        break;
      case Coll::Scatter:  // each rank copies its block from the root's input
        copyOne(c.sendOf[root] + ME * block);
        break;
      case Coll::AllToAll:
        if (a.counts) {
          allToAllv();
        } else {
          for (size_t p = 0; p < N; ++p) c.rt.copyAsync(c.out + p * block, c.sendOf[p] + ME * block, block, c.work);
        }
        break;
      case Coll::Barrier:  // host only: takes no buffers
        break;
    }
    endStep();
  }
};

}  // namespace

void runDeviceIpc(Context& ctx, const LocalArena& ar, Coll kind, const Args& a, DeviceIpcCall& call, uint64_t* step) {
  const auto N = static_cast<size_t>(ctx.size()), ME = static_cast<size_t>(ctx.rank());
  IpcSteps{ctx, ar, a, call, *step, N, ME, a.elem}.run(kind);
}

void gatherSlices(device::DeviceRuntime& rt, uint8_t* out, const std::vector<uint8_t*>& owners,
                  const std::vector<Segment>& slices, size_t me, size_t elem, device::StreamHandle work) {
  for (size_t p = 0; p < slices.size(); ++p) {
    const Segment& t = slices[p];
    if (p != me && t.count > 0) rt.copyAsync(out + t.offset * elem, owners[p] + t.offset * elem, t.count * elem, work);
  }
}

void failDeviceCall(const Context& ctx, Status s) {
  ctx.comm().failureState()->fail(s);
  throw s.toError(ctx.comm().rank());
}

}  // namespace coll
}  // namespace loom
