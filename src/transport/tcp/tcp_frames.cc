// TcpConnection, the protocol: the frames a message becomes on the way out (EAGER, RTS, PUSH,
// DATA, CTS, READY) and what each frame that comes in does to the matcher and the receives.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/request.hpp"
#include "core/signature.hpp"
#include "kernels/copy.hpp"
#include "transport/tcp/stream.hpp"

namespace loom {
namespace tcp {

namespace {

// What a frame only the control stream may carry is called in errors; null for DATA and unknown types.
const char* controlFrameName(FrameType type) {
  switch (type) {
    case FrameType::Eager:
    case FrameType::Rts:
    case FrameType::Push:
      return "message header";
    case FrameType::Cts:
      return "CTS";
    case FrameType::Ready:
      return "READY";
    case FrameType::Bye:
      return "BYE";
    case FrameType::Data:
      break;
  }
  return nullptr;
}

}  // namespace

void TcpConnection::enqueueDataLocked(const std::shared_ptr<SendOp>& op) {
  const size_t nstreams = stripesFor(op->bytes);
  const size_t even = (op->bytes + nstreams - 1) / nstreams;
  const size_t slice = (even + kSliceAlignBytes - 1) / kSliceAlignBytes * kSliceAlignBytes;
  op->framesLeft = static_cast<int>((op->bytes + slice - 1) / slice);
  for (size_t i = 0, off = 0; off < op->bytes; ++i, off += slice) {
    FrameHeader d;
    d.type = static_cast<uint8_t>(FrameType::Data);
    d.seq = op->seq;
    d.a = off;
    d.b = std::min(slice, op->bytes - off);
    enqueueLocked(*streams_[i], d, op->buf + off, d.b, op);
  }
}

void TcpConnection::acceptPushLocked(const FrameHeader& h) {
  std::shared_ptr<RecvOp> op = matcher_.takeRecv(h.tag).value_or(nullptr);
  if (op && !signaturesAgree(op->signature, h.b)) {
    // Another call's message: that receive fails, the bytes are dropped.
    op->req->fail(signatureMismatch(peer_, h.b, rank_, op->signature));
    op = std::make_shared<RecvOp>();
  } else if (op && h.a > op->capacity) {
    // Too large for the receive that matches it: that receive fails, the bytes are dropped.
    op->req->fail(truncationError(peer_, op->tag, h.a, op->capacity));
    op = std::make_shared<RecvOp>();
  } else if (!op) {
    // Nobody has posted for it yet: it lands in a buffer of its own, claimed by a later receive.
    auto u = std::make_shared<Unexpected>();
    u->hdr = h;
    u->data = pool_.take(h.a);
    matcher_.keep(h.tag, u);
    op = std::make_shared<RecvOp>();
    op->buf = u->data.data();
    op->capacity = h.a;
    op->ux = u;
  }
  op->bytes = h.a;
  op->seq = h.seq;
  incoming_[h.seq] = op;
}

Status TcpConnection::drainBlockedLocked(std::unique_lock<std::mutex>& lock) {
  Status st;
  for (auto& x : streams_) {
    if (!st.ok || !x->blocked || x->reading || closed_) continue;
    st = read(*x, lock);
    if (st.ok && !x->blocked && !polled() && engineNeededLocked()) armReadLocked(*x);
  }
  return st;
}

void TcpConnection::acceptRtsLocked(const FrameHeader& h, const std::shared_ptr<RecvOp>& op) {
  if (!signaturesAgree(op->signature, h.b)) {
    sendCtsLocked(h.seq, false, op->signature);
    op->req->fail(signatureMismatch(peer_, h.b, rank_, op->signature));
    return;
  }
  if (h.a > op->capacity) {
    sendCtsLocked(h.seq, false);
    op->req->fail(truncationError(peer_, op->tag, h.a, op->capacity));
    return;
  }
  op->bytes = h.a;
  op->seq = h.seq;
  sendCtsLocked(h.seq, true);
  if (op->bytes == 0) {
    op->req->complete(0);
  } else {
    incoming_[h.seq] = op;
  }
}

void TcpConnection::sendCtsLocked(uint64_t seq, bool accept, uint64_t refusedFor) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::Cts);
  h.flags = accept ? 1 : (refusedFor != 0 ? 2 : 0);
  h.seq = seq;
  h.a = refusedFor;
  enqueueLocked(*streams_[0], h, nullptr, 0, nullptr);  // every caller flushes stream 0 next
}

void TcpConnection::enqueueLocked(Stream& s, const FrameHeader& h, const uint8_t* payload, size_t len,
                                  std::shared_ptr<SendOp> op) {
  OutFrame f;
  encodeHeader(h, f.hdr);
  f.payload = payload;
  f.payloadLen = len;
  f.op = std::move(op);
  s.out.push_back(std::move(f));
}

void TcpConnection::onSentLocked(OutFrame& f) {
  if (f.op && --f.op->framesLeft == 0) f.op->req->complete(f.op->bytes);
}

Status TcpConnection::onHeaderLocked(Stream& s, const FrameHeader& h) {
  const bool control = &s == streams_[0].get();
  if (h.magic != kFrameMagic) return malformed("bad frame magic");
  // Everything but a DATA slice is the control stream's, so that frames keep their order.
  const auto type = static_cast<FrameType>(h.type);
  if (const char* what = control || type == FrameType::Data ? nullptr : controlFrameName(type))
    return malformed(strFormat("%s on a data stream", what));
  switch (type) {
    case FrameType::Push:
      return onPushLocked(h);
    case FrameType::Eager:
    case FrameType::Rts:
      return onMessageLocked(s, h);
    case FrameType::Cts:
      return onCtsLocked(h);
    case FrameType::Bye:
      return onByeLocked(s, h);
    case FrameType::Ready:
      return onReadyLocked(h);
    case FrameType::Data:
      return onDataLocked(s, h, control);
  }
  return malformed(strFormat("unknown frame type %u", h.type));
}

Status TcpConnection::nextMessageLocked(const FrameHeader& h) {
  if (h.seq != nextRecvSeq_)
    return malformed(strFormat("message sequence %llu, expected %llu", static_cast<unsigned long long>(h.seq),
                               static_cast<unsigned long long>(nextRecvSeq_)));
  ++nextRecvSeq_;
  return Status::success();
}

Status TcpConnection::onPushLocked(const FrameHeader& h) {
  if (h.a == 0 || h.a > kMaxPushBytes) return malformed("pushed message of a size the protocol does not allow");
  Status st = nextMessageLocked(h);
  if (st.ok) acceptPushLocked(h);
  return st;
}

Status TcpConnection::onMessageLocked(Stream& s, const FrameHeader& h) {
  Status st = nextMessageLocked(h);
  if (!st.ok) return st;
  const bool eager = h.type == static_cast<uint8_t>(FrameType::Eager);
  if (eager && h.a > kMaxEagerBytes) return malformed("eager message larger than the protocol allows");
  std::shared_ptr<RecvOp> op = matcher_.takeRecv(h.tag).value_or(nullptr);
  if (!eager) {
    if (op) {
      acceptRtsLocked(h, op);
    } else {
      auto u = std::make_shared<Unexpected>();
      u->hdr = h;
      matcher_.keep(h.tag, u);
    }
    return Status::success();
  }
  s.inPayload = true;
  s.remaining = s.payloadLen = h.a;
  if (op && !signaturesAgree(op->signature, h.b)) {
    op->req->fail(signatureMismatch(peer_, h.b, rank_, op->signature));
    s.sink = Sink::Discard;
    s.target = nullptr;
  } else if (op && h.a <= op->capacity) {
    op->bytes = h.a;
    s.sink = Sink::Direct;
    s.target = op->buf;
    s.op = op;
    s.consumer = consumerOf(*op);
    s.consumeAt = 0;
  } else if (op) {
    op->req->fail(truncationError(peer_, op->tag, h.a, op->capacity));
    s.sink = Sink::Discard;
    s.target = nullptr;
  } else {
    auto u = std::make_shared<Unexpected>();
    u->hdr = h;
    u->data = pool_.take(h.a);
    matcher_.keep(h.tag, u);
    s.sink = Sink::Unexpected;
    s.target = u->data.data();
    s.ux = u;
  }
  return s.remaining == 0 ? finishPayloadLocked(s) : Status::success();
}

Status TcpConnection::onCtsLocked(const FrameHeader& h) {
  auto it = awaitingCts_.find(h.seq);
  if (it == awaitingCts_.end()) return malformed("CTS for a message that was not announced");
  std::shared_ptr<SendOp> op = it->second;
  awaitingCts_.erase(it);
  if ((h.flags & 1) == 0) {
    op->req->fail((h.flags & 2) != 0 ? signatureMismatch(peer_, h.a, rank_, op->signature)
                                     : refusedAsTooLarge(peer_, op->tag, op->bytes));
    return Status::success();
  }
  if (op->bytes == 0) {
    op->req->complete(0);
    return Status::success();
  }
  enqueueDataLocked(op);
  // The reader that parsed this CTS writes what the sockets take once it has read (tcp_io.cc, up
  // to its write budget per stream); the send engine is armed for the rest.
  return Status::success();
}

Status TcpConnection::onByeLocked(Stream& s, const FrameHeader& h) {
  if (h.a > kMaxByeBytes) return malformed("BYE reason too long");
  s.inPayload = true;
  s.remaining = s.payloadLen = h.a;
  s.bye.assign(h.a, '\0');
  byeFailed_ = (h.flags & 1) != 0;
  s.sink = Sink::Bye;
  s.target = reinterpret_cast<uint8_t*>(&s.bye[0]);
  return s.remaining == 0 ? finishPayloadLocked(s) : Status::success();
}

Status TcpConnection::onReadyLocked(const FrameHeader& h) {
  if (h.seq > nextSendSeq_) return malformed("READY from the future");
  // A hint whose receive was matched by a message already sent is stale on arrival.
  size_t n = sendsOnTagSinceLocked(h.tag, h.seq);
  if (n != SIZE_MAX && n <= h.b) readyHints_[h.tag].push_back(ReadyHint{h.seq, h.b, h.a});
  // Hints for messages never sent (mismatched calls) go once they fall out of the record.
  if (readyHints_.size() > kRecentSends) {
    for (auto it = readyHints_.begin(); it != readyHints_.end();) {
      while (!it->second.empty() && sendsOnTagSinceLocked(it->first, it->second.front().fromSeq) == SIZE_MAX)
        it->second.pop_front();
      it = it->second.empty() ? readyHints_.erase(it) : std::next(it);
    }
  }
  return Status::success();
}

Status TcpConnection::onDataLocked(Stream& s, const FrameHeader& h, bool control) {
  auto it = incoming_.find(h.seq);
  if (it == incoming_.end() && !control && h.seq >= nextRecvSeq_) {
    // Overtook its PUSH, which stream 0 has not reached yet: parse it again once it has.
    s.blocked = true;
    return Status::success();
  }
  if (it == incoming_.end()) return malformed("data for a message that was not accepted");
  RecvOp& op = *it->second;
  if (h.b == 0 || h.a > op.bytes || h.b > op.bytes - h.a) return malformed("data outside the message");
  // Checked before the stream takes the payload: a failure reads on to find the peer's word.
  ReceiveConsumer* consumer = consumerOf(op);
  if (consumer != nullptr && !sliceWhole(h, op.bytes, consumer->granule()))
    return malformed("a slice of a message that does not start and end at whole elements");
  s.inPayload = true;
  s.sink = Sink::Data;
  s.remaining = s.payloadLen = h.b;
  // A refused PUSH (its receive failed) has no buffer: its bytes are read and dropped.
  s.target = op.buf != nullptr ? op.buf + h.a : nullptr;
  s.op = it->second;
  s.consumer = consumer;
  s.consumeAt = h.a;
  return Status::success();
}

Status TcpConnection::finishPayloadLocked(Stream& s) {
  s.inPayload = false;
  switch (s.sink) {
    case Sink::Direct:
      if (s.consumer != nullptr) s.op->req->consumed = true;
      s.op->req->complete(s.op->bytes);
      break;
    case Sink::Bye: {
      // The peer's communicator failed: this one fails too, with its reason (failFrom). Destroyed
      // cleanly: its last messages may still be arriving on other streams, so the word is kept for
      // when every stream has ended (closedByPeerLocked), as with a plain end of file.
      s.sink = Sink::None;
      s.target = nullptr;
      if (!byeFailed_) {
        byeReason_ = s.bye.empty() ? "it was destroyed" : s.bye;
        return Status::success();
      }
      return leftStatus(s.bye.empty() ? "it was destroyed" : s.bye);
    }
    case Sink::Unexpected:
      s.ux->complete = true;
      if (s.ux->claimedBy) deliverUnexpectedLocked(*s.ux, *s.ux->claimedBy);
      break;
    case Sink::Data:
      s.op->received += s.payloadLen;
      if (s.op->received == s.op->bytes) {
        // Every slice of a receive with a consumer went to it (consumerOf decides per receive).
        if (s.op->req && s.consumer != nullptr) s.op->req->consumed = true;
        if (s.op->req) s.op->req->complete(s.op->bytes);
        if (s.op->ux) {
          s.op->ux->complete = true;
          if (s.op->ux->claimedBy) deliverUnexpectedLocked(*s.op->ux, *s.op->ux->claimedBy);
        }
        incoming_.erase(s.op->seq);
      }
      break;
    default:
      break;
  }
  s.sink = Sink::None;
  s.op.reset();
  s.ux.reset();
  s.target = nullptr;
  s.consumer = nullptr;
  return Status::success();
}

ReceiveConsumer* TcpConnection::consumerOf(const RecvOp& op) const {
  // A receive matched as its message arrives: its bytes can go to its consumer. One that took its
  // message from the unexpected queue (op.ux, or no request) was copied already; the waiter hands
  // its buffer on then.
  const bool takes = options_.consume && op.req && op.consumer && !op.ux && op.buf != nullptr;
  return takes ? op.consumer.get() : nullptr;
}

}  // namespace tcp
}  // namespace loom
