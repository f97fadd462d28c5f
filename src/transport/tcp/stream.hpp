// The insides of a TcpConnection that its implementation files share (tcp_connection.cc, the
// frames, the socket I/O, the failures): the per-socket Stream with its read buffer and queue of
// frames to write, the engines' handlers, and the protocol's constants. Not for other users.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/tcp_connection.hpp"

namespace loom {
namespace tcp {

// A stream's own read buffer. It is also where the payloads of receives with a consumer land
// (core/receive_consumer.hpp), a run at a time, so it should stay in a core's L2 cache.
constexpr size_t kInBufBytes = 256 * 1024;
// Payloads at least this large are read straight into their destination, not through inbuf.
constexpr size_t kDirectReadBytes = 32 * 1024;
// What a read between frames takes at most (see read()).
constexpr size_t kHeaderReadBytes = 4096;
// A read this large, or one that continues a payload, asks the kernel to acknowledge at once
// (setQuickAck): data flowing both ways puts Linux's TCP in its delayed-ACK ("pingpong") mode,
// and the unacknowledged tail of a message then holds up a sender that ran out of window for a
// delayed-ACK timer's worth (tens of milliseconds; docs/performance.md). Reads of small whole
// messages, which no sender waits on, skip the syscall.
constexpr ssize_t kQuickAckBytes = 8 * 1024;
// Streams poll() checks for readiness at once (LOOM_SOCKETS_PER_PEER is at most 16).
constexpr size_t kMaxStreams = 16;
// How long a link that broke without a word waits for the peer's word in the store: a failing
// peer notes it before it closes its other links, so it is there at once, or never (the peer was
// killed); the wait covers a peer that failed on this very link, and closed it first.
constexpr std::chrono::milliseconds kLastWordWait(250);
// The longest an ask can take: kLastWordWait, then the last store request's own limit (2 s,
// kStoreNoteLimit in comm/comm_impl.cc), with room to spare.
constexpr std::chrono::milliseconds kLastWordAskBound(3000);
constexpr int kMaxIov = 64;
// What the receive thread may write inline (control frames, small replies) before it hands the
// rest to the send engine.
constexpr size_t kReaderWriteBudget = 64 * 1024;
constexpr size_t kUnlimited = SIZE_MAX;
// Sends remembered to judge READY hints against: a hint older than this many sends is dropped.
constexpr size_t kRecentSends = 256;
// The slices of a striped message start at multiples of this (every element size divides it), so
// that a receive's consumer gets whole elements from every stream.
constexpr size_t kSliceAlignBytes = 64;

// Whether a DATA frame's slice of a message of `bytes` starts at a whole element of `granule`
// bytes and ends at one, or at the message's end.
inline bool sliceWhole(const FrameHeader& h, uint64_t bytes, size_t granule) {
  return h.a % granule == 0 && ((h.a + h.b) % granule == 0 || h.a + h.b == bytes);
}

class TcpConnection::ReadHandler : public PollHandler {
 public:
  ReadHandler(TcpConnection* conn, int index) : conn_(conn), index_(index) {}
  void onPollEvents(uint32_t) noexcept override { conn_->onReadable(index_); }

 private:
  TcpConnection* const conn_;  // owns this handler
  const int index_;
};

class TcpConnection::WriteHandler : public PollHandler {
 public:
  WriteHandler(TcpConnection* conn, int index) : conn_(conn), index_(index) {}
  void onPollEvents(uint32_t) noexcept override { conn_->onWritable(index_); }

 private:
  TcpConnection* const conn_;  // owns this handler
  const int index_;
};

struct TcpConnection::Stream {
  Socket sock;
  std::unique_ptr<ReadHandler> reader;
  std::unique_ptr<WriteHandler> writer;
  bool registered = false;
  bool eof = false;        // the peer closed its side of this socket
  bool readArmed = false;  // the receive engine's one-shot read event is armed
  bool blocked = false;    // holds a DATA header that overtook its PUSH (stream 0 is behind)
  // Sending. Frames are only appended by others; the active writer alone pops them, so pointers
  // into queued frames stay valid while it writes unlocked.
  std::deque<OutFrame> out;
  bool armed = false;    // EPOLLOUT requested from the send engine
  bool writing = false;  // a thread is in sendmsg on this stream, unlocked
  // Receiving (the receive thread's alone, but for failLocked while `reading` is false).
  bool reading = false;  // the receive thread is in recv on this stream, unlocked
  int lowWater = 1;      // the socket's SO_RCVLOWAT
  // Left uninitialised: only [rpos, wpos) is read, and a link that carries small messages touches
  // only its first pages (zeroing it cost every link its whole size at set-up, every rank many links).
  std::unique_ptr<uint8_t[]> in{new uint8_t[kInBufBytes]};
  size_t rpos = 0;
  size_t wpos = 0;
  bool inPayload = false;
  Sink sink = Sink::None;
  uint8_t* target = nullptr;
  size_t remaining = 0;
  size_t payloadLen = 0;
  std::shared_ptr<RecvOp> op;
  std::shared_ptr<Unexpected> ux;
  std::string bye;  // a BYE's reason, arriving
  // The payload's receive takes its bytes as they land (Request::consumer; `op` holds it): they are
  // read into `in` and handed on from there, never written to `target`.
  ReceiveConsumer* consumer = nullptr;
  size_t consumeAt = 0;  // the message offset of the payload's next byte
};

}  // namespace tcp
}  // namespace loom
