// IbTransport: links over InfiniBand or RoCE through RC queue pairs (ib_connection.hpp), for peers
// on other nodes (and any peer when it is the only transport allowed, LOOM_TRANSPORT=ib).
//
// Setup: publish() opens the rank's port (open_port.hpp: LOOM_IB_HCA, the NUMA node of the rank's
// CPUs, ranks spread over a node's ports), makes the completion channel every connection's queue
// reports to and listens for side channels (side_channel.hpp); the receive engine watches the
// channel and the device's asynchronous events (a queue pair or completion queue in error fails its
// link, the port going down or the device failing every link).
//
// Links on first use (LOOM_CONNECT lazy, or auto above 8 ranks): linkOnDemand() hands the side
// channels' listener to sockets::OnDemandLinks; a link's socket, once dialled and proved, carries the
// swap of its queue pairs' addresses (link_exchange.hpp) and stays its side channel.
//
// A full mesh at init (eager): connect() makes each peer's connection (its queue pairs in INIT,
// receives posted), writes all their addresses to the store in one request under ib/<rank>/<peer>,
// reads the peers' (waiting on the store's side) and brings the queue pairs to RTS; nothing is sent
// before every rank has (the communicator's meeting after connect says so). A rank whose setup
// fails writes "error: <why>" under ib/<rank>, and its peers waiting for it fail with that reason,
// not at the deadline. Then each link's side channel is formed.
//
// Device buffers: where this rank has GPUDirect RDMA (gpu_direct.hpp), its queue pairs' addresses
// say so, and a link whose two ranks both have it takes device buffers for send/recv.
//
// Where libibverbs is missing, lists no device, or no port is usable, the transport reaches no peer
// and says why (LOOM_DEBUG=INFO, and in the error when it was the only one allowed).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "transport/ib/gpu_direct.hpp"
#include "transport/ib/ib_connection.hpp"
#include "transport/ib/link_exchange.hpp"
#include "transport/ib/open_port.hpp"
#include "transport/ib/side_channel.hpp"
#include "transport/registration_cache.hpp"
#include "transport/sockets/on_demand_links.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace ib {

class IbTransport : public Transport, private Registrar {
 public:
  IbTransport();
  ~IbTransport() override;
  const char* name() const override { return "ib"; }
  /// RDMA links: LOOM_IB_LATENCY_US, the port's speed, one-sided writes into registered memory.
  LinkProperties properties() const override;
  bool reaches(const TransportContext& ctx, int peer) const override;
  std::string absentReason() const override { return port_ ? std::string() : why_; }
  void publish(TransportContext& ctx) override;
  /// The side channel (a TCP socket) of each link; queue pairs hold none.
  int descriptorsPerLink(const TransportContext& ctx) const override {
    (void)ctx;
    return 1;
  }
  std::vector<std::unique_ptr<Connection>> connect(TransportContext& ctx, const std::vector<int>& peers) override;
  /// Links on first use (LOOM_CONNECT): the side channel's socket is dialled and proved as TCP's
  /// links are (sockets/on_demand_links.hpp), then the two ranks swap their queue pairs' addresses
  /// over it (link_exchange.hpp); nothing goes through the store.
  bool linksOnDemand() const override { return port_ != nullptr; }
  void linkOnDemand(TransportContext& ctx, const std::vector<int>& peers, LinkSink* sink) override;
  void linkTo(int peer) noexcept override;
  /// Both ranks have GPUDirect RDMA (each says so in its record: ibgpu/<rank>).
  bool takesDeviceBuffersTo(int peer) const override { return deviceRegs_ != nullptr && gpuPeers_.count(peer) > 0; }
  Registration registerMemory(const void* addr, size_t bytes) override;
  RegistrationStats registrationStats() const override { return cache_ ? cache_->stats() : RegistrationStats{}; }

 private:
  class ChannelWatch;
  class AsyncWatch;
  Status registerRange(uintptr_t begin, size_t bytes, RegisteredRange* out) noexcept override;
  void deregisterRange(const RegisteredRange& range) noexcept override;
  std::vector<std::unique_ptr<Connection>> setUp(TransportContext& ctx, const std::vector<int>& peers);
  /// This rank's end of the link to `peer`: its queue pairs in INIT, receives posted.
  std::unique_ptr<IbConnection> makeLink(int rank, int peer, std::shared_ptr<FailureState> failure);
  /// What the peer's end needs of `c`: its queue pairs' addresses, and whether this rank has
  /// GPUDirect RDMA.
  std::string addressesOf(const IbConnection& c) const;
  /// Brings `c`'s queue pairs up to the peer's `theirs` (addressesOf on its side).
  void connectTo(IbConnection& c, std::string theirs);
  /// The link's side channel to `peer` is proved (sockets::OnDemandLinks): swap the queue pairs'
  /// addresses over it. Engine thread.
  void formOnDemand(int peer, std::vector<Socket> sockets, double tookMs);
  /// What peers[i] set under keys[i], for every i, by the init deadline; throws naming a peer that
  /// gave up (it says so under ib/<peer>) or the peers that did not come. One request reads all the
  /// keys still missing, and between two the store holds a wait for one of them: a few requests
  /// per rank however many peers, where a poll of each key would be O(N) requests every round.
  std::vector<std::string> awaitFromPeers(TransportContext& ctx, const std::vector<std::string>& keys,
                                          const std::vector<int>& peers, const char* what);
  /// Reads the device's asynchronous events into stash_ (asyncMu_ held).
  void drainAsyncLocked() noexcept;
  /// Reads the device's events and hands each to the links it is about (engine thread).
  void dispatchAsync() noexcept;
  /// What event `e` says, in a phrase ("port 1 of mlx5_0 went down (port error)"), and whether it
  /// is about link `c`.
  std::string describeEvent(const ibv_async_event& e) const;
  bool isAbout(const ibv_async_event& e, const IbConnection& c) const;
  /// What an event read so far says about link `c` ("" if none): a link whose work was flushed
  /// says why with it. Any thread (under the link's lock).
  std::string adapterReason(const IbConnection& c) noexcept;

  std::unique_ptr<OpenPort> port_;
  std::string why_;
  ibv_comp_channel* channel_ = nullptr;
  std::unique_ptr<ChannelWatch> watch_;
  std::unique_ptr<AsyncWatch> asyncWatch_;
  std::mutex asyncMu_;                  // after a link's lock, never before
  std::vector<ibv_async_event> stash_;  // read, not yet handed to the links
  static constexpr size_t kSaidKept = 64;
  std::deque<ibv_async_event> said_;  // the last kSaidKept handed to the links
  SideChannels side_;
  std::unique_ptr<RegistrationCache> cache_;
  GpuDirectChoice gpuDirect_;
  std::unique_ptr<DeviceRegistrations> deviceRegs_;  // where gpuDirect_ is on
  std::mutex connsMu_;  // conns_: set up by connect(), read by the engine thread's async events
  std::vector<IbConnection*> conns_;
  // Links on first use: what of the init context they need (it is gone after init), the links
  // being dialled or accepted, and the exchanges of addresses (engine thread; kept until the
  // transport goes, a failed one with its end of the link, which the link table may know).
  struct Lazy {
    int rank = 0;
    ProgressEngine* engine = nullptr;
    std::shared_ptr<FailureState> failure;
    std::function<std::string(int, std::chrono::milliseconds)> lastWordOf;
    std::chrono::milliseconds timeout{0};
    LinkSink* sink = nullptr;
  } lazy_;
  std::unique_ptr<sockets::OnDemandLinks> onDemand_;
  std::vector<std::unique_ptr<LinkExchange>> exchanges_;
  std::set<int> gpuPeers_;  // peers with GPUDirect RDMA, by their records (set in linkOnDemand)
};

}  // namespace ib
}  // namespace loom
