// What a communicator keeps in its rendezvous store on the paths where things go wrong, shared by
// joining (a link asks for its peer's last word) and diagnostics (a failing rank leaves it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace loom {
namespace detail {

/// A failing rank's word in the store (leaveWord / lastWordOf): its first error, this long at most.
constexpr size_t kMaxWordBytes = 4096;
/// Each store request on a failure path gives up after this (a stopped store host must not add
/// the whole operation timeout to an error that is already known).
constexpr std::chrono::milliseconds kStoreNoteLimit(2000);
/// The request number a departing rank's final flight record answers: every one.
constexpr int64_t kFinalRecord = std::numeric_limits<int64_t>::max();

inline std::string lastWordKey(int rank) { return "left/" + std::to_string(rank); }

}  // namespace detail
}  // namespace loom
