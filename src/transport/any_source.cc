// Receives from any source (any_source.hpp).
#include "transport/any_source.hpp"

#include <algorithm>
#include <chrono>

namespace loom {

uint64_t AnySource::stamp() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::optional<AnyRecv> AnySource::claim(uint32_t tag, uint64_t named) {
  std::lock_guard<std::mutex> lock(mu_);
  if (posting_ && tag == postingTag_) arrivals_++;
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->spec.tag != tag) continue;
    if (it->stamp > named) return std::nullopt;  // the link's own receive came first
    AnyRecv r = std::move(*it);
    pending_.erase(it);
    active_--;
    return r;
  }
  return std::nullopt;
}

void AnySource::post(const RequestPtr& req, const RecvSpec& spec, const std::vector<Connection*>& links) {
  // One poster looks at a time, so that receives go pending in the order they were posted. It
  // lets go while a link takes a kept message for it: that may complete requests, whose callbacks
  // may post again.
  std::unique_lock<std::mutex> one(postMu_);
  const uint64_t posted = stamp();
  active_++;  // before looking: a link that keeps a message from now on asks claim()
  for (;;) {
    uint64_t seen = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) {
        active_--;
        posting_ = false;
        req->fail(*failed_);
        return;
      }
      posting_ = true;
      postingTag_ = spec.tag;
      seen = arrivals_;
    }
    uint64_t first = kNone;
    Connection* at = nullptr;
    for (Connection* c : links) {
      const uint64_t s = c->firstKept(spec.tag);
      if (s < first) first = s, at = c;
    }
    if (at != nullptr) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        posting_ = false;
      }
      one.unlock();
      if (at->irecvKept(req, spec, first)) {
        active_--;
        return;
      }
      one.lock();  // a receive of that link took it meanwhile: look again
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (arrivals_ != seen) continue;  // one arrived while the links were looked over
    posting_ = false;
    // In posting order (a poster that let go for a link may come back after a later one).
    auto at2 = std::find_if(pending_.begin(), pending_.end(), [posted](const AnyRecv& r) { return r.stamp > posted; });
    pending_.insert(at2, AnyRecv{req, spec, posted});
    return;
  }
}

void AnySource::failAll(const Status& s) {
  std::deque<AnyRecv> failing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) failed_ = s;
    failing.swap(pending_);
    active_ -= static_cast<int>(failing.size());
  }
  for (auto& r : failing) r.req->fail(s);
}

}  // namespace loom
