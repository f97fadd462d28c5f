// ShmTransport: shared-memory connections between the ranks of one node (those whose host
// identities match, core/topology.hpp).
//
// Setup, all local ranks at once:
//   1. each rank creates its segment /dev/shm/loom-<communicator id>-<rank> (segment.hpp), with one
//      ring per local peer, starts its progress thread (which takes the liveness mutex) and
//      publishes "name bytes pid cookie-address" under shm/<rank> in the store;
//   2. each rank attaches every local peer's segment, checks it, and answers shm-att/<owner>/<rank>
//      with "ok" or the reason it could not;
//   3. once every peer said "ok", the owner unlinks its segment: from then on nothing is left in
//      /dev/shm whatever happens to the processes;
//   4. each rank probes cross-memory attach towards every peer (reading the peer's cookie with
//      process_vm_readv), and uses it for large messages where it works.
// A rank whose setup fails replaces its endpoint with "error: <why>", so that its local peers
// fail at once with that reason instead of at the deadline.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "transport/shm/arena.hpp"
#include "transport/shm/segment.hpp"
#include "transport/shm/shm_engine.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace shm {

class ShmTransport : public Transport, public ArenaProvider {
 public:
  ShmTransport() = default;
  ~ShmTransport() override;
  const char* name() const override { return "shm"; }
  LinkProperties properties() const override { return linkProperties(); }
  /// Shared-memory links: LOOM_SHM_LATENCY_US and LOOM_SHM_MBPS for the cost model, 512 KiB ring
  /// chunks (that stay in cache), one ring (one thread drives every link of the node), large
  /// messages read in place from the sender's memory.
  static LinkProperties linkProperties();
  bool reaches(const TransportContext& ctx, int peer) const override;
  void publish(TransportContext&) override {}
  std::vector<std::unique_ptr<Connection>> connect(TransportContext& ctx, const std::vector<int>& peers) override;
  void stop() noexcept override;
  void attend(bool on) noexcept override {
    if (engine_) engine_->attend(on);
  }
  void waiting(bool on) noexcept override {
    if (engine_) engine_->waiting(on);
  }
  const LocalArena* arena() const override { return arena_.bytes > 0 ? &arena_ : nullptr; }

 private:
  std::vector<std::unique_ptr<Connection>> setUp(TransportContext& ctx, const std::vector<int>& peers);
  /// Waits for `key` (set by `peer`), failing at once if the peer gave up meanwhile.
  std::optional<std::string> awaitFromPeer(TransportContext& ctx, const std::string& key, int peer);
  /// Throws the peer's own setup error if it gave up (it replaced its endpoint with it).
  void peerGaveUp(TransportContext& ctx, int peer);

  Segment mine_;
  std::map<int, Segment> theirs_;
  LocalArena arena_;
  std::unique_ptr<ShmEngine> engine_;  // declared last: stopped before the segments go
};

}  // namespace shm
}  // namespace loom
