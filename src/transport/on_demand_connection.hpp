// OnDemandConnection: the link table's stand-in for a peer whose link is made on first use
// (LOOM_CONNECT=lazy, Transport::linksOnDemand). The first send or receive asks the transport for
// the link (Transport::linkTo) and is kept, with any that follow, until the link is up (made by
// this rank or by the peer, who may need it first); they are then posted to it in the order they
// came, and from then on every call goes straight through. It is the ProgressSource the engines
// hold for the peer from init on, so that a link made later needs no change to a sealed engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "transport/transport.hpp"

namespace loom {

class OnDemandConnection : public Connection {
 public:
  /// `transport` makes the link (its linkOnDemand was called); `what` names it in describe().
  OnDemandConnection(int rank, int peer, Transport* transport);
  ~OnDemandConnection() override;

  /// The link is up: the kept operations go to it, in order. Once; any thread.
  void install(std::unique_ptr<Connection> conn) noexcept;
  /// Whether the link is up.
  bool linked() const noexcept { return inner_.load(std::memory_order_acquire) != nullptr; }

  int peer() const override { return peer_; }
  void isend(const RequestPtr& req, const SendSpec& spec) noexcept override;
  void irecv(const RequestPtr& req, const RecvSpec& spec) noexcept override;
  void quiesce(const Status& why) noexcept override;
  void attachAnySource(AnySource* hub) override { hub_ = hub; }
  uint64_t firstKept(uint32_t tag) override;
  bool irecvKept(const RequestPtr& req, const RecvSpec& spec, uint64_t stamp) noexcept override;
  /// Fails what is kept and, once linked, the link. Also: the transport could not link the peer.
  void failAll(const Status& status) noexcept override;
  std::string describe() const override;
  bool takesDeviceBuffers() const override { return transport_->takesDeviceBuffersTo(peer_); }

  bool progress() noexcept override;
  bool needsEngine() const noexcept override;
  bool hasWork() const noexcept override;
  void maintain() noexcept override;
  void resume(bool sleeper) noexcept override;

 private:
  struct Kept {
    RequestPtr req;
    bool send;
    SendSpec sendSpec;
    RecvSpec recvSpec;
  };
  /// Keeps the operation unless the link is up (posted through it) or failed (failed): false when
  /// the caller should post it to the link itself.
  bool keep(Kept&& op) noexcept;
  Connection* link() const noexcept { return inner_.load(std::memory_order_acquire); }

  const int rank_;
  const int peer_;
  Transport* const transport_;
  AnySource* hub_ = nullptr;
  mutable std::mutex mu_;
  std::list<Kept> kept_;                     // guarded by mu_ (a list: nothing allocated while empty)
  bool asked_ = false;                       // linkTo called; guarded by mu_
  bool stopped_ = false;                     // quiesce called: nothing more goes to the link; guarded by mu_
  std::thread::id posting_;                  // the thread handing a kept operation to the link; guarded by mu_
  std::condition_variable posted_;           // posting_ cleared
  bool failed_ = false;                      // guarded by mu_
  Status failure_;                           // guarded by mu_
  std::unique_ptr<Connection> own_;          // the link, once installed
  std::atomic<Connection*> inner_{nullptr};  // own_, published once the kept operations are posted
};

}  // namespace loom
