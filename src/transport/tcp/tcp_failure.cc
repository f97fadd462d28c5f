// TcpConnection, failures: a link that breaks, a peer that says goodbye or leaves without a word
// (then the store is asked for its last word), and failing every pending request exactly once.
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
