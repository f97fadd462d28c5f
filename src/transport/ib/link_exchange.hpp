// LinkExchange: the last step of an ib link made on first use (LOOM_CONNECT=lazy). Once the link's
// side-channel socket is proved (sockets::OnDemandLinks: either rank may ask first, the job key on both
// sides), each rank has made its end of the link (queue pairs in INIT, receives posted), and the two
// swap the queue pairs' addresses over the socket, bring their queue pairs up (RTR, RTS) and say so.
// A rank hands the link on only once the peer has said so, so that no first message meets a queue
// pair that is not ready; the socket then stays the link's side channel (side_channel.hpp).
//
// On the wire, after the handshake: a 4-byte length and the addresses (with "|gpu" where the rank
// has GPUDirect RDMA), then a 4-byte length and "up". Everything runs on the receive engine's
// thread; a timer bounds a peer that stops answering (the init deadline).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "core/status.hpp"
#include "net/socket.hpp"
#include "transport/ib/ib_connection.hpp"

namespace loom {
namespace ib {

class LinkExchange : public PollHandler {
 public:
  struct Steps {
    /// The peer's addresses came: bring `conn` up to them (throws Error naming the peer) and ready
    /// it for the link table (the peer may send once this rank says "up").
    std::function<void(IbConnection& conn, const std::string& theirs)> connect;
    /// The peer's queue pairs are up too: the link is made (`side`: its side channel).
    std::function<void(std::unique_ptr<IbConnection> conn, Socket side)> done;
    /// The link could not be made: why, naming the peer; `conn` (failed) where connect() had
    /// readied it for the link table, which then owns it, else null.
    std::function<void(const Status& why, std::unique_ptr<IbConnection> conn)> failed;
    /// The peer's last word in the store, waiting at most `wait` for it (empty where it left none;
    /// may be unset): a peer whose communicator failed or was aborted left it before it closed.
    std::function<std::string(std::chrono::milliseconds wait)> lastWord;
  };

  /// Starts the exchange on `side` (proved for `peer`), registered with `engine`: sends `mine`,
  /// the addresses of `conn`. Engine thread (or another: the engine gets the exchange last).
  LinkExchange(int rank, int peer, std::unique_ptr<IbConnection> conn, std::string mine, Socket side,
               ProgressEngine* engine, std::chrono::milliseconds timeout, Steps steps);
  /// After the engine stopped (or once the exchange is over).
  ~LinkExchange() override;
  LinkExchange(const LinkExchange&) = delete;
  LinkExchange& operator=(const LinkExchange&) = delete;

  void onPollEvents(uint32_t events) noexcept override;

 private:
  class Timer;
  enum class State { Addresses, Up, Over };
  /// Reads what has come; a whole message advances the exchange.
  void read() noexcept;
  void onMessage(const std::string& body);
  void fail(const std::string& why) noexcept;
  /// The side channel broke or the peer went quiet (`how`): fails with the peer's last word where
  /// it left one, waiting at most `wait` for it (the store has it before the peer closes its
  /// links; the default covers the store's round trip).
  void peerGone(const std::string& how, std::chrono::milliseconds wait = std::chrono::milliseconds(250)) noexcept;
  /// Takes the socket and the timer off the engine.
  void stopWatching() noexcept;
  bool sendMessage(const std::string& body);

  const int rank_, peer_;
  std::unique_ptr<IbConnection> conn_;
  Socket side_;
  ProgressEngine* const engine_;
  const std::chrono::milliseconds timeout_;
  const Steps steps_;
  State state_ = State::Addresses;
  bool watching_ = false;  // the socket and the timer are on the engine
  bool readied_ = false;   // Steps::connect returned
  std::vector<uint8_t> in_;
  std::unique_ptr<Timer> timer_;
};

}  // namespace ib
}  // namespace loom
