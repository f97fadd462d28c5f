#include "bootstrap/store.hpp"

#include <algorithm>
#include <thread>

namespace loom {
namespace {

// Waits poll the store with a growing pause: that keeps the store server stateless about
// waiters; rendezvous is not latency-critical, and the pause is capped so that joins still
// complete within milliseconds.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(20000));
  }

 private:
  std::chrono::microseconds pause_{100};
};

}  // namespace

std::optional<Bytes> Store::get(const std::string& key, const Deadline& deadline) {
  for (Backoff b;; b.pause()) {
    if (auto v = tryGet(key)) return v;
    if (deadline.expired()) return std::nullopt;
  }
}

bool Store::waitAll(const std::vector<std::string>& keys, const Deadline& deadline, std::vector<std::string>* missing) {
  size_t next = 0;
  for (Backoff b;; b.pause()) {
    while (next < keys.size() && tryGet(keys[next])) ++next;
    if (next == keys.size()) return true;
    if (deadline.expired()) break;
  }
  if (missing != nullptr) {
    missing->clear();
    for (size_t i = next; i < keys.size(); ++i)
      if (!tryGet(keys[i])) missing->push_back(keys[i]);
  }
  return false;
}

bool Store::setBounded(const std::string& key, const Bytes& value, std::chrono::milliseconds) {
  try {
    set(key, value);
    return true;
  } catch (...) {
    return false;
  }
}

std::optional<Bytes> Store::tryGetBounded(const std::string& key, std::chrono::milliseconds) {
  try {
    return tryGet(key);
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<Bytes> Store::getBounded(const std::string& key, const Deadline& deadline,
                                       std::chrono::milliseconds limit) {
  for (Backoff b;; b.pause()) {
    if (auto v = tryGetBounded(key, limit)) return v;
    if (deadline.expired()) return std::nullopt;
  }
}

}  // namespace loom
