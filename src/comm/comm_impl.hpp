// CommImpl: the communicator behind loom::Communicator and loomComm_t.
//
// Owns, in destruction order: the op queue (stopped first), the link table (transport/link_table.hpp:
// the connections, their transports and the progress engines, stopped before the links go), the
// diagnostics (comm/diagnostics.hpp), the store and, on the rank that hosts it, a reference
// keeping the store server up.
//
// Threads: isend/irecv and the collective entry points may be called from any thread. abort()
// from any thread. Collectives run in call order on the OpQueue.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/rendezvous.hpp"
#include "collectives/comm_view.hpp"
#include "comm/diagnostics.hpp"
#include "comm/meeting.hpp"
#include "comm/op_queue.hpp"
#include "core/function_ref.hpp"
#include "core/progress_engine.hpp"
#include "core/request.hpp"
#include "loom/loom.hpp"
#include "transport/arena.hpp"
#include "transport/cuda_ipc/ipc_mem_cache.hpp"
#include "transport/link_table.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace device {
class DeviceRuntime;
}  // namespace device
namespace coll {
class Selector;
}  // namespace coll
namespace detail {

class DeviceState;

using coll::collectiveTag;  // the collectives' tag space (collectives/comm_view.hpp)
using coll::kMaxChannels;

/// The deadline of every wait (Options::timeout, else LOOM_TIMEOUT) and of joining
/// (Options::initTimeout, else LOOM_INIT_TIMEOUT): both settings are declared in comm_impl.cc.
std::chrono::milliseconds opTimeoutOf(const Options& o);
std::chrono::milliseconds initTimeoutOf(const Options& o);

/// What the cost model knows about this communicator's links, when measured (LOOM_TUNE).
struct LinkModel {
  double latencyUs = 0;  ///< one-way, per message
  double gbps = 0;       ///< GB/s one way
};

class CommImpl : public Progressable, public coll::CommView {
 public:
  /// Joins the communicator: blocks until every rank has joined and every link is up, or throws.
  /// The ranks meet through `meeting` (comm/meeting.hpp), or through the store when it is null.
  CommImpl(int rank, int size, StoreAccess access, const Options& options, const std::string& origin,
           Meeting* meeting = nullptr);
  ~CommImpl() override;
  CommImpl(const CommImpl&) = delete;
  CommImpl& operator=(const CommImpl&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  /// Reproducible mode (Options::reproducible, LOOM_REPRODUCIBLE).
  bool reproducible() const { return reproducible_; }

  // ---- User point-to-point (validates arguments; throws Error). ----
  RequestPtr isend(const void* buf, size_t count, DataType type, int peer, uint32_t tag);
  RequestPtr irecv(void* buf, size_t count, DataType type, int peer, uint32_t tag);

  // ---- Collectives. `body` runs on the op queue with the collective's sequence number. ----
  /// `sig` is the call's signature (core/signature.hpp) for the flight recorder, 0 for internal calls.
  /// `seqs` sequence numbers are reserved, seq to seq + seqs - 1, for a call that runs as several
  /// collectives (a device collective's staged chunks); the body runs the others with runRecorded.
  RequestPtr submit(const std::string& what, std::function<void(int64_t seq)> body, uint64_t sig = 0, int64_t seqs = 1);
  /// Queues `body` behind the collectives called before it, without a sequence number: for device
  /// point-to-point, which not every rank takes part in, so it must not number calls. The request
  /// completes with the bytes `body` returns; `body` may set what else it reports (its source).
  RequestPtr submitUnnumbered(const std::string& what, std::function<size_t(Request& done)> body);
  /// Runs a collective and waits for it: inline when the queue is idle (no allocation), else
  /// queued behind the calls in flight (`body` is then copied into the queue).
  template <typename Body>
  void run(const char* what, Body&& body, uint64_t sig = 0) {
    checkOk(what);
    if (runInlineIfIdle(FunctionRef<void(int64_t)>(body), sig)) return;
    submit(what, std::function<void(int64_t)>(std::forward<Body>(body)), sig)->wait();
  }
  void barrierBody(int64_t seq);
  /// Communicator::monitoredBarrier's body (comm/monitored_barrier.cc).
  void monitoredBarrierBody(int64_t seq, std::chrono::milliseconds timeout, bool waitAll);

  // ---- For algorithms: byte-level messages on the collective tag space. ----
  RequestPtr postSend(int peer, const void* buf, size_t bytes, uint32_t tag, const Label& label,
                      uint64_t sig = 0) override;
  /// `consumer` (may be null) takes the bytes as they land (core/receive_consumer.hpp).
  RequestPtr postRecv(int peer, void* buf, size_t bytes, uint32_t tag, const Label& label, uint64_t sig = 0,
                      std::shared_ptr<ReceiveConsumer> consumer = nullptr) override;

  /// Scratch memory for collectives, `slot` 0 to kScratchSlots-1. Only collectives use it, and they
  /// run one at a time on the op queue, so no lock is needed. Grows, never shrinks.
  static constexpr int kScratchSlots = 3;
  uint8_t* scratch(size_t bytes, int slot) override;

  // ---- Progress driven by waiting threads (Progressable). ----
  bool pollPeer(int peer) noexcept override;
  bool pollAnother(int peer) noexcept override;
  void beginPolling(int peer) noexcept override;
  void endPolling(int peer) noexcept override;
  void attend(bool on) noexcept override;
  /// What a thread attends while it runs a blocking operation of this communicator (AttendScope).
  const std::shared_ptr<ProgressHook>& progressHook() const { return progress_; }
  void waiting(bool on) noexcept override;
  void check() noexcept override { diag_.check(); }

  /// A local peer in collective `seq` under another signature, as an error (Diagnostics).
  Status localCallMismatch(int64_t seq, uint64_t sig) const override { return diag_.localCallMismatch(seq, sig); }

  // ---- Where the ranks are: flight recorder, dump requests, hang reports (comm/diagnostics.hpp). ----
  Diagnostics& diagnostics() { return diag_; }
  /// For a wait that timed out: the hang report of the collective this rank is in.
  std::string diagnose() noexcept override { return diag_.diagnose(); }
  void runQueued(const detail::Request* done) noexcept override;
  /// Runs collective `seq` and records in the flight recorder whether it finished or failed.
  void runRecorded(int64_t seq, FunctionRef<void(int64_t)> body);

  // ---- Which ranks share a node (can share memory; core/topology.hpp), learnt at join. ----
  const NodeMap& nodes() const override { return nodes_; }

  /// The name of the transport linking this rank to `peer` ("self" for this rank), for logs.
  const std::string& transportOf(int peer) const { return links_.transportOf(peer); }
  const LinkProperties& link(int peer) const override { return links_.properties(peer); }
  const LinkProperties& nodeLink() const override { return links_.nodeLink(); }
  std::string describeLink(int peer) { return links_.to(peer).describe(); }
  int linkCount() const { return links_.linkCount(); }
  /// Registers [addr, addr + bytes) with the transport linking this rank to `peer` (for this rank
  /// itself: the range without keys), for a zero-copy path to that peer; throws Error on failure.
  Registration registerMemory(int peer, const void* addr, size_t bytes) const;
  /// What the registration cache of the transport linking to `peer` did so far.
  RegistrationStats registrationStats(int peer) const {
    checkPeer(peer, "registrationStats");
    return links_.registrationStats(peer);
  }
  /// The node's shared arena (a transport's Services), or nullptr.
  const LocalArena* arena() const override { return links_.arena(); }
  /// Where peers' device memory is mapped (a transport's Services), or nullptr when no
  /// transport shares device memory with the node's peers.
  cuda_ipc::IpcMemCache* ipcCache() const { return links_.ipcCache(); }

  // ---- Cost model inputs measured at init (comm/tune.hpp); unset unless LOOM_TUNE. ----
  void setLink(const LinkModel& m) { link_ = m; }
  /// The collectives' algorithm selector, set once right after joining (comm/tune.cc).
  void setSelector(std::shared_ptr<const coll::Selector> s) { selector_ = std::move(s); }
  const coll::Selector* selector() const override { return selector_.get(); }
  const std::optional<LinkModel>& link() const { return link_; }

  // ---- Recovery. ----
  /// The survivors' rendezvous for Communicator::shrink: registers this rank, lets rank 0 decide
  /// who is in (those registered within `wait`), and returns this rank's place, the new size and
  /// the new communicator's store access. Throws when rank 0 or its store is gone, or this rank
  /// was left out.
  StoreAccess shrinkAccess(std::chrono::milliseconds wait, int* newRank, int* newSize);
  /// The store access of the sub-communicator of `color` made by this rank's next
  /// Communicator::split: its own namespace in this communicator's store, and an id every member
  /// derives alike from this communicator's, the split's number and the color (no message).
  StoreAccess splitAccess(int color);
  /// The store access of the group `name` of `ranks` (Communicator::group): a namespace of its
  /// own in this communicator's store, named after both, and an id derived from them.
  StoreAccess groupAccess(const std::vector<int>& ranks, const std::string& name);
  const Options& options() const { return options_; }

  /// The state of operations on device buffers (comm/device_state.hpp): made with `rt` on first
  /// use, then the same for the communicator's lifetime.
  std::shared_ptr<detail::DeviceState> deviceState(device::DeviceRuntime& rt);

  // ---- Errors and lifetime. ----
  void abort();
  /// Throws the failure that marked this communicator failed, if any: its code, peer and sequence
  /// number, and its message, after `call` ("all_reduce") where given, so that a call made after the
  /// failure (which a progress thread may have found between two calls) still says what it was.
  void checkOk(const char* call = nullptr) const;
  std::shared_ptr<FailureState> failureState() const override { return failure_; }
  /// Throws InvalidArgument unless peer names a rank.
  void checkPeer(int peer, const char* what) const;
  /// Throws InvalidArgument for an unknown type, a null buffer with count > 0 or an overflowing size.
  size_t checkBuffer(const void* buf, size_t count, DataType type, const char* what) const;

 private:
  /// run()'s fast path: runs `body` on this thread as the next call if the queue is idle.
  bool runInlineIfIdle(FunctionRef<void(int64_t)> body, uint64_t sig);
  void join(const Options& options, int sockets, const Deadline& deadline, const std::string& origin, Meeting& meeting);
  void failEverything(const Status& status);
  /// Reads every rank's host identity from the records swapped and groups the ranks by node.
  void mapNodes(const JoinStore& store);

  const int rank_;
  const int size_;
  const Options options_;
  int shrinks_ = 0;  // shrink generations started from this communicator
  int splits_ = 0;   // splits called on this communicator
  const std::string name_;
  std::chrono::milliseconds timeout_;
  bool reproducible_ = false;
  std::shared_ptr<FailureState> failure_;
  std::shared_ptr<ProgressHook> progress_;
  StoreAccess access_;
  std::shared_ptr<JoinStore> joinStore_;  // what the transports publish to and read (comm/meeting.hpp)
  Diagnostics diag_;
  LinkTable links_;  // the connections, their transports and progress engines
  std::unique_ptr<OpQueue> queue_;
  std::atomic<int64_t> nextSeq_{0};
  std::atomic<bool> aborted_{false};
  std::vector<uint8_t> scratch_[kScratchSlots];
  std::optional<LinkModel> link_;
  std::shared_ptr<const coll::Selector> selector_;
  std::mutex deviceMu_;
  std::shared_ptr<detail::DeviceState> deviceState_;
  int ranksOnThisMachine_ = 1;  // ranks whose boot id is this rank's (network namespaces split nodes)
  NodeMap nodes_;               // set once while joining, before any user call
};

}  // namespace detail
}  // namespace loom
