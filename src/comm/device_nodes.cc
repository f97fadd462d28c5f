// Node-aware collectives on device buffers (see device_nodes.hpp).
#include "comm/device_nodes.hpp"

#include <string>
#include <vector>

#include "collectives/device_nodes.hpp"
#include "comm/device_record.hpp"
#include "comm/device_staging.hpp"
#include "comm/device_state.hpp"
#include "core/format.hpp"
#include "device/runtime.hpp"

namespace loom {
namespace detail {

using coll::Args;
using coll::Coll;
using coll::collName;
using coll::Context;
namespace {

constexpr const char* kAlgo = "cuda_ipc+net";

// The communicator's part of one call (collectives/device_nodes.hpp): this rank's record in the
// node's arena, its buffers exported, the peers' mapped, the pinned slot, the streams.
class NodeMemory : public coll::NodeDeviceMemory {
 public:
  NodeMemory(detail::CommImpl& c, DeviceState& s, const Context& ctx, const Args& a, std::string label)
      : comm_(c), st_(s), ctx_(ctx), ar_(*c.arena()), dev_(a.device), label_(std::move(label)) {
    mine_.seq = static_cast<uint64_t>(ctx.seq());
    mine_.sig = ctx.signature();
    mine_.bytes = a.count * a.elem;
    mine_.proc = cuda_ipc::thisProcess();
    mine_.device = a.device;
  }
  const std::string& label() const { return label_; }

  uint8_t* share(const void* p, size_t bytes, int slot, bool input, Buffer which) override {
    const bool send = which == Buffer::Send;
    return shareDeviceBuffer(
        st_, p, bytes, slot, input, work(), [this] { drain(work(), "the device work"); },
        send ? &mine_.sendPtr : &mine_.recvPtr, send ? &mine_.send : &mine_.recv);
  }
  void exchange(uint64_t* step) override { recs_ = exchangeRecords(ctx_, ar_, mine_, step, label_); }
  uint8_t* peer(size_t p, Buffer which) override {
    const DeviceRecord& r = recs_.at(p);
    const bool send = which == Buffer::Send;
    return peerDeviceBuffer(comm_, st_.rt(), mine_, r, p == static_cast<size_t>(ar_.me), send ? r.sendPtr : r.recvPtr,
                            send ? r.send : r.recv, dev_);
  }
  uint8_t* hostSlot(size_t bytes) override { return st_.slot(0, bytes); }
  uint8_t* deviceScratch(int slot, size_t bytes) override { return st_.deviceScratch(slot, bytes); }
  device::StreamHandle toHost() override { return st_.streams(dev_).d2h; }
  device::StreamHandle toDevice() override { return st_.streams(dev_).h2d; }
  // The kernels run on the device-to-host stream, as the single-node path's do.
  device::StreamHandle work() override { return st_.streams(dev_).d2h; }
  void drain(device::StreamHandle s, const std::string& what) override {
    drainStream(st_.rt(), s, comm_, (label_ + ": " + what).c_str());
  }

 private:
  detail::CommImpl& comm_;
  DeviceState& st_;
  const Context& ctx_;
  const LocalArena& ar_;
  const int dev_;
  const std::string label_;
  DeviceRecord mine_;
  std::vector<DeviceRecord> recs_;
};

void run(detail::CommImpl& comm, Coll kind, const Args& a, uint64_t sig, int64_t seq, DeviceState& st) {
  comm.diagnostics().enterCall(seq, sig, kAlgo);
  if (a.count == 0) return;  // the count is in the signature: every rank skips alike
  Context ctx(comm, seq, collName(kind), kAlgo, sig);
  NodeMemory mem(comm, st, ctx, a, strFormat("%s #%lld (%s)", collName(kind), static_cast<long long>(seq), kAlgo));
  try {
    coll::runDeviceNodes(ctx, comm, *comm.arena(), kind, a, st.rt(), mem, deviceStagingBytes());
  } catch (const Error&) {
    // A rank that gives up mid-exchange must not leave its peers waiting at a barrier.
    failCommunicatorWithCurrent(comm, mem.label());
    throw;
  }
}

}  // namespace

bool deviceNodesUsable(const detail::CommImpl& c, Coll kind) {
  if (kind == Coll::AllToAll || kind == Coll::Gather || kind == Coll::Scatter) return false;  // staged flat
  if (c.nodeCount() < 2) return false;
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

Work launchAcrossNodesOnDevice(detail::CommImpl& c, Coll kind, const Args& a, void* stream, uint64_t sig) {
  // One sequence number for the exchange within the node, one per chunk across nodes.
  const int64_t seqs = coll::deviceNodeSeqs(c, kind, a, deviceStagingBytes());
  return launchDeviceCall(c, kind, a.device, stream, sig, seqs,
                          [&c, kind, a, sig](int64_t seq, DeviceState& st) { run(c, kind, a, sig, seq, st); });
}

}  // namespace detail
}  // namespace loom
