// ReceiveConsumer: what a receive does with its bytes as they land, instead of leaving them in its
// buffer for a later pass. The reduce steps of the ring, halving-doubling and recursive-doubling
// all-reduces attach one that reduces the arriving partial sums straight into the output.
//
// Why: a reduce step that receives a chunk into a staging buffer and then reduces it reads and
// writes that chunk through main memory twice (the kernel's copy writes it out, the reduction reads
// it back). A transport that reads a socket into a small buffer of its own and hands each run of
// bytes on at once, while it is still in cache, saves both passes (LOOM_TCP_REDUCE_ON_ARRIVAL
// turns it off for comparison; docs/performance.md).
//
// Contract, for transports: a transport that honours the consumer (TcpConnection) hands it every
// byte of the message exactly once, in runs whose offsets and lengths are whole multiples of
// `granule` (message sizes are), from memory of its own that is valid during the call only; it
// then sets Request::consumed before it completes the request, and never writes the receive
// buffer. Runs of one message may be handed on from several threads at once (one per socket of a
// striped message); they never overlap. A transport that does not (shared memory, the self link),
// or a message that took another way (one that arrived before its receive was posted), leaves the
// bytes in the receive buffer and Request::consumed false: the waiter then hands the whole buffer
// to the consumer after completion (coll::Context::wait), so the result is the same either way.
//
// Ownership: the request holds the consumer (shared_ptr) until it is destroyed, so a transport
// that is still inside consume() while the collective gives up on a failure keeps it alive; the
// memory it reduces into is the caller's, as for any receive buffer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

class ReceiveConsumer {
 public:
  /// `granule`: the unit every run is cut at (the element size of the data).
  explicit ReceiveConsumer(size_t granule) : granule_(granule == 0 ? 1 : granule) {}
  virtual ~ReceiveConsumer() = default;

  /// Bytes [offset, offset + len) of the message, at `src` for the duration of the call.
  /// Must not throw and must not call back into the transport.
  virtual void consume(const uint8_t* src, size_t offset, size_t len) noexcept = 0;

  size_t granule() const { return granule_; }

 private:
  const size_t granule_;
};

}  // namespace loom
