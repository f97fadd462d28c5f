// RingView: one side's handle on a single-producer/single-consumer byte ring in a Segment, and
// the frames the shared-memory transport sends through it.
//
// head and tail count bytes since the start (never wrap); the producer publishes bytes by
// storing head with release, the consumer frees them by storing tail with release. Exactly one
// thread may write and one may read at a time (ShmConnection's two mutexes see to it).
//
// Frames (40-byte header; EAGER and DATA carry a payload after it, streamed through the ring in
// as many pieces as it takes):
//   EAGER (tag, seq, bytes, sig) + payload   small message, copied through the ring
//   RTS   (tag, seq, bytes, addr, sig)  large message announced; addr is the sender's buffer
//   DONE  (seq)                         receiver has read it with process_vm_readv: sender completes
//   CTS   (seq)                         receiver cannot read it directly: sender streams it ...
//   DATA  (seq, bytes) + payload        ... through the ring, straight into the receive buffer
//   NACK  (seq[, sig])                  receive buffer too small, or (sig set: the receiver's
//                                       signature) a receive of another collective call: sender fails
// sig is the collective call's signature (core/signature.hpp), 0 for point-to-point messages.
// A header is written only when it fits whole, so a reader always finds headers whole.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/copy.hpp"
#include "transport/shm/segment.hpp"

namespace loom {
namespace shm {

enum class FrameType : uint8_t { Eager = 1, Rts = 2, Done = 3, Cts = 4, Data = 5, Nack = 6 };

struct Frame {
  uint8_t type = 0;
  uint8_t pad[3] = {0, 0, 0};
  uint32_t tag = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint64_t addr = 0;
  uint64_t sig = 0;
};
static_assert(sizeof(Frame) == 40, "frame layout");
constexpr size_t kFrameBytes = sizeof(Frame);

class RingView {
 public:
  RingView() = default;
  RingView(RingControl* control, uint8_t* data, size_t capacity) : c_(control), data_(data), cap_(capacity) {}

  RingControl* control() const { return c_; }
  size_t capacity() const { return cap_; }

  /// Bytes the consumer may read now.
  size_t readable() const {
    return static_cast<size_t>(c_->head.load(std::memory_order_acquire) - c_->tail.load(std::memory_order_relaxed));
  }
  /// Bytes the producer may write now.
  size_t writable() const {
    return cap_ -
           static_cast<size_t>(c_->head.load(std::memory_order_relaxed) - c_->tail.load(std::memory_order_acquire));
  }
  /// Producer: copies n <= writable() bytes in and publishes them.
  void write(const void* src, size_t n) {
    const uint64_t head = c_->head.load(std::memory_order_relaxed);
    copyIn(head, static_cast<const uint8_t*>(src), n);
    c_->head.store(head + n, std::memory_order_release);
  }
  /// Consumer: copies n <= readable() bytes out and frees them.
  void read(void* dst, size_t n) {
    const uint64_t tail = c_->tail.load(std::memory_order_relaxed);
    copyOut(tail, static_cast<uint8_t*>(dst), n);
    c_->tail.store(tail + n, std::memory_order_seq_cst);
  }
  /// Consumer: frees n <= readable() bytes unread.
  void skip(size_t n) { c_->tail.fetch_add(n, std::memory_order_seq_cst); }

 private:
  void copyIn(uint64_t pos, const uint8_t* src, size_t n) {
    const size_t at = static_cast<size_t>(pos % cap_);
    const size_t first = std::min(n, cap_ - at);
    kernels::copy(data_ + at, src, first);
    if (n > first) kernels::copy(data_, src + first, n - first);
  }
  void copyOut(uint64_t pos, uint8_t* dst, size_t n) const {
    const size_t at = static_cast<size_t>(pos % cap_);
    const size_t first = std::min(n, cap_ - at);
    kernels::copy(dst, data_ + at, first);
    if (n > first) kernels::copy(dst + first, data_, n - first);
  }

  RingControl* c_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace shm
}  // namespace loom
