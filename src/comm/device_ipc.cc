// Collectives on device buffers through CUDA IPC (see device_ipc.hpp).
#include "comm/device_ipc.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/arena_sync.hpp"
#include "comm/device_record.hpp"
#include "comm/device_state.hpp"
#include "core/format.hpp"
#include "core/function_ref.hpp"
#include "core/logging.hpp"
#include "core/signature.hpp"
#include "device/runtime.hpp"
#include "transport/cuda_ipc/ipc_mem_cache.hpp"

namespace loom {
namespace detail {

using coll::planSegments;
using coll::Segment;

using coll::Args;
using coll::barrier;
using coll::Coll;
using coll::collName;
using coll::Context;
namespace {

constexpr const char* kAlgo = "cuda_ipc";

// Which of its buffers a rank shares for `kind`: those its peers read or write.
bool sharesSend(Coll kind, const Args& a, int rank) {
  return (kind != Coll::Broadcast && kind != Coll::Scatter) || rank == a.root;
}
bool sharesRecv(Coll kind, const Args& a, int rank) {
  return kind == Coll::AllReduce || (kind == Coll::Reduce && rank == a.root);
}

// The extent of this rank's input in bytes (what its peers may read of it).
size_t inputBytes(Coll kind, const Args& a, size_t n) {
  if (a.counts) {
    const auto& v = *a.counts;  // send counts, send displacements, receive counts, receive displacements
    size_t end = 0;
    for (size_t p = 0; p < n; ++p) end = std::max(end, v[n + p] + v[p]);
    return end * a.elem;
  }
  const bool blocks = kind == Coll::ReduceScatter || kind == Coll::AllToAll || kind == Coll::Scatter;
  return (blocks ? n : 1) * a.count * a.elem;
}

// The operation on one rank with no peers: copies.
void runAlone(device::DeviceRuntime& rt, const Args& a, device::StreamHandle work) {
  const size_t E = a.elem;
  if (a.counts) {
    const auto& v = *a.counts;  // n = 1: send count, send displacement, receive count, receive displacement
    rt.copyAsync(static_cast<uint8_t*>(a.recv) + v[3] * E, static_cast<const uint8_t*>(a.send) + v[1] * E, v[2] * E,
                 work);
    return;
  }
  if (a.send != a.recv && a.count > 0) rt.copyAsync(a.recv, a.send, a.count * E, work);
}

// One collective's work through CUDA IPC once every rank's buffers are mapped: what each kind
// reads and writes, each step ended by draining the device work and a barrier on the arena.
struct IpcWork {
  device::DeviceRuntime& rt;
  Context& ctx;
  const LocalArena& ar;
  const Args& a;
  const std::vector<DeviceRecord>& recs;
  const std::vector<const uint8_t*>& sendOf;  // every rank's input, mapped here
  const std::vector<uint8_t*>& recvOf;        // every rank's shared output, mapped here
  uint8_t* out;                               // this rank's output (or its bounce)
  device::StreamHandle work;
  FunctionRef<void()> drain;
  const std::string& label;
  uint64_t step;
  const size_t N, ME, E;

  void endStep() {
    drain();
    barrier(ctx, ar, ++step);
  }
  // dst[i] = op over every rank's input at `offset` (reproducible mode: along the canonical tree).
  void reduceInto(void* dst, size_t offset, size_t count) {
    std::vector<const void*> srcs(N);
    for (size_t p = 0; p < N; ++p) srcs[p] = sendOf[p] + offset * E;
    const int n = static_cast<int>(N);
    if (isInReproducibleMode(ctx.signature())) {
      rt.reduceCanonicalAsync(dst, srcs.data(), n, count, a.type, a.op, work);
    } else {
      rt.reduceAsync(dst, srcs.data(), n, count, a.type, a.op, a.op == ReduceOp::Avg ? n : 1, work);
    }
  }
  // All-reduce and reduce: each rank reduces its slice into its output (the root's, for reduce);
  // an all-reduce then copies the other slices from their owners.
  void reduceSlices(bool all) {
    const auto slices = planSegments(a.count, static_cast<int>(N));
    const Segment& s = slices[ME];
    uint8_t* dst = all ? out : recvOf[static_cast<size_t>(a.root)];
    if (s.count > 0) reduceInto(dst + s.offset * E, s.offset, s.count);
    endStep();
    if (!all) return;
    gatherSlices(rt, out, recvOf, slices, ME, E, work);
    endStep();
  }
  // Copies block p of the output from `from(p)` for each rank p (skipped where it is in place).
  template <typename From>
  void copyBlocks(From from) {
    const size_t block = a.count * E;
    for (size_t p = 0; p < N; ++p)
      if (from(p) != out + p * block) rt.copyAsync(out + p * block, from(p), block, work);
  }
  void copyOne(const uint8_t* from) {
    if (from != out) rt.copyAsync(out, from, a.count * E, work);
  }
  // All-to-all with counts per peer: each rank's count for this one must be what this one expects.
  void allToAllv() {
    const auto& v = *a.counts;
    for (size_t p = 0; p < N; ++p) {
      const DeviceRecord& r = recs[p];
      const uint64_t theirCount = r.counts[ME], theirDispl = r.counts[N + ME];
      if (r.nCounts != N || theirCount != v[2 * N + p]) {
        failDeviceCall(
            ctx, Status::error(ErrorCode::InvalidUsage,
                               strFormat("%s: rank %zu sends this rank %llu elements, but this rank "
                                         "expects %zu from it: the ranks' counts do not match",
                                         label.c_str(), p, static_cast<unsigned long long>(theirCount), v[2 * N + p]),
                               static_cast<int>(p), ctx.seq()));
      }
      if (theirCount > 0) rt.copyAsync(out + v[3 * N + p] * E, sendOf[p] + theirDispl * E, theirCount * E, work);
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
        reduceInto(out, ME * a.count, a.count);
        break;
      case Coll::Broadcast:
        copyOne(sendOf[root]);
        break;
      case Coll::AllGather:
        copyBlocks([&](size_t p) { return sendOf[p]; });
        break;
      case Coll::Gather:  // the root copies each rank's block from its input
        if (ME == root) copyBlocks([&](size_t p) { return sendOf[p]; });
        break;
      case Coll::Scatter:  // each rank copies its block from the root's input
        copyOne(sendOf[root] + ME * block);
        break;
      case Coll::AllToAll:
        if (a.counts) {
          allToAllv();
        } else {
          for (size_t p = 0; p < N; ++p) rt.copyAsync(out + p * block, sendOf[p] + ME * block, block, work);
        }
        break;
      case Coll::Barrier:  // host only: takes no buffers
        break;
    }
    endStep();
  }
};

// This rank's record of the call: its buffers shared (an in-place all-to-all's input copied first,
// as the peers read it while this rank overwrites it), its counts per peer. Returns the bounce
// of its output, where the output cannot be shared in place.
uint8_t* shareBuffers(DeviceState& st, Coll kind, const Args& a, int me, size_t N, device::StreamHandle work,
                      FunctionRef<void()> drain, DeviceRecord* mine) {
  auto share = [&](const void* p, size_t bytes, int slot, bool in, uint64_t* ptr, device::IpcHandle* h) {
    return shareDeviceBuffer(st, p, bytes, slot, in, work, drain, ptr, h);
  };
  const size_t E = a.elem;
  const void* input = a.send;
  if (kind == Coll::AllToAll && a.send == a.recv) {
    uint8_t* copy = st.deviceScratch(0, N * a.count * E);
    st.rt().copyAsync(copy, a.send, N * a.count * E, work);
    drain();
    input = copy;
  }
  if (sharesSend(kind, a, me)) share(input, inputBytes(kind, a, N), 0, true, &mine->sendPtr, &mine->send);
  uint8_t* bounce = nullptr;
  if (sharesRecv(kind, a, me)) bounce = share(a.recv, a.count * E, 1, false, &mine->recvPtr, &mine->recv);
  if (a.counts) {
    mine->nCounts = static_cast<uint32_t>(N);
    for (size_t p = 0; p < N; ++p) {
      mine->counts[p] = (*a.counts)[p];
      mine->counts[N + p] = (*a.counts)[N + p];
    }
  }
  return bounce;
}

void runIpc(detail::CommImpl& comm, Coll kind, const Args& a, uint64_t sig, int64_t seq, DeviceState& st) {
  device::DeviceRuntime& rt = st.rt();
  comm.diagnostics().enterCall(seq, sig, kAlgo);
  Context ctx(comm, seq, collName(kind), kAlgo, sig);
  const int n = comm.size(), me = comm.rank();
  const auto N = static_cast<size_t>(n), ME = static_cast<size_t>(me);
  device::StreamHandle work = st.streams(a.device).d2h;
  const std::string label = strFormat("%s #%lld (%s)", collName(kind), static_cast<long long>(seq), kAlgo);
  auto drain = [&] { drainStream(rt, work, comm, (label + ": the device work").c_str()); };

  if (n == 1) {
    runAlone(rt, a, work);
    drain();
    return;
  }
  if (!a.counts && a.count == 0) return;  // the count is in the signature: every rank skips alike

  try {
    const LocalArena& ar = *comm.arena();
    // 1. This rank's record; barrier.
    DeviceRecord mine;
    mine.seq = static_cast<uint64_t>(seq);
    mine.sig = sig;
    mine.bytes = a.count * a.elem;
    mine.proc = cuda_ipc::thisProcess();
    mine.device = a.device;
    uint8_t* bounce = shareBuffers(st, kind, a, me, N, work, drain, &mine);
    uint64_t step = ar.steps[ME]->load(std::memory_order_relaxed);
    // 2. The peers' records (the same call?), their buffers mapped.
    const std::vector<DeviceRecord> recs = exchangeRecords(ctx, ar, mine, &step, label);
    std::vector<const uint8_t*> sendOf(N);
    std::vector<uint8_t*> recvOf(N);
    for (size_t p = 0; p < N; ++p) {
      sendOf[p] = peerDeviceBuffer(comm, rt, mine, recs[p], p == ME, recs[p].sendPtr, recs[p].send, a.device);
      recvOf[p] = peerDeviceBuffer(comm, rt, mine, recs[p], p == ME, recs[p].recvPtr, recs[p].recv, a.device);
    }
    // 3. The work.
    uint8_t* out = bounce != nullptr ? bounce : static_cast<uint8_t*>(a.recv);
    IpcWork{rt, ctx, ar, a, recs, sendOf, recvOf, out, work, drain, label, step, N, ME, a.elem}.run(kind);
    // After the last barrier no peer touches the bounce any more.
    if (bounce != nullptr) {
      rt.copyAsync(a.recv, bounce, a.count * a.elem, work);
      drain();
    }
  } catch (const Error&) {
    // A rank that gives up mid-exchange must not leave its peers waiting at a barrier.
    failCommunicatorWithCurrent(comm, label);
    throw;
  }
}

}  // namespace

bool deviceIpcUsable(const detail::CommImpl& c, Coll kind, bool varCounts) {
  (void)kind;
  if (c.size() == 1) return true;
  if (varCounts && c.size() > kIpcMaxAllToAllvRanks) return false;
  const LocalArena* ar = c.arena();
  if (c.ipcCache() == nullptr || ar == nullptr || static_cast<int>(ar->ranks.size()) != c.size() ||
      static_cast<int>(ar->deviceRecords.size()) != c.size())
    return false;
  for (int r = 0; r < c.size(); ++r)
    if (r != c.rank() && !c.link(r).deviceMemory) return false;
  return true;
}

Work launchOnDeviceIpc(detail::CommImpl& c, Coll kind, const Args& a, void* stream, uint64_t sig) {
  device::DeviceRuntime* rt = device::runtime();
  if (rt == nullptr) LOOM_THROW(ErrorCode::Internal, c.rank(), "device collective without a device runtime");
  rejectCapture(*rt, stream, c, collName(kind));
  rt->prepare(a.device);
  std::shared_ptr<DeviceState> st = stateOf(c, *rt);
  device::EventHandle ready = rt->recordEvent(stream);
  auto body = [&c, st, kind, a, sig, ready](int64_t seq) {
    awaitInput(st->rt(), ready, a.device, c,
               strFormat("the work queued on the stream before %s #%lld", collName(kind), static_cast<long long>(seq)));
    runIpc(c, kind, a, sig, seq, *st);
  };
  return holdStream(*rt, st, stream, ready, [&] { return c.submit(collName(kind), body, sig); });
}

}  // namespace detail
}  // namespace loom
