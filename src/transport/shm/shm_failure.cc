// ShmConnection, failures: a peer whose process is gone, and failing every pending request
// exactly once while the transfers in flight finish with their buffers.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/signature.hpp"
#include "kernels/copy.hpp"
#include "transport/shm/cma.hpp"
#include "transport/shm/shm_connection.hpp"

namespace loom {
namespace shm {

void ShmConnection::checkPeer() noexcept {
  const PeerState st = probeOwner(theirs_);
  const std::string theirReason = recordedFailure(theirs_);
  if (st == PeerState::Alive && theirReason.empty()) return;
  if (in_.readable() > 0) return;  // read what it left first; the next check decides
  bool pending;
  {
    std::lock_guard<std::mutex> in(inMu_);
    std::lock_guard<std::mutex> out(outMu_);
    if (closed_ || cmaBusy_) return;
    pending = hasPendingLocked();
  }
  const std::string because = theirReason.empty() ? std::string() : " after an error of its own: " + theirReason;
  Status s;
  if (st == PeerState::Died) {
    s = Status::error(ErrorCode::Remote,
                      strFormat("rank %d (pid %d, same node) died%s%s", peer_, static_cast<int>(peerPid_),
                                theirReason.empty() ? ": its process exited or was killed without closing its "
                                                      "communicator (shared memory)"
                                                    : "",
                                because.c_str()),
                      peer_);
  } else if (st == PeerState::Closed) {
    s = Status::error(ErrorCode::Remote,
                      strFormat("rank %d closed its communicator%s%s", peer_,
                                pending ? " while this rank still had messages with it" : "", because.c_str()),
                      peer_);
  } else {
    s = Status::error(ErrorCode::Remote, strFormat("rank %d stopped%s", peer_, because.c_str()), peer_);
  }
  if (!pending && theirReason.empty()) {
    // Nothing waits on a peer that closed or exited (a rank that leaves after its last collective
    // without destroying its communicator, as a training script's os._exit does): close the link
    // only, as TCP does; a later operation on it fails with this, and a collective waiting for the
    // peer in the node's arena finds it gone (its `gone` probes the peer's process too). A peer
    // whose communicator failed fails this one, pending or not: the next collective would wait for
    // it in vain.
    std::lock_guard<std::mutex> in(inMu_);
    std::lock_guard<std::mutex> out(outMu_);
    failLocked(s, false);
    return;
  }
  failFrom(s);
}

bool ShmConnection::hasPendingLocked() const {
  if (cmaBusy_ || matcher_.anyPosted() || !incoming_.empty() || !cmaJobs_.empty() || !outq_.empty() ||
      !awaiting_.empty() || sink_ != Sink::None)
    return true;
  bool claimed = false;
  matcher_.forEachKept([&claimed](const std::shared_ptr<Unexpected>& u) { claimed = claimed || u->claimedBy; });
  return claimed;
}

void ShmConnection::failFrom(const Status& st) noexcept {
  // The communicator is marked failed before this link's requests fail: a thread woken by one
  // must find it failed (tcp_connection.cc, failFrom, says why); the hook then fails the rest.
  const bool first = failure_ && failure_->record(st);
  failAll(st);
  if (first) failure_->runHook(st);
}

void ShmConnection::failAll(const Status& status) noexcept {
  std::unique_lock<std::mutex> in(inMu_);
  std::unique_lock<std::mutex> out(outMu_);
  failLocked(status, true);
}

bool ShmConnection::failLocked(const Status& st, bool record) {
  if (closed_) return false;
  closed_ = true;
  closedStatus_ = st;
  // Leave word for the peer (it reads it to explain what it sees next), unless this rank is
  // leaving cleanly: its progress thread marked the segment closed first.
  if (record && mine_->closed.load() == 0) recordFailure(mine_, st.message);
  bool any = false;
  auto failReq = [&](const RequestPtr& r) {
    if (!r->done()) any = true;
    r->fail(st);
  };
  for (auto& op : matcher_.takeAllPosted()) failReq(op->req);
  matcher_.forEachKept([&failReq](const std::shared_ptr<Unexpected>& u) {
    if (u->claimedBy) failReq(u->claimedBy->req);
  });
  // Eager messages fully received stay: a peer that closed cleanly right after its last send (the
  // last step of a barrier) has delivered it, and the receive may not be posted yet.
  matcher_.dropKeptIf([](const std::shared_ptr<Unexpected>& u) {
    return !u->complete || u->claimedBy || u->frame.type != static_cast<uint8_t>(FrameType::Eager);
  });
  if (sinkUnexpected_ && sinkUnexpected_->claimedBy) failReq(sinkUnexpected_->claimedBy->req);
  if (sinkOp_) failReq(sinkOp_->req);
  for (auto& [seq, op] : incoming_) failReq(op->req);
  incoming_.clear();
  for (auto& op : cmaJobs_) failReq(op->req);  // a read in progress fails when it returns
  cmaJobs_.clear();
  for (auto& o : outq_)
    if (o.op) failReq(o.op->req);
  outq_.clear();
  for (auto& [seq, op] : awaiting_) failReq(op->req);
  awaiting_.clear();
  outBacklog_.store(0);
  cmaBacklog_.store(0);
  return any;
}

}  // namespace shm
}  // namespace loom
