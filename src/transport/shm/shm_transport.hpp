// ShmTransport: shared-memory connections between the ranks of one node (those whose host
// identities match, core/topology.hpp).
//
// Setup, all local ranks at once:
//   1. each rank creates its segment /dev/shm/loom-<communicator id>-<rank> (segment.hpp), with one
//      ring per local peer, and starts its progress engine; the name follows from the communicator
//      and the rank, so nothing is published;
//   2. each rank attaches every local peer's segment once its owner marked it ready, checks it,
//      and sets its bit in the segment's attach map;
//   3. once every peer's bit is set, the owner unlinks its segment: from then on nothing is left in
//      /dev/shm whatever happens to the processes;
//   4. each rank probes cross-memory attach towards every peer (reading the cookie whose address
//      the peer's header holds, with process_vm_readv), and uses it for large messages where it works.
// A rank whose setup fails sets shm/<rank> in the store to "error: <why>", so that its local peers
// fail soon with that reason instead of at the deadline.
//
// Progress: the connections are sources of one progress engine (core/progress_engine.hpp) that
// the link table makes for this rank's doorbell, the futex word in its segment that every writer
// bumps; the segment's `attending` and `waiters` counts, which writers read to decide whether to
// ring (segment.hpp, ring()), are the engine's waiter counts. That engine's thread holds the
// segment's liveness mutex for its whole life, which is what tells peers that this rank is alive,
// and marks the segment closed as it ends (a clean exit); its maintenance checks now and then that
// the peers still live.
#pragma once

#include <functional>
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
  /// Steps 2 and 3 of the setup for `peers`: attaches each one's segment into theirs_ as it
  /// becomes ready and marks it, and returns once each one has marked ours. Throws naming a peer
  /// that gave up meanwhile, whose segment is unusable, or that is missing at ctx.deadline.
  void attachAll(TransportContext& ctx, const std::vector<int>& peers,
                 const std::function<int(int owner, int writer)>& slotIn);
  /// Throws the peer's own setup error if it gave up (it set shm/<peer> to it).
  void peerGaveUp(TransportContext& ctx, int peer);

  Segment mine_;
  std::map<int, Segment> theirs_;
  LocalArena arena_;
  ProgressEngine* engine_ = nullptr;  // the link table's, which outlives us; stopped before the segments go
};

}  // namespace shm
}  // namespace loom
