// ShmTransport: shared-memory connections between the ranks of one node (those whose host
// identities match, core/topology.hpp).
//
// Setup, all local ranks at once:
//   1. each rank creates its segment /dev/shm/loom-<communicator id>-<rank> (segment.hpp), with one
//      ring per local peer, starts its progress engine and publishes "name bytes pid
//      cookie-address" under shm/<rank> in the store;
//   2. each rank attaches every local peer's segment, checks it, and answers shm-att/<owner>/<rank>
//      with "ok" or the reason it could not;
//   3. once every peer said "ok", the owner unlinks its segment: from then on nothing is left in
//      /dev/shm whatever happens to the processes;
//   4. each rank probes cross-memory attach towards every peer (reading the peer's cookie with
//      process_vm_readv), and uses it for large messages where it works.
// A rank whose setup fails replaces its endpoint with "error: <why>", so that its local peers
// fail at once with that reason instead of at the deadline.
//
// Progress: the connections are sources of one progress engine (core/progress_engine.hpp) that
// the link table makes for this rank's doorbell, the futex word in its segment that every writer
// bumps; the segment's `attending` and `waiters` counts, which writers read to decide whether to
// ring (segment.hpp, ring()), are the engine's waiter counts. That engine's thread holds the
// segment's liveness mutex for its whole life, which is what tells peers that this rank is alive,
// and marks the segment closed as it ends (a clean exit); its maintenance checks now and then that
// the peers still live.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/progress_engine.hpp"
#include "transport/shm/arena.hpp"
#include "transport/shm/segment.hpp"
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
  /// Stops the progress engine (the link table's; it stops it too), so that the segments can go.
  void stop() noexcept {
    if (engine_ != nullptr) engine_->stop();
  }
  const LocalArena* arena() const override { return arena_.bytes > 0 ? &arena_ : nullptr; }

 private:
  std::vector<std::unique_ptr<Connection>> setUp(TransportContext& ctx, const std::vector<int>& peers);
  /// Waits for `key` (set by `peer`), failing at once if the peer gave up meanwhile.
  /// The values of keys[i], each written by peers[i], read together (one store request per round
  /// for every key still missing); throws naming a peer that gave up meanwhile (its endpoint says
  /// so); nullopt for those still missing at ctx.deadline.
  std::vector<std::optional<std::string>> awaitFromPeers(TransportContext& ctx, const std::vector<std::string>& keys,
                                                         const std::vector<int>& peers);
  /// Throws the peer's own setup error if it gave up (it replaced its endpoint with it).
  void peerGaveUp(TransportContext& ctx, int peer);

  Segment mine_;
  std::map<int, Segment> theirs_;
  LocalArena arena_;
  ProgressEngine* engine_ = nullptr;  // the link table's, which outlives us; stopped before the segments go
};

}  // namespace shm
}  // namespace loom
