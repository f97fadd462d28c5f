// TagMatcher: the matching of receives to messages on one link, the same for every transport.
//
// A receive posted on a tag takes the earliest message with that tag that arrived before it
// (the "unexpected" queue); a message arriving on a tag takes the earliest receive posted on it
// (the "posted" queue), else waits in the unexpected queue. So per tag, the n-th receive gets the
// n-th message, in the order the peer sent them (every transport delivers one link's messages in
// send order). Tags are independent: a receive never waits behind another tag's.
//
// Receives from any source (any_source.hpp): attached to its communicator's AnySource, the matcher
// stamps what it posts and keeps, and a message that arrives goes to a receive from any source
// posted before the link's own earliest receive on the tag, which `adopt` turns into the link's
// kind of receive.
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
#include <functional>
#include <mutex>
#include <optional>
#include <utility>

#include "core/status.hpp"
#include "transport/any_source.hpp"

namespace loom {

template <typename Recv, typename Message>
class TagMatcher {
 public:
  /// Joins the communicator's receives from any source: `adopt` makes this link's receive of one
  /// that a message arriving here takes (under the lock the matcher is called with).
  using Adopt = std::function<Recv(AnyRecv&&)>;
  void attach(AnySource* hub, Adopt adopt) {
    hub_ = hub;
    adopt_ = std::move(adopt);
  }

  /// A receive on `tag` is posted: the earliest unexpected message on the tag, taken out of the
  /// matcher, or nothing (then call post()).
  std::optional<Message> takeMessage(uint32_t tag) { return takeFirst(unexpected_, tag); }
  /// Queues a receive that no message has matched yet; `posted`: when it was posted, if before now
  /// (RecvSpec::posted), else 0.
  void post(uint32_t tag, Recv r, uint64_t posted = 0) {
    posted_.push_back(Entry<Recv>{tag, posted != 0 && hub_ != nullptr ? posted : stampNow(), std::move(r)});
  }

  /// A message on `tag` arrives: the earliest posted receive on the tag (of this link, or from
  /// any source), taken out of the matcher, or nothing (then call keep()).
  std::optional<Recv> takeRecv(uint32_t tag) {
    if (hub_ != nullptr && hub_->active()) {
      auto it = findFirst(posted_, tag);
      if (std::optional<AnyRecv> any = hub_->claim(tag, it == posted_.end() ? AnySource::kNone : it->stamp))
        return adopt_(std::move(*any));
    }
    return takeFirst(posted_, tag);
  }
  /// Keeps a message that no receive has matched yet, for a later receive.
  void keep(uint32_t tag, Message m) { unexpected_.push_back(Entry<Message>{tag, stampNow(), std::move(m)}); }
  /// When the earliest message kept on `tag` arrived (AnySource::kNone: none is kept).
  uint64_t firstKept(uint32_t tag) const {
    auto it =
        std::find_if(unexpected_.begin(), unexpected_.end(), [tag](const Entry<Message>& e) { return e.tag == tag; });
    return it == unexpected_.end() ? AnySource::kNone : it->stamp;
  }

  /// Receives posted on `tag` and not matched yet.
  size_t postedOn(uint32_t tag) const { return count(posted_, tag); }
  /// Messages kept on `tag` and not matched yet.
  size_t keptOn(uint32_t tag) const { return count(unexpected_, tag); }
  bool anyPosted() const { return !posted_.empty(); }
  bool anyKept() const { return !unexpected_.empty(); }

  /// Takes every posted receive, in posting order (a link that closes fails them).
  std::deque<Recv> takeAllPosted() {
    std::deque<Recv> out;
    for (auto& e : posted_) out.push_back(std::move(e.item));
    posted_.clear();
    return out;
  }
  /// Calls f(message) for each kept message, in arrival order.
  template <typename F>
  void forEachKept(F&& f) const {
    for (const auto& e : unexpected_) f(e.item);
  }
  /// Drops the kept messages for which pred(message) holds (a closed link keeps only those that
  /// arrived whole, for receives posted later).
  template <typename Pred>
  void dropKeptIf(Pred&& pred) {
    unexpected_.erase(std::remove_if(unexpected_.begin(), unexpected_.end(),
                                     [&pred](const Entry<Message>& e) { return pred(e.item); }),
                      unexpected_.end());
  }

 private:
  template <typename T>
  struct Entry {
    uint32_t tag;
    uint64_t stamp;  // when posted or kept (0 where no receive from any source can be posted)
    T item;
  };
  uint64_t stampNow() const { return hub_ != nullptr ? AnySource::stamp() : 0; }
  template <typename T>
  static typename std::deque<Entry<T>>::iterator findFirst(std::deque<Entry<T>>& q, uint32_t tag) {
    return std::find_if(q.begin(), q.end(), [tag](const Entry<T>& e) { return e.tag == tag; });
  }
  template <typename T>
  static std::optional<T> takeFirst(std::deque<Entry<T>>& q, uint32_t tag) {
    auto it = findFirst(q, tag);
    if (it == q.end()) return std::nullopt;
    std::optional<T> out(std::move(it->item));
    q.erase(it);
    return out;
  }
  template <typename T>
  static size_t count(const std::deque<Entry<T>>& q, uint32_t tag) {
    return static_cast<size_t>(std::count_if(q.begin(), q.end(), [tag](const Entry<T>& e) { return e.tag == tag; }));
  }

  std::deque<Entry<Recv>> posted_;         // in posting order
  std::deque<Entry<Message>> unexpected_;  // in arrival order
  AnySource* hub_ = nullptr;
  Adopt adopt_;
};

/// The error every transport gives a message larger than the receive it matched: the receive
/// fails (and the message is dropped), the link goes on.
Status truncationError(int peer, uint32_t tag, size_t message, size_t capacity);
/// Its sender's side: the message of `bytes` to `peer` on `tag` was refused as larger than the
/// receive that matched it there.
Status refusedAsTooLarge(int peer, uint32_t tag, size_t bytes);

}  // namespace loom
