// IbConnection: the link to one peer over InfiniBand or RoCE, through RC queue pairs
// (queue_pair.hpp) of the rank's opened port.
//
// Protocol. Every message starts as a SEND on queue pair 0 into one of the receive slots the peer
// keeps posted (registered buffers of LOOM_IB slot size): a message up to the eager limit goes
// whole in it (EAGER: header and payload, copied once on each side; inline in the work request,
// with no read of memory by the adapter, where it fits the queue pair's inline limit, at most
// kInlineBytes with its header); a larger one is announced
// (RTS). Once a matching receive is posted, the receiver registers its buffer (the transport's
// registration cache: a buffer used again is registered once) and answers CTS with the buffer's
// address and remote key and an id; the sender then RDMA-writes the payload straight from its own
// registered buffer into the receiver's, in chunks striped over the connection's queue pairs,
// each with the id as immediate data, so that the receiver counts the bytes that landed and
// completes the receive when all have; no payload byte is copied on either side. A receive that
// refuses an announced message (another call's signature, too small) answers NACK, and the send
// fails with the same reason. Matching is per tag in arrival order (the shared TagMatcher).
//
// Device buffers (where both ranks have GPUDirect RDMA: gpu_direct.hpp) take the same path, their
// allocations registered with the adapter instead of host pages; a message from a device buffer is
// always announced, whatever its size, so that no CPU copy reads device memory. An eager message
// that meets a receive into device memory (its sender used host memory) is copied in by the device
// runtime.
//
// Flow control. A SEND, or an RDMA write with immediate data, consumes a posted receive of the
// queue pair it arrives on: a sender spends a credit per queue pair for each and never goes
// below zero, so the adapter never meets a receiver that is not ready. The receiver reposts each
// slot as soon as it has taken what it holds, and returns the credits in the header of every
// message it sends, or in a CREDIT message (ahead of anything queued) once half its slots wait to
// be announced; the last credit of queue pair 0 is kept for that message, so two sides that both
// ran out always can.
//
// Closing: a rank that closes a link (its communicator destroyed, aborted or failed) lets what it
// sent reach the peer (briefly), stops its queue pairs, fails what it has pending, and sends BYE
// with its reason over the link's side channel (side_channel.hpp), which works when the queue pairs
// do not; the peer takes what its completion queue still holds, then fails what it has pending with
// the link with "rank N left the communicator: <reason>" (and the communicator, if anything was
// pending), as over TCP. A side channel that ends without a BYE means the peer's process ended:
// that is said at once, where the queue pair would say it only when its retries ran out. The
// adapter's asynchronous events about the link (a queue pair or its completion queue in error, the
// port down: ib_transport.cc) fail it too, naming the peer.
//
// Threads: isend/irecv post from the caller's thread; completions are taken by whichever thread
// calls progress() (a waiter, or the receive engine woken through the completion channel of the
// transport). One mutex guards everything; no verbs call blocks.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "net/socket.hpp"
#include "transport/ib/gpu_direct.hpp"
#include "transport/ib/queue_pair.hpp"
#include "transport/matched_connection.hpp"
#include "transport/matching.hpp"
#include "transport/registration_cache.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace ib {

/// Queue pairs a connection may stripe over (its messages' headers carry a credit per pair).
constexpr int kMaxQps = 16;

struct IbOptions {
  /// A receive slot: a header and an eager payload of 64 KiB, the eager limit of every transport
  /// (a send that small completes before its receive is posted).
  size_t slotBytes = (64 << 10) + 128;
  int slots = 16;               ///< receives kept posted per queue pair (a sender's credits)
  int sendSlots = 16;           ///< staging slots for outgoing messages
  size_t chunkBytes = 1 << 20;  ///< one RDMA write of a large message
  int qps = 1;                  ///< queue pairs (LOOM_IB_QPS_PER_CONNECTION)
};

class IbConnection : public MatchedConnection<IbConnection> {
 public:
  /// Creates the queue pairs (in INIT, receives posted) and their completion queue, whose events
  /// go to `channel` (the transport's; cq_context is this connection). `cache` registers large
  /// buffers; both outlive this. Throws Error naming the peer.
  IbConnection(int rank, int peer, const PortContext& pc, ibv_comp_channel* channel, RegistrationCache& cache,
               std::shared_ptr<FailureState> failure, IbOptions options, std::string description);
  ~IbConnection() override;

  /// The queue pairs' addresses, for the peer's connect().
  std::string addresses() const;
  /// Connects the queue pairs to the peer's (its addresses()). Throws Error naming the peer.
  void connect(const std::string& remote);
  /// After an event on the transport's completion channel for this connection's queue: re-arms
  /// it and moves what is there. Engine thread.
  void onCompletionEvent() noexcept;
  /// Watches the link's side channel to the peer (side_channel.hpp) from `engine`; `lastWordOf`
  /// asks the store for what a peer that ended without a BYE left there (may be empty).
  void watchSide(Socket side, ProgressEngine* engine,
                 std::function<std::string(int, std::chrono::milliseconds)> lastWordOf);
  /// The adapter reported `what` (a phrase: "port 1 of mlx5_0 went down (port error)") about one
  /// of this link's queue pairs, its completion queue or its port: the link fails (and the
  /// communicator with it). Engine thread.
  void onAdapterEvent(const std::string& what) noexcept;
  /// Where the transport tells what the adapter said about this link so far ("" if nothing): a
  /// link whose work was flushed, or whose posting was refused, asks it for the cause.
  void setAdapterReason(std::function<std::string()> reason) { adapterReason_ = std::move(reason); }
  /// Lets isend and irecv take device buffers, registered through `regs` (which outlives this):
  /// both ranks have GPUDirect RDMA. Called before the link carries anything.
  void takeDeviceBuffers(DeviceRegistrations* regs) { deviceRegs_ = regs; }
  bool takesDeviceBuffers() const override { return deviceRegs_ != nullptr; }
  /// Whether `qp` is one of this link's queue pairs; `cq` its completion queue.
  bool owns(const ibv_qp* qp) const;
  bool owns(const ibv_cq* cq) const { return cq == cq_; }

  int peer() const override { return peer_; }
  void isend(const RequestPtr& req, const SendSpec& spec) noexcept override;
  void quiesce(const Status& why) noexcept override;
  void failAll(const Status& status) noexcept override;
  std::string describe() const override { return description_; }
  bool progress() noexcept override;

  size_t eagerBytes() const { return eagerLimit(options_); }
  /// The largest message that goes whole in a slot.
  static size_t eagerLimit(const IbOptions& o);

 private:
  struct Header;
  struct SendOp;
  struct RecvOp;
  struct Unexpected;
  struct Outgoing;
  struct Write;

  // The side channel's reader, in the receive engine.
  class SideWatch : public PollHandler {
   public:
    explicit SideWatch(IbConnection& c) : c_(c) {}
    void onPollEvents(uint32_t events) noexcept override { c_.onSideEvents(events); }

   private:
    IbConnection& c_;
  };

  // The receive side every matched link shares (matched_connection.hpp).
  friend class MatchedConnection<IbConnection>;
  std::mutex& receiveMutex() { return mu_; }
  std::shared_ptr<RecvOp> makeRecv(const RequestPtr& req, const RecvSpec& spec) const;
  void irecvLocked(const RequestPtr& req, const RecvSpec& spec, std::unique_lock<std::mutex>& lock);
  /// Whether `p` is device memory this link moves in place.
  bool onDevice(const void* p) const;
  /// A registration of [p, p + bytes): of device memory (`device`) or of host memory.
  Registration acquire(const void* p, size_t bytes, bool device, Status* error);
  /// Copies an eager payload into device memory, through the device runtime.
  Status copyToDevice(void* dst, const void* src, size_t bytes) noexcept;
  /// The constructor's work: the completion queue, the queue pairs, the slots. Throws.
  void build(ibv_comp_channel* channel);
  /// Frees what build() made (also after it threw halfway).
  void release() noexcept;
  bool pollLocked() noexcept;
  /// Whether an operation waits on the peer (then its leaving fails the communicator).
  bool pendingLocked() const;
  void onSideEvents(uint32_t events) noexcept;
  /// The side channel ended: with the peer's BYE (`why`) or without a word (null).
  void sideEnded(const std::string* why) noexcept;
  /// Tells the peer over the side channel why this link closes, once (best effort, no wait).
  void sayOnSideLocked(const std::string& why) noexcept;
  Status leftStatus(const std::string& why) const;
  void completionLocked(const ibv_wc& wc) noexcept;
  void receivedLocked(int qp, int slot, const ibv_wc& wc) noexcept;
  void messageLocked(const Header& h, const uint8_t* payload) noexcept;
  void deliverEagerLocked(const std::shared_ptr<RecvOp>& op, const Header& h, const uint8_t* payload) noexcept;
  void startLargeLocked(const std::shared_ptr<RecvOp>& op, const Header& h) noexcept;
  void ctsLocked(const Header& h) noexcept;
  void nackLocked(const Header& h) noexcept;
  void queueLocked(Outgoing o) noexcept;
  void pumpLocked() noexcept;
  void repostLocked(int qp, int slot) noexcept;
  void returnCreditsLocked() noexcept;
  /// Closes the link and fails what is pending. A failure of the link itself (`ofLink`) is also
  /// the communicator's: recorded now, its hook (which stops every other link) run by unlock(),
  /// and this link's requests failed after it.
  void failLocked(const Status& s, bool ofLink = true) noexcept;
  /// Closes the link: the queue pairs stop (no byte moves from now on), the peer is told why.
  void stopLocked(const Status& s) noexcept;
  /// Fails every pending request with `s`.
  void failRequestsLocked(const Status& s) noexcept;
  /// Before the link closes in order (failAll, destruction): what this rank sent, which its
  /// senders count as gone (an eager message is complete once copied), reaches the peer first, or
  /// a BYE over the side channel could overtake it and the queue pair's end flush it. Briefly.
  void finishSendsLocked(std::unique_lock<std::mutex>& lock) noexcept;
  bool sendsInFlightLocked() const;
  /// Lets go of the lock, then runs the failure hook a failure of the link left to run.
  void unlock(std::unique_lock<std::mutex>& lock) noexcept;
  /// "ib: <what> on the link to rank N failed: <why><hint>".
  Status linkError(const char* what, const std::string& why, const char* hint = "") const;
  /// A work completion's error, with what it says of the peer.
  Status completionError(const char* what, ibv_wc_status status) const;
  /// The link failed for what the adapter said (`what`, a phrase).
  Status adapterStatus(const std::string& what) const;
  /// Posting on queue pair `qp` was refused with `err`: said as the adapter's doing where it put
  /// the queue pair in error (its asynchronous event may not have been read yet).
  Status postError(int qp, const char* what, int err) const;
  /// The link failed because the adapter put one of its queue pairs in error (`detail`: how
  /// this rank saw it), with the adapter's reason where it gave one.
  Status inErrorStatus(const std::string& detail) const;

  const int rank_, peer_;
  const PortContext& pc_;
  RegistrationCache& cache_;
  DeviceRegistrations* deviceRegs_ = nullptr;
  void* copyStream_ = nullptr;  // copyToDevice's stream, made at its first use
  const std::shared_ptr<FailureState> failure_;
  const IbOptions options_;
  const std::string description_;

  std::mutex mu_;
  bool closed_ = false;
  bool connected_ = false;  // the queue pairs reached RTS
  bool closing_ = false;    // finishSendsLocked: nothing delivered, no announced send started
  bool creditQueued_ = false;
  Status closedStatus_;
  std::optional<Status> hookPending_;
  ibv_cq* cq_ = nullptr;
  std::vector<std::unique_ptr<QueuePair>> qps_;
  uint8_t* recvArea_ = nullptr;  // qps * slots receive slots
  uint8_t* sendArea_ = nullptr;  // sendSlots staging slots
  ibv_mr* recvMr_ = nullptr;
  ibv_mr* sendMr_ = nullptr;
  std::vector<int> freeSendSlots_;
  int credits_[kMaxQps] = {};   // receives the peer has posted for us, per queue pair
  int toReturn_[kMaxQps] = {};  // receives we reposted and have not announced
  int sendWrLeft_[kMaxQps] = {};
  std::deque<std::unique_ptr<Outgoing>> outq_;
  std::deque<Write> writes_;
  std::map<uint64_t, std::shared_ptr<SendOp>> awaitingCts_;  // by sequence number
  std::map<uint64_t, std::shared_ptr<SendOp>> writing_;      // by sequence number
  std::map<uint32_t, std::shared_ptr<RecvOp>> incoming_;     // by id: CTS sent, writes awaited
  TagMatcher<std::shared_ptr<RecvOp>, std::shared_ptr<Unexpected>> matcher_;
  // The side channel (engine thread, but for the BYE said on it under mu_).
  Socket side_;
  ProgressEngine* sideEngine_ = nullptr;
  std::unique_ptr<SideWatch> sideWatch_;
  std::vector<uint8_t> sideIn_;
  bool sideSaid_ = false;
  bool sideDone_ = false;
  std::function<std::string(int, std::chrono::milliseconds)> lastWordOf_;
  std::function<std::string()> adapterReason_;
  uint64_t nextSeq_ = 1;
  uint32_t nextId_ = 1;
  unsigned nextQp_ = 0;
};

}  // namespace ib
}  // namespace loom
