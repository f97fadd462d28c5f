// Status: the noexcept error currency of progress code, and the helpers that turn it into a
// loom::Error at the API boundary.
#pragma once

#include <cstdint>
#include <string>

#include "loom/loom.hpp"

namespace loom {

/// An outcome: ok, or an error code with its readable message and the peer / collective involved.
struct Status {
  bool ok = true;
  ErrorCode code = ErrorCode::Internal;
  std::string message;
  int peer = -1;
  int64_t seq = -1;

  static Status success() { return Status{}; }
  static Status error(ErrorCode code, std::string message, int peer = -1, int64_t seq = -1) {
    Status s;
    s.ok = false;
    s.code = code;
    s.message = std::move(message);
    s.peer = peer;
    s.seq = seq;
    return s;
  }
  /// The exception a caller on `rank` receives for this status.
  Error toError(int rank) const { return Error(code, message, rank, peer, seq); }
};

/// Builds a status from the current exception (an Error keeps its code; anything else is Internal).
Status statusFromCurrentException();

}  // namespace loom

/// Throws loom::Error with file:line. Usage: LOOM_THROW(ErrorCode::InvalidArgument, rank, "bad count " ...).
#define LOOM_THROW(code, rank, msg) throw ::loom::Error((code), (msg), (rank), -1, -1, __FILE__, __LINE__)
#define LOOM_THROW_PEER(code, rank, peer, msg) \
  throw ::loom::Error((code), (msg), (rank), (peer), -1, __FILE__, __LINE__)
