// Frames of the TCP transport. Every frame starts with a 32-byte header; EAGER and DATA frames
// carry a payload after it.
//
//   EAGER (tag, seq, nbytes, sig) + payload   small message, sent at once on socket 0
//   RTS   (tag, seq, nbytes, sig)        large message announced on socket 0 ...
//   CTS   (seq, accept[, sig])           ... the receiver answers once a matching receive is
//                                        posted (or rejects it: too large for the receive, or of
//                                        another collective call, whose signature it returns) ...
//   DATA  (seq, offset, len) + payload   ... and the sender stripes the payload over all sockets,
//                                        straight into the receiver's buffer.
//   PUSH  (tag, seq, nbytes)             a message up to kMaxPushBytes sent at once but striped:
//                                        DATA frames follow on every stream (stream 0 included)
//                                        without waiting for a CTS; the receiver takes them into
//                                        the matching receive, or buffers them as an unexpected
//                                        message. A DATA frame that overtakes its PUSH (another
//                                        stream) waits, unparsed, until the PUSH has been read.
//   BYE   (nbytes) + reason              the sender's communicator failed (or was destroyed) and
//                                        says why, so that its peers report the cause, not only
//                                        a closed connection
//   READY (tag, seq, capacity, ahead)    a hint from the receiver: a receive of `capacity` bytes
//                                        is posted for tag; it will match the (ahead+1)-th message
//                                        on that tag from sequence number `seq` on. A sender whose
//                                        next large message is that one (up to LOOM_READY_BYTES)
//                                        sends it at once, as a PUSH (an EAGER where it takes one
//                                        stripe), saving the RTS/CTS round trip. Only a hint: a wrong
//                                        guess costs a copy through the unexpected queue, never
//                                        correctness.
//
// Fields are little-endian. Everything read from the wire is checked before use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the TCP frame layout assumes a little-endian host");

namespace loom {
namespace tcp {

constexpr uint16_t kFrameMagic = 0x4d4c;  // "LM"
constexpr size_t kHeaderBytes = 32;
/// The largest EAGER payload a receiver accepts, whatever the sender's configuration.
constexpr uint64_t kMaxEagerBytes = 1u << 20;
/// The largest PUSH a receiver accepts (a hinted message goes at once up to LOOM_READY_BYTES).
constexpr uint64_t kMaxPushBytes = uint64_t{1} << 30;

enum class FrameType : uint8_t { Eager = 1, Rts = 2, Cts = 3, Data = 4, Ready = 5, Push = 6, Bye = 7 };
/// The longest reason a BYE carries.
constexpr uint64_t kMaxByeBytes = 4096;

struct FrameHeader {
  uint16_t magic = kFrameMagic;
  uint8_t type = 0;
  uint8_t flags = 0;  // CTS: 1 = accepted; 2 = refused, another call (a = the receiver's signature).
                      // BYE: 1 = the sender's communicator failed (else it was destroyed cleanly)
  uint32_t tag = 0;
  uint64_t seq = 0;
  uint64_t a = 0;  // EAGER/RTS/PUSH: message bytes; DATA: offset; READY: capacity
  uint64_t b = 0;  // EAGER/RTS/PUSH: the call's signature (core/signature.hpp); DATA: payload length;
                   // READY: receives posted ahead of this one
};
static_assert(sizeof(FrameHeader) == kHeaderBytes, "frame header layout");

inline void encodeHeader(const FrameHeader& h, uint8_t* out) { std::memcpy(out, &h, kHeaderBytes); }
inline FrameHeader decodeHeader(const uint8_t* in) {
  FrameHeader h;
  std::memcpy(&h, in, kHeaderBytes);
  return h;
}

}  // namespace tcp
}  // namespace loom
