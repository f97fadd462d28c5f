#include "transport/self_connection.hpp"

#include <cstring>

#include "core/format.hpp"

namespace loom {

void SelfConnection::match(const Op& send, const Op& recv, uint32_t tag) const {
  if (send.bytes > recv.bytes) {
    Status s = truncationError(peer_, tag, send.bytes, recv.bytes);
    send.req->fail(s);
    recv.req->fail(s);
    return;
  }
  if (send.bytes > 0) std::memmove(recv.buf, send.buf, send.bytes);
  send.req->complete(send.bytes);
  recv.req->complete(send.bytes);
}

void SelfConnection::isend(const RequestPtr& req, const SendSpec& spec) noexcept {
  const uint32_t tag = spec.tag;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return req->fail(closedStatus_);
  Op op{req, const_cast<void*>(spec.buf), spec.bytes};
  if (auto r = matcher_.takeRecv(tag)) {
    match(op, *r, tag);
  } else {
    matcher_.keep(tag, op);
  }
}

void SelfConnection::irecvLocked(const RequestPtr& req, const RecvSpec& spec, std::unique_lock<std::mutex>&) {
  const uint32_t tag = spec.tag;
  if (closed_) return req->fail(closedStatus_);
  Op op = makeRecv(req, spec);
  if (auto s = matcher_.takeMessage(tag)) {
    match(*s, op, tag);
  } else {
    matcher_.post(tag, op, spec.posted);
  }
}

void SelfConnection::failAll(const Status& status) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  closedStatus_ = status;
  for (auto& op : matcher_.takeAllPosted()) op.req->fail(status);
  matcher_.forEachKept([&status](const Op& op) { op.req->fail(status); });
  matcher_.dropKeptIf([](const Op&) { return true; });
}

std::string SelfConnection::describe() const { return strFormat("rank %d <-> itself: in-process copy", peer_); }

}  // namespace loom
