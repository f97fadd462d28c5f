// Store: the small key-value service ranks rendezvous through (set / get / add / wait).
// Implementations: TcpStoreClient (talks to a TcpStoreServer hosted by one rank) and
// PrefixStore (a namespace inside another store, one per communicator). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/deadline.hpp"

namespace loom {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  /// The value, or nullopt when the key is not set yet. Never waits.
  virtual std::optional<Bytes> tryGet(const std::string& key) = 0;
  /// Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// The values of `keys` (nullopt where not set yet), in as few requests as the store allows
  /// (one per few thousand keys over TCP). Never waits.
  virtual std::vector<std::optional<Bytes>> tryGetMany(const std::vector<std::string>& keys);
  /// Sets every pair, in as few requests as the store allows.
  virtual void setMany(const std::vector<std::pair<std::string, Bytes>>& pairs);

  /// Waits until `key` is set or the deadline passes (then nullopt). Here by polling; a store that
  /// can wait on its server's side (TcpStoreClient) does so.
  virtual std::optional<Bytes> get(const std::string& key, const Deadline& deadline);
  /// Waits until every key is set; on the deadline returns false and lists the missing ones.
  bool waitAll(const std::vector<std::string>& keys, const Deadline& deadline, std::vector<std::string>* missing);
  /// The same, keeping the values (in the order of `keys`) in *values. Each round asks for all the
  /// keys still missing at once (tryGetMany).
  bool getAll(const std::vector<std::string>& keys, const Deadline& deadline, std::vector<Bytes>* values,
              std::vector<std::string>* missing);

  void setString(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }

  // For notes written and read on a failure path, where a store host that stopped answering must
  // not hold the caller for the store's whole operation timeout: every request gives up after
  // `limit`. They never throw (false or nullopt on a timeout or any other error).
  virtual bool setBounded(const std::string& key, const Bytes& value, std::chrono::milliseconds limit);
  virtual std::optional<Bytes> tryGetBounded(const std::string& key, std::chrono::milliseconds limit);
  /// Waits until `key` is set or `deadline` passes, each request bounded by `limit`.
  std::optional<Bytes> getBounded(const std::string& key, const Deadline& deadline, std::chrono::milliseconds limit);

  /// Whether the store's host is known to be this machine: what it sends this rank then crosses no
  /// network. False where it cannot tell.
  virtual bool hostedHere() const { return false; }
};

/// Keys of `base` under "prefix/". Shares ownership of base.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}
  void set(const std::string& key, const Bytes& value) override { base_->set(prefix_ + key, value); }
  std::optional<Bytes> tryGet(const std::string& key) override { return base_->tryGet(prefix_ + key); }
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(prefix_ + key, delta); }
  std::optional<Bytes> get(const std::string& key, const Deadline& deadline) override {
    return base_->get(prefix_ + key, deadline);
  }
  std::vector<std::optional<Bytes>> tryGetMany(const std::vector<std::string>& keys) override {
    std::vector<std::string> mine;
    mine.reserve(keys.size());
    for (const auto& k : keys) mine.push_back(prefix_ + k);
    return base_->tryGetMany(mine);
  }
  void setMany(const std::vector<std::pair<std::string, Bytes>>& pairs) override {
    std::vector<std::pair<std::string, Bytes>> mine;
    mine.reserve(pairs.size());
    for (const auto& [k, v] : pairs) mine.emplace_back(prefix_ + k, v);
    base_->setMany(mine);
  }
  bool setBounded(const std::string& key, const Bytes& value, std::chrono::milliseconds limit) override {
    return base_->setBounded(prefix_ + key, value, limit);
  }
  std::optional<Bytes> tryGetBounded(const std::string& key, std::chrono::milliseconds limit) override {
    return base_->tryGetBounded(prefix_ + key, limit);
  }
  bool hostedHere() const override { return base_->hostedHere(); }

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace loom
