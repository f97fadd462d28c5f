// TagMatcher: the matching of receives to messages on one link, the same for every transport.
//
// A receive posted on a tag takes the earliest message with that tag that arrived before it
// (the "unexpected" queue); a message arriving on a tag takes the earliest receive posted on it
// (the "posted" queue), else waits in the unexpected queue. So per tag, the n-th receive gets the
// n-th message, in the order the peer sent them (every transport delivers one link's messages in
// send order). Tags are independent: a receive never waits behind another tag's.
//
// What a receive and a message are is the transport's (`Recv`, `Message`: a pointer to its own
// record, an eager payload, an announcement); the matcher only orders them. It is pure: no locks
// (the transport calls it under the lock that guards its receive side), no I/O, no allocation
// per tag, and unit-tested on its own (tests/unit/matching_test.cc). Few receives and messages
// are outstanding on a link at once, so each queue is one flat sequence in arrival order that a
// match scans, which is cheaper than a map of queues that allocates for each new tag (every
// collective has a tag of its own).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "core/status.hpp"

namespace loom {

template <typename Recv, typename Message>
class TagMatcher {
 public:
  /// A receive on `tag` is posted: the earliest unexpected message on the tag, taken out of the
  /// matcher, or nothing (then call post()).
  std::optional<Message> takeMessage(uint32_t tag) { return takeFirst(unexpected_, tag); }
  /// Queues a receive that no message has matched yet.
  void post(uint32_t tag, Recv r) { posted_.emplace_back(tag, std::move(r)); }

  /// A message on `tag` arrives: the earliest posted receive on the tag, taken out of the
  /// matcher, or nothing (then call keep()).
  std::optional<Recv> takeRecv(uint32_t tag) { return takeFirst(posted_, tag); }
  /// Keeps a message that no receive has matched yet, for a later receive.
  void keep(uint32_t tag, Message m) { unexpected_.emplace_back(tag, std::move(m)); }

  /// Receives posted on `tag` and not matched yet.
  size_t postedOn(uint32_t tag) const { return count(posted_, tag); }
  /// Messages kept on `tag` and not matched yet.
  size_t keptOn(uint32_t tag) const { return count(unexpected_, tag); }
  bool anyPosted() const { return !posted_.empty(); }
  bool anyKept() const { return !unexpected_.empty(); }

  /// Takes every posted receive, in posting order (a link that closes fails them).
  std::deque<Recv> takeAllPosted() {
    std::deque<Recv> out;
    for (auto& e : posted_) out.push_back(std::move(e.second));
    posted_.clear();
    return out;
  }
  /// Calls f(message) for each kept message, in arrival order.
  template <typename F>
  void forEachKept(F&& f) const {
    for (const auto& e : unexpected_) f(e.second);
  }
  /// Drops the kept messages for which pred(message) holds (a closed link keeps only those that
  /// arrived whole, for receives posted later).
  template <typename Pred>
  void dropKeptIf(Pred&& pred) {
    unexpected_.erase(std::remove_if(unexpected_.begin(), unexpected_.end(),
                                     [&pred](const std::pair<uint32_t, Message>& e) { return pred(e.second); }),
                      unexpected_.end());
  }

 private:
  template <typename T>
  static std::optional<T> takeFirst(std::deque<std::pair<uint32_t, T>>& q, uint32_t tag) {
    auto it = std::find_if(q.begin(), q.end(), [tag](const std::pair<uint32_t, T>& e) { return e.first == tag; });
    if (it == q.end()) return std::nullopt;
    std::optional<T> out(std::move(it->second));
    q.erase(it);
    return out;
  }
  template <typename T>
  static size_t count(const std::deque<std::pair<uint32_t, T>>& q, uint32_t tag) {
    return static_cast<size_t>(
        std::count_if(q.begin(), q.end(), [tag](const std::pair<uint32_t, T>& e) { return e.first == tag; }));
  }

  std::deque<std::pair<uint32_t, Recv>> posted_;         // in posting order
  std::deque<std::pair<uint32_t, Message>> unexpected_;  // in arrival order
};

/// The error every transport gives a message larger than the receive it matched: the receive
/// fails (and the message is dropped), the link goes on.
Status truncationError(int peer, uint32_t tag, size_t message, size_t capacity);

}  // namespace loom
