// IbTransport: links over InfiniBand or RoCE through RC queue pairs (ib_connection.hpp), for peers
// on other nodes (and any peer when it is the only transport allowed, LOOM_TRANSPORT=ib).
//
// Setup: publish() opens the rank's port (open_port.hpp: LOOM_IB_HCA, the NUMA node of the rank's
// CPUs, ranks spread over a node's ports), makes the completion channel every connection's queue
// reports to and listens for side channels (side_channel.hpp); the receive engine watches the
// channel and the device's asynchronous events (a queue pair or completion queue in error fails its
// link, the port going down or the device failing every link). connect() makes each peer's
// connection (its queue pairs in INIT, receives posted), writes their addresses to the store under
// ib/<rank>/<peer>, reads the peer's, brings the queue pairs to RTS and says so under
// ibok/<rank>/<peer>; it returns once every peer has said so, so that no first message meets a
// queue pair that is not ready, and each link's side channel is formed. A rank whose setup fails
// writes "error: <why>" under ib/<rank>, and its peers fail at once with that reason, not at the
// deadline.
//
// Device buffers: where this rank has GPUDirect RDMA (gpu_direct.hpp), its queue pairs' addresses
// say so, and a link whose two ranks both have it takes device buffers for send/recv.
//
// Where libibverbs is missing, lists no device, or no port is usable, the transport reaches no peer
// and says why (LOOM_DEBUG=INFO, and in the error when it was the only one allowed).
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/ib/gpu_direct.hpp"
#include "transport/ib/ib_connection.hpp"
#include "transport/ib/open_port.hpp"
#include "transport/ib/side_channel.hpp"
#include "transport/registration_cache.hpp"
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
  Registration registerMemory(const void* addr, size_t bytes, Status* error) override;
  RegistrationStats registrationStats() const override { return cache_ ? cache_->stats() : RegistrationStats{}; }

 private:
  class ChannelWatch;
  class AsyncWatch;
  Status registerRange(uintptr_t begin, size_t bytes, RegisteredRange* out) noexcept override;
  void deregisterRange(const RegisteredRange& range) noexcept override;
  std::vector<std::unique_ptr<Connection>> setUp(TransportContext& ctx, const std::vector<int>& peers);
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
};

}  // namespace ib
}  // namespace loom
