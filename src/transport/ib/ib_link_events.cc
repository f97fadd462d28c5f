// IbConnection, what it learns beside its completions: the side channel to the peer (a BYE said
// there, or the channel's end when the peer's process ends) and the adapter's asynchronous events.
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "bootstrap/store_protocol.hpp"
#include "core/deadline.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "transport/ib/ib_connection.hpp"
#include "transport/ib/side_channel.hpp"

namespace loom {
namespace ib {
namespace {

// What a peer that ended without a BYE may have left in the store is asked for this long.
constexpr std::chrono::milliseconds kLastWordWait(250);
// How long an orderly goodbye waits for the completions of writes the peer has taken.
constexpr std::chrono::milliseconds kByeGrace(200);
// A BYE longer than this is not one.
constexpr uint32_t kMaxSideBye = 64 << 10;

}  // namespace

void IbConnection::watchSide(Socket side, ProgressEngine* engine,
                             std::function<std::string(int, std::chrono::milliseconds)> lastWordOf) {
  side_ = std::move(side);
  setNonBlocking(side_.fd());
  sideEngine_ = engine;
  lastWordOf_ = std::move(lastWordOf);
  sideWatch_ = std::make_unique<SideWatch>(*this);
  engine->add(side_.fd(), sideWatch_.get(), EPOLLIN | EPOLLRDHUP);
}

bool IbConnection::owns(const ibv_qp* qp) const {
  for (const auto& q : qps_)
    if (q->get() == qp) return true;
  return false;
}

void IbConnection::onSideEvents(uint32_t events) noexcept {
  (void)events;
  if (sideDone_) return;
  uint8_t buf[4096];
  for (;;) {
    const ssize_t n = ::recv(side_.fd(), buf, sizeof buf, 0);
    if (n > 0) {
      sideIn_.insert(sideIn_.end(), buf, buf + n);
      if (sideIn_.size() >= 4) {
        const uint32_t len = storewire::getU32(sideIn_.data());
        if (len > kMaxSideBye) break;  // not a BYE: as if the channel ended without a word
        if (sideIn_.size() >= 4 + static_cast<size_t>(len)) {
          const std::string why(sideIn_.begin() + 4, sideIn_.begin() + 4 + len);
          sideDone_ = true;
          sideEngine_->remove(side_.fd());
          sideEnded(&why);
          return;
        }
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    break;  // the end (0) or an error (reset): the peer's process is gone
  }
  sideDone_ = true;
  sideEngine_->remove(side_.fd());
  sideEnded(nullptr);
}

void IbConnection::sideEnded(const std::string* why) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  // What the peer sent before it went may still wait in the completion queue: taken first, its
  // messages stay for receives posted later, and a BYE among them gives its reason.
  while (!closed_ && pollLocked()) {
  }
  if (closed_) return unlock(lock);
  // A peer that said goodbye took what was written to it: writes whose completion alone is still
  // to come (the adapter has the acknowledgement in hand, or soon) complete, not fail.
  if (why != nullptr && !writing_.empty() && awaitingCts_.empty() && incoming_.empty() && !matcher_.anyPosted()) {
    const Deadline grace(kByeGrace);
    while (!closed_ && !writing_.empty() && !grace.expired()) {
      if (!pollLocked()) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lock.lock();
      }
    }
    if (closed_) return unlock(lock);
  }
  const bool pending = pendingLocked();
  Status st;
  if (why != nullptr) {
    st = leftStatus(*why);
  } else {
    std::string word;
    if (pending && lastWordOf_) {
      // A peer whose communicator failed left its first error in the store before it went.
      lock.unlock();
      word = lastWordOf_(peer_, kLastWordWait);
      lock.lock();
      if (closed_) return unlock(lock);
    }
    st = !word.empty() ? leftStatus(word)
                       : Status::error(ErrorCode::Remote,
                                       strFormat("rank %d's process ended without closing its links (killed or "
                                                 "crashed?): its ib side channel to rank %d closed",
                                                 peer_, rank_),
                                       peer_);
  }
  // A peer that leaves while nothing is pending with it is a normal shutdown; one that leaves
  // mid-operation fails the communicator.
  if (pending) {
    LOOM_WARN("%s", st.message.c_str());
  } else {
    LOOM_INFO("%s", st.message.c_str());
  }
  failLocked(st, pending);
  unlock(lock);
}

void IbConnection::sayOnSideLocked(const std::string& why) noexcept {
  if (sideSaid_ || !side_.valid()) return;
  sideSaid_ = true;
  const std::vector<uint8_t> bye = encodeSideBye(why.substr(0, std::min<size_t>(why.size(), 4096)));
  // A few hundred bytes into an idle socket's buffer: it goes whole, or the peer is gone anyway.
  (void)::send(side_.fd(), bye.data(), bye.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void IbConnection::onAdapterEvent(const std::string& what) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  const Status st = adapterStatus(what);
  LOOM_WARN("%s", st.message.c_str());
  failLocked(st);
  unlock(lock);
}

Status IbConnection::postError(int qp, const char* what, int err) const {
  ibv_qp_attr attr;
  ibv_qp_init_attr init;
  std::memset(&attr, 0, sizeof attr);
  if (pc_.verbs->queryQp(qps_[static_cast<size_t>(qp)]->get(), &attr, IBV_QP_STATE, &init) == 0 &&
      attr.qp_state == IBV_QPS_ERR)
    return inErrorStatus(strFormat("%s was refused: %s", what, std::strerror(err)));
  return linkError(what, std::strerror(err));
}

Status IbConnection::adapterStatus(const std::string& what) const {
  return Status::error(ErrorCode::Remote, strFormat("ib: the link to rank %d failed: %s", peer_, what.c_str()), peer_);
}

Status IbConnection::inErrorStatus(const std::string& detail) const {
  // The adapter's event may have come before this rank saw the consequence.
  const std::string said = adapterReason_ ? adapterReason_() : std::string();
  if (!said.empty()) return adapterStatus(said + "; " + detail);
  return Status::error(ErrorCode::Remote,
                       strFormat("ib: the link to rank %d failed: %s put a queue pair of the link in error (%s)", peer_,
                                 pc_.port.device.c_str(), detail.c_str()),
                       peer_);
}

bool IbConnection::pendingLocked() const {
  return matcher_.anyPosted() || !awaitingCts_.empty() || !writing_.empty() || !incoming_.empty();
}

Status IbConnection::leftStatus(const std::string& why) const {
  return Status::error(ErrorCode::Remote, strFormat("rank %d left the communicator: %s", peer_, why.c_str()), peer_);
}

}  // namespace ib
}  // namespace loom
