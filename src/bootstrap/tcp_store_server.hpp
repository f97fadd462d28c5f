// TcpStoreServer: the rendezvous store, hosted by one rank (or by the process that made a unique
// id) on a thread of its own. Serves any number of clients through epoll, with the waits indexed by
// key and by deadline, so that a request costs the server the same whether 10 or 10,000 ranks are
// connected (a poll() over every client and a look at every waiting one, per request, made the
// store's host the bottleneck of a large job's init: O(N) work per request, O(N^2) per init).
// Every client must pass the job-key handshake (store_protocol.hpp) within a few seconds or is
// dropped and logged; a client that sends anything malformed is dropped and logged; the store goes
// on serving the others.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "core/deadline.hpp"
#include "net/socket.hpp"

namespace loom {

class TcpStoreServer {
 public:
  /// Listens on `addr` (port 0: a free port). Throws Error(System) with advice when the port is
  /// taken or cannot be bound.
  TcpStoreServer(const SockAddr& addr, const JobKey& key);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// The port actually bound.
  int port() const { return port_; }
  /// Connections refused so far (bad handshake, malformed requests): for tests and logs.
  int rejected() const { return rejected_.load(); }
  /// Requests served by every store server of this process so far, but reads of a counter (an
  /// add of 0: what every sleeping communicator asks about once a second, to answer a dump
  /// request): what a test that a step needs no store asks.
  static uint64_t servedInProcess();
  /// Keys looked up for readers (a get, a wait, each key of a many-key get) by every store server
  /// of this process so far: the work a bootstrap gives the store beyond its request count.
  static uint64_t keysReadInProcess();
  /// Bytes of replies sent by every store server of this process so far (handshakes aside).
  static uint64_t bytesSentInProcess();

 private:
  struct Client;
  using ClientId = uint64_t;  // never reused, unlike descriptors: what the indexes below hold
  void run();
  void onAccept();
  // Returns false when the client must be dropped.
  bool onReadable(Client& c);
  bool handleRequests(Client& c);
  /// Sends what `c` has queued, and watches its socket for room only while something is left.
  bool flush(Client& c);
  void drop(ClientId id);
  /// Answers the waits on keys set since the last call and those whose time has passed; each
  /// answer may let its client's later requests set more keys.
  void answerWaits();
  /// Answers `c`'s wait (with the key's value, or NotFound) and goes on with its later requests.
  bool answer(Client& c);
  /// Drops the clients that have not proved the job key in time.
  void dropUnproven(Clock::time_point now);
  /// How long epoll may sleep: until the next wait or handshake runs out, at most 500 ms.
  int sleepMs() const;

  JobKey key_;
  Socket listener_;
  int port_ = 0;
  int wakeFd_[2] = {-1, -1};
  int epoll_ = -1;
  // Touched only by the server thread from here on.
  ClientId nextId_ = 2;  // 0 and 1 tag the wake pipe and the listener in epoll's events
  std::unordered_map<ClientId, std::unique_ptr<Client>> clients_;
  std::map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::unordered_set<ClientId>> waiters_;  // by the key they wait for
  std::vector<std::string> setKeys_;  // keys with waiters set since answerWaits() last ran
  using Due = std::pair<Clock::time_point, std::pair<ClientId, uint64_t>>;  // (when, (client, its wait))
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> waitsDue_;
  std::deque<std::pair<Clock::time_point, ClientId>> unproven_;  // in order of acceptance
  std::atomic<int> rejected_{0};
  std::thread thread_;
};

}  // namespace loom
