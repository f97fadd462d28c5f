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
bool sharesSend(Coll kind, const Args& a, int rank) { return kind != Coll::Broadcast || rank == a.root; }
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
  const bool blocks = kind == Coll::ReduceScatter || kind == Coll::AllToAll;
  return (blocks ? n : 1) * a.count * a.elem;
}

// The operation on one rank with no peers: copies.
void runAlone(device::DeviceRuntime& rt, Coll kind, const Args& a, device::StreamHandle work) {
  const size_t E = a.elem;
  if (a.counts) {
    const auto& v = *a.counts;  // n = 1: send count, send displacement, receive count, receive displacement
    rt.copyAsync(static_cast<uint8_t*>(a.recv) + v[3] * E, static_cast<const uint8_t*>(a.send) + v[1] * E, v[2] * E,
                 work);
    return;
  }
  (void)kind;
  if (a.send != a.recv && a.count > 0) rt.copyAsync(a.recv, a.send, a.count * E, work);
}

void runIpc(detail::CommImpl& comm, Coll kind, const Args& a, uint64_t sig, int64_t seq, DeviceState& st) {
  device::DeviceRuntime& rt = st.rt();
  comm.diagnostics().enterCall(seq, sig, kAlgo);
  Context ctx(comm, seq, collName(kind), kAlgo, sig);
  const int n = comm.size(), me = comm.rank();
  const auto N = static_cast<size_t>(n), ME = static_cast<size_t>(me);
  const size_t E = a.elem;
  device::StreamHandle work = st.streams(a.device).d2h;
  const std::string label = strFormat("%s #%lld (%s)", collName(kind), static_cast<long long>(seq), kAlgo);
  auto drain = [&] { drainStream(rt, work, comm, (label + ": the device work").c_str()); };

  if (n == 1) {
    runAlone(rt, kind, a, work);
    drain();
    return;
  }
  if (!a.counts && a.count == 0) return;  // the count is in the signature: every rank skips alike

  try {
    const shm::LocalArena& ar = *comm.arena();
    // 1. This rank's record; barrier.
    DeviceRecord mine;
    mine.seq = static_cast<uint64_t>(seq);
    mine.sig = sig;
    mine.bytes = a.count * E;
    mine.proc = cuda_ipc::thisProcess();
    mine.device = a.device;
    auto share = [&](const void* p, size_t bytes, int slot, bool in, uint64_t* ptr, device::IpcHandle* h) {
      return shareDeviceBuffer(st, p, bytes, slot, in, work, drain, ptr, h);
    };
    const void* input = a.send;
    if (kind == Coll::AllToAll && a.send == a.recv) {
      // In place: the peers read this rank's blocks while it overwrites them; they read a copy.
      uint8_t* copy = st.deviceScratch(0, N * a.count * E);
      rt.copyAsync(copy, a.send, N * a.count * E, work);
      drain();
      input = copy;
    }
    if (sharesSend(kind, a, me)) share(input, inputBytes(kind, a, N), 0, true, &mine.sendPtr, &mine.send);
    uint8_t* outBounce = nullptr;
    if (sharesRecv(kind, a, me)) outBounce = share(a.recv, a.count * E, 1, false, &mine.recvPtr, &mine.recv);
    if (a.counts) {
      mine.nCounts = static_cast<uint32_t>(N);
      for (size_t p = 0; p < N; ++p) {
        mine.counts[p] = (*a.counts)[p];
        mine.counts[N + p] = (*a.counts)[N + p];
      }
    }
    uint64_t step = ar.steps[ME]->load(std::memory_order_relaxed);
    // 2. The peers' records (the same call?), their buffers mapped.
    const std::vector<DeviceRecord> recs = exchangeRecords(ctx, ar, mine, &step, label);
    auto resolve = [&](size_t p, uint64_t ptr, const device::IpcHandle& h) {
      return peerDeviceBuffer(comm, rt, mine, recs[p], p == ME, ptr, h, a.device);
    };
    std::vector<const uint8_t*> sendOf(N);
    std::vector<uint8_t*> recvOf(N);
    for (size_t p = 0; p < N; ++p) {
      sendOf[p] = resolve(p, recs[p].sendPtr, recs[p].send);
      recvOf[p] = resolve(p, recs[p].recvPtr, recs[p].recv);
    }
    auto* out = outBounce != nullptr ? outBounce : static_cast<uint8_t*>(a.recv);
    const int divisor = a.op == ReduceOp::Avg ? n : 1;
    std::vector<const void*> srcs(N);
    // Reproducible mode: every input of a slice at once along the canonical tree, the CPU's bits.
    const bool canonical = isInReproducibleMode(sig);
    auto reduceInto = [&](void* dst, size_t count) {
      if (canonical) {
        rt.reduceCanonicalAsync(dst, srcs.data(), n, count, a.type, a.op, work);
      } else {
        rt.reduceAsync(dst, srcs.data(), n, count, a.type, a.op, divisor, work);
      }
    };

    // 3. The work.
    switch (kind) {
      case Coll::AllReduce:
      case Coll::Reduce: {
        const auto slices = planSegments(a.count, n);
        const Segment& s = slices[ME];
        uint8_t* dst = kind == Coll::AllReduce ? out : recvOf[static_cast<size_t>(a.root)];
        if (s.count > 0) {
          for (size_t p = 0; p < N; ++p) srcs[p] = sendOf[p] + s.offset * E;
          reduceInto(dst + s.offset * E, s.count);
        }
        drain();
        barrier(ctx, ar, ++step);
        if (kind == Coll::AllReduce) {
          gatherSlices(rt, out, recvOf, slices, ME, E, work);
          drain();
          barrier(ctx, ar, ++step);
        }
        break;
      }
      case Coll::ReduceScatter: {
        for (size_t p = 0; p < N; ++p) srcs[p] = sendOf[p] + ME * a.count * E;
        reduceInto(out, a.count);
        drain();
        barrier(ctx, ar, ++step);
        break;
      }
      case Coll::Broadcast: {
        const uint8_t* from = sendOf[static_cast<size_t>(a.root)];
        if (from != out) rt.copyAsync(out, from, a.count * E, work);
        drain();
        barrier(ctx, ar, ++step);
        break;
      }
      case Coll::AllGather: {
        const size_t block = a.count * E;
        for (size_t p = 0; p < N; ++p)
          if (sendOf[p] != out + p * block) rt.copyAsync(out + p * block, sendOf[p], block, work);
        drain();
        barrier(ctx, ar, ++step);
        break;
      }
      case Coll::AllToAll: {
        if (!a.counts) {
          const size_t block = a.count * E;
          for (size_t p = 0; p < N; ++p) rt.copyAsync(out + p * block, sendOf[p] + ME * block, block, work);
        } else {
          const auto& v = *a.counts;
          for (size_t p = 0; p < N; ++p) {
            const DeviceRecord& r = recs[p];
            const uint64_t theirCount = r.counts[ME], theirDispl = r.counts[N + ME];
            if (r.nCounts != N || theirCount != v[2 * N + p]) {
              failDeviceCall(
                  ctx,
                  Status::error(ErrorCode::InvalidUsage,
                                strFormat("%s: rank %zu sends this rank %llu elements, but this rank expects "
                                          "%zu from it: the ranks' counts do not match",
                                          label.c_str(), p, static_cast<unsigned long long>(theirCount), v[2 * N + p]),
                                static_cast<int>(p), seq));
            }
            if (theirCount > 0) rt.copyAsync(out + v[3 * N + p] * E, sendOf[p] + theirDispl * E, theirCount * E, work);
          }
        }
        drain();
        barrier(ctx, ar, ++step);
        break;
      }
    }
    // After the last barrier no peer touches the bounce any more.
    if (outBounce != nullptr) {
      rt.copyAsync(a.recv, outBounce, a.count * E, work);
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
  const shm::LocalArena* ar = c.arena();
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
