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

std::vector<std::optional<Bytes>> Store::tryGetMany(const std::vector<std::string>& keys) {
  std::vector<std::optional<Bytes>> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(tryGet(k));
  return out;
}

void Store::setMany(const std::vector<std::pair<std::string, Bytes>>& pairs) {
  for (const auto& [k, v] : pairs) set(k, v);
}

bool Store::waitAll(const std::vector<std::string>& keys, const Deadline& deadline, std::vector<std::string>* missing) {
  std::vector<Bytes> values;
  return getAll(keys, deadline, &values, missing);
}

bool Store::getAll(const std::vector<std::string>& keys, const Deadline& deadline, std::vector<Bytes>* values,
                   std::vector<std::string>* missing) {
  values->assign(keys.size(), Bytes());
  std::vector<size_t> left(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) left[i] = i;
  for (Backoff b;; b.pause()) {
    std::vector<std::string> ask;
    ask.reserve(left.size());
    for (size_t i : left) ask.push_back(keys[i]);
    auto got = tryGetMany(ask);
    std::vector<size_t> still;
    for (size_t j = 0; j < left.size(); ++j) {
      if (got[j]) {
        (*values)[left[j]] = std::move(*got[j]);
      } else {
        still.push_back(left[j]);
      }
    }
    if (still.size() < left.size()) b = Backoff();  // progress: look again soon
    left.swap(still);
    if (left.empty()) return true;
    if (deadline.expired()) break;
  }
  if (missing != nullptr) {
    missing->clear();
    for (size_t i : left) missing->push_back(keys[i]);
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
