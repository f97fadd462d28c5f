// Collectives on device buffers through CUDA IPC (see device_ipc.hpp).
#include "comm/device_ipc.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/arena_sync.hpp"
#include "collectives/device_ipc.hpp"
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
    uint8_t* out = bounce != nullptr ? bounce : static_cast<uint8_t*>(a.recv);
    coll::DeviceIpcCall call{rt, work, drain, label, std::vector<const uint8_t*>(N), std::vector<uint8_t*>(N), out, {}};
    for (size_t p = 0; p < N; ++p) {
      call.sendOf[p] = peerDeviceBuffer(comm, rt, mine, recs[p], p == ME, recs[p].sendPtr, recs[p].send, a.device);
      call.recvOf[p] = peerDeviceBuffer(comm, rt, mine, recs[p], p == ME, recs[p].recvPtr, recs[p].recv, a.device);
      if (a.counts) call.counts.push_back(coll::PeerCounts{recs[p].nCounts, recs[p].counts});
    }
    // 3. The work (collectives/device_ipc.hpp).
    coll::runDeviceIpc(ctx, ar, kind, a, call, &step);
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
  return launchDeviceCall(c, kind, a.device, stream, sig, 1,
                          [&c, kind, a, sig](int64_t seq, DeviceState& st) { runIpc(c, kind, a, sig, seq, st); });
}

}  // namespace detail
}  // namespace loom
