#include "transport/ib/ib_connection.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/format.hpp"
#include "device/runtime.hpp"
#include "transport/ib/ib_protocol.hpp"

namespace loom {
namespace ib {

using namespace proto;  // NOLINT: this file speaks the protocol

IbConnection::IbConnection(int rank, int peer, const PortContext& pc, ibv_comp_channel* channel,
                           RegistrationCache& cache, std::shared_ptr<FailureState> failure, IbOptions options,
                           std::string description)
    : rank_(rank),
      peer_(peer),
      pc_(pc),
      cache_(cache),
      failure_(std::move(failure)),
      options_(options),
      description_(std::move(description)) {
  try {
    build(channel);
  } catch (...) {
    release();  // a constructor that throws runs no destructor
    throw;
  }
}

void IbConnection::build(ibv_comp_channel* channel) {
  const PortContext& pc = pc_;
  const Verbs& v = *pc.verbs;
  const int nq = std::max(1, std::min(options_.qps, kMaxQps));
  const int cqe = nq * (options_.slots + kSendWr) + 16;
  cq_ = v.createCq(pc.context, cqe, this, channel, 0);
  if (cq_ == nullptr) throw linkError("creating a completion queue", std::strerror(errno)).toError(rank_);
  for (int q = 0; q < nq; ++q) {
    qps_.push_back(
        std::make_unique<QueuePair>(pc, cq_, cq_, kSendWr, static_cast<uint32_t>(options_.slots), rank_, peer_));
    qps_.back()->init();
    credits_[q] = options_.slots;
    sendWrLeft_[q] = kSendWr;
  }
  const size_t recvBytes = static_cast<size_t>(nq) * static_cast<size_t>(options_.slots) * options_.slotBytes;
  const size_t sendBytes = static_cast<size_t>(options_.sendSlots) * options_.slotBytes;
  recvArea_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (recvBytes + 4095) / 4096 * 4096));
  sendArea_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (sendBytes + 4095) / 4096 * 4096));
  if (recvArea_ == nullptr || sendArea_ == nullptr) throw linkError("allocating slots", "out of memory").toError(rank_);
  std::memset(recvArea_, 0, recvBytes);
  std::memset(sendArea_, 0, sendBytes);
  recvMr_ = v.regMr(pc.pd, recvArea_, recvBytes, IBV_ACCESS_LOCAL_WRITE);
  sendMr_ = v.regMr(pc.pd, sendArea_, sendBytes, IBV_ACCESS_LOCAL_WRITE);
  if (recvMr_ == nullptr || sendMr_ == nullptr)
    throw linkError("registering its slots", std::strerror(errno)).toError(rank_);
  for (int s = options_.sendSlots - 1; s >= 0; --s) freeSendSlots_.push_back(s);
  std::lock_guard<std::mutex> lock(mu_);
  for (int q = 0; q < nq; ++q)
    for (int s = 0; s < options_.slots; ++s) repostLocked(q, s);
  if (closed_) throw closedStatus_.toError(rank_);
  if (ibv_req_notify_cq(cq_, 0) != 0) throw linkError("arming its completion queue", "refused").toError(rank_);
}

IbConnection::~IbConnection() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    const Status why = Status::error(ErrorCode::Aborted, "the communicator was destroyed", peer_);
    finishSendsLocked(lock);
    stopLocked(why);
    failRequestsLocked(closedStatus_);
  }
  release();
}

void IbConnection::release() noexcept {
  const Verbs& v = *pc_.verbs;
  if (copyStream_ != nullptr && device::runtime() != nullptr) device::runtime()->destroyStream(copyStream_);
  copyStream_ = nullptr;
  qps_.clear();  // before their completion queue
  if (cq_ != nullptr) v.destroyCq(cq_);
  if (recvMr_ != nullptr) v.deregMr(recvMr_);
  if (sendMr_ != nullptr) v.deregMr(sendMr_);
  std::free(recvArea_);
  std::free(sendArea_);
  cq_ = nullptr;
  recvMr_ = sendMr_ = nullptr;
  recvArea_ = sendArea_ = nullptr;
}

size_t IbConnection::eagerLimit(const IbOptions& o) { return o.slotBytes - sizeof(Header); }

std::string IbConnection::addresses() const {
  std::string out;
  for (const auto& q : qps_) out += (out.empty() ? "" : ";") + q->address().encode();
  return out;
}

void IbConnection::connect(const std::string& remote) {
  std::vector<QpAddress> theirs;
  std::stringstream ss(remote);
  for (std::string item; std::getline(ss, item, ';');) {
    QpAddress a;
    if (!QpAddress::decode(item, &a)) break;
    theirs.push_back(a);
  }
  if (theirs.size() != qps_.size()) {
    LOOM_THROW_PEER(ErrorCode::InvalidUsage, rank_, peer_,
                    strFormat("ib: rank %d offers %zu queue pair(s) (\"%s\"), this rank %zu: every rank must set "
                              "the same LOOM_IB_QPS_PER_CONNECTION",
                              peer_, theirs.size(), remote.c_str(), qps_.size()));
  }
  for (size_t i = 0; i < qps_.size(); ++i) qps_[i]->connect(theirs[i]);
  std::lock_guard<std::mutex> lock(mu_);
  connected_ = true;
}

void IbConnection::onCompletionEvent() noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  // Arm first, then take what is there: a completion that arrives in between raises a new event.
  ibv_req_notify_cq(cq_, 0);
  while (pollLocked()) {
  }
  unlock(lock);
}

bool IbConnection::progress() noexcept {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || closed_) return false;
  bool moved = false;
  while (pollLocked()) moved = true;
  unlock(lock);
  return moved;
}

void IbConnection::unlock(std::unique_lock<std::mutex>& lock) noexcept {
  std::optional<Status> hook;
  hook.swap(hookPending_);
  lock.unlock();
  if (!hook) return;
  failure_->runHook(*hook);  // stops every link, then fails their requests (this one's too)
  lock.lock();
  failRequestsLocked(closedStatus_);
  lock.unlock();
}

bool IbConnection::pollLocked() noexcept {
  ibv_wc wc[16];
  const int n = ibv_poll_cq(cq_, 16, wc);
  if (n < 0) {
    failLocked(linkError("polling its completion queue", "the adapter reports an error"));
    return false;
  }
  for (int i = 0; i < n && !closed_; ++i) completionLocked(wc[i]);
  if (!closed_) pumpLocked();
  return n > 0;
}

void IbConnection::completionLocked(const ibv_wc& wc) noexcept {
  const uint64_t kind = wc.wr_id & kKindMask;
  if (wc.status == IBV_WC_WR_FLUSH_ERR) {
    // A consequence: the queue pair went to the error state (its cause, an asynchronous event or
    // a failed request of the other side, may come later or never reach this rank).
    failLocked(inErrorStatus("the work posted on it was flushed"));
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    const char* what = kind == kRecvSlot ? "receiving" : kind == kWrite ? "an RDMA write" : "sending";
    failLocked(completionError(what, wc.status));
    return;
  }
  if (kind == kRecvSlot) {
    const int qp = static_cast<int>((wc.wr_id >> 20) & 0xff);
    const int slot = static_cast<int>(wc.wr_id & 0xfffff);
    receivedLocked(qp, slot, wc);
    return;
  }
  if (kind == kSendSlot) {
    if ((wc.wr_id & kNoSlot) != kNoSlot) freeSendSlots_.push_back(static_cast<int>(wc.wr_id & kNoSlot));
    sendWrLeft_[0]++;
    return;
  }
  // A chunk of a large message landed in the receiver's memory.
  const uint64_t seq = wc.wr_id & ~kKindMask;
  for (size_t q = 0; q < qps_.size(); ++q)
    if (qps_[q]->get()->qp_num == wc.qp_num) sendWrLeft_[q]++;
  auto it = writing_.find(seq);
  if (it == writing_.end()) return;
  if (--it->second->chunksLeft == 0) {
    it->second->req->complete(it->second->bytes);
    writing_.erase(it);
  }
}

void IbConnection::quiesce(const Status& why) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  finishSendsLocked(lock);
  stopLocked(why);
}

void IbConnection::failAll(const Status& status) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  finishSendsLocked(lock);
  stopLocked(status);
  failRequestsLocked(status);
}

void IbConnection::finishSendsLocked(std::unique_lock<std::mutex>& lock) noexcept {
  // Where the adapter may touch a caller's buffer (a clear-to-send went either way), the link
  // stops at once: no byte may move once its request has failed.
  if (closed_ || !connected_ || !incoming_.empty() || !writing_.empty() || !writes_.empty()) return;
  // Meanwhile nothing is delivered into a posted receive (what arrives is kept) and no announced
  // send starts: only this link's own staging slots are read, whatever the callers do with their
  // buffers (a collective that failed on another link may return before this one fails).
  closing_ = true;
  // Briefly: a peer that is gone takes the adapter's whole retry time to say so.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (!closed_ && sendsInFlightLocked() && std::chrono::steady_clock::now() < until) {
    if (!pollLocked()) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      lock.lock();
    }
  }
  // A failure of the link met meanwhile needs no hook: every link is being closed already.
  hookPending_.reset();
}

bool IbConnection::sendsInFlightLocked() const {
  if (!outq_.empty() || !writes_.empty()) return true;
  for (size_t q = 0; q < qps_.size(); ++q)
    if (sendWrLeft_[q] < kSendWr) return true;
  return false;
}

void IbConnection::failLocked(const Status& s, bool ofLink) noexcept {
  if (closed_) return;
  // The communicator is marked failed before this link's requests fail: a thread woken by one
  // must find it failed (tcp_connection.cc, failFrom, says why).
  const bool first = ofLink && failure_ && failure_->record(s);
  stopLocked(s);
  // The communicator's first failure: its hook stops every other link before any request fails
  // (LinkTable::failAll), this link's included (unlock() fails them if the hook did not).
  if (first) {
    hookPending_ = s;
    return;
  }
  failRequestsLocked(s);
}

void IbConnection::stopLocked(const Status& s) noexcept {
  if (closed_) return;
  closed_ = true;
  closedStatus_ = s;
  sayOnSideLocked(s.message);
  // Stop the adapter first: no write may land in a buffer once its request has failed and its
  // owner may free it.
  for (auto& q : qps_) {
    ibv_qp_attr a;
    std::memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_ERR;
    pc_.verbs->modifyQp(q->get(), &a, IBV_QP_STATE);
  }
}

void IbConnection::failRequestsLocked(const Status& s) noexcept {
  for (auto& [seq, op] : awaitingCts_) op->req->fail(s);
  for (auto& [seq, op] : writing_) op->req->fail(s);
  for (auto& [id, op] : incoming_) op->req->fail(s);
  for (auto& op : matcher_.takeAllPosted()) op->req->fail(s);
  awaitingCts_.clear();
  writing_.clear();
  incoming_.clear();
  writes_.clear();
  outq_.clear();
  // Messages that arrived whole stay for receives posted later; announcements cannot be read now.
  matcher_.dropKeptIf([](const std::shared_ptr<Unexpected>& u) { return static_cast<Msg>(u->h.type) != Msg::Eager; });
}

Status IbConnection::linkError(const char* what, const std::string& why, const char* hint) const {
  return Status::error(ErrorCode::Remote,
                       strFormat("ib: %s on the link to rank %d failed: %s%s", what, peer_, why.c_str(), hint), peer_);
}

Status IbConnection::completionError(const char* what, ibv_wc_status status) const {
  const char* hint = "";
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
      hint =
          " (its adapter did not answer within LOOM_IB_TIMEOUT and LOOM_IB_RETRY_CNT: is its port down, or "
          "unreachable from this one?)";
      break;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      hint = " (it kept no receive posted)";
      break;
    case IBV_WC_REM_ACCESS_ERR:
      hint = " (it refused the access: a key or range it did not give, or no longer has registered)";
      break;
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
      hint = " (it could not carry the request out)";
      break;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_QP_OP_ERR:
      hint = " (this rank's request was at fault: a bug in Loom, please report it)";
      break;
    default:
      break;
  }
  return linkError(what, pc_.verbs->wcStatusStr(status), hint);
}

}  // namespace ib
}  // namespace loom
