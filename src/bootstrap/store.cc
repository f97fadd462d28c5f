#include "bootstrap/store.hpp"

#include <algorithm>
#include <thread>

namespace loom {

std::optional<Bytes> Store::get(const std::string& key, const Deadline& deadline) {
  // Polling with a growing pause keeps the store server stateless about waiters; rendezvous is
  // not latency-critical, and the pause is capped so joins still complete within milliseconds.
  auto pause = std::chrono::microseconds(100);
  for (;;) {
    if (auto v = tryGet(key)) return v;
    if (deadline.expired()) return std::nullopt;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

bool Store::waitAll(const std::vector<std::string>& keys, const Deadline& deadline, std::vector<std::string>* missing) {
  auto pause = std::chrono::microseconds(100);
  size_t next = 0;
  for (;;) {
    while (next < keys.size() && tryGet(keys[next])) ++next;
    if (next == keys.size()) return true;
    if (deadline.expired()) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
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
  auto pause = std::chrono::microseconds(100);
  for (;;) {
    if (auto v = tryGetBounded(key, limit)) return v;
    if (deadline.expired()) return std::nullopt;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

}  // namespace loom
