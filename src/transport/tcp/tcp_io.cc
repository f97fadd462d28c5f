// TcpConnection, the sockets: writing queued frames, reading into the stream buffer or straight
// into a receive, the engines' events, and the waiters' polls (tcp_connection.hpp, Threads).
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
#include "core/progress_policy.hpp"
#include "core/request.hpp"
#include "core/signature.hpp"
#include "kernels/copy.hpp"
#include "transport/tcp/stream.hpp"

namespace loom {
namespace tcp {

void TcpConnection::armLocked(Stream& s, bool want) {
  // While a thread polls this connection it writes what the socket takes: no send engine woken
  // per writable event meanwhile (resume hands what is left to the engine).
  if (want && polled()) return;
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
  if (recvEngine_->waitersAsleep() > 0) return true;
  unattended_.erase(
      std::remove_if(unattended_.begin(), unattended_.end(), [](const RequestPtr& r) { return r->done(); }),
      unattended_.end());
  return !unattended_.empty();
}

void TcpConnection::rearmIfNeededLocked() {
  if (polled() || closed_ || !engineNeededLocked()) return;
  for (auto& s : streams_) armReadLocked(*s);
}

void TcpConnection::noteUnattendedLocked(const RequestPtr& req) {
  if (detail::AttendScope::current() != nullptr) return;
  unattended_.push_back(req);
  if (!polled())
    for (auto& s : streams_) armReadLocked(*s);
}

bool TcpConnection::needsEngine() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  for (const auto& r : unattended_)
    if (!r->done()) return true;
  return false;
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
    if (w < 0) {
      if (closed_) break;  // failed meanwhile: abandonWritesLocked below settles the frames
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
    // Failed meanwhile (the peer said goodbye while this thread wrote): the frames this write
    // finished went out whole and complete above, as their peer may well have taken them;
    // abandonWritesLocked below fails the rest.
    if (closed_) break;
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

Status TcpConnection::read(Stream& s, std::unique_lock<std::mutex>& lock) {
  Status st = readSome(s, lock);
  if (st.ok && !closed_ && !s.eof && !s.reading) setLowWaterLocked(s);
  return st;
}

void TcpConnection::setLowWaterLocked(Stream& s) {
  // A long payload arrives over many packets. With more ranks than cores, waiters of large
  // transfers sleep and the receive thread reads (core/progress_policy.hpp): woken per packet, it
  // pays a wake-up and a syscall for every 64 KiB, on the cores the senders need. Readable only
  // per lowWater bytes, it reads them in one go. With a core per rank a polling waiter reads
  // instead, and copying out as the bytes land overlaps the sender's copying in: no low-water mark
  // then (it made that case slower). Never more than the payload still owes, which the sender is
  // writing: the wait ends.
  const size_t lw = options_.lowWater;
  const bool bulk = progress::crowded() && lw > 1 && s.inPayload && s.target != nullptr && s.remaining > lw;
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
    Status st;
    switch (takeBufferedLocked(s, lock, &st)) {
      case ReadStep::More:
        continue;
      case ReadStep::Stop:
        return st;
      case ReadStep::Empty:
        break;
    }
    // Nothing usable is buffered: read from the socket (if the budget allows; the level-triggered
    // event brings us back for the rest).
    if (reads >= options_.readsPerEvent || drained) return Status::success();
    ++reads;
    if (readSocketLocked(s, lock, &drained, &st) == ReadStep::Stop) return st;
  }
}

TcpConnection::ReadStep TcpConnection::takeBufferedLocked(Stream& s, std::unique_lock<std::mutex>& lock, Status* st) {
  if (!s.inPayload) {
    if (s.wpos - s.rpos < kHeaderBytes) return ReadStep::Empty;
    FrameHeader h = decodeHeader(s.in.get() + s.rpos);
    s.rpos += kHeaderBytes;
    *st = onHeaderLocked(s, h);
    if (!st->ok) return ReadStep::Stop;
    if (s.blocked) {
      s.rpos -= kHeaderBytes;  // kept for when stream 0 has read the PUSH it belongs to
      return ReadStep::Stop;
    }
    return ReadStep::More;
  }
  if (s.wpos == s.rpos) return ReadStep::Empty;
  size_t take = std::min(s.wpos - s.rpos, s.remaining);
  // A consumer takes whole elements; the payload's end is whole (sliceWhole).
  if (s.consumer != nullptr && take < s.remaining) take -= take % s.consumer->granule();
  if (take == 0) return ReadStep::Empty;  // part of an element: the rest is read from the socket
  if (s.consumer != nullptr) {
    // Handed on unlocked, like a read: `reading` keeps failLocked off this stream's buffer and
    // receive meanwhile, and other streams' slices of the message go on at once.
    ReceiveConsumer* consumer = s.consumer;
    const uint8_t* src = s.in.get() + s.rpos;
    const size_t at = s.consumeAt;
    s.reading = true;
    lock.unlock();
    consumer->consume(src, at, take);
    lock.lock();
    s.reading = false;
    if (closed_) {
      abandonReadLocked(s);
      *st = Status::success();
      return ReadStep::Stop;
    }
    s.consumeAt += take;
    s.target += take;
  } else if (s.target != nullptr) {
    kernels::copy(s.target, s.in.get() + s.rpos, take);
    s.target += take;
  }
  s.rpos += take;
  return payloadMovedLocked(s, take, st);
}

TcpConnection::ReadStep TcpConnection::payloadMovedLocked(Stream& s, size_t n, Status* st) {
  s.remaining -= n;
  if (s.remaining == 0) {
    *st = finishPayloadLocked(s);
    if (!st->ok) return ReadStep::Stop;
  }
  return ReadStep::More;
}

TcpConnection::ReadStep TcpConnection::readSocketLocked(Stream& s, std::unique_lock<std::mutex>& lock, bool* drained,
                                                        Status* st) {
  if (s.rpos == s.wpos) {
    s.rpos = s.wpos = 0;
  } else if (s.rpos > 0) {
    std::memmove(s.in.get(), s.in.get() + s.rpos, s.wpos - s.rpos);
    s.wpos -= s.rpos;
    s.rpos = 0;
  }
  const bool direct =
      s.inPayload && s.target != nullptr && s.consumer == nullptr && s.remaining >= kDirectReadBytes && s.wpos == 0;
  uint8_t* dst = direct ? s.target : s.in.get() + s.wpos;
  // Between frames, read a little: enough to batch small frames, not so much that a following
  // large payload lands in the staging buffer and has to be copied again. A payload for a
  // consumer is read up to its end only, for the same reason (what is buffered of it is less
  // than what it still owes, or it would have been handed on).
  const size_t room = kInBufBytes - s.wpos;
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
  *st = Status::success();
  if (closed_) {
    abandonReadLocked(s);
    return ReadStep::Stop;
  }
  if (n > 0) {
    moved_ += static_cast<uint64_t>(n);
    if (direct) {
      s.target += n;
      return payloadMovedLocked(s, static_cast<size_t>(n), st);
    }
    s.wpos += static_cast<size_t>(n);
    *drained = static_cast<size_t>(n) < len;
    return ReadStep::More;
  }
  if (n == 0) {
    // Other streams may still hold the tail of a striped message: the connection is closed
    // only once every stream has reached its end (see onReadable).
    s.eof = true;
    recvEngine_->remove(fd);
    return ReadStep::Stop;
  }
  if (err == EINTR) return ReadStep::More;
  if (err == EAGAIN || err == EWOULDBLOCK) return ReadStep::Stop;
  *st = Status::error(
      ErrorCode::Remote,
      strFormat("receiving from rank %d failed: %s (did it exit or crash?)", peer_, errnoText(err).c_str()), peer_);
  return ReadStep::Stop;
}

void TcpConnection::onReadable(int index) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  Stream& s = *streams_[static_cast<size_t>(index)];
  s.readArmed = false;  // one-shot: the event disarmed it
  if (s.eof) return;
  // A waiter drives this connection: it re-arms the event when done, if still needed.
  if (s.reading || polled()) return;
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

bool TcpConnection::progress() noexcept {
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
  // A poll by a thread that did not announce it (a waiter looking at its other connections) may
  // have kept the engine off a stream it fired for meanwhile.
  if (!polled()) rearmIfNeededLocked();
  return moved_ != before;
}

void TcpConnection::resume(bool sleeper) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  if (sleeper) {
    for (auto& s : streams_) armReadLocked(*s);
    return;
  }
  // The last poller left (a thread that polls again meanwhile keeps the engine off; see polled()).
  // The engine is armed only while something needs it; if it fired while the poller was on, it
  // found a poller and left the stream (one-shot: it is now disarmed).
  rearmIfNeededLocked();
  // What the poller left unwritten goes to the send engine (a writer still in sendmsg arms it
  // itself when it finishes).
  for (auto& x : streams_)
    if (!x->out.empty() && !x->writing) armLocked(*x, true);
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

}  // namespace tcp
}  // namespace loom
