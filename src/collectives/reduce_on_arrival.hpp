// ReduceOnArrival: the receive consumer (core/receive_consumer.hpp) of a reduce step. Each run of
// arriving bytes at message offset `off` is reduced with the local operand at the same offset
// straight into the destination: dst[off..] = op(local[off..], received), or op(received, local)
// when the received data comes first in the algorithm's fixed order (so that both ends of an
// exchange compute the same bits). The received chunk never takes a trip through memory of its own.
//
// Usable only where the local operand is final when the receive is posted and nothing else reads
// or writes the destination range until the receive completes: runs land in any order, at any time
// before completion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/receive_consumer.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace coll {

class ReduceOnArrival : public ReceiveConsumer {
 public:
  /// `dst` and `local` point at the chunk's first element (they may be equal); `elem` is the size
  /// of one element of `type`.
  ReduceOnArrival(uint8_t* dst, const uint8_t* local, DataType type, ReduceOp op, size_t elem, bool receivedFirst)
      : ReceiveConsumer(elem), dst_(dst), local_(local), type_(type), op_(op), receivedFirst_(receivedFirst) {}

  void consume(const uint8_t* src, size_t offset, size_t len) noexcept override {
    // Whole elements only: a message of another size (a mismatched call, which the waiter reports)
    // never has its ragged end reduced.
    const size_t n = len / granule();
    if (receivedFirst_)
      kernels::reduce(dst_ + offset, src, local_ + offset, n, type_, op_);
    else
      kernels::reduce(dst_ + offset, local_ + offset, src, n, type_, op_);
  }

  static std::shared_ptr<ReduceOnArrival> make(uint8_t* dst, const uint8_t* local, DataType type, ReduceOp op,
                                               size_t elem, bool receivedFirst = false) {
    return std::make_shared<ReduceOnArrival>(dst, local, type, op, elem, receivedFirst);
  }

 private:
  uint8_t* const dst_;
  const uint8_t* const local_;
  const DataType type_;
  const ReduceOp op_;
  const bool receivedFirst_;
};

}  // namespace coll
}  // namespace loom
