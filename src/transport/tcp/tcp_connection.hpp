// TcpConnection: the link to one peer over one or more TCP sockets ("streams").
//
// Protocol (frame.hpp): messages up to the eager limit go whole on stream 0 (EAGER). Larger ones
// are announced (RTS), accepted by the receiver once a matching receive is posted (CTS), then
// striped as DATA frames over all streams and received straight into the receive buffer. Two
// kinds of larger messages skip that round trip, which on a loaded network costs a queueing
// delay per message: those the receiver said with a READY hint it has a receive posted for (up
// to LOOM_READY_BYTES), and those of collectives (tags with pushTagBit, up to LOOM_PUSH_BYTES),
// whose receivers post their receives within a pipeline step. They go at once, whole on stream 0
// when one socket would carry them anyway, else striped (PUSH then DATA on every stream); a
// receive not posted yet costs a copy through the unexpected queue, never correctness. Matching is per
// tag in arrival order on stream 0, which is send order. Receives that arrive before they are
// posted are kept ("unexpected": an eager payload is buffered, an RTS only remembered).
// A receive with a consumer (core/receive_consumer.hpp) that matches its message as it arrives
// gets the payload through the stream's read buffer instead, a run at a time, each handed to the
// consumer unlocked while still in cache; slices start at multiples of 64 bytes, so every run is
// whole elements.
//
// Threads: isend/irecv run on the caller's thread and may write to a socket directly (a send on
// an idle socket then costs no thread hand-off). A thread waiting on one of this connection's
// requests calls progress(), which reads and writes from that thread; otherwise the communicator's
// receive engine thread reads and its send engine thread finishes writes.
//
// The receive engine stays off a connection while nothing needs it ("quiet engine"): its
// registration is one-shot and is re-armed only while a request posted outside an attended
// operation is pending (a user's isend/irecv left to complete in the background), or while a
// thread of this rank sleeps in a wait (ProgressEngine::waiting resumes every connection).
// Requests posted inside an attended operation (a collective, a blocking send or receive:
// detail::AttendScope) are driven by the thread that will wait on them, which polls their
// connection, and its other connections in turn, so that a back-to-back run of collectives costs
// no epoll_ctl and no engine wake-up per message. A waiter that gives up spinning goes to sleep
// only after arming the engines. One mutex, mu_, guards all state, but it is never held across a
// data syscall: a stream's reader (the receive thread) and its one active writer (flag `writing`)
// copy bytes unlocked, so both directions and the caller's reductions proceed in parallel. While
// a stream is being read or written unlocked, a failure leaves that stream's in-flight operation
// alone; the reader or writer fails it when it relocks, so a buffer is never released to the user
// while the kernel still copies into it. Requests are completed with mu_ held (Request never calls back into the
// connection).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "net/socket.hpp"
#include "transport/matched_connection.hpp"
#include "transport/matching.hpp"
#include "transport/tcp/buffer_pool.hpp"
#include "transport/tcp/frame.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace tcp {

struct TcpOptions {
  size_t eagerBytes = 64 * 1024;            ///< largest message sent without RTS/CTS
  size_t readyBytes = 64u << 20;            ///< largest message sent at once on a receiver's READY hint (0: no hints)
  size_t stripeMinBytes = 256 * 1024;       ///< a slice per stream is at least this big
  int readsPerEvent = 64;                   ///< recv calls per readable event before yielding to other sockets
  uint32_t pushTagBit = kCollectiveTagBit;  ///< tags with this bit (collectives') may be sent at once ...
  size_t pushBytes = 1024 * 1024;           ///< ... up to this size (0: never)
  bool quickAck = true;                     ///< acknowledge bulk reads at once (see read())
  size_t lowWater = 256 * 1024;             ///< wake the reader of a long payload per this many bytes (0: per packet)
  bool consume = true;                      ///< hand receives' bytes to their consumers as they are read
};

class TcpConnection : public MatchedConnection<TcpConnection> {
 public:
  /// Takes the connected, authenticated sockets (index = stream). The engines and `failure`
  /// outlive it: `recvEngine` reads, `sendEngine` finishes writes.
  /// While any thread of this rank sleeps in a wait (recvEngine->waitersAsleep()), the receive
  /// engine reads every connection.
  TcpConnection(int rank, int peer, std::vector<Socket> sockets, ProgressEngine* recvEngine, ProgressEngine* sendEngine,
                std::shared_ptr<FailureState> failure, TcpOptions options, std::string description,
                std::function<std::string(int, std::chrono::milliseconds)> lastWordOf = nullptr);
  ~TcpConnection() override;

  /// Registers the sockets with the engines, and the connection as a source of the receive engine
  /// (unless it is driven through another source: ProgressSource::drivenThrough).
  void start();

  int peer() const override { return peer_; }
  void isend(const RequestPtr& req, const SendSpec& spec) noexcept override;
  void failAll(const Status& status) noexcept override;
  std::string describe() const override { return description_; }
  bool progress() noexcept override;
  /// Requests posted outside an attended operation are pending (only the engine completes them).
  bool needsEngine() const noexcept override;
  /// The engine takes over: re-arms the reads it is needed for (every stream when a thread of this
  /// rank is going to sleep) and the writes a poller left.
  void resume(bool sleeper) noexcept override;

 private:
  struct SendOp {
    RequestPtr req;
    const uint8_t* buf = nullptr;
    size_t bytes = 0;
    uint32_t tag = 0;
    uint64_t signature = 0;  // SendSpec::signature
    uint64_t seq = 0;
    int framesLeft = 0;
  };
  struct Unexpected;
  struct RecvOp : PostedRecv {
    size_t received = 0;
    std::shared_ptr<ReceiveConsumer> consumer;  // RecvSpec::consumer
    uint64_t seq = 0;                           // the sender's sequence number, once an RTS or PUSH matched
    std::shared_ptr<Unexpected> ux;             // a PUSH nobody had posted for: fills ux->data
  };
  /// Bytes of an unexpected message, from the connection's pool (buffer_pool.hpp).
  using Buffer = BufferPool::Buffer;
  struct Unexpected {
    FrameHeader hdr;
    Buffer data;  // eager or pushed payload
    bool complete = false;
    std::shared_ptr<RecvOp> claimedBy;
  };
  struct OutFrame {
    uint8_t hdr[kHeaderBytes];
    const uint8_t* payload = nullptr;
    size_t payloadLen = 0;
    size_t sent = 0;
    std::shared_ptr<SendOp> op;  // completed when its last frame is written
  };
  struct ReadyHint {
    uint64_t fromSeq = 0;  // the receiver had received messages up to here when it posted
    uint64_t ahead = 0;    // receives on the tag posted before it and not yet matched
    uint64_t capacity = 0;
  };
  enum class Sink { None, Direct, Discard, Unexpected, Data, Bye };
  struct Stream;
  class ReadHandler;
  class WriteHandler;

  void onReadable(int stream) noexcept;
  void onWritable(int stream) noexcept;
  Status read(Stream& s, std::unique_lock<std::mutex>& lock);
  Status readSome(Stream& s, std::unique_lock<std::mutex>& lock);
  /// What one step of readSome came to: go on, read from the socket (nothing usable is
  /// buffered), or return its status.
  enum class ReadStep { More, Empty, Stop };
  /// Parses a header or hands on payload bytes already buffered on `s`.
  ReadStep takeBufferedLocked(Stream& s, std::unique_lock<std::mutex>& lock, Status* st);
  /// `n` bytes of the payload being read reached their place; finishes the payload at its end.
  ReadStep payloadMovedLocked(Stream& s, size_t n, Status* st);
  /// One recv from the socket, unlocked: into the destination itself or the staging buffer;
  /// *drained when it came back short.
  ReadStep readSocketLocked(Stream& s, std::unique_lock<std::mutex>& lock, bool* drained, Status* st);
  /// Sets the stream's SO_RCVLOWAT for what it reads next: options_.lowWater while a payload
  /// longer than that is being read into its destination, else 1 (never more than will come).
  void setLowWaterLocked(Stream& s);
  /// Writes queued frames until the queue is empty, the socket is full, or `budget` bytes went
  /// out; then arms the send engine if anything is left. Returns at once if another thread is
  /// writing this stream (that writer picks the new frames up).
  Status flush(Stream& s, std::unique_lock<std::mutex>& lock, size_t budget);
  void armLocked(Stream& s, bool want);
  /// Arms the receive engine's one-shot read event on `s` unless it is armed already.
  void armReadLocked(Stream& s);
  /// Whether the receive engine must watch this connection: a thread sleeps in a wait, or a
  /// request posted outside an attended operation is pending (drops finished ones).
  bool engineNeededLocked();
  /// Re-arms the streams' reads if the engine is needed (and nobody polls).
  void rearmIfNeededLocked();
  /// Remembers `req` when it is posted outside an attended operation (and arms the engine).
  void noteUnattendedLocked(const RequestPtr& req);
  /// A frame's header was read on `s`: checks it and hands it to its type's handler below.
  Status onHeaderLocked(Stream& s, const FrameHeader& h);
  /// Checks a message's sequence number and counts it.
  Status nextMessageLocked(const FrameHeader& h);
  Status onPushLocked(const FrameHeader& h);
  /// An EAGER (its payload follows) or an RTS.
  Status onMessageLocked(Stream& s, const FrameHeader& h);
  Status onCtsLocked(const FrameHeader& h);
  Status onByeLocked(Stream& s, const FrameHeader& h);
  Status onReadyLocked(const FrameHeader& h);
  /// A slice of an accepted message; `control`: read on the control stream.
  Status onDataLocked(Stream& s, const FrameHeader& h, bool control);
  Status finishPayloadLocked(Stream& s);
  /// The consumer `op`'s payload goes to, if the receive has one and took its message as it
  /// arrived; null when the bytes go to its buffer as usual.
  ReceiveConsumer* consumerOf(const RecvOp& op) const;
  /// Answers an RTS; a refusal for another call's message carries this rank's signature.
  void sendCtsLocked(uint64_t seq, bool accept, uint64_t refusedFor = 0);
  void enqueueLocked(Stream& s, const FrameHeader& h, const uint8_t* payload, size_t len, std::shared_ptr<SendOp> op);
  void onSentLocked(OutFrame& f);
  /// Whether a READY hint says the receive that will match this send (tag, bytes, the next
  /// sequence number) is posted; drops hints found stale on the way.
  bool takeReadyHintLocked(uint32_t tag, size_t bytes);
  /// Streams an accepted message of `bytes` is striped over (a slice is at least stripeMinBytes).
  size_t stripesFor(size_t bytes) const {
    return std::min(streams_.size(), std::max<size_t>(1, bytes / options_.stripeMinBytes));
  }
  /// How many of the recent sends on `tag` have sequence numbers >= from; SIZE_MAX when the
  /// record of recent sends does not reach back that far.
  size_t sendsOnTagSinceLocked(uint32_t tag, uint64_t from) const;
  void deliverUnexpectedLocked(Unexpected& u, RecvOp& op);
  // The receive side every matched link shares (matched_connection.hpp).
  friend class MatchedConnection<TcpConnection>;
  std::mutex& receiveMutex() { return mu_; }
  std::shared_ptr<RecvOp> makeRecv(const RequestPtr& req, const RecvSpec& spec) const;
  void irecvLocked(const RequestPtr& req, const RecvSpec& spec, std::unique_lock<std::mutex>& lock);
  /// Queues the DATA frames of `op` over its stripes (after a CTS, or right behind a PUSH).
  void enqueueDataLocked(const std::shared_ptr<SendOp>& op);
  /// Takes a PUSH header: its DATA goes to the matching receive, or to an unexpected buffer.
  void acceptPushLocked(const FrameHeader& h);
  /// Parses what streams held back (DATA that overtook its PUSH) now that stream 0 moved on.
  Status drainBlockedLocked(std::unique_lock<std::mutex>& lock);
  void acceptRtsLocked(const FrameHeader& h, const std::shared_ptr<RecvOp>& op);
  bool hasPendingLocked() const;
  bool anyWritingLocked() const;
  /// An error once every stream has seen the peer's end of file (deferred while a write is in flight).
  Status closedByPeerLocked();
  /// Fails all pending requests (but those a reader or writer holds unlocked) and closes the
  /// sockets; nothing once closed.
  void failLocked(const Status& status);
  /// Tells the peer why this side goes (a BYE frame: `failed`, or destroyed cleanly), when stream 0
  /// is between frames; best effort.
  void sayByeLocked(const Status& status, bool failed);
  /// Fails `req`, an operation on a closed link, with the reason it closed (asking the store for
  /// the peer's word first if the link ended without one while nothing was pending).
  void failClosedLocked(const RequestPtr& req, std::unique_lock<std::mutex>& lock);
  /// Asks the store for the peer's last word (lastWordOf_, bounded), unlocked, with
  /// askingLastWord_ set meanwhile; "" when the peer left none.
  std::string askLastWord(std::unique_lock<std::mutex>& lock);
  /// "rank P left the communicator: why".
  Status leftStatus(const std::string& why) const;
  void abandonReadLocked(Stream& s);
  void abandonWritesLocked(Stream& s);
  /// Runs after a failure found on a stream: fails the connection, then the communicator.
  void failFrom(const Status& st, std::unique_lock<std::mutex>& lock);
  Status malformed(const std::string& why) const;

  const int rank_;
  const int peer_;
  ProgressEngine* const recvEngine_;  // both outlive this: the communicator stops them first
  ProgressEngine* const sendEngine_;
  const std::shared_ptr<FailureState> failure_;
  /// TransportContext::lastWordOf (may be empty).
  const std::function<std::string(int, std::chrono::milliseconds)> lastWordOf_;
  bool askingLastWord_ = false;        ///< a thread is asking for the peer's word (unlocked)
  bool wordUnasked_ = false;           ///< the link ended without a word, with nothing pending: not asked yet
  std::condition_variable wordAsked_;  ///< askingLastWord_ went false
  const TcpOptions options_;
  const std::string description_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_;
  TagMatcher<std::shared_ptr<RecvOp>, std::shared_ptr<Unexpected>> matcher_;
  std::map<uint64_t, std::shared_ptr<SendOp>> awaitingCts_;
  std::map<uint64_t, std::shared_ptr<RecvOp>> incoming_;
  std::map<uint32_t, std::deque<ReadyHint>> readyHints_;   // READY hints from the peer, by tag
  std::deque<std::pair<uint64_t, uint32_t>> recentSends_;  // (seq, tag) of the last sends, for the hints
  uint64_t nextSendSeq_ = 0;
  uint64_t nextRecvSeq_ = 0;
  bool closed_ = false;
  Status closedStatus_;
  std::optional<Status> peerClosed_;    // every stream saw EOF while a write was in flight
  uint64_t moved_ = 0;                  // bytes read and written, so that poll() can tell progress
  bool byeFailed_ = false;              // the peer's BYE said its communicator failed
  std::string byeReason_;               // a clean BYE's word, kept for when its streams end
  std::vector<RequestPtr> unattended_;  // pending requests posted outside an attended operation
  BufferPool pool_;                     // spare buffers for unexpected messages
};

}  // namespace tcp
}  // namespace loom
