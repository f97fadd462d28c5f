// ShmConnection: the link to one peer on the same node through shared memory.
//
// Two rings: "in" (peer -> this rank) lives in this rank's segment, "out" (this rank -> peer) in
// the peer's (segment.hpp). Messages up to the eager limit are copied through the ring (two
// copies, no round trip); larger ones are announced (RTS, carrying the sender's buffer address)
// and the receiver reads them straight from the sender's memory with process_vm_readv once a
// matching receive is posted (one copy), then answers DONE. Where cross-memory attach is refused,
// the receiver answers CTS instead and the sender streams the payload through the ring into the
// receive buffer. Matching is per tag in arrival order, which is send order.
//
// Threads: isend/irecv run on the caller's thread and copy into the ring at once when it has room
// (no hand-off). A thread waiting on one of this connection's requests calls poll(), which reads
// and writes from that thread; otherwise the progress engine polling it (shm_transport.hpp) does,
// woken through the segments' doorbells. inMu_ guards the receive side (the in-ring's reader, posted and
// unexpected receives), outMu_ the send side (the out-ring's writer, queued frames, sends
// awaiting an answer); lock order inMu_ then outMu_. Ring copies are bounded pieces done under
// the lock; a process_vm_readv runs unlocked, its receive held aside so that a failure meanwhile
// leaves its buffer alone until the read returns. Requests are completed with a lock held.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "transport/matched_connection.hpp"
#include "transport/matching.hpp"
#include "transport/shm/ring.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace shm {

struct ShmOptions {
  size_t eagerBytes = 64 * 1024;  ///< largest message copied through the ring unasked
  bool cma = true;                ///< cross-memory attach allowed (probed) for this pair
};

class ShmConnection : public MatchedConnection<ShmConnection> {
 public:
  /// `mine` is this rank's segment header, `theirs` the peer's (both mapped by the transport,
  /// which outlives the connection). `peerPid` is the peer's pid as seen from this process.
  ShmConnection(int rank, int peer, RingView in, RingView out, SegmentHeader* mine, SegmentHeader* theirs,
                pid_t peerPid, std::shared_ptr<FailureState> failure, ShmOptions options, std::string description);

  int peer() const override { return peer_; }
  void isend(const RequestPtr& req, const SendSpec& spec) noexcept override;
  void failAll(const Status& status) noexcept override;
  std::string describe() const override { return description_; }
  /// Moves whatever can move now from this thread (never blocks on another thread's copy);
  /// returns whether anything moved. For the engine and for waiters.
  bool progress() noexcept override;
  /// Fails everything pending if the peer's process is gone (its liveness mutex says so) and its
  /// ring holds nothing more to read. For the engine, now and then.
  void checkPeer() noexcept;
  /// Whether anything waits to be moved: unread bytes in the in-ring, queued frames, reads to do.
  bool hasWork() const noexcept override;
  /// Whether the engine should look again before sleeping: work it can do now that no waiting
  /// thread is doing (a full ring does not count: the consumer rings when it frees room).
  bool needsEngine() const noexcept override;
  void maintain() noexcept override { checkPeer(); }

 private:
  struct SendOp {
    RequestPtr req;
    const uint8_t* buf = nullptr;
    size_t bytes = 0;
    uint32_t tag = 0;
    uint64_t signature = 0;  // SendSpec::signature
  };
  struct RecvOp : PostedRecv {
    uint64_t seq = 0;     // the sender's sequence number (large messages)
    uint64_t remote = 0;  // the sender's buffer (large messages)
  };
  struct Unexpected {
    Frame frame;                // EAGER or RTS
    std::vector<uint8_t> data;  // EAGER payload: its first frame.bytes bytes (a recycled buffer may be longer)
    bool complete = false;
    std::shared_ptr<RecvOp> claimedBy;  // a receive posted while the payload was still arriving
  };
  struct Out {
    Frame frame;
    const uint8_t* payload = nullptr;
    size_t len = 0;
    size_t written = 0;          // header and payload bytes in the ring so far
    std::shared_ptr<SendOp> op;  // completed once the whole frame is in the ring
  };
  enum class Sink { None, Direct, Unexpected, Discard };

  bool readLocked(std::unique_lock<std::mutex>& in);
  /// A frame came in: hands it to its kind's handler below.
  Status onFrameLocked(const Frame& f);
  /// An EAGER (its payload follows in the ring) or an RTS (the sender's buffer, for a read).
  Status onMessageLocked(const Frame& f);
  /// Keeps a message no receive was posted for.
  void keepLocked(const Frame& f);
  /// An accepted message's payload follows in the ring.
  Status onDataLocked(const Frame& f);
  /// The receiver's answer to an RTS: DONE (it read the buffer), CTS (send it) or NACK.
  Status onAnswerLocked(const Frame& f);
  /// The payload of `f` that follows in the ring goes to `sink`.
  void readPayloadLocked(const Frame& f, Sink sink);
  void finishPayloadLocked();
  /// Starts the transfer of a matched large message: a direct read, or CTS where that is refused.
  void startLargeLocked(const std::shared_ptr<RecvOp>& op);
  // The receive side every matched link shares (matched_connection.hpp).
  friend class MatchedConnection<ShmConnection>;
  std::mutex& receiveMutex() { return inMu_; }
  std::shared_ptr<RecvOp> makeRecv(const RequestPtr& req, const RecvSpec& spec) const {
    return postedRecv<RecvOp>(req, spec);
  }
  void irecvLocked(const RequestPtr& req, const RecvSpec& spec, std::unique_lock<std::mutex>& in);
  /// Runs one queued direct read (unlocking `in` meanwhile); returns whether one ran.
  bool runCmaLocked(std::unique_lock<std::mutex>& in);
  /// A control frame; a NACK for another call's message carries this rank's signature.
  void sendControl(FrameType type, uint64_t seq, uint64_t sig = 0);
  void enqueueLocked(Out out);
  bool flushLocked();
  void wakePeerLocked(bool urgent);
  void failFrom(const Status& st) noexcept;
  /// Fails every pending request and closes the link; `record`: also leave the reason in this
  /// rank's segment for the peers (a communicator failure, not one link closing).
  bool failLocked(const Status& st, bool record);
  /// Whether a request of this link is still in flight (both locks held).
  bool hasPendingLocked() const;
  Status malformed(const std::string& why) const;
  void updateBacklogLocked();
  std::vector<uint8_t> bufferLocked(size_t bytes);
  void recycleLocked(std::vector<uint8_t>&& v);

  const int rank_;
  const int peer_;
  RingView in_;
  RingView out_;
  SegmentHeader* const mine_;  // valid while the transport lives, which outlives us
  SegmentHeader* const theirs_;
  const pid_t peerPid_;
  const std::shared_ptr<FailureState> failure_;
  const ShmOptions options_;
  const std::string description_;
  std::atomic<bool> cma_;

  // Receive side (inMu_).
  mutable std::mutex inMu_;
  TagMatcher<std::shared_ptr<RecvOp>, std::shared_ptr<Unexpected>> matcher_;
  std::map<uint64_t, std::shared_ptr<RecvOp>> incoming_;  // CTS sent, DATA awaited
  std::deque<std::shared_ptr<RecvOp>> cmaJobs_;
  bool cmaBusy_ = false;
  std::deque<std::vector<uint8_t>> spare_;  // buffers of consumed unexpected messages, for reuse
  Frame cur_;                               // the frame whose payload is being read
  Sink sink_ = Sink::None;
  std::shared_ptr<RecvOp> sinkOp_;
  std::shared_ptr<Unexpected> sinkUnexpected_;
  size_t payloadDone_ = 0;

  // Send side (outMu_).
  mutable std::mutex outMu_;
  std::deque<Out> outq_;
  std::map<uint64_t, std::shared_ptr<SendOp>> awaiting_;  // RTS sent, DONE/CTS/NACK awaited
  uint64_t nextSendSeq_ = 0;

  // Both (written with both locks held, read with either).
  bool closed_ = false;
  Status closedStatus_;
  std::atomic<int> outBacklog_{0};  // queued frames (outMu_ writes)
  std::atomic<int> cmaBacklog_{0};  // direct reads to run (inMu_ writes)
};

}  // namespace shm
}  // namespace loom
