#include "transport/matching.hpp"

#include "core/format.hpp"

namespace loom {

Status truncationError(int peer, uint32_t tag, size_t message, size_t capacity) {
  return Status::error(ErrorCode::InvalidUsage,
                       strFormat("message of %zu bytes from rank %d (tag %u) is larger than the receive buffer of "
                                 "%zu bytes: post a receive as large as the message",
                                 message, peer, tag, capacity),
                       peer);
}

Status refusedAsTooLarge(int peer, uint32_t tag, size_t bytes) {
  return Status::error(ErrorCode::InvalidUsage,
                       strFormat("message of %zu bytes to rank %d (tag %u) is larger than the receive buffer rank %d "
                                 "posted: post a receive as large as the message",
                                 bytes, peer, tag, peer),
                       peer);
}

}  // namespace loom
