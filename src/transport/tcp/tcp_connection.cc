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

namespace loom {
namespace tcp {
namespace {

// A stream's own read buffer. It is also where the payloads of receives with a consumer land
// (core/receive_consumer.hpp), a run at a time, so it should stay in a core's L2 cache.
constexpr size_t kInBufBytes = 256 * 1024;
// Payloads at least this large are read straight into their destination, not through inbuf.
constexpr size_t kDirectReadBytes = 32 * 1024;
// What a read between frames takes at most (see read()).
constexpr size_t kHeaderReadBytes = 4096;
// A read this large, or one that continues a payload, asks the kernel to acknowledge at once
// (setQuickAck): data flowing both ways puts Linux's TCP in its delayed-ACK ("pingpong") mode,
// and the unacknowledged tail of a message then holds up a sender that ran out of window for a
// delayed-ACK timer's worth (tens of milliseconds; docs/performance.md). Reads of small whole
// messages, which no sender waits on, skip the syscall.
constexpr ssize_t kQuickAckBytes = 8 * 1024;
// Streams poll() checks for readiness at once (LOOM_SOCKETS_PER_PEER is at most 16).
constexpr size_t kMaxStreams = 16;
// How long a link that broke without a word waits for the peer's word in the store: a failing
// peer notes it before it closes its other links, so it is there at once, or never (the peer was
// killed); the wait covers a peer that failed on this very link, and closed it first.
constexpr std::chrono::milliseconds kLastWordWait(250);
// The longest an ask can take: kLastWordWait, then the last store request's own limit (2 s,
// kStoreNoteLimit in comm/comm_impl.cc), with room to spare.
constexpr std::chrono::milliseconds kLastWordAskBound(3000);
constexpr int kMaxIov = 64;
// What the receive thread may write inline (control frames, small replies) before it hands the
// rest to the send engine.
constexpr size_t kReaderWriteBudget = 64 * 1024;
constexpr size_t kUnlimited = SIZE_MAX;
// Sends remembered to judge READY hints against: a hint older than this many sends is dropped.
constexpr size_t kRecentSends = 256;
// Spare buffers kept per connection for unexpected messages.
constexpr size_t kPoolBytes = 8u << 20;
// The slices of a striped message start at multiples of this (every element size divides it), so
// that a receive's consumer gets whole elements from every stream.
constexpr size_t kSliceAlignBytes = 64;

// Whether a DATA frame's slice of a message of `bytes` starts at a whole element of `granule`
// bytes and ends at one, or at the message's end.
bool sliceWhole(const FrameHeader& h, uint64_t bytes, size_t granule) {
  return h.a % granule == 0 && ((h.a + h.b) % granule == 0 || h.a + h.b == bytes);
}

}  // namespace

class TcpConnection::ReadHandler : public PollHandler {
 public:
  ReadHandler(TcpConnection* conn, int index) : conn_(conn), index_(index) {}
  void onPollEvents(uint32_t) noexcept override { conn_->onReadable(index_); }

 private:
  TcpConnection* const conn_;  // owns this handler
  const int index_;
};

class TcpConnection::WriteHandler : public PollHandler {
 public:
  WriteHandler(TcpConnection* conn, int index) : conn_(conn), index_(index) {}
  void onPollEvents(uint32_t) noexcept override { conn_->onWritable(index_); }

 private:
  TcpConnection* const conn_;  // owns this handler
  const int index_;
};

struct TcpConnection::Stream {
  Socket sock;
  std::unique_ptr<ReadHandler> reader;
  std::unique_ptr<WriteHandler> writer;
  bool registered = false;
  bool eof = false;        // the peer closed its side of this socket
  bool readArmed = false;  // the receive engine's one-shot read event is armed
  bool blocked = false;    // holds a DATA header that overtook its PUSH (stream 0 is behind)
  // Sending. Frames are only appended by others; the active writer alone pops them, so pointers
  // into queued frames stay valid while it writes unlocked.
  std::deque<OutFrame> out;
  bool armed = false;    // EPOLLOUT requested from the send engine
  bool writing = false;  // a thread is in sendmsg on this stream, unlocked
  // Receiving (the receive thread's alone, but for failLocked while `reading` is false).
  bool reading = false;  // the receive thread is in recv on this stream, unlocked
  int lowWater = 1;      // the socket's SO_RCVLOWAT
  std::vector<uint8_t> in = std::vector<uint8_t>(kInBufBytes);
  size_t rpos = 0;
  size_t wpos = 0;
  bool inPayload = false;
  Sink sink = Sink::None;
  uint8_t* target = nullptr;
  size_t remaining = 0;
  size_t payloadLen = 0;
  std::shared_ptr<RecvOp> op;
  std::shared_ptr<Unexpected> ux;
  std::string bye;  // a BYE's reason, arriving
  // The payload's receive takes its bytes as they land (Request::consumer; `op` holds it): they are
  // read into `in` and handed on from there, never written to `target`.
  ReceiveConsumer* consumer = nullptr;
  size_t consumeAt = 0;  // the message offset of the payload's next byte
};

TcpConnection::TcpConnection(int rank, int peer, std::vector<Socket> sockets, ProgressEngine* recvEngine,
                             ProgressEngine* sendEngine, std::shared_ptr<FailureState> failure, TcpOptions options,
                             std::string description, const std::atomic<int>* sleepers,
                             std::function<std::string(int, std::chrono::milliseconds)> lastWordOf)
    : rank_(rank),
      peer_(peer),
      recvEngine_(recvEngine),
      sendEngine_(sendEngine),
      failure_(std::move(failure)),
      lastWordOf_(std::move(lastWordOf)),
      options_(options),
      description_(std::move(description)),
      sleepers_(sleepers) {
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

void TcpConnection::isend(const RequestPtr& req, const void* buf, size_t bytes, uint32_t tag) noexcept {
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
  op->seq = nextSendSeq_++;
  FrameHeader h;
  h.tag = tag;
  h.seq = op->seq;
  h.a = bytes;
  h.b = req->signature;  // EAGER, RTS and PUSH carry the call they belong to
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

void TcpConnection::irecv(const RequestPtr& req, void* buf, size_t bytes, uint32_t tag) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  noteUnattendedLocked(req);
  auto op = std::make_shared<RecvOp>();
  op->req = req;
  op->buf = static_cast<uint8_t*>(buf);
  op->capacity = bytes;
  op->tag = tag;
  if (std::optional<std::shared_ptr<Unexpected>> kept = matcher_.takeMessage(tag)) {
    std::shared_ptr<Unexpected> u = std::move(*kept);
    if (!signaturesAgree(req->signature, u->hdr.b)) {
      // A message of another call: this receive fails; an announced one is refused.
      req->fail(signatureMismatch(peer_, u->hdr.b, rank_, req->signature));
      if (u->hdr.type == static_cast<uint8_t>(FrameType::Rts)) {
        sendCtsLocked(u->hdr.seq, false, req->signature);
        Status st = flush(*streams_[0], lock, kUnlimited);
        if (!st.ok) failFrom(st, lock);
      } else if (u->complete) {
        giveBackLocked(std::move(u->data));
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
    matcher_.post(tag, op);
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
    giveBackLocked(std::move(u.data));
    op.req->fail(truncationError(peer_, op.tag, n, op.capacity));
    return;
  }
  if (n > 0) kernels::copy(op.buf, u.data.data(), n);
  giveBackLocked(std::move(u.data));
  op.req->complete(n);
}

TcpConnection::Buffer TcpConnection::takeBufferLocked(size_t n) {
  size_t best = pool_.size();
  for (size_t i = 0; i < pool_.size(); ++i)
    if (pool_[i].capacity >= n && (best == pool_.size() || pool_[i].capacity < pool_[best].capacity)) best = i;
  Buffer b;
  if (best < pool_.size()) {
    b = std::move(pool_[best]);
    pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(best));
    pooled_ -= b.capacity;
  } else {
    b.bytes.reset(new uint8_t[std::max<size_t>(n, 1)]);
    b.capacity = std::max<size_t>(n, 1);
  }
  b.size = n;
  return b;
}

void TcpConnection::giveBackLocked(Buffer b) {
  if (!b.bytes || pooled_ + b.capacity > kPoolBytes) return;
  pooled_ += b.capacity;
  pool_.push_back(std::move(b));
}

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
  if (op && !signaturesAgree(op->req->signature, h.b)) {
    // Another call's message: that receive fails, the bytes are dropped.
    op->req->fail(signatureMismatch(peer_, h.b, rank_, op->req->signature));
    op = std::make_shared<RecvOp>();
  } else if (op && h.a > op->capacity) {
    // Too large for the receive that matches it: that receive fails, the bytes are dropped.
    op->req->fail(truncationError(peer_, op->tag, h.a, op->capacity));
    op = std::make_shared<RecvOp>();
  } else if (!op) {
    // Nobody has posted for it yet: it lands in a buffer of its own, claimed by a later receive.
    auto u = std::make_shared<Unexpected>();
    u->hdr = h;
    u->data = takeBufferLocked(h.a);
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
    if (st.ok && !x->blocked && pollers_ == 0 && engineNeededLocked()) armReadLocked(*x);
  }
  return st;
}

void TcpConnection::acceptRtsLocked(const FrameHeader& h, const std::shared_ptr<RecvOp>& op) {
  if (!signaturesAgree(op->req->signature, h.b)) {
    sendCtsLocked(h.seq, false, op->req->signature);
    op->req->fail(signatureMismatch(peer_, h.b, rank_, op->req->signature));
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

void TcpConnection::armLocked(Stream& s, bool want) {
  // While a thread polls this connection it writes what the socket takes: no send engine woken
  // per writable event meanwhile (pollEnd hands what is left to the engine).
  if (want && pollers_ > 0) return;
  if (s.armed == want || !s.registered) return;
  s.armed = want;
  sendEngine_->modify(s.sock.fd(), s.writer.get(), want ? static_cast<uint32_t>(EPOLLOUT | EPOLLONESHOT) : 0u);
}

void TcpConnection::armReadLocked(Stream& s) {
  // A stream holding back data waits for stream 0, not for its socket (which stays readable).
  if (s.readArmed || s.blocked || !s.registered || s.eof || closed_) return;
  s.readArmed = true;
  recvEngine_->modify(s.sock.fd(), s.reader.get(), EPOLLIN | EPOLLONESHOT);
}

bool TcpConnection::engineNeededLocked() {
  if (sleepers_ != nullptr && sleepers_->load(std::memory_order_acquire) > 0) return true;
  unattended_.erase(
      std::remove_if(unattended_.begin(), unattended_.end(), [](const RequestPtr& r) { return r->done(); }),
      unattended_.end());
  return !unattended_.empty();
}

void TcpConnection::rearmIfNeededLocked() {
  if (pollers_ > 0 || closed_ || !engineNeededLocked()) return;
  for (auto& s : streams_) armReadLocked(*s);
}

void TcpConnection::noteUnattendedLocked(const RequestPtr& req) {
  if (detail::AttendScope::current() != nullptr) return;
  unattended_.push_back(req);
  if (pollers_ == 0)
    for (auto& s : streams_) armReadLocked(*s);
}

void TcpConnection::wakeEngine() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : streams_) armReadLocked(*s);
}

Status TcpConnection::flush(Stream& s, std::unique_lock<std::mutex>& lock, size_t budget) {
  if (s.writing || closed_ || s.out.empty()) return Status::success();
  s.writing = true;
  size_t written = 0;
  Status st;
  while (!s.out.empty() && written < budget) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = s.out.begin(); it != s.out.end() && n + 2 <= kMaxIov; ++it) {
      if (it->sent < kHeaderBytes) {
        iov[n].iov_base = it->hdr + it->sent;
        iov[n].iov_len = kHeaderBytes - it->sent;
        ++n;
      }
      size_t payloadSent = it->sent > kHeaderBytes ? it->sent - kHeaderBytes : 0;
      if (it->payloadLen > payloadSent) {
        iov[n].iov_base = const_cast<uint8_t*>(it->payload) + payloadSent;
        iov[n].iov_len = it->payloadLen - payloadSent;
        ++n;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const int fd = s.sock.fd();
    lock.unlock();
    ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    const int err = errno;
    lock.lock();
    if (closed_) break;  // failed meanwhile: abandonWritesLocked below settles the frames
    if (w < 0) {
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      st = Status::error(
          ErrorCode::Remote,
          strFormat("sending to rank %d failed: %s (did it exit or crash?)", peer_, errnoText(err).c_str()), peer_);
      break;
    }
    written += static_cast<size_t>(w);
    moved_ += static_cast<uint64_t>(w);
    size_t left = static_cast<size_t>(w);
    while (left > 0 && !s.out.empty()) {
      OutFrame& f = s.out.front();
      size_t total = kHeaderBytes + f.payloadLen;
      size_t take = std::min(left, total - f.sent);
      f.sent += take;
      left -= take;
      if (f.sent == total) {
        onSentLocked(f);
        s.out.pop_front();
      }
    }
  }
  s.writing = false;
  if (closed_) {
    abandonWritesLocked(s);
    return Status::success();
  }
  if (st.ok) armLocked(s, !s.out.empty());
  if (st.ok && peerClosed_ && !anyWritingLocked()) st = *peerClosed_;
  return st;
}

Status TcpConnection::onHeaderLocked(Stream& s, const FrameHeader& h) {
  const bool control = &s == streams_[0].get();
  if (h.magic != kFrameMagic) return malformed("bad frame magic");
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::Push: {
      if (!control) return malformed("message header on a data stream");
      if (h.seq != nextRecvSeq_)
        return malformed(strFormat("message sequence %llu, expected %llu", static_cast<unsigned long long>(h.seq),
                                   static_cast<unsigned long long>(nextRecvSeq_)));
      if (h.a == 0 || h.a > kMaxPushBytes) return malformed("pushed message of a size the protocol does not allow");
      ++nextRecvSeq_;
      acceptPushLocked(h);
      return Status::success();
    }
    case FrameType::Eager:
    case FrameType::Rts: {
      if (!control) return malformed("message header on a data stream");
      if (h.seq != nextRecvSeq_)
        return malformed(strFormat("message sequence %llu, expected %llu", static_cast<unsigned long long>(h.seq),
                                   static_cast<unsigned long long>(nextRecvSeq_)));
      ++nextRecvSeq_;
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
      if (op && !signaturesAgree(op->req->signature, h.b)) {
        op->req->fail(signatureMismatch(peer_, h.b, rank_, op->req->signature));
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
        u->data = takeBufferLocked(h.a);
        matcher_.keep(h.tag, u);
        s.sink = Sink::Unexpected;
        s.target = u->data.data();
        s.ux = u;
      }
      return s.remaining == 0 ? finishPayloadLocked(s) : Status::success();
    }
    case FrameType::Cts: {
      if (!control) return malformed("CTS on a data stream");
      auto it = awaitingCts_.find(h.seq);
      if (it == awaitingCts_.end()) return malformed("CTS for a message that was not announced");
      std::shared_ptr<SendOp> op = it->second;
      awaitingCts_.erase(it);
      if ((h.flags & 1) == 0) {
        op->req->fail((h.flags & 2) != 0
                          ? signatureMismatch(peer_, h.a, rank_, op->req->signature)
                          : Status::error(ErrorCode::InvalidUsage,
                                          strFormat("rank %d's matching receive (tag %u) is smaller than this "
                                                    "message of %zu bytes",
                                                    peer_, op->tag, op->bytes),
                                          peer_));
        return Status::success();
      }
      if (op->bytes == 0) {
        op->req->complete(0);
        return Status::success();
      }
      enqueueDataLocked(op);
      // Whoever reads this writes what the sockets take at once (flushAllLocked); the send engine
      // is armed for the rest.
      return Status::success();
    }
    case FrameType::Bye: {
      if (!control) return malformed("BYE on a data stream");
      if (h.a > kMaxByeBytes) return malformed("BYE reason too long");
      s.inPayload = true;
      s.remaining = s.payloadLen = h.a;
      s.bye.assign(h.a, '\0');
      byeFailed_ = (h.flags & 1) != 0;
      s.sink = Sink::Bye;
      s.target = reinterpret_cast<uint8_t*>(&s.bye[0]);
      return s.remaining == 0 ? finishPayloadLocked(s) : Status::success();
    }
    case FrameType::Ready: {
      if (!control) return malformed("READY on a data stream");
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
    case FrameType::Data: {
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
  }
  return malformed(strFormat("unknown frame type %u", h.type));
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
  const bool takes = options_.consume && op.req && op.req->consumer && !op.ux && op.buf != nullptr;
  return takes ? op.req->consumer.get() : nullptr;
}

Status TcpConnection::read(Stream& s, std::unique_lock<std::mutex>& lock) {
  Status st = readSome(s, lock);
  if (st.ok && !closed_ && !s.eof && !s.reading) setLowWaterLocked(s);
  return st;
}

void TcpConnection::setLowWaterLocked(Stream& s) {
  // A long payload arrives over many packets. With more ranks than cores, waiters of large
  // transfers sleep and the receive thread reads (core/request.cc): woken per packet, it pays a
  // wake-up and a syscall for every 64 KiB, on the cores the senders need. Readable only per
  // lowWater bytes, it reads them in one go. With a core per rank a polling waiter reads instead,
  // and copying out as the bytes land overlaps the sender's copying in: no low-water mark then
  // (it made that case slower). Never more than the payload still owes, which the sender is
  // writing: the wait ends.
  const size_t lw = options_.lowWater;
  const bool crowded = detail::pauseSpinsBeforeYield().load(std::memory_order_relaxed) <= detail::kPauseSpinsCrowded;
  const bool bulk = crowded && lw > 1 && s.inPayload && s.target != nullptr && s.remaining > lw;
  const int want = bulk ? static_cast<int>(lw) : 1;
  if (want == s.lowWater) return;
  setLowWater(s.sock.fd(), want);
  s.lowWater = want;
}

Status TcpConnection::readSome(Stream& s, std::unique_lock<std::mutex>& lock) {
  // The budget bounds syscalls only: bytes already buffered are always parsed before returning,
  // since no further EPOLLIN would come for them. A read into the staging buffer that came back
  // short found the socket empty: the next one would only say EAGAIN, so it is skipped (a later
  // poll, or the re-armed level-triggered event, sees what arrives after).
  bool drained = false;
  s.blocked = false;  // a held-back header is parsed again below
  for (int reads = 0;;) {
    if (!s.inPayload) {
      if (s.wpos - s.rpos >= kHeaderBytes) {
        FrameHeader h = decodeHeader(s.in.data() + s.rpos);
        s.rpos += kHeaderBytes;
        Status st = onHeaderLocked(s, h);
        if (!st.ok) return st;
        if (s.blocked) {
          s.rpos -= kHeaderBytes;  // kept for when stream 0 has read the PUSH it belongs to
          return Status::success();
        }
        continue;
      }
    } else if (s.wpos > s.rpos) {
      size_t take = std::min(s.wpos - s.rpos, s.remaining);
      // A consumer takes whole elements; the payload's end is whole (sliceWhole).
      if (s.consumer != nullptr && take < s.remaining) take -= take % s.consumer->granule();
      if (take > 0) {
        if (s.consumer != nullptr) {
          // Handed on unlocked, like a read: `reading` keeps failLocked off this stream's buffer and
          // receive meanwhile, and other streams' slices of the message go on at once.
          ReceiveConsumer* consumer = s.consumer;
          const uint8_t* src = s.in.data() + s.rpos;
          const size_t at = s.consumeAt;
          s.reading = true;
          lock.unlock();
          consumer->consume(src, at, take);
          lock.lock();
          s.reading = false;
          if (closed_) {
            abandonReadLocked(s);
            return Status::success();
          }
          s.consumeAt += take;
          s.target += take;
        } else if (s.target != nullptr) {
          kernels::copy(s.target, s.in.data() + s.rpos, take);
          s.target += take;
        }
        s.rpos += take;
        s.remaining -= take;
        if (s.remaining == 0) {
          Status st = finishPayloadLocked(s);
          if (!st.ok) return st;
        }
        continue;
      }
      // Part of an element: the rest is read below.
    }
    // Nothing usable is buffered: read from the socket, unlocked (if the budget allows; the
    // level-triggered event brings us back for the rest).
    if (reads >= options_.readsPerEvent || drained) return Status::success();
    if (s.rpos == s.wpos) {
      s.rpos = s.wpos = 0;
    } else if (s.rpos > 0) {
      std::memmove(s.in.data(), s.in.data() + s.rpos, s.wpos - s.rpos);
      s.wpos -= s.rpos;
      s.rpos = 0;
    }
    const bool direct =
        s.inPayload && s.target != nullptr && s.consumer == nullptr && s.remaining >= kDirectReadBytes && s.wpos == 0;
    uint8_t* dst = direct ? s.target : s.in.data() + s.wpos;
    // Between frames, read a little: enough to batch small frames, not so much that a following
    // large payload lands in the staging buffer and has to be copied again. A payload for a
    // consumer is read up to its end only, for the same reason (what is buffered of it is less
    // than what it still owes, or it would have been handed on above).
    const size_t room = s.in.size() - s.wpos;
    const size_t len = direct                  ? s.remaining
                       : s.consumer != nullptr ? std::min(room, s.remaining - (s.wpos - s.rpos))
                       : s.inPayload           ? room
                                               : std::min(room, kHeaderReadBytes);
    const int fd = s.sock.fd();
    const bool midPayload = s.inPayload;
    s.reading = true;
    lock.unlock();
    ssize_t n = recv(fd, dst, len, MSG_DONTWAIT);
    const int err = errno;
    if (options_.quickAck && (n >= kQuickAckBytes || (n > 0 && midPayload))) setQuickAck(fd);
    lock.lock();
    s.reading = false;
    ++reads;
    if (closed_) {
      abandonReadLocked(s);
      return Status::success();
    }
    if (n > 0) {
      moved_ += static_cast<uint64_t>(n);
      if (direct) {
        s.target += n;
        s.remaining -= static_cast<size_t>(n);
        if (s.remaining == 0) {
          Status st = finishPayloadLocked(s);
          if (!st.ok) return st;
        }
      } else {
        s.wpos += static_cast<size_t>(n);
        drained = static_cast<size_t>(n) < len;
      }
      continue;
    }
    if (n == 0) {
      // Other streams may still hold the tail of a striped message: the connection is closed
      // only once every stream has reached its end (see onReadable).
      s.eof = true;
      recvEngine_->remove(fd);
      return Status::success();
    }
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return Status::success();
    return Status::error(
        ErrorCode::Remote,
        strFormat("receiving from rank %d failed: %s (did it exit or crash?)", peer_, errnoText(err).c_str()), peer_);
  }
}

void TcpConnection::onReadable(int index) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  Stream& s = *streams_[static_cast<size_t>(index)];
  s.readArmed = false;  // one-shot: the event disarmed it
  if (s.eof) return;
  // A waiter drives this connection: it re-arms the event when done, if still needed.
  if (s.reading || pollers_ > 0) return;
  Status st = read(s, lock);
  // Stream 0 may have brought the PUSH that other streams' data waits for.
  if (st.ok && !closed_ && &s == streams_[0].get()) st = drainBlockedLocked(lock);
  // A stream holding back data is re-read when stream 0 catches up, not on its (still ready) socket.
  if (st.ok && !closed_ && engineNeededLocked())
    for (auto& x : streams_)
      if (!x->blocked && !x->eof && !x->reading) armReadLocked(*x);
  // Reading may have queued frames (a CTS, the slices of a message the peer accepted): send
  // what the sockets take now, not at the next writable event; the send engine does the rest.
  for (auto& x : streams_)
    if (st.ok && !closed_ && !x->writing && !x->out.empty()) st = flush(*x, lock, kReaderWriteBudget);
  if (st.ok && !closed_) st = closedByPeerLocked();
  if (!st.ok) failFrom(st, lock);
}

bool TcpConnection::poll() noexcept {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || closed_) return false;
  const uint64_t before = moved_;
  // Ask which streams have bytes first: poll(2) reads the receive queue without the socket lock,
  // where an empty recv(2) would take it and contend with arriving packets and with senders.
  // Streams with frames waiting for room are asked whether they have room now (no sendmsg that
  // would only say EAGAIN); frames queued after the look are tried at once.
  pollfd ready[kMaxStreams];
  bool waitingForRoom[kMaxStreams];
  const size_t ns = std::min(streams_.size(), kMaxStreams);
  for (size_t i = 0; i < ns; ++i) {
    const Stream& x = *streams_[i];
    waitingForRoom[i] = !x.out.empty() && !x.writing;
    ready[i] = pollfd{x.eof ? -1 : x.sock.fd(), static_cast<short>(POLLIN | (waitingForRoom[i] ? POLLOUT : 0)), 0};
  }
  if (::poll(ready, ns, 0) < 0) return false;
  Status st;
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = *streams_[i];
    const bool readable = i >= ns || s.blocked || (ready[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    if (st.ok && readable && !closed_ && !s.reading && !s.eof) {
      st = read(s, lock);
    }
    const bool tryWrite = i >= ns || !waitingForRoom[i] || (ready[i].revents & (POLLOUT | POLLERR | POLLHUP)) != 0;
    if (st.ok && !closed_ && !s.writing && !s.out.empty() && tryWrite) st = flush(s, lock, kUnlimited);
  }
  if (st.ok && !closed_) st = drainBlockedLocked(lock);
  if (st.ok && !closed_) st = closedByPeerLocked();
  if (!st.ok) {
    failFrom(st, lock);
    return true;
  }
  // A poll outside pollBegin/pollEnd (a waiter looking at its other connections) may have kept
  // the engine off a stream it fired for meanwhile.
  if (pollers_ == 0) rearmIfNeededLocked();
  return moved_ != before;
}

void TcpConnection::pollBegin() noexcept {
  // Nothing to switch off: the engine is armed only while something needs it, and if it fires
  // meanwhile it finds a poller and leaves the stream to it (one-shot: it is then disarmed).
  std::lock_guard<std::mutex> lock(mu_);
  ++pollers_;
}

void TcpConnection::pollEnd() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (--pollers_ > 0) return;
  rearmIfNeededLocked();
  // What the poller left unwritten goes to the send engine (a writer still in sendmsg arms it
  // itself when it finishes).
  for (auto& x : streams_)
    if (!x->out.empty() && !x->writing && !closed_) armLocked(*x, true);
}

Status TcpConnection::closedByPeerLocked() {
  for (const auto& x : streams_)
    if (!x->eof) return Status::success();
  Status st =
      byeReason_.empty()
          ? Status::error(
                ErrorCode::Remote,
                strFormat("rank %d closed its connection (it exited, crashed or destroyed its communicator)", peer_),
                peer_)
          : leftStatus(byeReason_);
  // A writer in sendmsg may have delivered its last frame without having recorded it yet: judge
  // whether anything is pending only once it has (see flush).
  if (anyWritingLocked()) {
    peerClosed_ = st;
    return Status::success();
  }
  return st;
}

bool TcpConnection::anyWritingLocked() const {
  for (const auto& x : streams_)
    if (x->writing) return true;
  return false;
}

void TcpConnection::onWritable(int index) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  Stream& s = *streams_[static_cast<size_t>(index)];
  s.armed = false;  // one-shot: the event disarmed it; flush (ours or the active writer's) re-arms
  Status st = flush(s, lock, kUnlimited);
  if (!st.ok) failFrom(st, lock);
}

void TcpConnection::failFrom(const Status& given, std::unique_lock<std::mutex>& lock) {
  // A broken link may have a BYE waiting on stream 0 that says why the peer went (a write can
  // fail on the closed socket before the reader has seen the word): read it if it is there.
  Status st = given;
  Stream& s0 = *streams_[0];
  // A BYE whose header was read but not yet its reason is still worth finishing.
  const bool byeArriving = byeFailed_ && s0.inPayload && s0.sink == Sink::Bye;
  if (!closed_ && given.code == ErrorCode::Remote && !s0.eof && byeReason_.empty() && (!byeFailed_ || byeArriving)) {
    // Another thread may be in its (non-blocking) recv on stream 0 right now, perhaps taking in
    // that very word: let it finish rather than report the bare broken link.
    for (int i = 0; i < 10000 && s0.reading && !closed_; ++i) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    if (closed_) return;
    if (!s0.reading && !s0.eof && byeReason_.empty()) {
      const bool sawFailedBye = byeFailed_;
      Status word = read(s0, lock);
      if (closed_) return;
      if (!word.ok &&
          ((byeFailed_ && !sawFailedBye) || word.message.find("left the communicator") != std::string::npos))
        st = word;
      if (!byeReason_.empty()) st = leftStatus(byeReason_);
    }
  }
  // No word on the link (the peer was killed, or its BYE could not get between the frames it was
  // writing): a peer whose communicator failed left its first error in the store. With nothing
  // pending the link may just have ended (a peer that exited): asked only if an operation comes.
  const bool wordless = given.code == ErrorCode::Remote && st.message == given.message && byeReason_.empty() &&
                        !byeFailed_ && lastWordOf_;
  if (!closed_ && wordless && !hasPendingLocked()) wordUnasked_ = true;
  if (!closed_ && wordless && !wordUnasked_) {
    if (askingLastWord_) return;  // another thread asks, and fails the link with the answer
    const std::string word = askLastWord(lock);
    if (closed_) return;
    if (!word.empty()) st = leftStatus(word);
  }
  // A peer that leaves while nothing is pending with it is a normal shutdown; a peer that
  // leaves mid-operation fails the communicator. The communicator is marked failed before this
  // link's requests fail, and the link closes before the lock is let go: a thread woken by its
  // failed request may destroy the communicator at once, and must find it failed, so that its
  // other peers are told this cause and not a clean goodbye (seen in CI: a rank whose receive
  // failed when another timed out left "destroyed", and a third rank waiting on it reported that
  // instead of the hang); and no other reader of this link may fail it meanwhile with a worse word.
  const bool pending = (!closed_ && hasPendingLocked()) || byeFailed_;
  const bool first = pending && failure_->record(st);
  failLocked(st);
  lock.unlock();
  if (pending) {
    LOOM_WARN("%s", st.message.c_str());
    if (first) failure_->runHook(st);  // fails every other link and queued collective
  } else {
    LOOM_INFO("%s", st.message.c_str());
  }
}

void TcpConnection::failClosedLocked(const RequestPtr& req, std::unique_lock<std::mutex>& lock) {
  if (wordUnasked_ && !askingLastWord_) {
    // The link ended without a word while nothing was pending; an operation on it now fails, so
    // its error should say why the peer went, if the peer said it in the store.
    wordUnasked_ = false;
    const Status bare = closedStatus_;
    const std::string word = askLastWord(lock);
    if (!word.empty() && closedStatus_.message == bare.message) closedStatus_ = leftStatus(word);
  } else if (askingLastWord_) {
    // Another thread is asking: its answer is this operation's reason too. The ask is bounded
    // (kLastWordAskBound); so is this wait.
    wordAsked_.wait_for(lock, kLastWordAskBound, [&] { return !askingLastWord_; });
  }
  req->fail(closedStatus_);
}

std::string TcpConnection::askLastWord(std::unique_lock<std::mutex>& lock) {
  askingLastWord_ = true;
  lock.unlock();
  std::string word = lastWordOf_(peer_, kLastWordWait);
  lock.lock();
  askingLastWord_ = false;
  wordAsked_.notify_all();
  return word;
}

Status TcpConnection::leftStatus(const std::string& why) const {
  return Status::error(ErrorCode::Remote, strFormat("rank %d left the communicator: %s", peer_, why.c_str()), peer_);
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

void TcpConnection::abandonReadLocked(Stream& s) {
  if (s.inPayload && s.op && s.op->req) s.op->req->fail(closedStatus_);
  if (s.inPayload && s.op && s.op->ux && s.op->ux->claimedBy) s.op->ux->claimedBy->req->fail(closedStatus_);
  if (s.inPayload && s.ux && s.ux->claimedBy) s.ux->claimedBy->req->fail(closedStatus_);
  s.op.reset();
  s.ux.reset();
  s.inPayload = false;
  s.target = nullptr;
  s.consumer = nullptr;
}

void TcpConnection::abandonWritesLocked(Stream& s) {
  for (auto& f : s.out)
    if (f.op) f.op->req->fail(closedStatus_);
  s.out.clear();
}

void TcpConnection::failLocked(const Status& status) {
  if (closed_) return;
  closed_ = true;
  closedStatus_ = status;
  for (auto& op : matcher_.takeAllPosted()) op->req->fail(status);
  for (auto& [seq, op] : awaitingCts_) op->req->fail(status);
  awaitingCts_.clear();
  for (auto& [seq, op] : incoming_) {
    // A receive the reader is filling right now is failed by the reader when it relocks.
    bool inFlight = false;
    for (auto& s : streams_) inFlight = inFlight || (s->reading && s->op == op);
    if (!inFlight && op->req) op->req->fail(status);
    if (op->ux && op->ux->claimedBy) op->ux->claimedBy->req->fail(status);
  }
  incoming_.clear();
  // Eager payloads fully received stay: a later receive can still take them.
  matcher_.dropKeptIf([](const std::shared_ptr<Unexpected>& u) { return !u->complete; });
  for (auto& s : streams_) {
    if (!s->writing) abandonWritesLocked(*s);
    if (!s->reading) abandonReadLocked(*s);
    if (s->registered) {
      if (!s->eof) recvEngine_->remove(s->sock.fd());
      sendEngine_->remove(s->sock.fd());
      s->registered = false;
    }
    if (s->sock.valid()) shutdown(s->sock.fd(), SHUT_RDWR);
  }
}

void TcpConnection::failAll(const Status& status) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) sayByeLocked(status, failure_->failed());
  failLocked(status);
}

void TcpConnection::sayByeLocked(const Status& status, bool failed) {
  Stream& s0 = *streams_[0];
  // Only between frames: a partly written frame cannot be interrupted.
  if (s0.writing || !s0.sock.valid() || (!s0.out.empty() && s0.out.front().sent > 0)) return;
  const std::string reason = status.message.substr(0, kMaxByeBytes);
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::Bye);
  h.flags = failed ? 1 : 0;
  h.a = reason.size();
  uint8_t hdr[kHeaderBytes];
  encodeHeader(h, hdr);
  iovec iov[2] = {{hdr, kHeaderBytes}, {const_cast<char*>(reason.data()), reason.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  (void)::sendmsg(s0.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);  // a few bytes: all or nothing in practice
}

}  // namespace tcp
}  // namespace loom
