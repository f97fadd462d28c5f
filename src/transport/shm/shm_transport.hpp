// ShmTransport: shared-memory connections between the ranks of one node (those whose host
// identities match, core/topology.hpp).
//
// Setup, all local ranks at once (node_file.hpp):
//   1. the node's lowest rank creates the node's file /dev/shm/loom-<communicator id>-<rank>, with
//      one segment (segment.hpp) per local rank of one ring per local peer; its name follows from
//      the communicator and that rank, so nothing is published;
//   2. each rank opens and maps it once ready, writes its own segment's header, starts its
//      progress engine and marks itself joined in the file's node header;
//   3. once every rank joined, the lowest unlinks the file: from then on nothing is left in
//      /dev/shm whatever happens to the processes;
//   4. each rank probes cross-memory attach towards every peer (reading the cookie whose address
//      the peer's header holds, with process_vm_readv), and uses it for large messages where it works.
// A rank whose setup fails sets shm/<rank> in the store to "error: <why>", so that its local peers
// fail soon with that reason instead of at the deadline.
//
// Links on first use (LOOM_CONNECT=lazy, transport/link_table.hpp): steps 1 to 3 run at init (one
// mapping per rank, whatever the node's size), but the rings' memory is not backed and step 4
// waits. The first operation that needs a peer links it from this side alone (linkTo): it backs the ring
// it writes in the peer's segment, probes cross-memory attach, and marks itself in the peer's
// link requests; the peer's progress thread, woken, links back, so that what arrives there is
// read (unexpected messages, receives from any source) whether or not the peer asked first. A
// node of L ranks that only all-reduces thus backs and probes O(L log L) rings, not L².
//
// Progress: the connections are sources of one progress engine (core/progress_engine.hpp) that
// the link table makes for this rank's doorbell, the futex word in its segment that every writer
// bumps; the segment's `attending` and `waiters` counts, which writers read to decide whether to
// ring (segment.hpp, ring()), are the engine's waiter counts. That engine's thread holds the
// segment's liveness mutex for its whole life, which is what tells peers that this rank is alive,
// and marks the segment closed as it ends (a clean exit); its maintenance checks now and then that
// the peers still live.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "transport/arena.hpp"
#include "transport/shm/node_file.hpp"
#include "transport/shm/segment.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace shm {

class ShmTransport : public Transport {
 public:
  ShmTransport();
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
  bool linksOnDemand() const override { return true; }
  bool meetsPeersAtInit() const override { return true; }
  ProgressEngine* prepareOnDemand(TransportContext& ctx, const std::vector<int>& peers) override;
  void linkOnDemand(TransportContext& ctx, const std::vector<int>& peers, LinkSink* sink) override;
  void linkTo(int peer) noexcept override;
  /// Stops the progress engine (the link table's; it stops it too), so that the segments can go.
  void stop() noexcept {
    if (engine_ != nullptr) engine_->stop();
  }
  /// The node's shared arena (after connect), or nullptr when it has none.
  const LocalArena* arena() const { return arena_.bytes > 0 ? &arena_ : nullptr; }
  Services services() override { return Services{arena(), nullptr}; }

 private:
  class LinkRequests;

  /// Runs `step`; if it throws, tells the local peers through the store (shm/<rank>) first.
  template <typename F>
  auto reportingFailure(TransportContext& ctx, F&& step) -> decltype(step());
  /// The node's layout (its ranks, each one's slot in the others' segments, the sizes): throws
  /// on settings out of range.
  void plan(const TransportContext& ctx);
  /// The ring that `writer` writes in `owner`'s segment.
  int slotIn(int owner, int writer) const;
  /// Waits until `ready()` says so, sleeping with `sleep(until)` in between, and looking now and
  /// then whether the peer `missing()` names gave up. Throws its reason, or at ctx.deadline a
  /// timeout naming it and what it did not do (`what`: "create", "join").
  template <typename Ready, typename Missing, typename Sleep>
  void waitFor(TransportContext& ctx, const char* what, Ready&& ready, Missing&& missing, Sleep&& sleep);
  /// Creates the node's file (its lowest rank) or opens it once ready; adopts its layout.
  void openNodeFile(TransportContext& ctx);
  /// Step 1: the node's file, our segment in it (its rings backed or left for their writers),
  /// our progress thread; then we joined.
  void joinNode(TransportContext& ctx, bool backRings);
  /// Steps 2 and 3: returns once every local rank joined (the lowest then unlinks the file).
  /// Throws naming a rank that gave up meanwhile or is missing at ctx.deadline.
  void waitForNode(TransportContext& ctx);
  /// Local rank `rank`'s segment.
  Segment segmentOf(int rank) const;
  /// Throws the peer's own setup error if it gave up (it set shm/<peer> to it).
  void peerGaveUp(TransportContext& ctx, int peer);
  /// Step 4 for one peer whose segment is attached: the connection, with cross-memory attach
  /// where the probe passes.
  std::unique_ptr<Connection> connectionTo(int peer);
  /// Step 5: the node's arena, where every local rank's direct area has one size; `backed`: ours
  /// was backed at init (else it is as it comes into use).
  void makeArena(const Nonce& commId, bool backed);

  int rank_ = 0;
  std::vector<int> local_;       // the node's ranks, ascending
  std::vector<int> localIndex_;  // by rank: its index in local_, or -1
  size_t ringBytes_ = 0;
  size_t directBytes_ = 0;
  std::shared_ptr<FailureState> failure_;
  NodeFile node_;
  Segment mine_;
  LocalArena arena_;
  ProgressEngine* engine_ = nullptr;  // the link table's, which outlives us; stopped before the segments go
  // Links on first use.
  LinkSink* sink_ = nullptr;
  std::unique_ptr<std::atomic<bool>[]> linking_;  // by rank: linkTo began
  std::unique_ptr<LinkRequests> requests_;
};

}  // namespace shm
}  // namespace loom
