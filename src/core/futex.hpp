// Waiting on a word in memory that other threads, or other processes mapping it, bump to wake
// the sleeper (Linux futexes, shared between processes).
#pragma once

#include <atomic>
#include <cstdint>

namespace loom {

/// Sleeps while *word == expected, at most `timeoutMs` (a spurious return is allowed).
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeoutMs) noexcept;
/// Wakes every thread asleep on `word`.
void futexWakeAll(std::atomic<uint32_t>* word) noexcept;

}  // namespace loom
