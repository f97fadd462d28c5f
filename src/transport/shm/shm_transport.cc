#include "transport/shm/shm_transport.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
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

std::vector<std::optional<std::string>> ShmTransport::awaitFromPeers(TransportContext& ctx,
                                                                     const std::vector<std::string>& keys,
                                                                     const std::vector<int>& peers) {
  std::vector<std::optional<std::string>> out(keys.size());
  std::vector<size_t> left(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) left[i] = i;
  for (;;) {
    // A key other than the peer's endpoint is asked for with the endpoint, which says whether the
    // peer gave up.
    std::vector<std::string> ask;
    for (size_t i : left) {
      const std::string endpoint = "shm/" + std::to_string(peers[i]);
      ask.push_back(keys[i]);
      if (keys[i] != endpoint) ask.push_back(endpoint);
    }
    auto got = ctx.store->tryGetMany(ask);
    std::vector<size_t> still;
    size_t j = 0;
    for (size_t i : left) {
      const bool withEndpoint = keys[i] != "shm/" + std::to_string(peers[i]);
      const auto& v = got[j++];
      const auto* endpoint = withEndpoint ? &got[j++] : nullptr;
      if (v) {
        out[i] = std::string(v->begin(), v->end());
        continue;
      }
      if (endpoint != nullptr && *endpoint &&
          std::string(endpoint->value().begin(), endpoint->value().end()).rfind(kGaveUp, 0) == 0)
        peerGaveUp(ctx, peers[i]);
      still.push_back(i);
    }
    left.swap(still);
    if (left.empty() || ctx.deadline.expired()) return out;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
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
  Store& store = *ctx.store;
  // Every rank of the node gets a slot in every other's segment: slot = index among the node's
  // ranks leaving out the segment's owner.
  std::vector<int> local;
  for (int r = 0; r < ctx.size; ++r)
    if (reaches(ctx, r)) local.push_back(r);
  auto slotIn = [&](int owner, int writer) {
    int idx = static_cast<int>(std::find(local.begin(), local.end(), writer) - local.begin());
    int ownerIdx = static_cast<int>(std::find(local.begin(), local.end(), owner) - local.begin());
    return idx > ownerIdx ? idx - 1 : idx;
  };
  const int slots = static_cast<int>(local.size()) - 1;
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

  // 1. Our segment, our progress thread, our announcement.
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
  store.setString("shm/" + std::to_string(rank),
                  strFormat("%s %zu %d %" PRIu64, name.c_str(), mine_.bytes(), static_cast<int>(getpid()),
                            static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&mine_.header()->cookie))));

  // 2. Attach the peers' segments and tell each owner how it went.
  std::map<int, std::pair<int, uint64_t>> pidCookie;  // peer -> (pid, cookie address)
  std::vector<std::string> endpointKeys, ackKeys;
  for (int p : peers) {
    endpointKeys.push_back("shm/" + std::to_string(p));
    ackKeys.push_back("shm-att/" + std::to_string(rank) + "/" + std::to_string(p));
  }
  const auto endpoints = awaitFromPeers(ctx, endpointKeys, peers);
  std::vector<std::pair<std::string, Bytes>> attached;
  for (size_t k = 0; k < peers.size(); ++k) {
    const int p = peers[k];
    const auto& v = endpoints[k];
    if (!v) {
      LOOM_THROW_PEER(
          ErrorCode::Timeout, rank, p,
          strFormat("rank %d did not publish its shared-memory segment within %.0f s", p, ctx.deadline.totalSeconds()));
    }
    const std::string& text = *v;
    if (text.rfind(kGaveUp, 0) == 0) peerGaveUp(ctx, p);
    char peerName[256] = {0};
    size_t bytes = 0;
    int pid = 0;
    uint64_t cookieAddr = 0;
    if (std::sscanf(text.c_str(), "%255s %zu %d %" SCNu64, peerName, &bytes, &pid, &cookieAddr) != 4) {
      LOOM_THROW_PEER(ErrorCode::Remote, rank, p,
                      strFormat("rank %d published a malformed shared-memory endpoint \"%s\"", p, text.c_str()));
    }
    const std::string ack = "shm-att/" + std::to_string(p) + "/" + std::to_string(rank);
    try {
      theirs_[p] = Segment::attach(peerName, rank, p, bytes, ctx.commId);
    } catch (const Error& e) {
      store.setMany(attached);
      peerGaveUp(ctx, p);  // its segment went because it failed: say why it did
      store.setString(ack, e.what());
      throw;
    }
    attached.emplace_back(ack, Bytes{'o', 'k'});
    pidCookie[p] = {pid, cookieAddr};
  }
  store.setMany(attached);  // every answer in one request

  // 3. Once every peer has attached ours, unlink it.
  const auto acks = awaitFromPeers(ctx, ackKeys, peers);
  for (size_t k = 0; k < peers.size(); ++k) {
    const int p = peers[k];
    const auto& v = acks[k];
    if (!v) {
      LOOM_THROW_PEER(ErrorCode::Timeout, rank, p,
                      strFormat("rank %d did not attach shared-memory segment /dev/shm%s within %.0f s", p,
                                name.c_str(), ctx.deadline.totalSeconds()));
    }
    const std::string& answer = *v;
    if (answer != "ok") {
      LOOM_THROW_PEER(ErrorCode::Remote, rank, p,
                      strFormat("rank %d could not attach this rank's shared-memory segment /dev/shm%s: %s", p,
                                name.c_str(), answer.c_str()));
    }
  }
  mine_.unlink();

  // 4. Connections, with cross-memory attach where the probe passes.
  const bool cmaWanted = cmaParam() != 0;
  for (int p : peers) {
    Segment& theirs = theirs_[p];
    const auto [pid, cookieAddr] = pidCookie[p];
    const bool cma = cmaWanted && cmaProbe(pid, cookieAddr, theirs.header()->cookie);
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
