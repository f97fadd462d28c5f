#include "transport/ib/link_exchange.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>

#include "bootstrap/store_protocol.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"

namespace loom {
namespace ib {
namespace {

constexpr const char* kUp = "up";
// Addresses are a few dozen bytes a queue pair; anything longer is not a peer's.
constexpr uint32_t kMaxMessage = 1u << 16;
}  // namespace

class LinkExchange::Timer : public PollHandler {
 public:
  explicit Timer(LinkExchange* owner)
      : owner_(owner), fd_(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {}
  void onPollEvents(uint32_t) noexcept override {
    owner_->peerGone(
        strFormat("rank %d did not bring up its end of the ib link within %.0f s (LOOM_INIT_TIMEOUT sets the "
                  "wait): did it stop, or die?",
                  owner_->peer_, static_cast<double>(owner_->timeout_.count()) / 1000.0),
        std::chrono::milliseconds(0));
  }
  int fd() const { return fd_.fd(); }

 private:
  LinkExchange* owner_;
  Socket fd_;
};

LinkExchange::LinkExchange(int rank, int peer, std::unique_ptr<IbConnection> conn, std::string mine, Socket side,
                           ProgressEngine* engine, std::chrono::milliseconds timeout, Steps steps)
    : rank_(rank),
      peer_(peer),
      conn_(std::move(conn)),
      side_(std::move(side)),
      engine_(engine),
      timeout_(timeout),
      steps_(std::move(steps)),
      timer_(std::make_unique<Timer>(this)) {
  setNonBlocking(side_.fd());
  if (timer_->fd() < 0) {
    fail("timerfd_create: " + errnoText(errno));
    return;
  }
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(timeout_.count() / 1000);
  spec.it_value.tv_nsec = static_cast<long>((timeout_.count() % 1000) * 1000000 + 1);
  timerfd_settime(timer_->fd(), 0, &spec, nullptr);
  // Sent before the engine watches the socket (what the peer answers meanwhile waits there), so
  // that nothing here touches the exchange once the engine may run it.
  if (!sendMessage(mine)) {
    peerGone("sending its queue pairs' addresses: " + errnoText(errno));
    return;
  }
  watching_ = true;
  engine_->add(timer_->fd(), timer_.get(), EPOLLIN);
  engine_->add(side_.fd(), this, EPOLLIN | EPOLLRDHUP);
}

LinkExchange::~LinkExchange() { stopWatching(); }

void LinkExchange::stopWatching() noexcept {
  if (!watching_) return;
  watching_ = false;
  engine_->remove(side_.fd());
  engine_->remove(timer_->fd());
}

bool LinkExchange::sendMessage(const std::string& body) {
  // The socket is new and the messages small: a short write means the socket is gone.
  std::vector<uint8_t> msg(4);
  storewire::putU32(msg.data(), static_cast<uint32_t>(body.size()));
  msg.insert(msg.end(), body.begin(), body.end());
  return ::send(side_.fd(), msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(msg.size());
}

void LinkExchange::onPollEvents(uint32_t) noexcept {
  if (state_ != State::Over) read();
}

void LinkExchange::read() noexcept {
  // Reads no further than the message it waits for: what follows (the peer's goodbye, say) is the
  // side channel's, once the link is made.
  while (state_ != State::Over) {
    size_t want = 4;
    if (in_.size() >= 4) {
      const uint32_t len = storewire::getU32(in_.data());
      if (len > kMaxMessage)
        return fail(strFormat("it sent a message of %u bytes while setting up the link", static_cast<unsigned>(len)));
      want = 4 + len;
    }
    if (in_.size() == want) {
      const std::string body(in_.begin() + 4, in_.end());
      in_.clear();
      try {
        onMessage(body);
      } catch (...) {
        // Bringing the queue pairs up to a peer that is going can fail too: its word says why.
        return peerGone(statusFromCurrentException().message);
      }
      continue;
    }
    const size_t had = in_.size();
    in_.resize(want);
    const ssize_t n = ::recv(side_.fd(), in_.data() + had, want - had, 0);
    if (n > 0) {
      in_.resize(had + static_cast<size_t>(n));
      continue;
    }
    in_.resize(had);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    return peerGone(n == 0 ? std::string("it closed the link's side channel while setting the link up (did it die, "
                                         "or destroy its communicator?)")
                           : "its side channel failed: " + errnoText(errno));
  }
}

void LinkExchange::peerGone(const std::string& how, std::chrono::milliseconds wait) noexcept {
  // A peer whose communicator failed, or was aborted, said why in the store before it closed.
  const std::string word = steps_.lastWord ? steps_.lastWord(wait) : std::string();
  if (!word.empty()) return fail(strFormat("rank %d left the communicator: %s", peer_, word.c_str()));
  fail(how);
}

void LinkExchange::onMessage(const std::string& body) {
  if (state_ == State::Addresses) {
    steps_.connect(*conn_, body);
    readied_ = true;
    if (!sendMessage(kUp)) return peerGone("saying its queue pairs are up: " + errnoText(errno));
    state_ = State::Up;
    return;
  }
  if (body != kUp) LOOM_THROW(ErrorCode::Remote, rank_, "it did not say its queue pairs were up");
  stopWatching();
  state_ = State::Over;
  steps_.done(std::move(conn_), std::move(side_));
}

void LinkExchange::fail(const std::string& why) noexcept {
  if (state_ == State::Over) return;
  stopWatching();
  state_ = State::Over;
  side_.reset();
  const Status s =
      Status::error(ErrorCode::Remote, strFormat("ib: cannot link rank %d: %s", peer_, why.c_str()), peer_);
  LOOM_TRACE("%s", s.message.c_str());
  if (!conn_) return steps_.failed(s, nullptr);
  conn_->failAll(s);
  // One the link table knows goes to it (it takes messages for receives from any source); one it
  // does not stays here until the transport goes (its completion queue may still have events).
  steps_.failed(s, readied_ ? std::move(conn_) : nullptr);
}

}  // namespace ib
}  // namespace loom
