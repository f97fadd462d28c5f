// The ib connection's messages (ib_connection.hpp, "Protocol" and "Flow control"): what arrives,
// what matches it, and what goes out, within the credits.
#include <arpa/inet.h>

#include <cstring>

#include "core/format.hpp"
#include "core/signature.hpp"
#include "transport/ib/ib_connection.hpp"
#include "transport/ib/ib_protocol.hpp"

namespace loom {
namespace ib {

using namespace proto;  // NOLINT: this file speaks the protocol

void IbConnection::receivedLocked(int qp, int slot, const ibv_wc& wc) noexcept {
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    const uint32_t id = ntohl(wc.imm_data);
    auto it = incoming_.find(id);
    if (it == incoming_.end()) {
      failLocked(linkError("receiving", strFormat("an RDMA write for unknown receive %u", id)));
      return;
    }
    RecvOp& op = *it->second;
    op.received += wc.byte_len;
    if (op.received >= op.bytes) {
      op.req->complete(op.bytes);
      incoming_.erase(it);
    }
    repostLocked(qp, slot);
    toReturn_[qp]++;
    returnCreditsLocked();
    return;
  }
  const uint8_t* p =
      recvArea_ + (static_cast<size_t>(qp) * options_.slots + static_cast<size_t>(slot)) * options_.slotBytes;
  if (wc.byte_len < sizeof(Header)) {
    failLocked(linkError("receiving", strFormat("a message of %u bytes, shorter than a header", wc.byte_len)));
    return;
  }
  Header h;
  std::memcpy(&h, p, sizeof h);
  for (size_t q = 0; q < qps_.size(); ++q) credits_[q] += h.grant[q];
  const size_t payload = wc.byte_len - sizeof(Header);
  const auto type = static_cast<Msg>(h.type);
  if (type == Msg::Eager && payload != h.bytes) {
    failLocked(linkError("receiving", "a message whose length disagrees with its header"));
    return;
  }
  messageLocked(h, p + sizeof(Header));  // copies what it keeps before the slot is reposted
  if (closed_) return;
  repostLocked(qp, slot);
  toReturn_[qp]++;
  returnCreditsLocked();
}

void IbConnection::messageLocked(const Header& h, const uint8_t* payload) noexcept {
  switch (static_cast<Msg>(h.type)) {
    case Msg::Eager:
    case Msg::Rts: {
      // While the link closes, nothing is delivered into a caller's buffer (finishSendsLocked).
      std::optional<std::shared_ptr<RecvOp>> r = closing_ ? std::nullopt : matcher_.takeRecv(h.tag);
      if (!r) {
        auto u = std::make_shared<Unexpected>();
        u->h = h;
        if (static_cast<Msg>(h.type) == Msg::Eager) u->data.assign(payload, payload + h.bytes);
        matcher_.keep(h.tag, std::move(u));
      } else if (static_cast<Msg>(h.type) == Msg::Eager) {
        deliverEagerLocked(*r, h, payload);
      } else {
        startLargeLocked(*r, h);
      }
      return;
    }
    case Msg::Cts:
      ctsLocked(h);
      return;
    case Msg::Nack:
      nackLocked(h);
      return;
    case Msg::Credit:
      return;
  }
  failLocked(linkError("receiving", strFormat("a message of unknown type %u", h.type)));
}

void IbConnection::deliverEagerLocked(const std::shared_ptr<RecvOp>& op, const Header& h,
                                      const uint8_t* payload) noexcept {
  if (!signaturesAgree(op->signature, h.sig))
    return op->req->fail(signatureMismatch(peer_, h.sig, rank_, op->signature));
  if (h.bytes > op->capacity) return op->req->fail(truncationError(peer_, h.tag, h.bytes, op->capacity));
  if (h.bytes > 0 && onDevice(op->buf)) {
    const Status copied = copyToDevice(op->buf, payload, h.bytes);
    if (!copied.ok) return op->req->fail(copied);
  } else if (h.bytes > 0) {
    std::memcpy(op->buf, payload, h.bytes);
  }
  op->req->complete(h.bytes);
}

void IbConnection::startLargeLocked(const std::shared_ptr<RecvOp>& op, const Header& h) noexcept {
  auto refuse = [&](const Status& why, uint64_t sig) {
    op->req->fail(why);
    Outgoing o;
    o.h.type = static_cast<uint8_t>(Msg::Nack);
    o.h.seq = h.seq;
    o.h.sig = sig;
    queueLocked(std::move(o));
  };
  if (!signaturesAgree(op->signature, h.sig))
    return refuse(signatureMismatch(peer_, h.sig, rank_, op->signature), op->signature);
  if (h.bytes > op->capacity) return refuse(truncationError(peer_, h.tag, h.bytes, op->capacity), 0);
  Status err;
  op->reg = acquire(op->buf, h.bytes, onDevice(op->buf), &err);
  if (!op->reg) {
    op->req->fail(err);
    failLocked(linkError("registering a receive buffer", err.message));
    return;
  }
  op->bytes = h.bytes;
  const uint32_t id = nextId_++;
  incoming_[id] = op;
  Outgoing o;
  o.h.type = static_cast<uint8_t>(Msg::Cts);
  o.h.seq = h.seq;
  o.h.bytes = h.bytes;
  o.h.addr = reinterpret_cast<uint64_t>(op->buf);
  o.h.rkey = static_cast<uint32_t>(op->reg->remoteKey);
  o.h.id = id;
  queueLocked(std::move(o));
}

void IbConnection::ctsLocked(const Header& h) noexcept {
  auto it = awaitingCts_.find(h.seq);
  if (closing_) return;  // its send fails as the link closes, before a byte of it moves
  if (it == awaitingCts_.end() || h.bytes != it->second->bytes) {
    failLocked(linkError("receiving", "a clear-to-send for a message that was not announced"));
    return;
  }
  std::shared_ptr<SendOp> op = it->second;
  awaitingCts_.erase(it);
  const size_t chunk = options_.chunkBytes;
  op->chunksLeft = (op->bytes + chunk - 1) / chunk;
  writing_[op->seq] = op;
  for (size_t off = 0; off < op->bytes; off += chunk) {
    Write w;
    w.op = op;
    w.offset = off;
    w.len = std::min(chunk, op->bytes - off);
    w.raddr = h.addr;
    w.rkey = h.rkey;
    w.id = h.id;
    w.qp = static_cast<int>(nextQp_++ % qps_.size());
    writes_.push_back(std::move(w));
  }
}

void IbConnection::nackLocked(const Header& h) noexcept {
  auto it = awaitingCts_.find(h.seq);
  if (closing_) return;
  if (it == awaitingCts_.end()) {
    failLocked(linkError("receiving", "a refusal of a message that was not announced"));
    return;
  }
  std::shared_ptr<SendOp> op = it->second;
  awaitingCts_.erase(it);
  op->req->fail(h.sig != 0 ? signatureMismatch(peer_, h.sig, rank_, op->sig)
                           : refusedAsTooLarge(peer_, op->tag, op->bytes));
}

void IbConnection::queueLocked(Outgoing o) noexcept { outq_.push_back(std::make_unique<Outgoing>(std::move(o))); }

void IbConnection::returnCreditsLocked() noexcept {
  int pending = 0;
  for (size_t q = 0; q < qps_.size(); ++q) pending += toReturn_[q];
  // Announced with the next message anyway; said on its own once half the slots wait, ahead of
  // whatever is queued: the messages in the queue may be waiting for the peer's credits, and the
  // peer for these.
  if (pending < options_.slots / 2 || creditQueued_) return;
  Outgoing o;
  o.h.type = static_cast<uint8_t>(Msg::Credit);
  outq_.push_front(std::make_unique<Outgoing>(std::move(o)));
  creditQueued_ = true;
}

void IbConnection::repostLocked(int qp, int slot) noexcept {
  ibv_sge sge;
  sge.addr =
      reinterpret_cast<uint64_t>(recvArea_ + (static_cast<size_t>(qp) * options_.slots + slot) * options_.slotBytes);
  sge.length = static_cast<uint32_t>(options_.slotBytes);
  sge.lkey = recvMr_->lkey;
  ibv_recv_wr wr;
  std::memset(&wr, 0, sizeof wr);
  wr.wr_id = kRecvSlot | (static_cast<uint64_t>(qp) << 20) | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int e = ibv_post_recv(qps_[static_cast<size_t>(qp)]->get(), &wr, &bad))
    failLocked(postError(qp, "posting a receive", e));
}

void IbConnection::pumpLocked() noexcept {
  const Verbs& v = *pc_.verbs;
  (void)v;
  const size_t inlineBytes = qps_[0]->maxInline();
  uint8_t stage[kInlineBytes];
  while (!closed_ && !outq_.empty() && sendWrLeft_[0] > 0) {
    Outgoing& o = *outq_.front();
    const bool credit = static_cast<Msg>(o.h.type) == Msg::Credit;
    // The last credit of queue pair 0 is kept for the message that returns credits.
    if (credits_[0] < (credit ? 1 : 2)) break;
    // A small message goes inline (the adapter takes its bytes with the request); a larger one
    // from a registered staging slot.
    const size_t bytes = sizeof(Header) + o.payload.size();
    const bool inlined = bytes <= inlineBytes;
    if (!inlined && freeSendSlots_.empty()) break;
    for (size_t q = 0; q < qps_.size(); ++q) {
      o.h.grant[q] = static_cast<uint16_t>(toReturn_[q]);
      toReturn_[q] = 0;
    }
    uint64_t slot = kNoSlot;
    uint8_t* at = stage;
    if (!inlined) {
      slot = static_cast<uint64_t>(freeSendSlots_.back());
      freeSendSlots_.pop_back();
      at = sendArea_ + slot * options_.slotBytes;
    }
    std::memcpy(at, &o.h, sizeof(Header));
    if (!o.payload.empty()) std::memcpy(at + sizeof(Header), o.payload.data(), o.payload.size());
    ibv_sge sge;
    sge.addr = reinterpret_cast<uint64_t>(at);
    sge.length = static_cast<uint32_t>(bytes);
    sge.lkey = inlined ? 0 : sendMr_->lkey;
    ibv_send_wr wr;
    std::memset(&wr, 0, sizeof wr);
    wr.wr_id = kSendSlot | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | (inlined ? static_cast<unsigned>(IBV_SEND_INLINE) : 0u);
    ibv_send_wr* bad = nullptr;
    if (int e = ibv_post_send(qps_[0]->get(), &wr, &bad)) {
      failLocked(postError(0, "posting a send", e));
      return;
    }
    credits_[0]--;
    sendWrLeft_[0]--;
    if (static_cast<Msg>(o.h.type) == Msg::Credit) creditQueued_ = false;
    outq_.pop_front();
  }
  while (!closed_ && !writes_.empty()) {
    Write& w = writes_.front();
    const auto q = static_cast<size_t>(w.qp);
    if (credits_[q] < (q == 0 ? 2 : 1) || sendWrLeft_[q] <= 0) break;
    ibv_sge sge;
    sge.addr = reinterpret_cast<uint64_t>(w.op->buf + w.offset);
    sge.length = static_cast<uint32_t>(w.len);
    sge.lkey = static_cast<uint32_t>(w.op->reg->localKey);
    ibv_send_wr wr;
    std::memset(&wr, 0, sizeof wr);
    wr.wr_id = kWrite | w.op->seq;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(w.id);
    wr.wr.rdma.remote_addr = w.raddr + w.offset;
    wr.wr.rdma.rkey = w.rkey;
    ibv_send_wr* bad = nullptr;
    if (int e = ibv_post_send(qps_[q]->get(), &wr, &bad)) {
      failLocked(postError(w.qp, "posting an RDMA write", e));
      return;
    }
    credits_[q]--;
    sendWrLeft_[q]--;
    writes_.pop_front();
  }
}

void IbConnection::isend(const RequestPtr& req, const SendSpec& spec) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return req->fail(closedStatus_);
  const uint64_t seq = nextSeq_++;
  Outgoing o;
  o.h.tag = spec.tag;
  o.h.seq = seq;
  o.h.bytes = spec.bytes;
  o.h.sig = spec.signature;
  // From device memory, even a small message is written in place: no CPU copy reads it.
  const bool device = spec.bytes > 0 && onDevice(spec.buf);
  if (spec.bytes <= eagerBytes() && !device) {
    // Copied into the message now: the buffer is the caller's again at once.
    o.h.type = static_cast<uint8_t>(Msg::Eager);
    const auto* b = static_cast<const uint8_t*>(spec.buf);
    o.payload.assign(b, b + spec.bytes);
    queueLocked(std::move(o));
    pumpLocked();
    if (!closed_)
      req->complete(spec.bytes);
    else
      req->fail(closedStatus_);
    return unlock(lock);
  }
  auto op = std::make_shared<SendOp>();
  Status err;
  op->reg = acquire(spec.buf, spec.bytes, device, &err);
  if (!op->reg) {
    return req->fail(Status::error(
        err.code,
        strFormat("the send of %zu bytes to rank %d (tag %u): %s", spec.bytes, peer_, spec.tag, err.message.c_str()),
        peer_));
  }
  op->req = req;
  op->buf = static_cast<const uint8_t*>(spec.buf);
  op->bytes = spec.bytes;
  op->tag = spec.tag;
  op->sig = spec.signature;
  op->seq = seq;
  awaitingCts_[seq] = op;
  o.h.type = static_cast<uint8_t>(Msg::Rts);
  queueLocked(std::move(o));
  pumpLocked();
  unlock(lock);
}

std::shared_ptr<IbConnection::RecvOp> IbConnection::makeRecv(const RequestPtr& req, const RecvSpec& spec) const {
  return postedRecv<RecvOp>(req, spec);
}

void IbConnection::irecvLocked(const RequestPtr& req, const RecvSpec& spec, std::unique_lock<std::mutex>& lock) {
  std::optional<std::shared_ptr<Unexpected>> kept = matcher_.takeMessage(spec.tag);
  if (closed_ && !(kept && static_cast<Msg>((*kept)->h.type) == Msg::Eager)) return req->fail(closedStatus_);
  std::shared_ptr<RecvOp> op = makeRecv(req, spec);
  if (!kept) {
    matcher_.post(spec.tag, std::move(op), spec.posted);
    return;
  }
  const Unexpected& u = **kept;
  if (static_cast<Msg>(u.h.type) == Msg::Eager) {
    deliverEagerLocked(op, u.h, u.data.data());
  } else {
    startLargeLocked(op, u.h);
    pumpLocked();
  }
  unlock(lock);
}

}  // namespace ib
}  // namespace loom
