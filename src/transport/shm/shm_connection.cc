#include "transport/shm/shm_connection.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/signature.hpp"
#include "kernels/copy.hpp"
#include "transport/shm/cma.hpp"

namespace loom {
namespace shm {
namespace {

// Ring copies are done in pieces of at most this much, so that a lock is never held long.
constexpr size_t kPieceBytes = 256 * 1024;
// Largest EAGER payload a receiver accepts (it may have to buffer it unasked).
constexpr uint64_t kMaxEagerBytes = 4u << 20;

}  // namespace

ShmConnection::ShmConnection(int rank, int peer, RingView in, RingView out, SegmentHeader* mine, SegmentHeader* theirs,
                             pid_t peerPid, std::shared_ptr<FailureState> failure, ShmOptions options,
                             std::string description)
    : rank_(rank),
      peer_(peer),
      in_(in),
      out_(out),
      mine_(mine),
      theirs_(theirs),
      peerPid_(peerPid),
      failure_(std::move(failure)),
      options_(options),
      description_(std::move(description)),
      cma_(options.cma) {}

Status ShmConnection::malformed(const std::string& why) const {
  return Status::error(
      ErrorCode::Remote,
      strFormat("malformed data from rank %d over shared memory (%s): closing the link", peer_, why.c_str()), peer_);
}

void ShmConnection::updateBacklogLocked() {
  // Called with the lock of whichever queue changed; the sum is a hint for hasWork.
  outBacklog_.store(static_cast<int>(outq_.size()), std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Send side.

void ShmConnection::isend(const RequestPtr& req, const SendSpec& spec) noexcept {
  const void* buf = spec.buf;
  const size_t bytes = spec.bytes;
  const uint32_t tag = spec.tag;
  std::unique_lock<std::mutex> out(outMu_);
  if (closed_) return req->fail(closedStatus_);
  auto op = std::make_shared<SendOp>();
  op->req = req;
  op->buf = static_cast<const uint8_t*>(buf);
  op->bytes = bytes;
  op->tag = tag;
  op->signature = spec.signature;
  Out o;
  o.frame.tag = tag;
  o.frame.seq = nextSendSeq_++;
  o.frame.bytes = bytes;
  o.frame.sig = spec.signature;
  if (bytes <= options_.eagerBytes) {
    o.frame.type = static_cast<uint8_t>(FrameType::Eager);
    o.payload = op->buf;
    o.len = bytes;
    o.op = op;
  } else {
    o.frame.type = static_cast<uint8_t>(FrameType::Rts);
    o.frame.addr = reinterpret_cast<uintptr_t>(buf);
    awaiting_[o.frame.seq] = op;
  }
  enqueueLocked(std::move(o));
}

void ShmConnection::enqueueLocked(Out o) {
  outq_.push_back(std::move(o));
  flushLocked();
  updateBacklogLocked();
}

bool ShmConnection::flushLocked() {
  bool moved = false, urgent = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    while (!outq_.empty()) {
      Out& o = outq_.front();
      size_t room = out_.writable();
      if (o.written == 0) {
        if (room < kFrameBytes) break;
        out_.write(&o.frame, kFrameBytes);
        o.written = kFrameBytes;
        room -= kFrameBytes;
        moved = true;
      }
      size_t done = o.written - kFrameBytes;
      while (done < o.len && room > 0) {
        size_t n = std::min({o.len - done, room, kPieceBytes});
        out_.write(o.payload + done, n);
        done += n;
        room -= n;
        moved = true;
      }
      o.written = kFrameBytes + done;
      urgent = urgent || o.frame.type != static_cast<uint8_t>(FrameType::Eager);
      if (done < o.len) break;
      if (o.op) o.op->req->complete(o.op->bytes);
      outq_.pop_front();
    }
    if (moved) wakePeerLocked(urgent);
    if (outq_.empty()) {
      out_.control()->wantSpace.store(0, std::memory_order_relaxed);
      break;
    }
    // Ask the consumer to ring us when it frees room, then look once more: it may have freed
    // some between our last look and the flag.
    out_.control()->wantSpace.store(1, std::memory_order_seq_cst);
    if (out_.writable() < kFrameBytes) break;
  }
  updateBacklogLocked();
  return moved;
}

void ShmConnection::wakePeerLocked(bool urgent) { ring(theirs_, urgent); }

void ShmConnection::sendControl(FrameType type, uint64_t seq, uint64_t sig) {
  std::lock_guard<std::mutex> out(outMu_);
  if (closed_) return;
  Out o;
  o.frame.type = static_cast<uint8_t>(type);
  o.frame.seq = seq;
  o.frame.sig = sig;
  outq_.push_back(o);
  flushLocked();
}

// ---------------------------------------------------------------------------------------------
// Receive side.

void ShmConnection::irecvLocked(const RequestPtr& req, const RecvSpec& spec, std::unique_lock<std::mutex>& in) {
  const size_t bytes = spec.capacity;
  const uint32_t tag = spec.tag;
  // Unexpected messages in arrival order; the first with this tag matches. On a closed link too:
  // what the peer sent before it went stays for its receive (failLocked).
  std::optional<std::shared_ptr<Unexpected>> kept = matcher_.takeMessage(tag);
  if (closed_ && !kept) return req->fail(closedStatus_);
  std::shared_ptr<RecvOp> op = makeRecv(req, spec);
  if (!kept) {
    matcher_.post(tag, std::move(op), spec.posted);
    return;
  }
  std::shared_ptr<Unexpected> u = std::move(*kept);
  const size_t message = static_cast<size_t>(u->frame.bytes);
  if (!signaturesAgree(spec.signature, u->frame.sig)) {
    // A message of another call: this receive fails; an announced one is refused.
    req->fail(signatureMismatch(peer_, u->frame.sig, rank_, spec.signature));
    if (u->frame.type == static_cast<uint8_t>(FrameType::Rts)) {
      in.unlock();
      sendControl(FrameType::Nack, u->frame.seq, spec.signature);
    } else if (u->complete) {
      recycleLocked(std::move(u->data));
    }
    return;
  }
  if (spec.signature == kDeviceAnySourceRecv) req->setMatchedSignature(u->frame.sig);
  if (u->frame.type == static_cast<uint8_t>(FrameType::Rts)) {
    if (message > bytes) {
      req->fail(truncationError(peer_, tag, message, bytes));
      in.unlock();
      sendControl(FrameType::Nack, u->frame.seq);
      return;
    }
    op->bytes = message;
    op->seq = u->frame.seq;
    op->remote = u->frame.addr;
    startLargeLocked(op);
    // The read is for whoever polls first: a waiter, or the engine, which we wake unless a thread
    // of ours attends.
    ring(mine_, true);
    return;
  }
  if (message > bytes) {
    req->fail(truncationError(peer_, tag, message, bytes));
    return;
  }
  op->bytes = message;
  if (u->complete) {
    if (message > 0) kernels::copy(op->buf, u->data.data(), message);
    recycleLocked(std::move(u->data));
    req->complete(message);
  } else {
    u->claimedBy = op;
  }
}

std::vector<uint8_t> ShmConnection::bufferLocked(size_t bytes) {
  // A recycled buffer keeps its size (only its first `bytes` are used): no zero-filling, and no
  // page faults from the heap growing and shrinking for every unexpected message.
  for (auto it = spare_.begin(); it != spare_.end(); ++it)
    if (it->size() >= bytes) {
      std::vector<uint8_t> v = std::move(*it);
      spare_.erase(it);
      return v;
    }
  // Rounded up to 4 KiB so that messages of nearby sizes can share buffers.
  std::vector<uint8_t> v;
  v.reserve((bytes + 4095) / 4096 * 4096);
  v.resize(v.capacity());
  return v;
}

void ShmConnection::recycleLocked(std::vector<uint8_t>&& v) {
  // Keep as many as a ring's worth of bytes: what a sender running ahead can have in flight.
  size_t kept = 0;
  for (const auto& b : spare_) kept += b.size();
  if (v.empty() || v.size() > options_.eagerBytes || kept + v.size() > in_.capacity()) return;
  spare_.push_back(std::move(v));
}

void ShmConnection::startLargeLocked(const std::shared_ptr<RecvOp>& op) {
  if (cma_.load(std::memory_order_relaxed)) {
    cmaJobs_.push_back(op);
    cmaBacklog_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  incoming_[op->seq] = op;
  // outMu_ after inMu_: the documented order.
  sendControl(FrameType::Cts, op->seq);
}

bool ShmConnection::runCmaLocked(std::unique_lock<std::mutex>& in) {
  if (cmaBusy_ || cmaJobs_.empty()) return false;
  std::shared_ptr<RecvOp> op = cmaJobs_.front();
  cmaJobs_.pop_front();
  cmaBacklog_.fetch_sub(1, std::memory_order_relaxed);
  cmaBusy_ = true;
  in.unlock();
  const int err = cmaRead(peerPid_, op->buf, op->remote, op->bytes);
  in.lock();
  cmaBusy_ = false;
  if (closed_) {
    op->req->fail(closedStatus_);
    return true;
  }
  if (err == 0) {
    op->req->complete(op->bytes);
    sendControl(FrameType::Done, op->seq);
    return true;
  }
  if (err == EPERM || err == ENOSYS || err == EACCES) {
    // Refused after the probe passed (a policy change, a seccomp filter): copy through the ring.
    if (cma_.exchange(false)) {
      LOOM_WARN("process_vm_readv from rank %d refused (%s): copying large messages through the ring from now on",
                peer_, errnoText(err).c_str());
    }
    incoming_[op->seq] = op;
    sendControl(FrameType::Cts, op->seq);
    // Turn the other queued reads into ring transfers too.
    for (auto& j : cmaJobs_) {
      incoming_[j->seq] = j;
      sendControl(FrameType::Cts, j->seq);
    }
    cmaBacklog_.fetch_sub(static_cast<int>(cmaJobs_.size()), std::memory_order_relaxed);
    cmaJobs_.clear();
    return true;
  }
  // The peer's memory or process is gone: it failed or exited. Say why where it left word.
  const std::string theirReason = recordedFailure(theirs_);
  Status st = Status::error(
      ErrorCode::Remote,
      !theirReason.empty()
          ? strFormat("rank %d stopped after an error of its own (%s) while rank %d read a message from it", peer_,
                      theirReason.c_str(), rank_)
          : strFormat("reading %zu bytes from rank %d's memory failed (%s): rank %d (pid %d) has probably exited "
                      "or freed the buffer of a send it abandoned",
                      op->bytes, peer_, errnoText(err).c_str(), peer_, static_cast<int>(peerPid_)),
      peer_);
  op->req->fail(st);
  in.unlock();
  failFrom(st);
  in.lock();
  return true;
}

bool ShmConnection::readLocked(std::unique_lock<std::mutex>& in) {
  bool moved = false;
  size_t consumed = 0;
  for (;;) {
    if (closed_) break;
    if (runCmaLocked(in)) {
      moved = true;
      continue;
    }
    const size_t avail = in_.readable();
    if (avail == 0) break;
    if (sink_ == Sink::None) {
      Frame f;
      in_.read(&f, kFrameBytes);
      consumed += kFrameBytes;
      moved = true;
      Status st = onFrameLocked(f);
      if (!st.ok) {
        in.unlock();
        failFrom(st);
        in.lock();
        return true;
      }
      continue;
    }
    const size_t n = std::min({avail, static_cast<size_t>(cur_.bytes) - payloadDone_, kPieceBytes});
    switch (sink_) {
      case Sink::Direct:
        in_.read(sinkOp_->buf + payloadDone_, n);
        break;
      case Sink::Unexpected:
        in_.read(sinkUnexpected_->data.data() + payloadDone_, n);
        break;
      default:
        in_.skip(n);
        break;
    }
    payloadDone_ += n;
    consumed += n;
    moved = true;
    if (payloadDone_ == cur_.bytes) finishPayloadLocked();
    if (consumed >= in_.capacity() / 4) {
      // Let a producer waiting for room go on while we copy the rest.
      if (in_.control()->wantSpace.load(std::memory_order_seq_cst)) wakePeerLocked(true);
      consumed = 0;
    }
  }
  if (consumed > 0 && in_.control()->wantSpace.load(std::memory_order_seq_cst)) wakePeerLocked(true);
  return moved;
}

Status ShmConnection::onFrameLocked(const Frame& f) {
  const auto type = static_cast<FrameType>(f.type);
  switch (type) {
    case FrameType::Eager:
    case FrameType::Rts:
      return onMessageLocked(f);
    case FrameType::Data:
      return onDataLocked(f);
    case FrameType::Done:
    case FrameType::Cts:
    case FrameType::Nack:
      return onAnswerLocked(f);
  }
  return malformed(strFormat("unknown frame type %u", f.type));
}

void ShmConnection::readPayloadLocked(const Frame& f, Sink sink) {
  cur_ = f;
  payloadDone_ = 0;
  sink_ = sink;
}

Status ShmConnection::onMessageLocked(const Frame& f) {
  const bool eager = static_cast<FrameType>(f.type) == FrameType::Eager;
  if (eager && f.bytes > kMaxEagerBytes) return malformed("eager message larger than the protocol allows");
  if (!eager && f.addr == 0) return malformed("large message without an address");
  std::optional<std::shared_ptr<RecvOp>> posted = matcher_.takeRecv(f.tag);
  if (!posted) {
    keepLocked(f);
    return Status::success();
  }
  std::shared_ptr<RecvOp> op = std::move(*posted);
  const size_t message = static_cast<size_t>(f.bytes);
  const bool agree = signaturesAgree(op->signature, f.sig);
  if (agree && op->signature == kDeviceAnySourceRecv) op->req->setMatchedSignature(f.sig);
  if (!agree || message > op->capacity) {
    op->req->fail(agree ? truncationError(peer_, f.tag, message, op->capacity)
                        : signatureMismatch(peer_, f.sig, rank_, op->signature));
    if (!eager) {
      sendControl(FrameType::Nack, f.seq, agree ? 0 : op->signature);
    } else if (message > 0) {
      readPayloadLocked(f, Sink::Discard);
    }
    return Status::success();
  }
  op->bytes = message;
  if (!eager) {
    op->seq = f.seq;
    op->remote = f.addr;
    startLargeLocked(op);
  } else if (message == 0) {
    op->req->complete(0);
  } else {
    readPayloadLocked(f, Sink::Direct);
    sinkOp_ = op;
  }
  return Status::success();
}

void ShmConnection::keepLocked(const Frame& f) {
  auto u = std::make_shared<Unexpected>();
  u->frame = f;
  if (static_cast<FrameType>(f.type) == FrameType::Eager) {
    u->data = bufferLocked(static_cast<size_t>(f.bytes));
    u->complete = f.bytes == 0;
    if (!u->complete) {
      readPayloadLocked(f, Sink::Unexpected);
      sinkUnexpected_ = u;
    }
  } else {
    u->complete = true;
  }
  matcher_.keep(f.tag, std::move(u));
}

Status ShmConnection::onDataLocked(const Frame& f) {
  auto it = incoming_.find(f.seq);
  if (it == incoming_.end()) return malformed("data for a message that was not accepted");
  if (f.bytes != it->second->bytes) return malformed("data of the wrong size");
  readPayloadLocked(f, Sink::Direct);
  sinkOp_ = it->second;
  incoming_.erase(it);
  if (f.bytes == 0) finishPayloadLocked();
  return Status::success();
}

Status ShmConnection::onAnswerLocked(const Frame& f) {
  const auto type = static_cast<FrameType>(f.type);
  std::lock_guard<std::mutex> out(outMu_);
  auto it = awaiting_.find(f.seq);
  if (it == awaiting_.end()) return malformed("answer for a message that was not announced");
  std::shared_ptr<SendOp> op = it->second;
  awaiting_.erase(it);
  if (type == FrameType::Done) {
    op->req->complete(op->bytes);
  } else if (type == FrameType::Nack) {
    op->req->fail(f.sig != 0 ? signatureMismatch(peer_, f.sig, rank_, op->signature)
                             : refusedAsTooLarge(peer_, op->tag, op->bytes));
  } else {
    Out o;
    o.frame.type = static_cast<uint8_t>(FrameType::Data);
    o.frame.seq = f.seq;
    o.frame.bytes = op->bytes;
    o.payload = op->buf;
    o.len = op->bytes;
    o.op = op;
    outq_.push_back(std::move(o));
    flushLocked();
  }
  return Status::success();
}

void ShmConnection::finishPayloadLocked() {
  if (sink_ == Sink::Direct) {
    sinkOp_->req->complete(sinkOp_->bytes);
  } else if (sink_ == Sink::Unexpected) {
    auto u = sinkUnexpected_;
    u->complete = true;
    if (u->claimedBy) {
      auto op = u->claimedBy;
      const size_t message = static_cast<size_t>(u->frame.bytes);
      if (message > 0) kernels::copy(op->buf, u->data.data(), message);
      recycleLocked(std::move(u->data));
      op->req->complete(message);
    }
  }
  sink_ = Sink::None;
  sinkOp_.reset();
  sinkUnexpected_.reset();
  payloadDone_ = 0;
}

// ---------------------------------------------------------------------------------------------
// Progress, liveness, failure.

bool ShmConnection::progress() noexcept {
  bool moved = false;
  {
    std::unique_lock<std::mutex> in(inMu_, std::try_to_lock);
    if (in.owns_lock()) moved |= readLocked(in);
  }
  if (outBacklog_.load(std::memory_order_relaxed) > 0) {
    std::unique_lock<std::mutex> out(outMu_, std::try_to_lock);
    if (out.owns_lock() && !closed_ && !outq_.empty()) moved |= flushLocked();
  }
  return moved;
}

bool ShmConnection::hasWork() const noexcept {
  return in_.readable() > 0 || outBacklog_.load(std::memory_order_relaxed) > 0 ||
         cmaBacklog_.load(std::memory_order_relaxed) > 0;
}

bool ShmConnection::needsEngine() const noexcept {
  if (polled()) return false;
  return in_.readable() > 0 || cmaBacklog_.load(std::memory_order_relaxed) > 0 ||
         (outBacklog_.load(std::memory_order_relaxed) > 0 && out_.writable() > 0);
}

}  // namespace shm
}  // namespace loom
