// MatchedConnection: what every link that orders its receives with a TagMatcher (matching.hpp)
// does the same way, written once: irecv under the link's receive lock, and the link's part in
// receives from any source (any_source.hpp) — joining the communicator's AnySource, telling when
// the earliest message it keeps on a tag arrived, and taking a receive from any source that chose
// it, reporting its peer as the source.
//
// A transport's connection derives from MatchedConnection<ItsClass>, befriends it, and has:
//   std::mutex& receiveMutex();     the lock that guards its receive side and matcher_
//   matcher_, peer_                 its TagMatcher and the rank at the other end
//   Recv makeRecv(const RequestPtr&, const RecvSpec&) const
//                                   its matcher's record of a receive (PostedRecv and
//                                   postedRecv<Op>() make the usual one)
//   void irecvLocked(const RequestPtr&, const RecvSpec&, std::unique_lock<std::mutex>&)
//                                   its receive, under the lock (which it may release)
// Static, not virtual: the calls below are the link's hot path.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "transport/any_source.hpp"
#include "transport/transport.hpp"

namespace loom {

/// The fields every transport's record of a posted receive starts with.
struct PostedRecv {
  RequestPtr req;
  uint8_t* buf = nullptr;
  size_t capacity = 0;
  size_t bytes = 0;  // of the matched message
  uint32_t tag = 0;
  uint64_t signature = 0;  // RecvSpec::signature
};

/// A new record `Op` (a PostedRecv) of the receive `spec`, posted by `req`.
template <typename Op>
std::shared_ptr<Op> postedRecv(const RequestPtr& req, const RecvSpec& spec) {
  auto op = std::make_shared<Op>();
  op->req = req;
  op->buf = static_cast<uint8_t*>(spec.buf);
  op->capacity = spec.capacity;
  op->tag = spec.tag;
  op->signature = spec.signature;
  return op;
}

template <typename Self>
class MatchedConnection : public Connection {
 public:
  void irecv(const RequestPtr& req, const RecvSpec& spec) noexcept final {
    std::unique_lock<std::mutex> lock(self().receiveMutex());
    self().irecvLocked(req, spec, lock);
  }

  void attachAnySource(AnySource* hub) final {
    Self& s = self();
    std::lock_guard<std::mutex> lock(s.receiveMutex());
    s.matcher_.attach(hub, [&s](AnyRecv&& a) {
      a.req->setSource(s.peer_);
      return s.makeRecv(a.req, a.spec);
    });
  }

  uint64_t firstKept(uint32_t tag) final {
    std::lock_guard<std::mutex> lock(self().receiveMutex());
    return self().matcher_.firstKept(tag);
  }

  bool irecvKept(const RequestPtr& req, const RecvSpec& spec, uint64_t stamp) noexcept final {
    Self& s = self();
    std::unique_lock<std::mutex> lock(s.receiveMutex());
    if (stamp == AnySource::kNone || s.matcher_.firstKept(spec.tag) != stamp) return false;
    req->setSource(s.peer_);
    s.irecvLocked(req, spec, lock);
    return true;
  }

 private:
  Self& self() { return static_cast<Self&>(*this); }
};

}  // namespace loom
