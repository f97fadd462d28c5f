// TcpStoreServer: the rendezvous store, hosted by one rank (or by the process that made a unique
// id) on a thread of its own. Serves any number of clients with poll(); every client must pass the
// job-key handshake (store_protocol.hpp) within a few seconds or is dropped and logged; a client
// that sends anything malformed is dropped and logged; the store goes on serving the others.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
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
  void run();
  void onAccept();
  // Returns false when the client must be dropped.
  bool onReadable(Client& c);
  bool handleRequests(Client& c);
  bool flush(Client& c);
  /// Answers the Waits whose key is now set or whose time has passed.
  void answerWaits();

  JobKey key_;
  Socket listener_;
  int port_ = 0;
  int wakeFd_[2] = {-1, -1};
  std::map<int, std::unique_ptr<Client>> clients_;
  std::map<std::string, Bytes> data_;  // touched only by the server thread
  bool changed_ = false;               // a key was set since the waits were last looked at
  std::chrono::steady_clock::time_point nextWait_ = std::chrono::steady_clock::time_point::max();
  std::atomic<int> rejected_{0};
  std::thread thread_;
};

}  // namespace loom
