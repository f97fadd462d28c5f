#include "transport/sockets/on_demand_links.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/descriptors.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"

namespace loom {
namespace sockets {
namespace {

constexpr std::chrono::milliseconds kTick(50);
constexpr std::chrono::milliseconds kRetryAfter(50);
// How long an inbound stranger may take to prove itself before it is turned away.
constexpr std::chrono::seconds kStrangerGrace(10);

// Sends a handshake message whole or not at all: the socket is new and the message small, so a
// short write means the socket is gone.
bool sendSmall(int fd, const uint8_t* msg, size_t n) {
  return ::send(fd, msg, n, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(n);
}

}  // namespace

struct OnDemandLinks::Link {
  enum State { Idle, Dialing, Accepting, Up, Failed } state = Idle;
  std::vector<Socket> socks;  // by stream index, once proved
  std::vector<bool> dialing;  // a dialled socket is open for the index
  std::vector<Clock::time_point> retryAt;
  Clock::time_point deadline;
  Clock::time_point asked;  // when it left Idle: its first use here, or the peer's first dial
  std::string lastError;
  bool refused = false;        // a dial was refused: nobody listens there any more
  bool noDescriptors = false;  // this process has no descriptor left for a socket
  int have = 0;
};

// One socket in its handshake, either direction; its events come to advance().
struct OnDemandLinks::Pending : HandshakeSocket, PollHandler {
  enum State { Connecting, ReadHello, ReadAnswer, ReadClientHello, Done } state = Connecting;
  OnDemandLinks* owner = nullptr;
  uint64_t doneAt = 0;  // the tick it was done at: freed two ticks later (stale events of its batch)
  bool outbound() const { return state == Connecting || state == ReadHello || state == ReadAnswer; }
  void onPollEvents(uint32_t) noexcept override {
    if (state != Done) owner->advance(*this);
  }
};

class OnDemandLinks::Listener : public PollHandler {
 public:
  Listener(OnDemandLinks* owner, size_t index, int fd) : owner_(owner), index_(index), fd_(fd) {}
  void onPollEvents(uint32_t) noexcept override { owner_->accept(index_); }
  int fd() const { return fd_; }

 private:
  OnDemandLinks* owner_;
  size_t index_;
  int fd_;
};

class OnDemandLinks::Timer : public PollHandler {
 public:
  explicit Timer(OnDemandLinks* owner)
      : owner_(owner), fd_(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {}
  void onPollEvents(uint32_t) noexcept override {
    uint64_t n = 0;
    (void)!::read(fd_.fd(), &n, sizeof n);
    owner_->tick();
  }
  int fd() const { return fd_.fd(); }

 private:
  OnDemandLinks* owner_;
  Socket fd_;
};

OnDemandLinks::OnDemandLinks(const TransportContext& ctx, const std::vector<Interface>& ifaces,
                             const std::vector<Socket>& listeners,
                             std::shared_ptr<const std::map<int, Endpoints>> remote, LinkSink* sink, Former form,
                             std::string port)
    : ctx_(ctx),
      ifaces_(ifaces),
      remote_(std::move(remote)),
      sink_(sink),
      form_(std::move(form)),
      port_(std::move(port)),
      sockets_(ctx.socketsPerPeer),
      timeout_(ctx.deadline.total()) {
  timer_ = std::make_unique<Timer>(this);
  if (timer_->fd() < 0) LOOM_THROW(ErrorCode::System, ctx.rank, "timerfd_create: " + errnoText(errno));
  ctx_.engine->add(timer_->fd(), timer_.get(), EPOLLIN);
  for (size_t i = 0; i < listeners.size(); ++i) {
    listeners_.push_back(std::make_unique<Listener>(this, i, listeners[i].fd()));
    ctx_.engine->add(listeners[i].fd(), listeners_.back().get(), EPOLLIN);
  }
}

OnDemandLinks::~OnDemandLinks() {
  for (auto& l : listeners_) ctx_.engine->remove(l->fd());
  ctx_.engine->remove(timer_->fd());
  for (auto& p : pending_)
    if (p->sock.valid()) ctx_.engine->remove(p->sock.fd());
  if (rejected_ > 0) LOOM_INFO("turned away %d stray connection(s) on the %s", rejected_, port_.c_str());
}

void OnDemandLinks::linkTo(int peer) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (remote_->count(peer) == 0) return;
    Link& l = linkOf(peer);
    if (l.state != Link::Idle) return;
    l.state = Link::Dialing;
    l.asked = Clock::now();
    l.deadline = l.asked + timeout_;
  }
  armTimer(std::chrono::milliseconds(0));
}

OnDemandLinks::Link& OnDemandLinks::linkOf(int peer) {
  auto [it, added] = links_.try_emplace(peer);
  if (added) {
    Link& l = it->second;
    l.socks.resize(static_cast<size_t>(sockets_));
    l.dialing.assign(static_cast<size_t>(sockets_), false);
    l.retryAt.assign(static_cast<size_t>(sockets_), Clock::time_point{});
  }
  return it->second;
}

void OnDemandLinks::armTimer(std::chrono::milliseconds after) noexcept {
  // Never later than it is set for already (a stream of accepts must not hold a due tick off),
  // and under a lock: the application's thread asks for a tick now while the engine's arms the
  // next one, and a check-then-set of the timer itself could put the sooner one off.
  std::lock_guard<std::mutex> lock(timerMu_);
  const auto at = Clock::now() + after;
  if (at >= armedFor_) return;  // it fires sooner, or has fired and its tick is to come
  armedFor_ = at;
  itimerspec spec{};
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(after).count();
  spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
  spec.it_value.tv_nsec = static_cast<long>(std::max<int64_t>(1, ns % 1000000000));  // 0 would disarm it
  timerfd_settime(timer_->fd(), 0, &spec, nullptr);
}

void OnDemandLinks::tick() noexcept {
  {
    std::lock_guard<std::mutex> lock(timerMu_);
    armedFor_ = Clock::time_point::max();  // fired: the next armTimer sets it again
  }
  ++ticks_;
  const auto now = Clock::now();
  std::vector<int> late;
  bool busy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [peer, l] : links_) {
      if (l.state != Link::Dialing && l.state != Link::Accepting) continue;
      if (now >= l.deadline || l.refused || l.noDescriptors) {
        late.push_back(peer);
        continue;
      }
      busy = true;
      if (l.state == Link::Dialing) dialDue(peer, l);
      if (l.refused || l.noDescriptors) late.push_back(peer);
    }
  }
  for (auto& p : pending_) {
    if (p->state == Pending::ReadClientHello && now - p->since > kStrangerGrace)
      drop(*p, strFormat("no handshake within %lld s", static_cast<long long>(kStrangerGrace.count())), true);
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const std::unique_ptr<Pending>& p) {
                                  return p->state == Pending::Done && ticks_ >= p->doneAt + 2;
                                }),
                 pending_.end());
  for (int peer : late) fail(peer, "");
  if (busy || !pending_.empty()) armTimer(kTick);
}

void OnDemandLinks::dialDue(int peer, Link& link) {
  const auto now = Clock::now();
  const Endpoints& eps = remote_->at(peer);
  for (int k = 0; k < sockets_; ++k) {
    const auto i = static_cast<size_t>(k);
    if (link.socks[i].valid() || link.dialing[i] || now < link.retryAt[i]) continue;
    const SockAddr& target = eps[i % eps.size()].first;
    Socket s = dialFrom(ifaces_[i % ifaces_.size()], target, &link.lastError);
    if (!s.valid()) {
      link.noDescriptors = link.noDescriptors || errno == EMFILE || errno == ENFILE;
      link.refused = link.refused || errno == ECONNREFUSED;
      link.retryAt[i] = now + kRetryAfter;
      continue;
    }
    auto p = std::make_unique<Pending>();
    p->owner = this;
    p->state = Pending::Connecting;
    p->sock = std::move(s);
    p->peer = peer;
    p->index = k;
    p->remote = target.toString();
    p->since = now;
    link.dialing[i] = true;
    ctx_.engine->add(p->sock.fd(), p.get(), EPOLLOUT);
    pending_.push_back(std::move(p));
  }
}

void OnDemandLinks::accept(size_t listener) noexcept {
  for (;;) {
    const int c = accept4(listeners_[listener]->fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EMFILE || errno == ENFILE)
        LOOM_WARN("cannot take a connection on rank %d's %s: %s (ulimit -n)", ctx_.rank, port_.c_str(),
                  errnoText(errno).c_str());
      return;
    }
    auto p = std::make_unique<Pending>();
    p->owner = this;
    p->state = Pending::ReadClientHello;
    p->sock.reset(c);
    p->remote = peerAddress(c).toString();
    p->since = Clock::now();
    p->mine = randomNonce();
    uint8_t hello[wire::kAcceptorHello];
    wire::acceptorHello(p->mine, hello);
    if (!sendSmall(c, hello, sizeof hello)) continue;
    ctx_.engine->add(c, p.get(), EPOLLIN);
    pending_.push_back(std::move(p));
    armTimer(kTick);  // its grace
  }
}

void OnDemandLinks::advance(Pending& p) noexcept {
  if (p.state == Pending::Connecting) {
    int soerr = 0;
    socklen_t len = sizeof soerr;
    getsockopt(p.sock.fd(), SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr != 0) {
      drop(p, errnoText(soerr), false);
      if (soerr == ECONNREFUSED) fail(p.peer, "");
      return;
    }
    p.state = Pending::ReadHello;
    ctx_.engine->modify(p.sock.fd(), &p, EPOLLIN);
    return;
  }
  const size_t need = p.state == Pending::ReadHello    ? wire::kAcceptorHello
                      : p.state == Pending::ReadAnswer ? wire::kProof
                                                       : wire::kConnectorHello;
  const int step = p.readStep(need);
  if (step < 0) {
    // A dial that closes before its first word is most often one its rank gave up because ours
    // crossed it (the lower rank's is kept): not worth a warning.
    const bool quiet = !p.outbound() && p.buf.empty() && (errno == 0 || errno == ECONNRESET);
    return drop(p, errno == 0 ? "closed during the handshake" : errnoText(errno), !p.outbound() && !quiet);
  }
  if (p.state == Pending::ReadHello && !wire::acceptorMagic(p.buf.data(), p.buf.size()))
    return fail(p.peer, strFormat("%s, published as rank %d's address, is not a Loom peer", p.remote.c_str(), p.peer));
  if (p.state == Pending::ReadClientHello && !wire::connectorMagic(p.buf.data(), p.buf.size()))
    return drop(p, "it does not speak Loom's protocol (a stray client or port scanner?)", true);
  if (step == 0) return;
  try {
    switch (p.state) {
      case Pending::ReadHello:
        return onAcceptorHello(p);
      case Pending::ReadAnswer:
        return onAnswer(p);
      default:
        return onConnectorHello(p);
    }
  } catch (...) {
    return drop(p, statusFromCurrentException().message, !p.outbound());
  }
}

wire::Ids OnDemandLinks::idsOf(const Pending& p) const {
  return wire::Ids{ctx_.commId, static_cast<uint32_t>(ctx_.rank), static_cast<uint32_t>(p.peer),
                   static_cast<uint32_t>(p.index), static_cast<uint32_t>(sockets_)};
}

// Dialling side: the acceptor's nonce came; send ours, the ids and the proof of the key.
void OnDemandLinks::onAcceptorHello(Pending& p) {
  uint8_t msg[wire::kConnectorHello];
  wire::connectorHello(ctx_.key, p.buf.data(), idsOf(p), &p.mine, &p.theirs, msg);
  if (!sendSmall(p.sock.fd(), msg, sizeof msg)) return drop(p, "handshake send failed", false);
  p.state = Pending::ReadAnswer;
  p.buf.clear();
}

// Dialling side: the acceptor proved the key (the socket is formed) or yielded (it dials us).
void OnDemandLinks::onAnswer(Pending& p) {
  switch (wire::checkAcceptorAnswer(ctx_.key, p.mine, p.theirs, idsOf(p), p.buf.data())) {
    case wire::Answer::Proof:
      return formed(p);
    case wire::Answer::Yield: {
      std::lock_guard<std::mutex> lock(mu_);
      Link& l = linkOf(p.peer);
      if (l.state == Link::Dialing) l.state = Link::Accepting;
      abandonDial(p.peer);
      return;
    }
    case wire::Answer::Wrong:
      return fail(p.peer, strFormat("the process at %s (rank %d's published address) proved a different job key: are "
                                    "two jobs mixed up? give every rank of a job the same LOOM_JOB_KEY",
                                    p.remote.c_str(), p.peer));
  }
}

// Accepting side: check the dialler's proof and identity, then prove ours (or yield to our dial).
void OnDemandLinks::onConnectorHello(Pending& p) {
  wire::Ids ids;
  if (!wire::checkConnectorHello(ctx_.key, p.mine, p.buf.data(), &ids, &p.theirs))
    return drop(p, "wrong job key (another job, or a stray client)", true);
  if (ids.commId != ctx_.commId) return drop(p, "it belongs to another communicator of this job", true);
  const int from = static_cast<int>(ids.from);
  const std::string unexpected =
      strFormat("unexpected link (from %u to %u, socket %u of %u)", ids.from, ids.to, ids.index, ids.count);
  if (ids.to != static_cast<uint32_t>(ctx_.rank) || remote_->count(from) == 0 ||
      ids.count != static_cast<uint32_t>(sockets_) || ids.index >= static_cast<uint32_t>(sockets_))
    return drop(p, unexpected, true);
  p.peer = from;
  p.index = static_cast<int>(ids.index);
  bool yield = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Link& l = linkOf(from);
    switch (l.state) {
      case Link::Up:
        // A higher rank's socket sent before our yield reached it (dials that crossed): it drops
        // the rest of its dial on its own.
        if (ctx_.rank < from) return drop(p, unexpected + ": the link is up", false);
        return drop(p, unexpected + ": the link is up", true);
      case Link::Failed:
        return drop(p, unexpected + ": the link is failed", true);
      case Link::Dialing:
        if (ctx_.rank < from) {
          yield = true;  // our dial is the one kept
          break;
        }
        abandonDial(from);
        l.state = Link::Accepting;
        break;
      case Link::Idle:
        l.state = Link::Accepting;
        l.asked = Clock::now();
        l.deadline = l.asked + timeout_;
        armTimer(kTick);
        break;
      case Link::Accepting:
        break;
    }
    if (!yield && l.socks[ids.index].valid()) return drop(p, unexpected + ": a duplicate", true);
  }
  uint8_t answer[wire::kProof];
  wire::acceptorAnswer(ctx_.key, p.mine, p.theirs, ids, yield, answer);
  const bool sent = sendSmall(p.sock.fd(), answer, sizeof answer);
  if (yield || !sent) {
    ctx_.engine->remove(p.sock.fd());
    p.sock.reset();
    p.state = Pending::Done;
    p.doneAt = ticks_;
    return;
  }
  formed(p);
}

void OnDemandLinks::drop(Pending& p, const std::string& why, bool stray) noexcept {
  if (p.sock.valid()) ctx_.engine->remove(p.sock.fd());
  p.sock.reset();
  const bool outbound = p.outbound();
  p.state = Pending::Done;
  p.doneAt = ticks_;
  if (stray) {
    ++rejected_;
    LOOM_WARN("rejected a connection from %s on rank %d's %s: %s", p.remote.c_str(), ctx_.rank, port_.c_str(),
              why.c_str());
    return;
  }
  if (!outbound) return;
  std::lock_guard<std::mutex> lock(mu_);
  Link& l = linkOf(p.peer);
  l.dialing[static_cast<size_t>(p.index)] = false;
  l.retryAt[static_cast<size_t>(p.index)] = Clock::now() + kRetryAfter;
  l.lastError = p.remote + ": " + why;
  LOOM_TRACE("rank %d's dial %d of its link to rank %d on its %s closed (%s); redialled in %lld ms", ctx_.rank, p.index,
             p.peer, port_.c_str(), why.c_str(), static_cast<long long>(kRetryAfter.count()));
}

void OnDemandLinks::abandonDial(int peer) {
  for (auto& p : pending_) {
    if (p->peer != peer || !p->outbound()) continue;
    if (p->sock.valid()) ctx_.engine->remove(p->sock.fd());
    p->sock.reset();
    p->state = Pending::Done;
    p->doneAt = ticks_;
  }
  Link& l = linkOf(peer);
  std::fill(l.dialing.begin(), l.dialing.end(), false);
  for (auto& s : l.socks) s.reset();
  l.have = 0;
}

void OnDemandLinks::formed(Pending& p) noexcept {
  const int peer = p.peer;
  const auto index = static_cast<size_t>(p.index);
  ctx_.engine->remove(p.sock.fd());
  tuneDataSocket(p.sock.fd());
  std::vector<Socket> socks;
  double tookMs = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Link& l = linkOf(peer);
    p.state = Pending::Done;
    p.doneAt = ticks_;
    l.dialing[index] = false;
    if (l.state != Link::Dialing && l.state != Link::Accepting) {
      p.sock.reset();
      return;
    }
    if (!l.socks[index].valid()) ++l.have;
    l.socks[index] = std::move(p.sock);
    if (l.have < sockets_) return;
    l.state = Link::Up;
    socks.swap(l.socks);
    tookMs = std::chrono::duration<double, std::milli>(Clock::now() - l.asked).count();
  }
  try {
    form_(peer, std::move(socks), tookMs);
  } catch (...) {
    const Status s = statusFromCurrentException();
    ctx_.failure->fail(s);
    sink_->linkFailed(peer, s);
  }
}

void OnDemandLinks::fail(int peer, const std::string& why) noexcept {
  std::string lastError;
  bool refused = false, noDescriptors = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Link& l = linkOf(peer);
    if (l.state == Link::Up || l.state == Link::Failed) return;
    lastError = why.empty() ? l.lastError : why;
    refused = l.refused || lastError.find(errnoText(ECONNREFUSED)) != std::string::npos;
    noDescriptors = l.noDescriptors;
    const bool dialled = l.state == Link::Dialing;
    abandonDial(peer);
    l.state = Link::Failed;
    if (why.empty())
      lastError = dialled ? (lastError.empty() ? "no answer" : "last error: " + lastError)
                          : "its connection began but did not finish";
  }
  Status s;
  if (!why.empty()) {
    s = Status::error(ErrorCode::Remote, why, peer);
  } else if (noDescriptors) {
    const size_t open = openDescriptors();  // 0 where even /proc/self/fd cannot be opened
    // Fewer sockets per peer only where a link has several (ib's side channel is one socket).
    s = Status::error(ErrorCode::System,
                      strFormat("cannot link rank %d: %s%s; raise the limit (ulimit -n)%s", peer, lastError.c_str(),
                                open > 0 ? strFormat(", with %zu open", open).c_str() : "",
                                sockets_ > 1 ? " or use fewer sockets per peer (LOOM_SOCKETS_PER_PEER)" : ""),
                      peer);
  } else if (refused) {
    // Its listener is gone, so its communicator is: what it left in the store says why.
    const std::string word = ctx_.lastWordOf ? ctx_.lastWordOf(peer, std::chrono::milliseconds(1000)) : std::string();
    s = Status::error(ErrorCode::Remote,
                      word.empty() ? strFormat("rank %d refused its link (%s): its communicator is gone (destroyed, "
                                               "or its process died) without a word",
                                               peer, lastError.c_str())
                                   : strFormat("rank %d left the communicator: %s", peer, word.c_str()),
                      peer);
  } else {
    const std::string word = ctx_.lastWordOf ? ctx_.lastWordOf(peer, std::chrono::milliseconds(0)) : std::string();
    const std::string cause = word.empty() ? strFormat(": did rank %d die, or is it unreachable?", peer)
                                           : strFormat("; rank %d left: %s", peer, word.c_str());
    s = Status::error(ErrorCode::Timeout,
                      strFormat("no link with rank %d within %.0f s of its first use (%s)%s (LOOM_INIT_TIMEOUT "
                                "sets the wait)",
                                peer, static_cast<double>(timeout_.count()) / 1000.0, lastError.c_str(), cause.c_str()),
                      peer);
  }
  ctx_.failure->fail(s);
  sink_->linkFailed(peer, s);
}

}  // namespace sockets
}  // namespace loom
