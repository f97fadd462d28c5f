// AnySource: receives from any peer of a communicator (MPI_ANY_SOURCE, Gloo's recv from a set of
// ranks), over the links of every transport.
//
// Semantics. A receive from any source on tag t takes the earliest message on t, from whichever
// peer (this rank included), in arrival order; against receives named for one peer, the
// earliest-posted receive that a message matches takes it, whichever kind it is. So each peer's
// messages on a tag are still taken in the order it sent them, and receives of both kinds mix.
//
// How. Every receive posted on a link and every message a link keeps unexpected carries a stamp
// (a monotonic clock, comparable across links and threads). A link's TagMatcher, when a message
// arrives and receives from any source are pending (active()), asks claim() whether one posted
// before the link's own earliest receive on the tag wants it; the link then takes it as if it had
// been posted there, and reports itself as the request's source. post(), for a new receive from
// any source, first looks over every link for the earliest message kept on the tag and hands the
// receive to that link (Connection::irecvKept) if it is still there; when no link keeps one, the
// receive is left pending for claim(), unless a message on the tag arrived while it looked (then
// it looks again). Lock order: a link's receive lock, then this one's; post() never holds this
// one while it takes a link's.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "transport/transport.hpp"

namespace loom {

/// The rank a receive from any source names (loom::kAnySource in the public API).
constexpr int kAnyPeer = -1;

/// A receive from any source that no message has matched yet.
struct AnyRecv {
  RequestPtr req;
  RecvSpec spec;
  uint64_t stamp = 0;
};

class AnySource {
 public:
  /// No stamp: no receive posted, no message kept.
  static constexpr uint64_t kNone = UINT64_MAX;
  /// When something is posted or kept: nanoseconds of the monotonic clock.
  static uint64_t stamp();

  /// Whether receives from any source are pending or being posted (links then ask claim()).
  bool active() const { return active_.load() > 0; }
  /// A message on `tag` arrived on a link, whose earliest receive posted on the tag has stamp
  /// `named` (kNone: none). Returns the receive from any source it goes to instead: the earliest
  /// pending on the tag, if posted before `named`. Called under the link's receive lock.
  std::optional<AnyRecv> claim(uint32_t tag, uint64_t named);
  /// Posts a receive from any source over `links` (every peer's link, this rank's own too).
  void post(const RequestPtr& req, const RecvSpec& spec, const std::vector<Connection*>& links);
  /// Fails the pending receives, and every later one, with `s` (the communicator failed).
  void failAll(const Status& s);

 private:
  mutable std::mutex mu_;  // pending_, arrivals_, posting*, failed_
  std::mutex postMu_;      // one post() looks over the links at a time
  std::atomic<int> active_{0};
  std::deque<AnyRecv> pending_;  // in posting order (by stamp)
  bool posting_ = false;
  uint32_t postingTag_ = 0;
  uint64_t arrivals_ = 0;  // messages on postingTag_ that arrived while post() looked
  std::optional<Status> failed_;
};

}  // namespace loom
