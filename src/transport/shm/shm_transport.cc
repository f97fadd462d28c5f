#include "transport/shm/shm_transport.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "transport/shm/cma.hpp"
#include "transport/shm/shm_connection.hpp"

namespace loom {
namespace shm {
namespace {

// The arena's processClock (arena.hpp): one per communicator per process.
std::shared_ptr<std::atomic<uint64_t>> processClockFor(const Nonce& commId) {
  static std::mutex mu;
  static auto* clocks = new std::map<Nonce, std::weak_ptr<std::atomic<uint64_t>>>();  // process lifetime
  std::lock_guard<std::mutex> lock(mu);
  auto& weak = (*clocks)[commId];
  auto clock = weak.lock();
  if (!clock) {
    clock = std::make_shared<std::atomic<uint64_t>>(0);
    weak = clock;
  }
  return clock;
}

LOOM_PARAM_INT(latencyParam, "LOOM_SHM_LATENCY_US", 2, "cost model: microseconds per message over shared memory");
LOOM_PARAM_INT(bandwidthParam, "LOOM_SHM_MBPS", 5000, "cost model: MB/s per shared-memory link");
LOOM_PARAM_INT(ringBytesParam, "LOOM_SHM_RING_BYTES", 1 << 20,
               "bytes of each shared-memory ring (one per local peer and direction); by default smaller where "
               "LOOM_SHM_RING_BUDGET would be exceeded");
LOOM_PARAM_INT(ringBudgetParam, "LOOM_SHM_RING_BUDGET", 8 << 20,
               "most bytes of rings in one rank's shared-memory segment (one ring per local peer): with more local "
               "peers than fit at LOOM_SHM_RING_BYTES each, unless that is set, the rings shrink (not below "
               "16 KiB), so that a node's shared memory grows linearly with its ranks, not quadratically");
LOOM_PARAM_INT(eagerBytesParam, "LOOM_SHM_EAGER_BYTES", 64 * 1024,
               "largest shared-memory message copied through the ring; larger ones are read directly from the "
               "sender (process_vm_readv) where the kernel allows it");
LOOM_PARAM_INT(directBytesParam, "LOOM_SHM_DIRECT_BYTES", 4 << 20,
               "bytes of each rank's direct area, where the intra-node all-reduce stages data that the node's "
               "ranks read in place (0: none)");
LOOM_PARAM_INT(cmaParam, "LOOM_SHM_CMA", 1,
               "1: use process_vm_readv for large shared-memory messages where it works; 0: always copy through "
               "the ring");

constexpr const char* kGaveUp = "error: ";

}  // namespace

LinkProperties ShmTransport::linkProperties() {
  LinkProperties p;
  p.latencyUs = static_cast<double>(latencyParam());
  p.gbps = static_cast<double>(std::max<int64_t>(1, bandwidthParam())) / 1000.0;
  p.ringChunkBytes = 512 * 1024;
  p.parallelChannels = false;
  p.readsInPlace = true;
  return p;
}

ShmTransport::~ShmTransport() { stop(); }

bool ShmTransport::reaches(const TransportContext& ctx, int peer) const {
  return !ctx.nodeOf.empty() && ctx.nodeOf[static_cast<size_t>(peer)] == ctx.nodeOf[static_cast<size_t>(ctx.rank)];
}

std::vector<std::unique_ptr<Connection>> ShmTransport::connect(TransportContext& ctx, const std::vector<int>& peers) {
  if (peers.empty()) return {};
  try {
    return setUp(ctx, peers);
  } catch (const Error& e) {
    // Tell the local peers at once (they may be waiting on us), instead of leaving them to their
    // deadline. A peer that already read our endpoint finds the segment gone and looks again.
    ctx.store->setString("shm/" + std::to_string(ctx.rank), std::string(kGaveUp) + e.what());
    throw;
  }
}

void ShmTransport::attachAll(TransportContext& ctx, const std::vector<int>& peers,
                             const std::function<int(int owner, int writer)>& slotIn) {
  const int rank = ctx.rank;
  std::vector<int> toAttach = peers, toHear = peers;  // whose segment we lack; who lacks ours
  // Only a peer that gave up says so through the store: looked at now and then, less often the
  // longer the wait, so that a node of waiting ranks does not load the store's host.
  auto look = std::chrono::milliseconds(5);
  auto nextLook = std::chrono::steady_clock::now() + look;
  auto nap = std::chrono::microseconds(100);
  for (;;) {
    bool progress = false;
    std::vector<int> still;
    for (int p : toAttach) {
      Segment seg;
      bool ready = false;
      try {
        ready = Segment::tryAttach(Segment::nameFor(ctx.commId, p), rank, p, ctx.commId, &seg);
      } catch (const Error&) {
        peerGaveUp(ctx, p);  // its segment went because it failed: say why it did
        throw;
      }
      if (!ready) {
        still.push_back(p);
        continue;
      }
      seg.markAttached(slotIn(p, rank));
      theirs_[p] = std::move(seg);
      progress = true;
    }
    toAttach.swap(still);
    still.clear();
    for (int p : toHear)
      if (!mine_.attachedBy(slotIn(rank, p))) still.push_back(p);
    progress = progress || still.size() < toHear.size();
    toHear.swap(still);
    if (toAttach.empty() && toHear.empty()) return;

    const auto now = std::chrono::steady_clock::now();
    if (now >= nextLook || ctx.deadline.expired()) {
      std::vector<std::string> keys;
      std::vector<int> whose;
      for (const auto* list : {&toAttach, &toHear})
        for (int p : *list) {
          keys.push_back("shm/" + std::to_string(p));
          whose.push_back(p);
        }
      const auto said = ctx.store->tryGetMany(keys);
      for (size_t i = 0; i < said.size(); ++i)
        if (said[i] && std::string(said[i]->begin(), said[i]->end()).rfind(kGaveUp, 0) == 0) peerGaveUp(ctx, whose[i]);
      look = std::min<std::chrono::milliseconds>(look * 2, std::chrono::milliseconds(100));
      nextLook = now + look;
    }
    if (ctx.deadline.expired()) {
      if (!toAttach.empty()) {
        const int p = toAttach.front();
        LOOM_THROW_PEER(ErrorCode::Timeout, rank, p,
                        strFormat("rank %d did not create its shared-memory segment /dev/shm%s within %.0f s", p,
                                  Segment::nameFor(ctx.commId, p).c_str(), ctx.deadline.totalSeconds()));
      }
      const int p = toHear.front();
      LOOM_THROW_PEER(ErrorCode::Timeout, rank, p,
                      strFormat("rank %d did not attach shared-memory segment /dev/shm%s within %.0f s", p,
                                mine_.name().c_str(), ctx.deadline.totalSeconds()));
    }
    // Short naps while peers keep arriving, longer ones while none does.
    nap = progress ? std::chrono::microseconds(100)
                   : std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(4));
    std::this_thread::sleep_for(nap);
  }
}

void ShmTransport::peerGaveUp(TransportContext& ctx, int peer) {
  auto v = ctx.store->tryGet("shm/" + std::to_string(peer));
  if (!v) return;
  std::string text(v->begin(), v->end());
  if (text.rfind(kGaveUp, 0) != 0) return;
  LOOM_THROW_PEER(
      ErrorCode::Remote, ctx.rank, peer,
      strFormat("rank %d gave up setting up shared memory: %s", peer, text.substr(std::strlen(kGaveUp)).c_str()));
}

std::vector<std::unique_ptr<Connection>> ShmTransport::setUp(TransportContext& ctx, const std::vector<int>& peers) {
  std::vector<std::unique_ptr<Connection>> out;
  const int rank = ctx.rank;
  // Every rank of the node gets a slot in every other's segment: slot = index among the node's
  // ranks leaving out the segment's owner.
  std::vector<int> local, localIndex(static_cast<size_t>(ctx.size), -1);
  for (int r = 0; r < ctx.size; ++r)
    if (reaches(ctx, r)) {
      localIndex[static_cast<size_t>(r)] = static_cast<int>(local.size());
      local.push_back(r);
    }
  auto slotIn = [&localIndex](int owner, int writer) {
    const int idx = localIndex[static_cast<size_t>(writer)], ownerIdx = localIndex[static_cast<size_t>(owner)];
    return idx > ownerIdx ? idx - 1 : idx;
  };
  const int slots = static_cast<int>(local.size()) - 1;
  if (slots > kMaxSlots) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank,
               strFormat("%d ranks on one node: shared memory links at most %d (LOOM_TRANSPORT=^shm avoids it)",
                         slots + 1, kMaxSlots + 1));
  }
  int64_t ringParam = ringBytesParam();
  if (ringParam < 4096 || ringParam > (int64_t{1} << 40)) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank,
               strFormat("LOOM_SHM_RING_BYTES=%lld is out of range (4096 to 2^40)", static_cast<long long>(ringParam)));
  }
  size_t ringBytes = (static_cast<size_t>(ringParam) + 4095) / 4096 * 4096;
  // Every segment is backed in full (fallocate, so that a full /dev/shm is an error at init, not
  // a SIGBUS later): without a budget a node of L ranks would hold L * (L - 1) rings.
  if (!ringBytesParamIsSet() && slots > 0) {
    const size_t budget = static_cast<size_t>(std::max<int64_t>(0, ringBudgetParam()));
    const size_t fair = budget / static_cast<size_t>(slots) / 4096 * 4096;
    ringBytes = std::min(ringBytes, std::max<size_t>(fair, 16 << 10));
  }

  // 1. Our segment and our progress thread (which holds its liveness mutex); then it is ready.
  const std::string name = Segment::nameFor(ctx.commId, rank);
  const int64_t directParam = directBytesParam();
  if (directParam < 0 || directParam > (int64_t{1} << 40)) {
    LOOM_THROW(
        ErrorCode::InvalidArgument, rank,
        strFormat("LOOM_SHM_DIRECT_BYTES=%lld is out of range (0 to 2^40)", static_cast<long long>(directParam)));
  }
  const size_t directBytes = (static_cast<size_t>(directParam) + 4095) / 4096 * 4096;
  mine_ = Segment::create(name, rank, slots, ringBytes, directBytes, ctx.commId);
  SegmentHeader* header = mine_.header();
  engine_ = &ctx.engineFor(WakeWord{&header->doorbell, &header->sleepers, &header->attending, &header->waiters});
  engine_->start([header] { pthread_mutex_lock(&header->alive); },
                 [header] {
                   header->closed.store(1);
                   pthread_mutex_unlock(&header->alive);
                 });
  mine_.markReady();

  // 2. Attach the peers' segments as they become ready, and wait for every peer to have attached
  // ours; then unlink it.
  attachAll(ctx, peers, slotIn);
  mine_.unlink();

  // 4. Connections, with cross-memory attach where the probe passes.
  const bool cmaWanted = cmaParam() != 0;
  for (int p : peers) {
    Segment& theirs = theirs_[p];
    const int pid = theirs.header()->pid;
    const bool cma = cmaWanted && cmaProbe(pid, theirs.header()->cookieAddr, theirs.header()->cookie);
    ShmOptions opt;
    opt.eagerBytes = static_cast<size_t>(std::max<int64_t>(0, eagerBytesParam()));
    opt.cma = cma;
    const int inSlot = slotIn(rank, p), outSlot = slotIn(p, rank);
    RingView in(mine_.ring(inSlot), mine_.ringData(inSlot), mine_.ringBytes());
    RingView outRing(theirs.ring(outSlot), theirs.ringData(outSlot), theirs.ringBytes());
    std::string how = cma ? strFormat("single copy (process_vm_readv) above %s", bytesText(opt.eagerBytes).c_str())
                          : std::string(cmaWanted ? "process_vm_readv refused: every message copied through the ring"
                                                  : "every message copied through the ring (LOOM_SHM_CMA=0)");
    std::string desc = strFormat("rank %d <-> rank %d: shm, rings of %s each way (segments %s, %s); %s", rank, p,
                                 bytesText(ringBytes).c_str(), name.c_str(), theirs.name().c_str(), how.c_str());
    auto conn = std::make_unique<ShmConnection>(rank, p, in, outRing, mine_.header(), theirs.header(), pid, ctx.failure,
                                                opt, desc);
    engine_->add(conn.get());
    out.push_back(std::move(conn));
  }
  engine_->seal();

  // 5. The node's arena: every local rank's direct area, usable only if all have one of a size.
  bool sameSize = directBytes > 0;
  for (const auto& [p, seg] : theirs_) sameSize = sameSize && seg.directBytes() == directBytes;
  if (sameSize) {
    arena_.ranks = local;
    arena_.bytes = directBytes;
    for (size_t i = 0; i < local.size(); ++i) {
      const int r = local[i];
      SegmentHeader* h = r == rank ? mine_.header() : theirs_[r].header();
      if (r == rank) arena_.me = static_cast<int>(i);
      arena_.buffers.push_back(r == rank ? mine_.direct() : theirs_[r].direct());
      arena_.steps.push_back(&h->directStep);
      arena_.calls.push_back(h->directCall);
      arena_.current.push_back(h->current);
      static_assert(sizeof(h->deviceRecord) == LocalArena::kDeviceRecordBytes, "record sizes agree");
      arena_.deviceRecords.push_back(h->deviceRecord);
    }
    arena_.processClock = processClockFor(ctx.commId);
    std::vector<SegmentHeader*> headers;
    for (int r : local) headers.push_back(r == rank ? mine_.header() : theirs_[r].header());
    arena_.gone = [headers](int index) -> std::string {
      SegmentHeader* h = headers[static_cast<size_t>(index)];
      const std::string why = recordedFailure(h);
      if (!why.empty()) return "it failed: " + why;
      if (h->closed.load() != 0) return "it closed its communicator";
      if (probeOwner(h) == PeerState::Died)
        return "it died (its process exited or was killed without closing its communicator)";
      return "";
    };
  }
  return out;
}

}  // namespace shm
}  // namespace loom
