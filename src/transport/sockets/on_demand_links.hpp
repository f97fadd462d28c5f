// OnDemandLinks: socket links made on first use (LOOM_CONNECT=lazy). Nothing is connected at init;
// the first operation on a peer asks for its link (linkTo), and either rank of a pair may ask
// first: the one that asks dials the other's listener, the other accepts without its
// application thread, and both run the job-key handshake of handshake.hpp on every socket.
// When both dial at once, the lower rank's dial is kept: the lower rank answers the higher one's
// sockets with a yield (an authenticated "not these"), and the higher rank drops its own dial and
// accepts. The proved sockets of a link go to the transport's Former: TCP makes them a
// TcpConnection for the link table (LinkSink); ib swaps its queue pairs' addresses over the one
// socket first (ib/link_exchange.hpp) and keeps it as the link's side channel.
//
// Everything but linkTo runs on the receive engine's thread: the listeners, every socket in its
// handshake and a timer (retries, the init deadline of each link, strangers that never speak).
// A link not formed within the init deadline fails the communicator, naming the peer.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "net/interfaces.hpp"
#include "net/socket.hpp"
#include "transport/sockets/handshake.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace sockets {

class OnDemandLinks {
 public:
  /// Takes the ctx.socketsPerPeer proved sockets of `peer`'s link (by stream index) and makes the
  /// link, handing it to the sink, or throws (the link fails, naming the peer); `tookMs` since the
  /// link was first asked for. Engine thread.
  using Former = std::function<void(int peer, std::vector<Socket> sockets, double tookMs)>;
  /// Links this rank with `remote` (the peers and their published endpoints) on demand, through
  /// `listeners` (this rank's, on `ifaces`), from now on: `form` makes each link of its sockets;
  /// `sink` hears of links that fail. `port` names the listeners in warnings ("peer port").
  OnDemandLinks(const TransportContext& ctx, const std::vector<Interface>& ifaces, const std::vector<Socket>& listeners,
                std::shared_ptr<const std::map<int, Endpoints>> remote, LinkSink* sink, Former form, std::string port);
  /// After the engine stopped.
  ~OnDemandLinks();
  OnDemandLinks(const OnDemandLinks&) = delete;
  OnDemandLinks& operator=(const OnDemandLinks&) = delete;

  /// Starts linking `peer` unless that is under way (either side) or done. Any thread.
  void linkTo(int peer) noexcept;

 private:
  struct Socketed;
  struct Pending;
  struct Link;
  class Listener;
  class Timer;

  void accept(size_t listener) noexcept;
  void tick() noexcept;
  void advance(Pending& p) noexcept;
  void onAcceptorHello(Pending& p);
  void onAnswer(Pending& p);
  void onConnectorHello(Pending& p);
  /// Dials the sockets of `peer`'s link that are due. mu_ held.
  void dialDue(int peer, Link& link);
  /// Gives up a socket: a stranger is turned away with a warning; a dial is retried.
  void drop(Pending& p, const std::string& why, bool stray) noexcept;
  /// Socket p is proved for its peer's link; the link forms when it has them all.
  void formed(Pending& p) noexcept;
  /// Closes `peer`'s dialled sockets (its peer dials instead). mu_ held.
  void abandonDial(int peer);
  void fail(int peer, const std::string& why) noexcept;
  void armTimer(std::chrono::milliseconds after) noexcept;
  /// `peer`'s link, made Idle on first touch (only the peers in use have one: the timer's tick
  /// walks them all). `peer` is in remote_; mu_ held.
  Link& linkOf(int peer);
  wire::Ids idsOf(const Pending& p) const;

  const TransportContext ctx_;  // a copy: the caller's is gone after init
  const std::vector<Interface>& ifaces_;
  // Shared with the transport's former (which names the link by them): not copied per holder.
  const std::shared_ptr<const std::map<int, Endpoints>> remote_;
  LinkSink* const sink_;
  const Former form_;
  const std::string port_;
  const int sockets_;
  const std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::unique_ptr<Timer> timer_;
  std::mutex mu_;
  std::mutex timerMu_;  // armTimer's, and armedFor_
  std::chrono::steady_clock::time_point armedFor_ = std::chrono::steady_clock::time_point::max();
  std::map<int, Link> links_;                      // by peer, those touched; guarded by mu_
  std::vector<std::unique_ptr<Pending>> pending_;  // engine thread only
  uint64_t ticks_ = 0;                             // engine thread only
  int rejected_ = 0;                               // engine thread only
};

}  // namespace sockets
}  // namespace loom
