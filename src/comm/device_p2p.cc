// Sends and receives on device buffers (see device_p2p.hpp).
#include "comm/device_p2p.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include "collectives/comm_view.hpp"
#include "comm/device_state.hpp"
#include "core/format.hpp"
#include "core/signature.hpp"
#include "device/runtime.hpp"
#include "transport/cuda_ipc/ipc_mem_cache.hpp"
#include "transport/matching.hpp"

namespace loom {
namespace detail {

using coll::p2pAckTag;
namespace {

constexpr uint64_t kMagic = 0x4c4f4f4d50325031ull;  // "LOOMP2P1"

// What a device send through CUDA IPC tells its receiver: where its bytes are.
struct Descriptor {
  uint64_t magic = kMagic;
  cuda_ipc::ProcessId proc;
  int32_t device = 0;   // the sender's GPU, as its process numbers them
  uint32_t ackTag = 0;  // where the receiver acknowledges
  uint64_t ptr = 0;     // the bytes as the sender's process sees them
  uint64_t bytes = 0;
  device::IpcHandle handle;
};

// The receiver's answer: that it has read the bytes, or refused them (with its buffer's size).
struct Ack {
  uint64_t refused = 0;
  uint64_t capacity = 0;
};

// ThreadSanitizer's view of a descriptor or an answer between ranks of one process: they go
// through a shared-memory ring each rank maps at its own address, where TSan sees no order, so the
// sender's writes to its buffer and the receiver's read of it look unordered. A read-modify-write
// of one word before each is sent and after it is received shows the order; nothing in other builds.
inline void tsanAnswerTick() {
#if defined(__SANITIZE_THREAD__)
  static std::atomic<uint64_t> clock{0};
  clock.fetch_add(1, std::memory_order_acq_rel);
#endif
}

enum class Way { Staged, Ipc, AnySource };

// One op's state through the body; addresses stay put (a vector sized once).
struct Op {
  Way way = Way::Staged;
  size_t bytes = 0;  // the user's: a send's size, a receive's capacity
  size_t at = 0;     // in the pinned slot (staged, any source)
  Descriptor desc;   // a send's own, a receive's peer's
  Ack ack;
  RequestPtr req, ackReq, ackSent;
  int source = -1;
  size_t received = 0;
};

detail::Label labelOf(const PointToPoint& op, const char* type) {
  detail::Label l;
  l.send = op.send;
  l.count = op.count;
  l.type = type;
  l.tag = op.tag;
  return l;
}

bool ipcLink(const detail::CommImpl& c, int peer) {
  return peer != kAnySource && peer != c.rank() && c.ipcCache() != nullptr && c.link(peer).deviceMemory;
}

// Where a descriptor's bytes are in this process: the pointer itself for a rank of this process,
// else the peer's allocation mapped (cached with the communicator).
const uint8_t* resolve(detail::CommImpl& c, device::DeviceRuntime& rt, const Descriptor& d, int dev) {
  if (d.proc == cuda_ipc::thisProcess()) {
    if (d.device != dev) rt.enablePeerAccess(d.device);
    return reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(d.ptr));
  }
  return static_cast<const uint8_t*>(c.ipcCache()->map(rt, d.proc, d.handle)) + d.handle.offset;
}

// The general case, on the op queue's thread, with `state` sized to `ops`: the sends staged (or
// exported), everything posted, the receives read, the senders answered, every op waited for.
struct OpsRun {
  detail::CommImpl& c;
  DeviceState& st;
  device::DeviceRuntime& rt;
  DeviceState::Streams& cs;
  const std::vector<PointToPoint>& ops;
  const int dev;
  std::vector<Op>& state;
  // The pinned slot's layout (64-byte aligned), and what goes through a device copy.
  uint8_t* h = nullptr;
  uint8_t* bounce = nullptr;
  std::vector<size_t> bounceAt;
  std::vector<bool> exportable;
  std::vector<device::IpcHandle> handles;
  std::vector<size_t> answers;  // the receives whose senders wait for an answer
  Status firstFailure;          // of the receives: every sender is answered first

  OpsRun(detail::CommImpl& comm, DeviceState& s, const std::vector<PointToPoint>& o, int device,
         std::vector<Op>& opState)
      : c(comm),
        st(s),
        rt(s.rt()),
        cs(s.streams(device)),
        ops(o),
        dev(device),
        state(opState),
        bounceAt(o.size(), SIZE_MAX),
        exportable(o.size(), true),
        handles(o.size()) {}

  size_t run(detail::Request& done) {
    layOut();
    post();
    for (size_t i = 0; i < ops.size(); ++i)
      if (!ops[i].send) receive(i);
    drainStream(rt, cs.d2h, c, "a device receive's copy from its sender's buffer");
    drainStream(rt, cs.h2d, c, "a staged copy to the device");
    answer();
    const size_t received = finish();
    if (ops.size() == 1 && !ops[0].send) done.setSource(state[0].source);
    return received;
  }

  // Each op's way, the slot's and the bounce's layout, and the sends' bytes copied there.
  void layOut() {
    size_t total = 0, bounceTotal = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      Op& s = state[i];
      s.bytes = ops[i].count * sizeOf(ops[i].type);
      s.way = ops[i].peer == kAnySource ? Way::AnySource : ipcLink(c, ops[i].peer) ? Way::Ipc : Way::Staged;
      if (s.way != Way::Ipc) {
        s.at = total;
        const size_t room = s.way == Way::AnySource ? std::max(s.bytes, sizeof(Descriptor)) : s.bytes;
        total += (room + 63) / 64 * 64;
      } else if (ops[i].send && s.bytes > 0) {
        try {
          handles[i] = rt.ipcExport(ops[i].buf);
        } catch (const Error& e) {
          if (e.code() != ErrorCode::Cuda) throw;
          exportable[i] = false;  // a stream-ordered pool's memory: sent from a device copy
          bounceAt[i] = bounceTotal;
          bounceTotal += (s.bytes + 255) / 256 * 256;
        }
      }
    }
    h = st.slot(0, total + 64);
    bounce = bounceTotal > 0 ? st.deviceScratch(0, bounceTotal) : nullptr;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!ops[i].send) continue;
      if (state[i].way == Way::Staged) rt.copyAsync(h + state[i].at, ops[i].buf, state[i].bytes, cs.d2h);
      if (!exportable[i]) rt.copyAsync(bounce + bounceAt[i], ops[i].buf, state[i].bytes, cs.d2h);
    }
    drainStream(rt, cs.d2h, c, "a copy of a device send");
  }

  // Receives first, then sends, as on host buffers.
  void post() {
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < ops.size(); ++i)
        if (ops[i].send == (pass == 1)) postOne(i);
  }
  void postOne(size_t i) {
    const PointToPoint& op = ops[i];
    Op& s = state[i];
    const detail::Label l = labelOf(op, toString(op.type));
    if (s.way == Way::Staged) {
      s.req = op.send ? c.isend(h + s.at, op.count, op.type, op.peer, op.tag)
                      : c.irecv(h + s.at, op.count, op.type, op.peer, op.tag);
    } else if (s.way == Way::AnySource) {
      s.req = c.postRecv(kAnySource, h + s.at, std::max(s.bytes, sizeof(Descriptor)), op.tag, l, kDeviceAnySourceRecv);
    } else if (!op.send) {
      s.req = c.postRecv(op.peer, &s.desc, sizeof(Descriptor), op.tag, l, kDeviceIpcMessage);
    } else {
      Descriptor& d = s.desc;
      d.proc = cuda_ipc::thisProcess();
      d.device = dev;
      d.bytes = s.bytes;
      d.ackTag = p2pAckTag(st.nextAckNumber());
      if (s.bytes > 0) {
        const void* from = exportable[i] ? op.buf : bounce + bounceAt[i];
        d.ptr = reinterpret_cast<uintptr_t>(from);
        d.handle = exportable[i] ? handles[i] : rt.ipcExport(from);
      }
      tsanAnswerTick();
      // The answer's receive before the descriptor goes: it cannot arrive unposted.
      s.ackReq = c.postRecv(op.peer, &s.ack, sizeof(Ack), d.ackTag, l, kDeviceIpcAck);
      s.req = c.postSend(op.peer, &d, sizeof(Descriptor), op.tag, l, kDeviceIpcMessage);
    }
  }

  // Receive i: reads the peer's bytes in place, or copies the staged ones back. A receive that
  // fails does not stop the others: every sender through CUDA IPC waits for its answer.
  void receive(size_t i) {
    const PointToPoint& op = ops[i];
    Op& s = state[i];
    try {
      s.req->wait();
    } catch (const Error&) {
      if (firstFailure.ok) firstFailure = statusFromCurrentException();
      return;
    }
    s.source = s.way == Way::AnySource ? s.req->source() : op.peer;
    tsanAnswerTick();
    const bool descriptor =
        s.way == Way::Ipc || (s.way == Way::AnySource && s.req->matchedSignature() == kDeviceIpcMessage);
    if (!descriptor) {
      s.received = s.req->bytes();
      if (s.received > s.bytes) {
        if (firstFailure.ok) firstFailure = truncationError(s.source, op.tag, s.received, s.bytes);
        return;
      }
      rt.copyAsync(op.buf, h + s.at, s.received, cs.h2d);
      return;
    }
    if (s.way == Way::AnySource) std::memcpy(&s.desc, h + s.at, sizeof(Descriptor));
    if (s.desc.magic != kMagic) {
      throw Status::error(ErrorCode::Internal,
                          strFormat("a device send's descriptor from rank %d is malformed", s.source), s.source)
          .toError(c.rank());
    }
    answers.push_back(i);
    if (s.desc.bytes > s.bytes) {
      // The sender hears why in its answer, and this receive fails.
      s.ack.refused = 1;
      s.ack.capacity = s.bytes;
      if (firstFailure.ok) firstFailure = truncationError(s.source, op.tag, s.desc.bytes, s.bytes);
      return;
    }
    s.received = s.desc.bytes;
    if (s.received > 0) rt.copyAsync(op.buf, resolve(c, rt, s.desc, dev), s.received, cs.d2h);
  }

  // The bytes are read (or refused): the senders may reuse their buffers. Then a receive's
  // failure is this call's.
  void answer() {
    if (!answers.empty()) tsanAnswerTick();
    for (size_t i : answers) {
      Op& s = state[i];
      s.ackSent = c.postSend(s.source, &s.ack, sizeof(Ack), s.desc.ackTag, labelOf(ops[i], toString(ops[i].type)),
                             kDeviceIpcAck);
    }
    if (firstFailure.ok) return;
    for (size_t i : answers) state[i].ackSent->wait();
    throw firstFailure.toError(c.rank());
  }

  // Every send and its answer, every answer sent; the bytes received.
  size_t finish() {
    size_t received = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      Op& s = state[i];
      if (!ops[i].send) {
        if (s.ackSent) s.ackSent->wait();
        received += s.received;
        continue;
      }
      s.req->wait();
      if (!s.ackReq) continue;
      s.ackReq->wait();
      tsanAnswerTick();
      if (s.ack.refused != 0)
        throw Status::error(
            ErrorCode::InvalidUsage,
            strFormat("message of %zu bytes to rank %d (tag %u) is larger than the receive buffer "
                      "rank %d posted (%llu bytes)",
                      s.bytes, ops[i].peer, ops[i].tag, ops[i].peer, static_cast<unsigned long long>(s.ack.capacity)),
            ops[i].peer)
            .toError(c.rank());
    }
    return received;
  }
};

}  // namespace

Work launchPointToPointOnDevice(detail::CommImpl& c, const std::vector<PointToPoint>& ops, int dev, void* stream) {
  device::DeviceRuntime* rt = device::runtime();
  if (rt == nullptr) LOOM_THROW(ErrorCode::Internal, c.rank(), "device send/recv without a device runtime");
  rejectCapture(*rt, stream, c, "send/recv");
  rt->prepare(dev);
  std::shared_ptr<DeviceState> st = stateOf(c, *rt);
  device::EventHandle ready = rt->recordEvent(stream);
  std::string what = ops.size() != 1 ? strFormat("device group of %zu sends and receives", ops.size())
                     : ops[0].peer == kAnySource
                         ? std::string("device recv from any rank")
                         : strFormat("device %s rank %d", ops[0].send ? "send to" : "recv from", ops[0].peer);
  // Where every peer's link takes device buffers (GPUDirect RDMA), they go to it as they are. A
  // receive from any source does not: which link its message comes by is known only then.
  bool direct = true;
  for (const auto& op : ops)
    direct = direct && op.peer != kAnySource && op.peer != c.rank() && c.link(op.peer).deviceBuffers;
  // A single receive reports its sender (for kAnySource, known once matched), as on host buffers.
  const bool single = ops.size() == 1 && !ops[0].send;
  if (direct) {
    auto inPlace = [&c, st, ops, dev, ready, single](detail::Request& done) {
      awaitInput(st->rt(), ready, dev, c, "the work queued on the stream before a device send/recv");
      std::vector<RequestPtr> reqs(ops.size());
      for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < ops.size(); ++i) {
          const PointToPoint& op = ops[i];
          if (op.send != (pass == 1)) continue;
          reqs[i] = op.send ? c.isend(op.buf, op.count, op.type, op.peer, op.tag)
                            : c.irecv(op.buf, op.count, op.type, op.peer, op.tag);
        }
      size_t received = 0;
      for (size_t i = 0; i < ops.size(); ++i) {
        reqs[i]->wait();
        if (!ops[i].send) received += reqs[i]->bytes();
      }
      if (single) done.setSource(reqs[0]->source());
      return received;
    };
    return holdStream(*rt, st, stream, ready, [&] { return c.submitUnnumbered(what, inPlace); });
  }
  auto body = [&c, st, ops, dev, ready](detail::Request& done) {
    awaitInput(st->rt(), ready, dev, c, "the work queued on the stream before a device send/recv");
    auto state = std::make_shared<std::vector<Op>>(ops.size());
    try {
      return OpsRun(c, *st, ops, dev, *state).run(done);
    } catch (...) {
      // Descriptors and answers are the buffers of messages still posted: they outlive them.
      for (const Op& s : *state)
        for (const RequestPtr& r : {s.req, s.ackReq, s.ackSent})
          if (r) r->onDone([state](const Status&) {});
      throw;
    }
  };
  return holdStream(*rt, st, stream, ready, [&] { return c.submitUnnumbered(what, body); });
}

}  // namespace detail
}  // namespace loom
