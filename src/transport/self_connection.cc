#include "transport/self_connection.hpp"

#include <cstring>

#include "core/format.hpp"

namespace loom {

void SelfConnection::match(const Op& send, const Op& recv) {
  if (send.bytes > recv.bytes) {
    Status s = Status::error(ErrorCode::InvalidUsage,
                             strFormat("message of %zu bytes to self is larger than the receive buffer of %zu bytes",
                                       send.bytes, recv.bytes));
    send.req->fail(s);
    recv.req->fail(s);
    return;
  }
  if (send.bytes > 0) std::memmove(recv.buf, send.buf, send.bytes);
  send.req->complete(send.bytes);
  recv.req->complete(send.bytes);
}

void SelfConnection::isend(const RequestPtr& req, const void* buf, size_t bytes, uint32_t tag) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return req->fail(closedStatus_);
  Op op{req, const_cast<void*>(buf), bytes};
  auto it = recvs_.find(tag);
  if (it != recvs_.end()) {
    Op r = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) recvs_.erase(it);
    match(op, r);
  } else {
    sends_[tag].push_back(op);
  }
}

void SelfConnection::irecv(const RequestPtr& req, void* buf, size_t bytes, uint32_t tag) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return req->fail(closedStatus_);
  Op op{req, buf, bytes};
  auto it = sends_.find(tag);
  if (it != sends_.end()) {
    Op s = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) sends_.erase(it);
    match(s, op);
  } else {
    recvs_[tag].push_back(op);
  }
}

void SelfConnection::failAll(const Status& status) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  closedStatus_ = status;
  for (auto* m : {&sends_, &recvs_})
    for (auto& [tag, q] : *m)
      for (auto& op : q) op.req->fail(status);
  sends_.clear();
  recvs_.clear();
}

std::string SelfConnection::describe() const { return strFormat("rank %d <-> itself: in-process copy", rank_); }

}  // namespace loom
