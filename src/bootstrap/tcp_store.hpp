// TcpStoreClient: a Store that talks to a TcpStoreServer. Connects with retries until the
// deadline (rank 0 may start last), proves the job key and checks the server's proof (so a
// store of another job on the same port is recognised as such). Thread-safe; every request is
// bounded by the client's operation timeout.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "net/socket.hpp"

namespace loom {

class TcpStoreClient : public Store {
 public:
  /// Connects to host:port. `rank` is for messages. Throws Error(Timeout) naming the host and port
  /// when nobody answers by `deadline`, Error(InvalidUsage) when the server has another job's key.
  TcpStoreClient(const std::string& host, int port, const JobKey& key, int rank, const Deadline& deadline,
                 std::chrono::milliseconds opTimeout);

  void set(const std::string& key, const Bytes& value) override;
  std::optional<Bytes> tryGet(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  /// Waits on the server's side (one request per few hundred ms of waiting, not a poll).
  std::optional<Bytes> get(const std::string& key, const Deadline& deadline) override;
  bool setBounded(const std::string& key, const Bytes& value, std::chrono::milliseconds limit) override;
  std::optional<Bytes> tryGetBounded(const std::string& key, std::chrono::milliseconds limit) override;
  std::vector<std::optional<Bytes>> tryGetMany(const std::vector<std::string>& keys) override;
  void setMany(const std::vector<std::pair<std::string, Bytes>>& pairs) override;
  /// True when the server answered at an address of this machine (the connection's two ends share
  /// one address: a connection to oneself).
  bool hostedHere() const override { return hostedHere_; }

  /// "host:port" of the server.
  const std::string& endpoint() const { return endpoint_; }

 private:
  /// One request and its reply, within `limit` (the operation timeout when zero), waiting at
  /// most that long for another thread's request too. A request cut short loses the connection.
  Bytes roundTrip(const Bytes& request, uint8_t* status, std::chrono::milliseconds limit = {});

  std::string endpoint_;
  int rank_;
  std::chrono::milliseconds opTimeout_;
  bool hostedHere_ = false;
  std::mutex mu_;
  Socket sock_;
};

}  // namespace loom
