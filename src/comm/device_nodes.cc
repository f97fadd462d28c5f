// Node-aware all-reduce on device buffers (see device_nodes.hpp).
#include "comm/device_nodes.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "collectives/arena_sync.hpp"
#include "collectives/plan.hpp"
#include "comm/device_record.hpp"
#include "comm/device_staging.hpp"
#include "comm/device_state.hpp"
#include "core/format.hpp"
#include "device/runtime.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {
namespace {

constexpr const char* kAlgo = "cuda_ipc+net";

// Elements of one chunk of the step across nodes: what one pinned slot holds.
size_t chunkElems(size_t elem) { return std::max<size_t>(1, deviceStagingBytes() / elem); }

// Chunks of the step across nodes: of the largest slice, so that every rank reserves as many
// sequence numbers (the slices of one column are alike; the others' may be one element shorter).
size_t chunksOf(const detail::CommImpl& c, const Args& a) {
  const size_t slice = (a.count + static_cast<size_t>(c.localSize()) - 1) / static_cast<size_t>(c.localSize());
  return std::max<size_t>(1, (slice + chunkElems(a.elem) - 1) / chunkElems(a.elem));
}

void runAcrossNodes(detail::CommImpl& comm, const Args& a, uint64_t sig, int64_t seq, DeviceState& st) {
  device::DeviceRuntime& rt = st.rt();
  comm.diagnostics().enterCall(seq, sig, kAlgo);
  Context ctx(comm, seq, "all_reduce", kAlgo, sig);
  const std::string label = strFormat("all_reduce #%lld (%s)", static_cast<long long>(seq), kAlgo);
  const size_t E = a.elem;
  device::StreamHandle work = st.streams(a.device).d2h;
  auto drain = [&] { drainStream(rt, work, comm, (label + ": the device work").c_str()); };
  if (a.count == 0) return;  // the count is in the signature: every rank skips alike
  try {
    const LocalArena& ar = *comm.arena();
    const auto L = ar.ranks.size(), ME = static_cast<size_t>(ar.me);
    // Within the node: the records, every local input and output shared.
    DeviceRecord mine;
    mine.seq = static_cast<uint64_t>(seq);
    mine.sig = sig;
    mine.bytes = a.count * E;
    mine.proc = cuda_ipc::thisProcess();
    mine.device = a.device;
    shareDeviceBuffer(st, a.send, a.count * E, 0, true, work, drain, &mine.sendPtr, &mine.send);
    uint8_t* outBounce = shareDeviceBuffer(st, a.recv, a.count * E, 1, false, work, drain, &mine.recvPtr, &mine.recv);
    uint64_t step = ar.steps[ME]->load(std::memory_order_relaxed);
    const std::vector<DeviceRecord> recs = exchangeRecords(ctx, ar, mine, &step, label);
    std::vector<const void*> inputs(L);
    std::vector<uint8_t*> outputs(L);
    for (size_t p = 0; p < L; ++p) {
      inputs[p] = peerDeviceBuffer(comm, rt, mine, recs[p], p == ME, recs[p].sendPtr, recs[p].send, a.device);
      outputs[p] = peerDeviceBuffer(comm, rt, mine, recs[p], p == ME, recs[p].recvPtr, recs[p].recv, a.device);
    }
    uint8_t* out = outBounce != nullptr ? outBounce : static_cast<uint8_t*>(a.recv);
    const std::vector<Segment> slices = planSegments(a.count, static_cast<int>(L));
    const Segment& s = slices[ME];

    // 1. This rank's slice, summed over the node.
    const ReduceOp op = a.op == ReduceOp::Avg ? ReduceOp::Sum : a.op;
    if (s.count > 0) {
      std::vector<const void*> srcs(L);
      for (size_t p = 0; p < L; ++p) srcs[p] = static_cast<const uint8_t*>(inputs[p]) + s.offset * E;
      rt.reduceAsync(out + s.offset * E, srcs.data(), static_cast<int>(L), s.count, a.type, op, 1, work);
    }
    drain();
    barrier(ctx, ar, ++step);

    // 2. The slice across nodes, by the ranks of this local index, chunk by chunk through a pinned slot.
    std::vector<int> column;
    const int l = static_cast<int>(ME);
    for (int k = 0; k < comm.nodeCount(); ++k) column.push_back(comm.ranksOnNode(k)[static_cast<size_t>(l)]);
    const size_t per = chunkElems(E);
    const DeviceState::Streams& cs = st.streams(a.device);
    for (size_t done = 0, k = 0; done < s.count; done += per, ++k) {
      const size_t n = std::min(per, s.count - done);
      uint8_t* h = st.slot(0, n * E);
      uint8_t* d = out + (s.offset + done) * E;
      rt.copyAsync(h, d, n * E, cs.d2h);
      drainStream(rt, cs.d2h, comm, (label + ": a copy to host memory").c_str());
      Context chunk(comm, seq + 1 + static_cast<int64_t>(k), "all_reduce", kAlgo, sig);
      Args across = a;
      across.send = across.recv = h;
      across.count = n;
      across.op = op;
      across.device = -1;
      allReduceAcrossNodes(chunk, column, across);
      if (a.op == ReduceOp::Avg) kernels::divide(h, n, a.type, comm.size());
      rt.copyAsync(d, h, n * E, cs.h2d);
      drainStream(rt, cs.h2d, comm, (label + ": a copy to the device").c_str());
    }
    barrier(ctx, ar, ++step);

    // 3. The other slices, from their owners.
    gatherSlices(rt, out, outputs, slices, ME, E, work);
    drain();
    barrier(ctx, ar, ++step);
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

bool deviceNodesUsable(const detail::CommImpl& c, Coll kind) {
  if (kind != Coll::AllReduce || c.nodeCount() < 2) return false;
  const int L = c.localSize();
  if (L < 2) return false;
  for (int k = 0; k < c.nodeCount(); ++k)
    if (static_cast<int>(c.ranksOnNode(k).size()) != L) return false;
  const LocalArena* ar = c.arena();
  if (c.ipcCache() == nullptr || ar == nullptr || ar->ranks != c.ranksOnNode(c.nodeOf(c.rank())) ||
      static_cast<int>(ar->deviceRecords.size()) != L)
    return false;
  for (int r : ar->ranks)
    if (r != c.rank() && !c.link(r).deviceMemory) return false;
  return true;
}

Work launchAcrossNodesOnDevice(detail::CommImpl& c, const Args& a, void* stream, uint64_t sig) {
  device::DeviceRuntime* rt = device::runtime();
  if (rt == nullptr) LOOM_THROW(ErrorCode::Internal, c.rank(), "device collective without a device runtime");
  rejectCapture(*rt, stream, c, "all_reduce");
  rt->prepare(a.device);
  std::shared_ptr<DeviceState> st = stateOf(c, *rt);
  device::EventHandle ready = rt->recordEvent(stream);
  auto body = [&c, st, a, sig, ready](int64_t seq) {
    awaitInput(st->rt(), ready, a.device, c,
               strFormat("the work queued on the stream before all_reduce #%lld", static_cast<long long>(seq)));
    runAcrossNodes(c, a, sig, seq, *st);
  };
  // One sequence number for the exchange within the node, one per chunk across nodes.
  const auto seqs = static_cast<int64_t>(1 + chunksOf(c, a));
  return holdStream(*rt, st, stream, ready, [&] { return c.submit("all_reduce", body, sig, seqs); });
}

}  // namespace coll
}  // namespace loom
