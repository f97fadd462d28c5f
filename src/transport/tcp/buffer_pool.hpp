// BufferPool: spare buffers for a TcpConnection's unexpected messages (those that arrive before
// their receive), so that a run of them costs no allocation, zero-fill or page faults per message.
// Buffers are uninitialised and recycled; the pool keeps at most `maxBytes` of them. Not
// thread-safe: the connection calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace loom {
namespace tcp {

class BufferPool {
 public:
  struct Buffer {
    std::unique_ptr<uint8_t[]> bytes;
    size_t size = 0;      ///< bytes in use
    size_t capacity = 0;  ///< bytes allocated
    uint8_t* data() { return bytes.get(); }
  };

  explicit BufferPool(size_t maxBytes = size_t{8} << 20) : maxBytes_(maxBytes) {}
  /// A buffer of `n` bytes: the smallest spare one that fits, else a new one. Its contents are garbage.
  Buffer take(size_t n);
  /// Keeps `b` for a later take() while the pool holds less than its limit; frees it otherwise.
  void giveBack(Buffer b);

 private:
  const size_t maxBytes_;
  std::vector<Buffer> spare_;
  size_t pooled_ = 0;  // the spare buffers' capacity
};

}  // namespace tcp
}  // namespace loom
