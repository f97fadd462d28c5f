// Transport and Connection: the interface every way of moving bytes plugs into (tcp/, shm/,
// cuda_ipc/ and ib/).
//
// A Transport is a factory, one per kind per communicator: it publishes this rank's endpoint
// through the Store and creates Connections to peers (every rank calls connect() collectively).
// A Connection links this rank to one peer. Its isend/irecv never block and never throw: the
// outcome arrives through the Request. Messages between one pair of ranks with one tag match in
// the order they were sent. The link table's progress engines drive connections (one thread
// reads sockets, one finishes writes, one polls each wake word's sources:
// core/progress_engine.hpp); neither a Connection nor a Transport starts a thread of its own.
// A transport whose links touch user memory in place registers it (registration.hpp).
//
// Errors: the calls that finish before they return (publish, connect, linkOnDemand,
// registerMemory) throw loom::Error; the ones that start something (isend, irecv, linkTo) never
// throw, and report through what they started (the Request, the LinkSink); progress code returns
// a Status. What a transport offers the algorithms beyond its links (a node's
// shared arena, a map of peers' device memory) it says through services(), never found by type.
//
// Ownership: the communicator owns transports and connections; connections hold a raw
// back-reference to the engine, which the communicator stops before destroying them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "core/deadline.hpp"
#include "core/progress_engine.hpp"
#include "core/receive_consumer.hpp"
#include "core/request.hpp"
#include "transport/link_properties.hpp"
#include "transport/registration.hpp"

namespace loom {

class AnySource;
struct LocalArena;
namespace cuda_ipc {
class IpcMemCache;
}  // namespace cuda_ipc

/// Tags with this bit belong to collectives (user tags stay below it). Transports may treat their
/// messages differently: a collective's receiver posts its receives within a pipeline step.
constexpr uint32_t kCollectiveTagBit = 0x80000000u;

/// One message to send.
struct SendSpec {
  const void* buf = nullptr;  ///< stays valid until the request is done
  size_t bytes = 0;
  uint32_t tag = 0;
  /// The call the message belongs to (core/signature.hpp), carried with it; 0: none.
  uint64_t signature = 0;
};

/// One receive.
struct RecvSpec {
  void* buf = nullptr;  ///< stays valid until the request is done
  size_t capacity = 0;  ///< the largest message it takes; a larger one fails it
  uint32_t tag = 0;
  /// The call it belongs to: a matching message that carries another fails it; 0: any.
  uint64_t signature = 0;
  /// Takes the bytes as they land, where the transport can hand them on (core/receive_consumer.hpp),
  /// setting Request::consumed; null: the bytes go to `buf`.
  std::shared_ptr<ReceiveConsumer> consumer;
  /// When the receive was posted (AnySource::stamp()), where that was before it reached the link
  /// (a stand-in kept it until the link was up: on_demand_connection.hpp), so that it keeps its
  /// place against receives from any source; 0: now.
  uint64_t posted = 0;
};

/// A link to one peer. What drives it is the ProgressSource it is (core/progress_engine.hpp):
/// progress() from any thread, and the engine its transport added it to (none for a link that
/// needs no driving).
class Connection : public ProgressSource {
 public:
  ~Connection() override = default;
  virtual int peer() const = 0;
  /// Starts sending `spec.bytes` from spec.buf on spec.tag.
  virtual void isend(const RequestPtr& req, const SendSpec& spec) noexcept = 0;
  /// Starts receiving into spec.buf the next message on spec.tag.
  virtual void irecv(const RequestPtr& req, const RecvSpec& spec) noexcept = 0;
  /// Stops whatever of the link could still touch a caller's buffer, ahead of failAll: the link
  /// table stops every link before it fails any request, so that a caller woken by a failed
  /// request may release its buffers at once (a collective that fails on one link returns while
  /// its requests on others were in flight). Idempotent; any thread. Default: nothing to stop.
  virtual void quiesce(const Status& why) noexcept { (void)why; }
  /// Whether isend and irecv may be given device (GPU) buffers, which the link then moves without
  /// the CPU touching them (GPUDirect RDMA); set once the link is up. Default: host buffers only.
  virtual bool takesDeviceBuffers() const { return false; }

  // ---- Receives from any source (any_source.hpp). ----
  /// Joins the communicator's receives from any source; before the link carries anything.
  virtual void attachAnySource(AnySource* hub) = 0;
  /// When the earliest message the link keeps unmatched on `tag` arrived (AnySource::kNone: none).
  virtual uint64_t firstKept(uint32_t tag) = 0;
  /// Posts a receive from any source here if the earliest message kept on its tag is still the
  /// one that arrived at `stamp` (which it then takes, as irecv would, reporting this link's peer
  /// as the source); false, posting nothing, if it is gone.
  virtual bool irecvKept(const RequestPtr& req, const RecvSpec& spec, uint64_t stamp) noexcept = 0;
  /// Fails every pending request with `status` and closes the link. Idempotent; any thread.
  virtual void failAll(const Status& status) noexcept = 0;
  /// One line for logs: transport, sockets, addresses.
  virtual std::string describe() const = 0;
};

/// What a transport needs to set up its connections.
struct TransportContext {
  int rank = 0;
  int size = 1;
  Store* store = nullptr;                ///< the communicator's namespace in the rendezvous store
  JobKey key{};                          ///< the job secret every connection must prove
  Nonce commId{};                        ///< this communicator instance, so links of two communicators never mix
  ProgressEngine* engine = nullptr;      ///< reads (and accepts)
  ProgressEngine* sendEngine = nullptr;  ///< finishes writes the caller's thread could not
  /// An engine that polls sources and sleeps on `wake` (core/progress_engine.hpp), owned and
  /// stopped by the link table: for a transport whose peers wake it through memory.
  std::function<ProgressEngine&(WakeWord wake)> engineFor;
  std::shared_ptr<FailureState> failure;
  Deadline deadline{std::chrono::milliseconds(0)};  ///< for setting up
  int socketsPerPeer = 2;
  std::vector<int> nodeOf;  ///< by rank: its node (ranks that can share memory), once known
  /// The word `peer` left when its communicator failed (its first error, noted in the store before
  /// it closed its links), or "" when it left none by `wait`: for a link that broke without the
  /// peer's BYE, so that the error says what brought the peer down (often a third rank).
  std::function<std::string(int peer, std::chrono::milliseconds wait)> lastWordOf;
};

/// Where a transport that links on first use (Transport::linksOnDemand) hands the links it makes
/// after init: the link table, which holds a stand-in Connection per peer until then.
class LinkSink {
 public:
  virtual ~LinkSink() = default;
  /// Readies a new link to `peer` before it starts to move bytes: it is driven through the
  /// stand-in the engines hold (ProgressSource::drivenThrough; the link adds no source of its own)
  /// and joins the communicator's receives from any source.
  virtual void adopt(int peer, Connection& conn) = 0;
  /// `peer`'s link is up (either side asked for it). Once per peer; any thread.
  virtual void linked(int peer, std::unique_ptr<Connection> conn) noexcept = 0;
  /// `peer` could not be linked: what waits on it fails with `why`. Any thread.
  virtual void linkFailed(int peer, const Status& why) noexcept = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  /// What this transport's links are like (link_properties.hpp): the layers above plan with these.
  virtual LinkProperties properties() const = 0;
  /// Whether this transport can link this rank to `peer` (ctx.nodeOf is set). The registry gives
  /// each pair the first transport that can.
  virtual bool reaches(const TransportContext& ctx, int peer) const {
    (void)ctx;
    (void)peer;
    return true;
  }
  /// Why this transport reaches no peer at all ("" when it may reach some): its library, device
  /// or port is missing. For the error when no allowed transport reaches a peer.
  virtual std::string absentReason() const { return std::string(); }
  /// Publishes this rank's endpoint in ctx.store. Called before connect() on every rank.
  virtual void publish(TransportContext& ctx) = 0;
  /// File descriptors each of its links holds open (sockets), so that the link table can make room
  /// for them before connecting (core/descriptors.hpp).
  virtual int descriptorsPerLink(const TransportContext& ctx) const {
    (void)ctx;
    return 0;
  }
  /// Connects to every rank in `peers`, all ranks at once; returns connections indexed like peers.
  virtual std::vector<std::unique_ptr<Connection>> connect(TransportContext& ctx, const std::vector<int>& peers) = 0;

  /// What this transport offers the algorithms besides its links, after connect: the node's shared
  /// arena (transport/arena.hpp; shared memory, CUDA IPC) and where peers' device memory is mapped
  /// (CUDA IPC). Null where it offers none. Pointers stay valid while the transport lives.
  struct Services {
    const LocalArena* arena = nullptr;
    cuda_ipc::IpcMemCache* ipcCache = nullptr;
  };
  virtual Services services() { return {}; }

  // ---- Links on first use (LOOM_CONNECT=lazy). A transport that can set up the link to one peer
  // when either side first needs it, without the other side's application thread, says so; the
  // link table then calls linkOnDemand instead of connect, and linkTo when a peer is first used.
  virtual bool linksOnDemand() const { return false; }
  /// Whether its set-up for links on first use still waits on peers at init (shared memory maps
  /// every local peer's segment then): the communicator's join then waits for every rank's set-up.
  virtual bool meetsPeersAtInit() const { return false; }
  /// Before linkOnDemand, on every rank at once: sets up what the stand-ins for `peers` need and
  /// returns the engine that is to drive them, and the links made behind them (null: the link
  /// table's receive engine). Sources may be added to it until the link table seals it.
  virtual ProgressEngine* prepareOnDemand(TransportContext& ctx, const std::vector<int>& peers) {
    (void)ctx;
    (void)peers;
    return nullptr;
  }
  /// Instead of connect(), on every rank at once: from now on links with `peers` are made when
  /// either side asks (linkTo here, or the peer's) and handed to `sink`. ctx and sink outlive the
  /// transport's links.
  virtual void linkOnDemand(TransportContext& ctx, const std::vector<int>& peers, LinkSink* sink) {
    (void)ctx;
    (void)peers;
    (void)sink;
  }
  /// Starts linking to `peer` (one of linkOnDemand's), unless that is under way or done; the
  /// outcome reaches the sink. Never blocks; any thread.
  virtual void linkTo(int peer) noexcept { (void)peer; }
  /// Whether the link to `peer` (one of linkOnDemand's) will take device buffers once made
  /// (Connection::takesDeviceBuffers), known before it is: the layers above plan with it at init.
  virtual bool takesDeviceBuffersTo(int peer) const {
    (void)peer;
    return false;
  }
  /// Registers [addr, addr + bytes) for this transport's links (registration.hpp): a transport
  /// whose properties say needsRegistration touches only registered memory in place, and keeps
  /// registrations for reuse in its RegistrationCache. The range stays registered while the result
  /// is held. This default, for transports that need none, returns the range without keys.
  /// Throws loom::Error where the range cannot be registered. Any thread.
  virtual Registration registerMemory(const void* addr, size_t bytes) { return registerKeyless(addr, bytes); }
  /// What this transport's registration cache did so far (zeros where it registers nothing).
  virtual RegistrationStats registrationStats() const { return {}; }
  /// The default's registration: the range, no keys; throws InvalidArgument for a null address.
  static Registration registerKeyless(const void* addr, size_t bytes) {
    if (addr == nullptr) LOOM_THROW(ErrorCode::InvalidArgument, -1, "cannot register memory at a null address");
    return keylessRegistration(addr, bytes);
  }
};

}  // namespace loom
