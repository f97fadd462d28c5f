// Deadline: a point on the steady clock that every wait in Loom is bounded by.
#pragma once

#include <chrono>

namespace loom {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  /// A deadline `timeout` from now.
  explicit Deadline(std::chrono::milliseconds timeout) : at_(Clock::now() + timeout), total_(timeout) {}

  bool expired() const { return Clock::now() >= at_; }
  Clock::time_point at() const { return at_; }
  /// Milliseconds left, at least 0 and at most INT32_MAX (for poll/epoll).
  int remainingMs() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left <= 0) return 0;
    return left > 0x7fffffff ? 0x7fffffff : static_cast<int>(left);
  }
  /// The whole span this deadline was made with.
  std::chrono::milliseconds total() const { return total_; }
  /// Seconds of the whole span, for messages.
  double totalSeconds() const { return static_cast<double>(total_.count()) / 1000.0; }

 private:
  Clock::time_point at_;
  std::chrono::milliseconds total_;
};

}  // namespace loom
