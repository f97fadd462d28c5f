// Loom C++ API: an RAII Communicator, asynchronous Work handles, option structs, one exception.
//
// Ownership: a Communicator owns its connections, the threads that drive them and run its queued
// operations, and (on the rank that hosts it) the rendezvous store. Buffers passed to an operation belong to the caller
// and must stay valid until the operation's Work has completed (wait() returned or test() returned true).
//
// Threads: operations on one Communicator may be called from several threads; collectives and
// barriers run in the order they were called. abort() may be called from any thread at any time.
// Work may be waited on from any thread.
//
// Errors: every failure is a loom::Error carrying an ErrorCode, this rank, the peer involved
// (when there is one), the sequence number of the collective (when there is one) and file:line.
// After a peer failure, a timeout or an abort, the Communicator is failed: every later call
// throws the original cause.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace loom {

/// Element types; the values equal loomDataType_t's.
enum class DataType : int {
  Int8 = 0,
  Uint8 = 1,
  Int32 = 2,
  Uint32 = 3,
  Int64 = 4,
  Uint64 = 5,
  Float16 = 6,
  Float32 = 7,
  Float64 = 8,
  Bfloat16 = 9,
};

/// Reductions; the values equal loomRedOp_t's. Avg is a sum divided once by the world size.
enum class ReduceOp : int { Sum = 0, Prod = 1, Max = 2, Min = 3, Avg = 4 };

/// What went wrong, in the categories a caller can act on.
enum class ErrorCode : int {
  InvalidArgument,  ///< a bad argument: null buffer, bad count, unknown datatype, rank out of range
  InvalidUsage,     ///< calls in a bad order, or ranks that called different things
  System,           ///< a system call failed (socket, bind, memory)
  Remote,           ///< a peer died, closed its connection, or sent something malformed
  Timeout,          ///< a deadline passed; the message says what was awaited from whom
  Aborted,          ///< the communicator was aborted
  Internal,         ///< a bug in Loom
  Cuda,             ///< a CUDA call failed
};

/// Name of an ErrorCode ("timeout", "remote", ...).
const char* toString(ErrorCode code);
/// Name of a datatype ("float32", ...).
const char* toString(DataType type);
/// Name of a reduction ("sum", ...).
const char* toString(ReduceOp op);
/// Size of one element in bytes.
size_t sizeOf(DataType type);

/// The one exception type Loom throws.
class Error : public std::runtime_error {
 public:
  /// `message` is the readable cause; what() adds the code, rank, peer, sequence and location.
  Error(ErrorCode code, const std::string& message, int rank = -1, int peer = -1, int64_t seq = -1,
        const char* file = nullptr, int line = 0);

  ErrorCode code() const { return code_; }
  /// The rank that raised the error, or -1 before the rank is known.
  int rank() const { return rank_; }
  /// The peer rank involved, or -1.
  int peer() const { return peer_; }
  /// The collective sequence number involved, or -1.
  int64_t seq() const { return seq_; }
  /// The readable cause alone, without the decorations what() adds.
  const std::string& message() const { return message_; }
  /// "file.cc:123" where it was raised, or "".
  const std::string& where() const { return where_; }

 private:
  ErrorCode code_;
  int rank_;
  int peer_;
  int64_t seq_;
  std::string message_;
  std::string where_;
};

/// Maps a C++ element type to its DataType.
template <typename T>
constexpr DataType dataTypeOf();
template <>
constexpr DataType dataTypeOf<int8_t>() {
  return DataType::Int8;
}
template <>
constexpr DataType dataTypeOf<uint8_t>() {
  return DataType::Uint8;
}
template <>
constexpr DataType dataTypeOf<int32_t>() {
  return DataType::Int32;
}
template <>
constexpr DataType dataTypeOf<uint32_t>() {
  return DataType::Uint32;
}
template <>
constexpr DataType dataTypeOf<int64_t>() {
  return DataType::Int64;
}
template <>
constexpr DataType dataTypeOf<uint64_t>() {
  return DataType::Uint64;
}
template <>
constexpr DataType dataTypeOf<float>() {
  return DataType::Float32;
}
template <>
constexpr DataType dataTypeOf<double>() {
  return DataType::Float64;
}

/// Communicator options. A field left unset takes its environment variable, then the default.
struct Options {
  /// Deadline of every wait (LOOM_TIMEOUT in seconds; default 300 s). Zero: unset.
  std::chrono::milliseconds timeout{0};
  /// Deadline for all ranks to join (LOOM_INIT_TIMEOUT in seconds; default 120 s). Zero: unset.
  std::chrono::milliseconds initTimeout{0};
  /// Name used in log lines and error messages.
  std::string name = "loom";
  /// Transports allowed, NCCL-style list (LOOM_TRANSPORT): "tcp", "^shm". Empty: all.
  std::string transports;
  /// TCP sockets striped per peer (LOOM_SOCKETS_PER_PEER; default 2). Zero: unset.
  int socketsPerPeer = 0;
  /// This rank's host identity (LOOM_HOST_ID): ranks with equal ids are taken to share a node and
  /// its memory. Empty: detected (same boot id, IPC namespace and /dev/shm).
  std::string hostId;
  /// Reproducible mode (LOOM_REPRODUCIBLE; default off): 1 on, 0 off, -1 unset. Every float sum,
  /// avg and prod (all-reduce, reduce, reduce-scatter) then returns, per element, one canonical
  /// expression of the ranks' inputs: the same bits whatever the message size, algorithm, transport,
  /// buffer location or placement of ranks on nodes (docs/reproducibility.md). Every rank of a
  /// communicator must agree.
  int reproducible = -1;
};

/// The 128-byte rendezvous id (see loomUniqueId). A secret: whoever holds it can join.
class UniqueId {
 public:
  static constexpr size_t kBytes = 128;

  /// Creates an id and starts the rendezvous store it names in this process.
  static UniqueId create();
  /// Rebuilds an id from its bytes (as sent by another rank); throws InvalidArgument if malformed.
  static UniqueId fromBytes(const void* data, size_t size);
  /// Rebuilds an id from toHex()'s text.
  static UniqueId fromHex(const std::string& hex);

  const std::array<uint8_t, kBytes>& bytes() const { return bytes_; }
  /// The bytes as 256 hexadecimal digits, e.g. to pass in an environment variable.
  std::string toHex() const;

 private:
  std::array<uint8_t, kBytes> bytes_{};
};

/// Where this process sits in its job, as its launcher told it (see launchFromEnv).
struct Launch {
  /// "loomrun", "torchrun", "environment" (RANK/WORLD_SIZE), "openmpi", "hydra", "slurm", "explicit".
  std::string launcher;
  int rank = -1;
  int size = -1;
  int localRank = -1;  ///< -1 when no launcher said
  int localSize = -1;  ///< -1 when no launcher said
  /// Where rank 0 serves the rendezvous, and on which port (derived from the job id when the
  /// launcher gives none, so that concurrent jobs on one node do not collide).
  std::string masterAddr;
  int masterPort = -1;
  /// For each field, where it came from: {"rank", "3 from SLURM_PROCID"}.
  std::vector<std::pair<std::string, std::string>> provenance;
};

/// Reads rank, world size, local rank and rendezvous address from the variables launchers set
/// (LOOM_RANK, RANK/WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_*, Slurm's SLURM_*), so
/// that no one computes them by hand. Throws InvalidArgument naming the variable when a value is
/// malformed or inconsistent, or when no launcher variable is set at all.
Launch launchFromEnv();

namespace detail {
class Request;
class CommImpl;
}  // namespace detail

/// The peer of a receive from any rank (this one included): it takes the earliest message on its
/// tag from whichever rank, and Work::source() names that rank (MPI_ANY_SOURCE). Into device
/// buffers too, staged through host memory (which link the message comes by is known only then).
constexpr int kAnySource = -1;

/// The color of a rank that takes no part in Communicator::split (it gets an empty communicator).
constexpr int kSplitNoColor = -1;

/// One send or receive of Communicator::igroup.
struct PointToPoint {
  bool send = true;  ///< true: send `count` elements of `buf` to `peer`; false: receive into `buf`
  void* buf = nullptr;
  size_t count = 0;
  DataType type = DataType::Float32;
  int peer = 0;      ///< a receive's may be kAnySource
  uint32_t tag = 0;  ///< below 2^31
};

/// Handle to an operation in flight. Copyable; all copies refer to the same operation.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::Request> request);

  /// True once the operation completed; throws its Error if it failed.
  bool test();
  /// Waits until the operation completes, at most the communicator's timeout; throws on failure.
  void wait();
  /// Waits at most `timeout`; on expiry throws ErrorCode::Timeout naming what was awaited, and
  /// marks the communicator failed (the peers may be stuck mid-protocol).
  void wait(std::chrono::milliseconds timeout);
  /// Runs `fn` once the operation completes, with nullptr on success or the loom::Error it failed
  /// with. If it has completed already, `fn` runs at once on this thread; otherwise on the Loom
  /// thread that completes it (a progress or op-queue thread, or a thread waiting on it), with no
  /// Loom lock held. Keep `fn` short: it delays that thread's other work. Callbacks run in the
  /// order they were added; an exception thrown by `fn` is logged and dropped. This is how a
  /// framework completes its own futures without a thread blocked per operation.
  void onCompletion(std::function<void(std::exception_ptr error)> fn);
  /// Bytes moved into the receive buffer (receives), or bytes sent.
  size_t bytes() const;
  /// The rank a receive took its message from: its peer, or for a receive from kAnySource the
  /// sender, known once complete (-1 before, and for groups and collectives).
  int source() const;
  bool valid() const { return request_ != nullptr; }

 private:
  std::shared_ptr<detail::Request> request_;
};

/// Waits for every Work in order; throws the first error.
void waitAll(std::vector<Work>& works);

/// A group of ranks that communicate. Movable, not copyable; the destructor frees everything.
class Communicator {
 public:
  /// Joins rank `rank` of `size` through `id`; blocks until every rank joined or initTimeout.
  Communicator(int rank, int size, const UniqueId& id, const Options& options = {});
  /// Joins from the launcher's environment (see loomCommInitFromEnv in loom.h).
  static Communicator fromEnv(const Options& options = {});

  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  int rank() const;
  int size() const;
  /// Ranks that share this rank's node (can share memory), numbered 0.. in rank order; use it to
  /// pick this rank's GPU. Learnt at join from every rank's host identity.
  int localRank() const;
  int localSize() const;
  /// Nodes in the communicator, numbered in the order of their lowest rank, and the node of `rank`.
  int nodeCount() const;
  int nodeOf(int rank) const;
  /// How this rank is linked to `peer`: "cuda_ipc" (same node, device buffers through CUDA IPC and
  /// host bytes over shared memory), "shm" (shared memory, same node), "ib" (InfiniBand verbs),
  /// "tcp", or "self".
  /// Chosen at join per pair: the first transport LOOM_TRANSPORT allows that reaches the peer.
  std::string transportOf(int peer) const;
  /// One line on that link for logs and tools (transport, rings or sockets, copy path).
  std::string describeLink(int peer) const;
  /// The peers this rank holds a link to now: those linked at init (shared memory; every peer with
  /// LOOM_CONNECT=eager) and those linked on first use since (TCP, with LOOM_CONNECT=lazy, the
  /// default: a link is made the first time an operation needs that peer).
  int linkCount() const;
  /// The algorithm this communicator runs for `collective` ("all_reduce", "broadcast", "reduce",
  /// "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "barrier") moving `bytes`
  /// in all: a name of the table of algorithms (`loom-info --algos`: "ring", "rd", "hd", "tree",
  /// "chain", "dbtree", "pairwise", "linear", "dissemination", "hier" node-aware, "direct" on one
  /// node through shared memory). What the cost model and LOOM_ALGO pick; in reproducible mode, for
  /// the float reductions (all-reduce, reduce, reduce-scatter): "canonical", "canonical-rd",
  /// "canonical-hier", or "direct" on one node.
  std::string algorithmFor(const std::string& collective, size_t bytes) const;
  /// The communicator's name (Options::name).
  const std::string& name() const;
  /// Whether the communicator is in reproducible mode (Options::reproducible).
  bool reproducible() const;

  // ---- Point-to-point. Ordered per pair and tag; `tag` must be below 2^31. ----
  //
  // Device buffers (see the collectives below) take a `cudaStream` and are ordered on it like the
  // collectives, and with them: a device send or receive waits for the communicator's collectives
  // called before it. Host and device messages between one pair should not share a tag.

  /// Starts sending `count` elements to `peer`.
  Work isend(const void* buf, size_t count, DataType type, int peer, uint32_t tag = 0, void* cudaStream = nullptr);
  /// Starts receiving up to `count` elements from `peer`. A larger message fails the Work (and
  /// the matching send) with InvalidUsage; a smaller one is accepted, Work::bytes() tells.
  /// `peer` kAnySource takes the earliest message on `tag` from any rank, in arrival order
  /// (each rank's own messages in the order it sent them; against receives named for one rank,
  /// the one posted first takes a message); Work::source() names the sender.
  Work irecv(void* buf, size_t count, DataType type, int peer, uint32_t tag = 0, void* cudaStream = nullptr);
  /// Blocking forms (on device buffers they return once the operation is queued on the stream).
  void send(const void* buf, size_t count, DataType type, int peer, uint32_t tag = 0, void* cudaStream = nullptr);
  void recv(void* buf, size_t count, DataType type, int peer, uint32_t tag = 0, void* cudaStream = nullptr);
  /// Posts the sends and receives of `ops` together, receives first, and returns a Work that
  /// completes when every one has (failing with the first error): an exchange that deadlocks as
  /// separate blocking calls (each rank sending to the next, then receiving from the previous)
  /// does not here. One call's buffers are all host memory or all device memory; device buffers
  /// are ordered on `cudaStream`. Work::bytes() is the total received.
  Work igroup(const std::vector<PointToPoint>& ops, void* cudaStream = nullptr);

  template <typename T>
  void send(const std::vector<T>& v, int peer, uint32_t tag = 0) {
    send(v.data(), v.size(), dataTypeOf<T>(), peer, tag);
  }
  template <typename T>
  void recv(std::vector<T>& v, int peer, uint32_t tag = 0) {
    recv(v.data(), v.size(), dataTypeOf<T>(), peer, tag);
  }

  // ---- Collectives: asynchronous forms return Work; they complete in call order. ----
  //
  // Device buffers (Loom built with CUDA): any collective also takes CUDA device memory, with
  // NCCL's stream semantics. `cudaStream` is the cudaStream_t the operation is ordered on (nullptr:
  // the legacy default stream): the collective reads its input once the work queued on that stream
  // before the call has completed, and work queued on the stream after the call waits until the
  // collective has completed. The call returns once that is arranged, whether blocking or not; it
  // does not wait for the peers, and the host is not blocked. The returned Work completes when the
  // collective has (and tells of errors; so does checkError()). Every buffer of a call must be
  // device memory of one device, or every one host memory: a mix is InvalidArgument. A stream being
  // captured into a CUDA graph is rejected (InvalidUsage). For host buffers `cudaStream` must be
  // nullptr.

  Work ibarrier();
  /// Returns once every rank entered the barrier.
  void barrier();
  /// A barrier that names the ranks that do not arrive (Gloo's monitored_barrier): each rank
  /// reports to rank 0 and waits for its release; rank 0 waits at most `timeout` (0: the
  /// communicator's) for the reports. Where ranks are missing, rank 0 throws Timeout naming them
  /// ("Ranks 2, 3 failed to pass monitoredBarrier in 2000 ms", Gloo's words) and where each one is
  /// (the hang report: the collective it is in, or its last one), and the others throw Timeout when
  /// no release comes. `waitAll`: rank 0 waits for every rank and names all that are missing;
  /// otherwise it stops at the first. Both end the communicator (as every timeout does).
  void monitoredBarrier(std::chrono::milliseconds timeout = std::chrono::milliseconds(0), bool waitAll = false);

  Work iallReduce(const void* sendbuf, void* recvbuf, size_t count, DataType type, ReduceOp op,
                  void* cudaStream = nullptr);
  void allReduce(const void* sendbuf, void* recvbuf, size_t count, DataType type, ReduceOp op,
                 void* cudaStream = nullptr);
  Work ibroadcast(const void* sendbuf, void* recvbuf, size_t count, DataType type, int root,
                  void* cudaStream = nullptr);
  void broadcast(const void* sendbuf, void* recvbuf, size_t count, DataType type, int root, void* cudaStream = nullptr);
  Work ireduce(const void* sendbuf, void* recvbuf, size_t count, DataType type, ReduceOp op, int root,
               void* cudaStream = nullptr);
  void reduce(const void* sendbuf, void* recvbuf, size_t count, DataType type, ReduceOp op, int root,
              void* cudaStream = nullptr);
  Work iallGather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType type, void* cudaStream = nullptr);
  void allGather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType type, void* cudaStream = nullptr);
  Work ireduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, DataType type, ReduceOp op,
                      void* cudaStream = nullptr);
  void reduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, DataType type, ReduceOp op,
                     void* cudaStream = nullptr);
  Work iallToAll(const void* sendbuf, void* recvbuf, size_t count, DataType type, void* cudaStream = nullptr);
  void allToAll(const void* sendbuf, void* recvbuf, size_t count, DataType type, void* cudaStream = nullptr);
  /// Gather (as MPI_Gather, NCCL's ncclGather): every rank sends `count` elements of sendbuf to
  /// `root`, which receives rank j's at element j * count of recvbuf (size() * count elements).
  /// recvbuf is used on the root only (elsewhere it may be null). In place on the root: sendbuf ==
  /// recvbuf + root * count elements. The root links its peers and no one else.
  Work igather(const void* sendbuf, void* recvbuf, size_t count, DataType type, int root, void* cudaStream = nullptr);
  void gather(const void* sendbuf, void* recvbuf, size_t count, DataType type, int root, void* cudaStream = nullptr);
  /// Scatter (as MPI_Scatter, NCCL's ncclScatter): `root` sends rank j the `count` elements at
  /// element j * count of sendbuf (size() * count elements), which it receives in recvbuf. sendbuf
  /// is used on the root only (elsewhere it may be null). In place on the root: recvbuf == sendbuf
  /// + root * count elements.
  Work iscatter(const void* sendbuf, void* recvbuf, size_t count, DataType type, int root, void* cudaStream = nullptr);
  void scatter(const void* sendbuf, void* recvbuf, size_t count, DataType type, int root, void* cudaStream = nullptr);
  /// All-to-all with a count per peer (as MPI_Alltoallv): sends sendCounts[j] elements starting at
  /// element sendDispls[j] of sendbuf to rank j, and receives recvCounts[j] elements from rank j
  /// at element recvDispls[j] of recvbuf. Each vector has one entry per rank. Rank i's
  /// sendCounts[j] must equal rank j's recvCounts[i]: where they differ, both calls fail with
  /// InvalidUsage. The buffers must not overlap (there is no in-place form).
  Work iallToAllv(const void* sendbuf, const std::vector<size_t>& sendCounts, const std::vector<size_t>& sendDispls,
                  void* recvbuf, const std::vector<size_t>& recvCounts, const std::vector<size_t>& recvDispls,
                  DataType type, void* cudaStream = nullptr);
  void allToAllv(const void* sendbuf, const std::vector<size_t>& sendCounts, const std::vector<size_t>& sendDispls,
                 void* recvbuf, const std::vector<size_t>& recvCounts, const std::vector<size_t>& recvDispls,
                 DataType type, void* cudaStream = nullptr);

  /// Where Loom sees `p`: -1 for host memory, else the CUDA device it belongs to (always -1 when
  /// Loom is built without CUDA, no device is present, or the process has not used CUDA: Loom
  /// never starts CUDA itself for host buffers).
  static int deviceOf(const void* p);

  // ---- Lifetime and errors. ----

  /// Sub-communicators, as NCCL's ncclCommSplit and MPI_Comm_split: collective over this
  /// communicator (every rank calls it, in the same order as its other collectives). The ranks
  /// that pass the same `color` (0 or more) form one new communicator, numbered by `key`, ties
  /// broken by their rank here; a rank passing kSplitNoColor takes part in the call and gets an
  /// empty communicator back (valid() false). No new rendezvous: the new communicators meet
  /// through this one's links (all-gathers of it swap colors and keys, then endpoints, then, where
  /// some rank links at init, say who is linked), with this one's options; they have links of their
  /// own (over TCP made on first use, so a split connects nothing), and live on whatever happens to
  /// this one (destroy them in any order). If a new communicator cannot be set up, each of its
  /// ranks throws (where every link is made on first use, a rank that failed after the swap is
  /// named by the first link to it), and this one stays usable.
  Communicator split(int color, int key);
  /// A communicator of `ranks` (ranks of this one, each once, in their new rank order), made by
  /// those ranks alone, as MPI_Comm_create_group: each of them calls it with the same `ranks` and
  /// `name`, the other ranks need not (what torch.distributed's new_group needs). `name` tells
  /// this communicator's groups apart (one name, one group). No new rendezvous: they meet through
  /// this communicator's store; links of their own; they outlive this communicator. `options`:
  /// the new communicator's (nullptr: this one's).
  Communicator group(const std::vector<int>& ranks, const std::string& name, const Options* options = nullptr);
  /// False for an empty communicator: moved from, or split with kSplitNoColor.
  bool valid() const noexcept { return impl_ != nullptr; }

  /// Fails every pending and later operation with ErrorCode::Aborted and closes connections.
  /// Any thread; safe to call more than once, and alongside the destructor of another handle.
  void abort();
  /// After a failure (a rank died, or stopped and timed out): a new communicator of the ranks that
  /// are still here, renumbered in their old order. Every survivor calls it; the ranks that have
  /// not called it within `wait` (default 5 s) are left out. It meets through the rendezvous store
  /// of this communicator, so rank 0 (which hosts it) must be among the survivors; if it is not,
  /// this throws and the job must restart. This communicator stays failed; destroy it after.
  Communicator shrink(std::chrono::milliseconds wait = std::chrono::seconds(5));
  /// Throws the error that marked the communicator failed, if any.
  void checkError() const;
  /// Waits until every operation this rank has queued on the communicator has completed: the
  /// asynchronous collectives and barriers, and the operations on device buffers, which return
  /// once ordered on their stream (as ncclCommFinalize flushes them). Then throws the
  /// communicator's first error, if any. The communicator stays usable until destroyed.
  void finalize();
  /// The default deadline of waits on this communicator.
  std::chrono::milliseconds timeout() const;

  /// For the C API and tests: the implementation.
  detail::CommImpl* impl() const { return impl_.get(); }

 private:
  explicit Communicator(std::unique_ptr<detail::CommImpl> impl);
  std::unique_ptr<detail::CommImpl> impl_;
};

}  // namespace loom
