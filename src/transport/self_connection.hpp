// SelfConnection: a rank's link to itself (send to and receive from one's own rank, as in a
// grouped exchange where a rank is its own neighbour). A send waits for its matching receive and
// is then copied straight into it, so it completes only once a receive is posted.
#pragma once

#include <mutex>

#include "transport/matched_connection.hpp"
#include "transport/matching.hpp"
#include "transport/transport.hpp"

namespace loom {

/// A rank's link to itself: a copy.
inline LinkProperties selfLinkProperties() {
  LinkProperties p;
  p.latencyUs = 0.1;
  p.gbps = 1000;
  p.ringChunkBytes = 512 * 1024;
  p.parallelChannels = false;
  p.readsInPlace = true;
  return p;
}

class SelfConnection : public MatchedConnection<SelfConnection> {
 public:
  explicit SelfConnection(int rank) : peer_(rank) {}
  int peer() const override { return peer_; }
  void isend(const RequestPtr& req, const SendSpec& spec) noexcept override;
  void failAll(const Status& status) noexcept override;
  std::string describe() const override;
  /// Nothing to drive: a send to itself completes as it matches.
  bool progress() noexcept override { return false; }

 private:
  struct Op {
    RequestPtr req;
    void* buf;
    size_t bytes;
  };
  void match(const Op& send, const Op& recv, uint32_t tag) const;
  // The receive side every matched link shares (matched_connection.hpp).
  friend class MatchedConnection<SelfConnection>;
  std::mutex& receiveMutex() { return mu_; }
  static Op makeRecv(const RequestPtr& req, const RecvSpec& spec) { return Op{req, spec.buf, spec.capacity}; }
  void irecvLocked(const RequestPtr& req, const RecvSpec& spec, std::unique_lock<std::mutex>& lock);

  const int peer_;  // this rank
  std::mutex mu_;
  TagMatcher<Op, Op> matcher_;  // receives, and sends waiting for one
  bool closed_ = false;
  Status closedStatus_;
};

}  // namespace loom
