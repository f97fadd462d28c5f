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
#include "transport/shm/node_file.hpp"
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

ShmTransport::ShmTransport() = default;
ShmTransport::~ShmTransport() { stop(); }

bool ShmTransport::reaches(const TransportContext& ctx, int peer) const {
  return !ctx.nodeOf.empty() && ctx.nodeOf[static_cast<size_t>(peer)] == ctx.nodeOf[static_cast<size_t>(ctx.rank)];
}

template <typename Ready, typename Missing, typename Sleep>
void ShmTransport::waitFor(TransportContext& ctx, const char* what, Ready&& ready, Missing&& missing, Sleep&& sleep) {
  // Only a peer that gave up says so through the store: looked at now and then, less often the
  // longer the wait, so that a node of waiting ranks does not load the store's host.
  auto look = std::chrono::milliseconds(5);
  auto nextLook = std::chrono::steady_clock::now() + look;
  for (;;) {
    if (ready()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= nextLook || ctx.deadline.expired()) {
      // The peer the wait stopped at: one that gave up holds every rank at it (a rank it held
      // back gives up in turn, naming it), so one key a look tells what the whole list would.
      peerGaveUp(ctx, missing());
      look = std::min<std::chrono::milliseconds>(look * 2, std::chrono::milliseconds(100));
      nextLook = now + look;
    }
    if (ctx.deadline.expired()) {
      const int p = missing();
      LOOM_THROW_PEER(ErrorCode::Timeout, ctx.rank, p,
                      strFormat("rank %d did not %s its node's shared-memory segment /dev/shm%s within %.0f s", p, what,
                                NodeFile::nameFor(ctx.commId, local_[0]).c_str(), ctx.deadline.totalSeconds()));
    }
    sleep(std::min(nextLook, ctx.deadline.at()));
  }
}

void ShmTransport::openNodeFile(TransportContext& ctx) {
  const int leader = local_[0];
  const std::string name = NodeFile::nameFor(ctx.commId, leader);
  if (rank_ == leader) {
    NodeLayout layout;
    layout.ranks = static_cast<int>(local_.size());
    layout.ringBytes = ringBytes_;
    layout.directBytes = directBytes_;
    node_ = NodeFile::create(name, leader, layout, ctx.commId);
  } else {
    const int ranks = static_cast<int>(local_.size());
    auto nap = std::chrono::microseconds(50);  // doubled up to 2 ms while the file is not there
    waitFor(
        ctx, "create",
        [&] {
          try {
            return NodeFile::tryOpen(name, rank_, leader, ranks, ctx.commId, &node_);
          } catch (const Error&) {
            peerGaveUp(ctx, leader);  // its file went because it failed: say why it did
            throw;
          }
        },
        [&] { return leader; },
        [&](std::chrono::steady_clock::time_point until) {
          std::this_thread::sleep_until(std::min(until, std::chrono::steady_clock::now() + nap));
          nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(2));
        });
  }
  // The node's layout is its leader's (the settings of ranks of one job normally agree).
  const NodeLayout layout = node_.layout();
  if (layout.ringBytes != ringBytes_ || layout.directBytes != directBytes_) {
    LOOM_INFO("shared memory: rings of %s and direct areas of %s, as rank %d (the node's first) set them",
              bytesText(layout.ringBytes).c_str(), bytesText(layout.directBytes).c_str(), leader);
  }
  ringBytes_ = layout.ringBytes;
  directBytes_ = layout.directBytes;
}

void ShmTransport::waitForNode(TransportContext& ctx) {
  // The last rank to join wakes the others; the map (in the node header: waiting reads no peer's
  // segment) names the first missing one, for a look in the store or a timeout.
  size_t joined = 0;
  waitFor(
      ctx, "join", [&] { return node_.allJoined(); },
      [&] {
        while (joined < local_.size() && node_.joined(static_cast<int>(joined))) ++joined;
        return local_[std::min(joined, local_.size() - 1)];
      },
      [&](std::chrono::steady_clock::time_point until) { node_.waitForJoins(until); });
  if (rank_ == local_[0]) node_.unlink();
  node_.closeDescriptor();
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

// The peers that linked to this rank on first use (their bits in our segment's linkedBy): the
// engine links back to each once, so that what they write is read.
class ShmTransport::LinkRequests : public ProgressSource {
 public:
  explicit LinkRequests(ShmTransport* t)
      : t_(t), header_(t->mine_.header()), handled_((t->local_.size() + 62) / 64, 0) {}
  bool progress() noexcept override {
    if (!pending()) return false;
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    // The count first: a request whose bump comes after this load is seen on the next call.
    seen_.store(header_->linkRequests.load(std::memory_order_acquire), std::memory_order_relaxed);
    const int me = t_->localIndex_[static_cast<size_t>(t_->rank_)];
    for (size_t w = 0; w < handled_.size(); ++w) {
      uint64_t fresh = header_->linkedBy[w].load(std::memory_order_acquire) & ~handled_[w];
      handled_[w] |= fresh;
      while (fresh != 0) {
        const int slot = static_cast<int>(w * 64) + __builtin_ctzll(fresh);
        fresh &= fresh - 1;
        t_->linkTo(t_->local_[static_cast<size_t>(slot < me ? slot : slot + 1)]);
      }
    }
    return true;
  }
  bool needsEngine() const noexcept override { return pending(); }
  bool hasWork() const noexcept override { return pending(); }

 private:
  bool pending() const noexcept {
    return header_->linkRequests.load(std::memory_order_acquire) != seen_.load(std::memory_order_relaxed);
  }
  ShmTransport* const t_;
  SegmentHeader* const header_;
  std::mutex mu_;
  std::atomic<uint32_t> seen_{0};
  std::vector<uint64_t> handled_;  // guarded by mu_
};

template <typename F>
auto ShmTransport::reportingFailure(TransportContext& ctx, F&& step) -> decltype(step()) {
  try {
    return step();
  } catch (const Error& e) {
    // Tell the local peers at once (they may be waiting on us), instead of leaving them to their
    // deadline. A peer that already read our endpoint finds the segment gone and looks again.
    ctx.store->setString("shm/" + std::to_string(ctx.rank), std::string(kGaveUp) + e.what());
    throw;
  }
}

std::vector<std::unique_ptr<Connection>> ShmTransport::connect(TransportContext& ctx, const std::vector<int>& peers) {
  if (peers.empty()) return {};
  return reportingFailure(ctx, [&] {
    plan(ctx);
    joinNode(ctx, /*backRings=*/true);
    // 2. Wait for every local rank to have joined; then the file's name goes.
    waitForNode(ctx);
    std::vector<std::unique_ptr<Connection>> out;
    for (int p : peers) {
      out.push_back(connectionTo(p));
      engine_->add(out.back().get());
    }
    engine_->seal();
    makeArena(ctx.commId, /*backed=*/true);
    return out;
  });
}

ProgressEngine* ShmTransport::prepareOnDemand(TransportContext& ctx, const std::vector<int>& peers) {
  if (peers.empty()) return nullptr;
  return reportingFailure(ctx, [&] {
    plan(ctx);
    joinNode(ctx, /*backRings=*/false);
    return engine_;
  });
}

void ShmTransport::linkOnDemand(TransportContext& ctx, const std::vector<int>& peers, LinkSink* sink) {
  if (peers.empty()) return;
  reportingFailure(ctx, [&] {
    waitForNode(ctx);
    makeArena(ctx.commId, /*backed=*/false);
  });
  linking_ = std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(ctx.size));
  sink_ = sink;
  requests_ = std::make_unique<LinkRequests>(this);
  engine_->add(requests_.get());
}

void ShmTransport::plan(const TransportContext& ctx) {
  rank_ = ctx.rank;
  failure_ = ctx.failure;
  // Every rank of the node gets a slot in every other's segment: slot = index among the node's
  // ranks leaving out the segment's owner.
  localIndex_.assign(static_cast<size_t>(ctx.size), -1);
  local_.clear();
  for (int r = 0; r < ctx.size; ++r)
    if (reaches(ctx, r)) {
      localIndex_[static_cast<size_t>(r)] = static_cast<int>(local_.size());
      local_.push_back(r);
    }
  const int slots = static_cast<int>(local_.size()) - 1;
  if (slots > kMaxSlots) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank_,
               strFormat("%d ranks on one node: shared memory links at most %d (LOOM_TRANSPORT=^shm avoids it)",
                         slots + 1, kMaxSlots + 1));
  }
  const int64_t ringParam = ringBytesParam();
  if (ringParam < 4096 || ringParam > (int64_t{1} << 40)) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank_,
               strFormat("LOOM_SHM_RING_BYTES=%lld is out of range (4096 to 2^40)", static_cast<long long>(ringParam)));
  }
  ringBytes_ = (static_cast<size_t>(ringParam) + 4095) / 4096 * 4096;
  // Without a budget a node of L ranks would hold L * (L - 1) rings (every one of them backed when
  // links are made at init).
  if (!ringBytesParamIsSet() && slots > 0) {
    const size_t budget = static_cast<size_t>(std::max<int64_t>(0, ringBudgetParam()));
    const size_t fair = budget / static_cast<size_t>(slots) / 4096 * 4096;
    ringBytes_ = std::min(ringBytes_, std::max<size_t>(fair, 16 << 10));
  }
  const int64_t directParam = directBytesParam();
  if (directParam < 0 || directParam > (int64_t{1} << 40)) {
    LOOM_THROW(
        ErrorCode::InvalidArgument, rank_,
        strFormat("LOOM_SHM_DIRECT_BYTES=%lld is out of range (0 to 2^40)", static_cast<long long>(directParam)));
  }
  directBytes_ = (static_cast<size_t>(directParam) + 4095) / 4096 * 4096;
}

int ShmTransport::slotIn(int owner, int writer) const {
  const int idx = localIndex_[static_cast<size_t>(writer)], ownerIdx = localIndex_[static_cast<size_t>(owner)];
  return idx > ownerIdx ? idx - 1 : idx;
}

Segment ShmTransport::segmentOf(int rank) const { return node_.segment(localIndex_[static_cast<size_t>(rank)]); }

void ShmTransport::joinNode(TransportContext& ctx, bool backRings) {
  // 1. The node's file, our segment in it and our progress thread (which holds its liveness
  // mutex); then we have joined.
  openNodeFile(ctx);
  const int me = localIndex_[static_cast<size_t>(rank_)];
  node_.back(me, rank_, backRings);
  mine_ = segmentOf(rank_);
  mine_.initialise(rank_, ctx.commId);
  if (segmentTestHooks().afterCreate) segmentTestHooks().afterCreate(mine_.header());
  SegmentHeader* header = mine_.header();
  engine_ = &ctx.engineFor(WakeWord{&header->doorbell, &header->sleepers, &header->attending, &header->waiters});
  engine_->start(
      [header] {
        pthread_mutex_lock(&header->alive);
        header->aliveHolder.store(static_cast<int32_t>(gettid()), std::memory_order_release);
      },
      [header] {
        header->closed.store(1);
        pthread_mutex_unlock(&header->alive);
      });
  node_.markJoined(me);
}

std::unique_ptr<Connection> ShmTransport::connectionTo(int p) {
  const Segment theirs = segmentOf(p);
  const int pid = theirs.header()->pid;
  const bool cmaWanted = cmaParam() != 0;
  const bool cma = cmaWanted && cmaProbe(pid, theirs.header()->cookieAddr, theirs.header()->cookie);
  ShmOptions opt;
  opt.eagerBytes = static_cast<size_t>(std::max<int64_t>(0, eagerBytesParam()));
  opt.cma = cma;
  const int inSlot = slotIn(rank_, p), outSlot = slotIn(p, rank_);
  RingView in(mine_.ring(inSlot), mine_.ringData(inSlot), mine_.ringBytes());
  RingView outRing(theirs.ring(outSlot), theirs.ringData(outSlot), theirs.ringBytes());
  std::string how = cma ? strFormat("single copy (process_vm_readv) above %s", bytesText(opt.eagerBytes).c_str())
                        : std::string(cmaWanted ? "process_vm_readv refused: every message copied through the ring"
                                                : "every message copied through the ring (LOOM_SHM_CMA=0)");
  std::string desc = strFormat("rank %d <-> rank %d: shm, rings of %s each way (segment %s); %s", rank_, p,
                               bytesText(ringBytes_).c_str(), mine_.name().c_str(), how.c_str());
  return std::make_unique<ShmConnection>(rank_, p, in, outRing, mine_.header(), theirs.header(), pid, failure_, opt,
                                         desc);
}

void ShmTransport::linkTo(int peer) noexcept {
  if (sink_ == nullptr || linking_[static_cast<size_t>(peer)].exchange(true)) return;
  try {
    const auto began = std::chrono::steady_clock::now();
    const Segment theirs = segmentOf(peer);
    // A peer gone before its first use that never linked to us (so left nothing to read): named
    // now, as a link made at init names it (shm_failure.cc). One that did is linked all the same,
    // and its link reads what it left before it says the peer is gone.
    const PeerState st = mine_.linkedBy(slotIn(rank_, peer)) ? PeerState::Alive : probeOwner(theirs.header());
    const std::string theirReason = st == PeerState::Alive ? std::string() : recordedFailure(theirs.header());
    if (st == PeerState::Closed && theirReason.empty()) {
      // A clean exit: this link fails; the communicator lives on, as with a link made at init.
      sink_->linkFailed(peer, Status::error(ErrorCode::Remote,
                                            strFormat("rank %d closed its communicator before this rank first "
                                                      "needed a link to it",
                                                      peer),
                                            peer));
      return;
    }
    if (st != PeerState::Alive || !theirReason.empty()) {
      LOOM_THROW_PEER(
          ErrorCode::Remote, rank_, peer,
          strFormat("rank %d %s before this rank first needed a link to it%s", peer,
                    st == PeerState::Died ? "died (its process exited or was killed without closing its communicator)"
                    : st == PeerState::Closed ? "closed its communicator"
                                              : "stopped",
                    theirReason.empty() ? "" : (": after an error of its own: " + theirReason).c_str()));
    }
    const int outSlot = slotIn(peer, rank_);
    theirs.backRing(outSlot, rank_);
    auto conn = connectionTo(peer);
    theirs.requestLink(outSlot);
    sink_->adopt(peer, *conn);
    LOOM_INFO("%s (linked on first use, in %.1f ms)", conn->describe().c_str(),
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
    sink_->linked(peer, std::move(conn));
  } catch (...) {
    const Status s = statusFromCurrentException();
    failure_->fail(s);
    sink_->linkFailed(peer, s);
  }
}

void ShmTransport::makeArena(const Nonce& commId, bool backed) {
  // 5. The node's arena: every local rank's direct area (one size: the node's layout). Addresses
  // only: no peer's segment is read until a collective uses the arena.
  const size_t directBytes = directBytes_;
  if (directBytes > 0) {
    arena_.ranks = local_;
    arena_.bytes = directBytes;
    std::vector<SegmentHeader*> headers;
    for (size_t i = 0; i < local_.size(); ++i) {
      const Segment seg = node_.segment(static_cast<int>(i));
      SegmentHeader* h = seg.header();
      if (local_[i] == rank_) arena_.me = static_cast<int>(i);
      headers.push_back(h);
      arena_.buffers.push_back(seg.direct());
      ArenaWords* words = node_.arenaWords(static_cast<int>(i));
      arena_.steps.push_back(&words->step);
      arena_.calls.push_back(words->call);
      arena_.current.push_back(words->current);
      static_assert(sizeof(h->deviceRecord) == LocalArena::kDeviceRecordBytes, "record sizes agree");
      arena_.deviceRecords.push_back(h->deviceRecord);
    }
    arena_.processClock = processClockFor(commId);
    if (!backed) {
      // Collectives of a communicator write its area one at a time; the count only grows.
      auto upTo = std::make_shared<std::atomic<size_t>>(0);
      const Segment* seg = &mine_;
      arena_.backOwnTo = [seg, upTo, directBytes](size_t bytes) {
        const size_t from = upTo->load(std::memory_order_acquire);
        if (bytes <= from) return;
        const size_t to = std::min(directBytes, (bytes + 4095) / 4096 * 4096);
        seg->backDirect(from, to);
        upTo->store(to, std::memory_order_release);
      };
    }
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
}

}  // namespace shm
}  // namespace loom
