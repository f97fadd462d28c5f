#include "transport/tcp/tcp_connection.hpp"

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

TcpConnection::TcpConnection(int rank, int peer, std::vector<Socket> sockets, ProgressEngine* recvEngine,
                             ProgressEngine* sendEngine, std::shared_ptr<FailureState> failure, TcpOptions options,
                             std::string description,
                             std::function<std::string(int, std::chrono::milliseconds)> lastWordOf)
    : rank_(rank),
      peer_(peer),
      recvEngine_(recvEngine),
      sendEngine_(sendEngine),
      failure_(std::move(failure)),
      lastWordOf_(std::move(lastWordOf)),
      options_(options),
      description_(std::move(description)) {
  for (size_t i = 0; i < sockets.size(); ++i) {
    auto s = std::make_unique<Stream>();
    s->sock = std::move(sockets[i]);
    s->reader = std::make_unique<ReadHandler>(this, static_cast<int>(i));
    s->writer = std::make_unique<WriteHandler>(this, static_cast<int>(i));
    streams_.push_back(std::move(s));
  }
}

TcpConnection::~TcpConnection() {
  std::lock_guard<std::mutex> lock(mu_);
  failLocked(Status::error(ErrorCode::Aborted, "the communicator was destroyed", peer_));
}

void TcpConnection::start() {
  // A link made on first use is driven through the stand-in the engine already holds.
  if (engine() == nullptr) recvEngine_->add(this);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : streams_) {
    // Armed once: whatever arrives before the first operation is read (and the engine then rests).
    recvEngine_->add(s->sock.fd(), s->reader.get(), EPOLLIN | EPOLLONESHOT);
    sendEngine_->add(s->sock.fd(), s->writer.get(), 0);
    s->registered = true;
    s->readArmed = true;
  }
}

Status TcpConnection::malformed(const std::string& why) const {
  return Status::error(ErrorCode::Remote,
                       strFormat("malformed data from rank %d (%s): closing the connection", peer_, why.c_str()),
                       peer_);
}

void TcpConnection::isend(const RequestPtr& req, const SendSpec& spec) noexcept {
  const void* buf = spec.buf;
  const size_t bytes = spec.bytes;
  const uint32_t tag = spec.tag;
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) {
    failClosedLocked(req, lock);
    return;
  }
  noteUnattendedLocked(req);
  auto op = std::make_shared<SendOp>();
  op->req = req;
  op->buf = static_cast<const uint8_t*>(buf);
  op->bytes = bytes;
  op->tag = tag;
  op->signature = spec.signature;
  op->seq = nextSendSeq_++;
  FrameHeader h;
  h.tag = tag;
  h.seq = op->seq;
  h.a = bytes;
  h.b = spec.signature;  // EAGER, RTS and PUSH carry the call they belong to
  Stream& s0 = *streams_[0];
  // Every send consumes the hint meant for it, so that hints for small messages do not pile up.
  const bool hinted = !readyHints_.empty() && takeReadyHintLocked(tag, bytes);
  const bool push =
      bytes > options_.eagerBytes && (hinted || ((tag & options_.pushTagBit) != 0 && bytes <= options_.pushBytes));
  recentSends_.emplace_back(op->seq, tag);
  if (recentSends_.size() > kRecentSends) recentSends_.pop_front();
  if (bytes <= options_.eagerBytes || (push && stripesFor(bytes) == 1 && bytes <= kMaxEagerBytes)) {
    h.type = static_cast<uint8_t>(FrameType::Eager);
    op->framesLeft = 1;
    enqueueLocked(s0, h, op->buf, bytes, op);
  } else if (push) {
    // At once, striped: the announcement, then the slices right behind it on every stream.
    h.type = static_cast<uint8_t>(FrameType::Push);
    enqueueLocked(s0, h, nullptr, 0, nullptr);
    enqueueDataLocked(op);
    for (auto& x : streams_) {
      Status st = flush(*x, lock, kUnlimited);
      if (!st.ok) {
        failFrom(st, lock);
        return;
      }
    }
    return;
  } else {
    h.type = static_cast<uint8_t>(FrameType::Rts);
    awaitingCts_[op->seq] = op;
    enqueueLocked(s0, h, nullptr, 0, nullptr);
  }
  // The caller writes what the socket takes at once; the send engine does the rest.
  Status st = flush(s0, lock, kUnlimited);
  if (!st.ok) failFrom(st, lock);
}

size_t TcpConnection::sendsOnTagSinceLocked(uint32_t tag, uint64_t from) const {
  if (from < nextSendSeq_ && (recentSends_.empty() || recentSends_.front().first > from)) return SIZE_MAX;
  size_t n = 0;
  for (auto it = recentSends_.rbegin(); it != recentSends_.rend() && it->first >= from; ++it)
    if (it->second == tag) ++n;
  return n;
}

bool TcpConnection::takeReadyHintLocked(uint32_t tag, size_t bytes) {
  auto it = readyHints_.find(tag);
  if (it == readyHints_.end()) return false;
  bool ready = false;
  auto& q = it->second;
  while (!q.empty()) {
    // The hinted receive matches the (ahead+1)-th message on the tag from fromSeq on; this send is
    // the (n+1)-th. Fewer: it is for an earlier receive, keep the hint; more: the hinted receive
    // was matched already (or the record is too short to tell), drop it.
    const ReadyHint h = q.front();  // a copy: it outlives the pop below
    size_t n = sendsOnTagSinceLocked(tag, h.fromSeq);
    if (n != SIZE_MAX && n < h.ahead) break;
    if (n == h.ahead) ready = bytes <= h.capacity && bytes <= options_.readyBytes;
    q.pop_front();
    if (n == h.ahead) break;
  }
  if (q.empty()) readyHints_.erase(it);
  return ready;
}

std::shared_ptr<TcpConnection::RecvOp> TcpConnection::makeRecv(const RequestPtr& req, const RecvSpec& spec) const {
  auto op = postedRecv<RecvOp>(req, spec);
  op->consumer = spec.consumer;
  return op;
}

void TcpConnection::irecvLocked(const RequestPtr& req, const RecvSpec& spec, std::unique_lock<std::mutex>& lock) {
  const size_t bytes = spec.capacity;
  const uint32_t tag = spec.tag;
  noteUnattendedLocked(req);
  std::shared_ptr<RecvOp> op = makeRecv(req, spec);
  if (std::optional<std::shared_ptr<Unexpected>> kept = matcher_.takeMessage(tag)) {
    std::shared_ptr<Unexpected> u = std::move(*kept);
    if (!signaturesAgree(spec.signature, u->hdr.b)) {
      // A message of another call: this receive fails; an announced one is refused.
      req->fail(signatureMismatch(peer_, u->hdr.b, rank_, spec.signature));
      if (u->hdr.type == static_cast<uint8_t>(FrameType::Rts)) {
        sendCtsLocked(u->hdr.seq, false, spec.signature);
        Status st = flush(*streams_[0], lock, kUnlimited);
        if (!st.ok) failFrom(st, lock);
      } else if (u->complete) {
        pool_.giveBack(std::move(u->data));
      }
      return;
    }
    if (u->hdr.type == static_cast<uint8_t>(FrameType::Eager) || u->hdr.type == static_cast<uint8_t>(FrameType::Push)) {
      op->bytes = u->hdr.a;
      if (u->complete) {
        deliverUnexpectedLocked(*u, *op);
      } else {
        u->claimedBy = op;  // delivered when its payload has arrived
      }
    } else {
      acceptRtsLocked(u->hdr, op);
      Status st = flush(*streams_[0], lock, kUnlimited);
      if (!st.ok) failFrom(st, lock);
    }
  } else if (closed_) {
    failClosedLocked(req, lock);
  } else {
    matcher_.post(tag, op, spec.posted);
    // (Collectives' messages up to pushBytes come at once anyway: no hint needed.)
    const bool pushed = (tag & options_.pushTagBit) != 0 && bytes <= options_.pushBytes;
    if (bytes > options_.eagerBytes && options_.readyBytes > 0 && !pushed) {
      // Tell the sender this receive is waiting, so that it can skip the RTS/CTS round trip.
      FrameHeader h;
      h.type = static_cast<uint8_t>(FrameType::Ready);
      h.tag = tag;
      h.seq = nextRecvSeq_;
      h.a = bytes;
      h.b = matcher_.postedOn(tag) - 1;
      enqueueLocked(*streams_[0], h, nullptr, 0, nullptr);
      Status st = flush(*streams_[0], lock, kUnlimited);
      if (!st.ok) failFrom(st, lock);
    }
  }
}

void TcpConnection::deliverUnexpectedLocked(Unexpected& u, RecvOp& op) {
  const size_t n = u.data.size;
  if (n > op.capacity) {
    pool_.giveBack(std::move(u.data));
    op.req->fail(truncationError(peer_, op.tag, n, op.capacity));
    return;
  }
  if (n > 0) kernels::copy(op.buf, u.data.data(), n);
  pool_.giveBack(std::move(u.data));
  op.req->complete(n);
}

bool TcpConnection::hasPendingLocked() const {
  if (matcher_.anyPosted() || !awaitingCts_.empty() || !incoming_.empty()) return true;
  for (const auto& s : streams_) {
    if (!s->out.empty()) return true;
    if (s->inPayload && (s->sink == Sink::Direct || s->sink == Sink::Data)) return true;
    if (s->inPayload && s->ux && s->ux->claimedBy) return true;  // a claimed eager payload arriving
  }
  return false;
}

}  // namespace tcp
}  // namespace loom
