// The point-to-point entry points of Communicator: single sends and receives, and groups of them
// posted together; on host buffers straight to the transports, on device buffers through the
// stream-ordered staging path (comm/device_staging.hpp).
#include <atomic>

#include "comm/comm_impl.hpp"
#include "comm/device_p2p.hpp"
#include "comm/device_staging.hpp"
#include "core/format.hpp"

namespace loom {
namespace {

detail::CommImpl& live(const Communicator& c) {
  if (c.impl() == nullptr) LOOM_THROW(ErrorCode::InvalidUsage, -1, "the communicator was moved from");
  return *c.impl();
}

void checkNotSelf(const detail::CommImpl& c, int peer, const char* what) {
  if (peer == c.rank()) {
    LOOM_THROW(
        ErrorCode::InvalidUsage, c.rank(),
        strFormat("a blocking %s to this rank itself can never complete: use isend/irecv (or a group in C)", what));
  }
}

// Where one op's buffer is (-1: host), checked like a collective's.
int locate(const detail::CommImpl& c, const PointToPoint& op, void* stream) {
  const size_t bytes = c.checkBuffer(op.buf, op.count, op.type, op.send ? "send" : "recv");
  return detail::locateBuffers(c, {bytes ? op.buf : nullptr}, stream, op.send ? "send" : "recv");
}

// One Work for several requests: done when all are, failed with the first failure; its bytes are
// those the receives (isRecv) got.
RequestPtr allOf(detail::CommImpl& c, const std::vector<RequestPtr>& parts, const std::vector<bool>& isRecv) {
  auto all = std::make_shared<detail::Request>(c.rank(), -1, strFormat("group of %zu sends and receives", parts.size()),
                                               c.timeout(), c.failureState(), c.progressHook());
  if (parts.empty()) {
    all->complete(0);
    return all;
  }
  auto left = std::make_shared<std::atomic<size_t>>(parts.size());
  auto received = std::make_shared<std::atomic<size_t>>(0);
  for (size_t i = 0; i < parts.size(); ++i) {
    detail::Request* r = parts[i].get();  // alive while it runs its own callback
    const bool recv = isRecv[i];
    r->onDone([all, left, received, r, recv](const Status& s) {
      if (!s.ok) all->fail(s);
      if (recv) received->fetch_add(r->bytes());
      if (left->fetch_sub(1) == 1) all->complete(received->load());
    });
  }
  return all;
}

}  // namespace

Work Communicator::igroup(const std::vector<PointToPoint>& ops, void* stream) {
  auto& c = live(*this);
  c.checkOk("grouped send/recv");
  int dev = -2;
  for (const auto& op : ops) {
    if (op.send || op.peer != kAnySource) c.checkPeer(op.peer, op.send ? "send" : "recv");
    const int d = locate(c, op, stream);
    if (dev != -2 && d != dev) {
      LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
                 "group of sends and receives: a mix of host and device buffers; pass all host or all device buffers");
    }
    dev = d;
  }
  if (dev >= 0) return detail::launchPointToPointOnDevice(c, ops, dev, stream);
  // Receives first, then sends: every receive is posted before a large send needs it.
  std::vector<RequestPtr> parts;
  std::vector<bool> isRecv;
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& op : ops) {
      if (op.send != (pass == 1)) continue;
      parts.push_back(op.send ? c.isend(op.buf, op.count, op.type, op.peer, op.tag)
                              : c.irecv(op.buf, op.count, op.type, op.peer, op.tag));
      isRecv.push_back(!op.send);
    }
  return Work(allOf(c, parts, isRecv));
}

Work Communicator::isend(const void* buf, size_t count, DataType type, int peer, uint32_t tag, void* stream) {
  auto& c = live(*this);
  PointToPoint op{true, const_cast<void*>(buf), count, type, peer, tag};
  if (stream != nullptr || (c.checkBuffer(buf, count, type, "send") > 0 && locate(c, op, stream) >= 0))
    return igroup({op}, stream);
  return Work(c.isend(buf, count, type, peer, tag));
}
Work Communicator::irecv(void* buf, size_t count, DataType type, int peer, uint32_t tag, void* stream) {
  auto& c = live(*this);
  PointToPoint op{false, buf, count, type, peer, tag};
  if (stream != nullptr || (c.checkBuffer(buf, count, type, "recv") > 0 && locate(c, op, stream) >= 0))
    return igroup({op}, stream);
  return Work(c.irecv(buf, count, type, peer, tag));
}

// A blocking send or receive is attended: this thread waits on it at once and drives it. On
// device buffers it returns once queued on the stream, as the collectives do.
void Communicator::send(const void* buf, size_t count, DataType type, int peer, uint32_t tag, void* stream) {
  auto& c = live(*this);
  checkNotSelf(c, peer, "send");
  PointToPoint op{true, const_cast<void*>(buf), count, type, peer, tag};
  if (stream != nullptr || (c.checkBuffer(buf, count, type, "send") > 0 && locate(c, op, stream) >= 0)) {
    igroup({op}, stream);
    return;
  }
  detail::AttendScope attend(c.progressHook());
  Work(c.isend(buf, count, type, peer, tag)).wait();
}
void Communicator::recv(void* buf, size_t count, DataType type, int peer, uint32_t tag, void* stream) {
  auto& c = live(*this);
  checkNotSelf(c, peer, "recv");
  PointToPoint op{false, buf, count, type, peer, tag};
  if (stream != nullptr || (c.checkBuffer(buf, count, type, "recv") > 0 && locate(c, op, stream) >= 0)) {
    igroup({op}, stream);
    return;
  }
  detail::AttendScope attend(c.progressHook());
  Work(c.irecv(buf, count, type, peer, tag)).wait();
}

}  // namespace loom
