#include "transport/link_table.hpp"

#include <algorithm>

#include "core/descriptors.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "transport/on_demand_connection.hpp"
#include "transport/self_connection.hpp"

namespace loom {
namespace {

LOOM_PARAM_STR(
    connectParam, "LOOM_CONNECT", "auto",
    "lazy: a link (shared memory, TCP or ib) is made the first time an operation needs that peer (a job that "
    "only all-reduces holds O(log N) links per rank); eager: every peer is linked at init (a full mesh); auto: "
    "eager up to 8 ranks, lazy above");

// Up to this many ranks a full mesh costs a few links, made at init, and the first operation
// keeps its latency; above it, links are made on first use.
constexpr int kEagerUpTo = 8;

bool lazyLinks(int rank, int size) {
  const std::string v = connectParam();
  if (v == "auto" || v.empty()) return size > kEagerUpTo;
  if (v == "lazy") return true;
  if (v == "eager") return false;
  LOOM_THROW(ErrorCode::InvalidArgument, rank, "LOOM_CONNECT=" + v + ": expected auto, lazy or eager");
}

}  // namespace

LinkTable::LinkTable(int rank, int size) : rank_(rank), size_(size), engine_(rank), sendEngine_(rank) {}

LinkTable::~LinkTable() {
  stopThreads();
  conns_.clear();
  transports_.clear();
}

void LinkTable::publish(TransportContext& ctx, const std::vector<TransportEntry>& entries) {
  ctx.engine = &engine_;
  ctx.sendEngine = &sendEngine_;
  engines_ = {&engine_, &sendEngine_};
  ctx.engineFor = [this](WakeWord wake) -> ProgressEngine& {
    wordEngines_.push_back(std::make_unique<ProgressEngine>(rank_, wake));
    engines_.push_back(wordEngines_.back().get());
    return *wordEngines_.back();
  };
  for (const auto& e : entries) {
    transports_.push_back(e.make());
    allowed_.emplace_back(e.name);
    transports_.back()->publish(ctx);
  }
}

bool LinkTable::linksAllOnFirstUse() const {
  if (!lazyLinks(rank_, size_)) return false;
  for (const auto& t : transports_)
    if (!t->linksOnDemand() || t->meetsPeersAtInit()) return false;
  return true;
}

std::vector<std::vector<int>> LinkTable::peersByTransport(const TransportContext& ctx) const {
  const auto nodeOf = [&](int r) { return ctx.nodeOf[static_cast<size_t>(r)]; };
  std::vector<std::vector<int>> peersOf(transports_.size());
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    size_t t = 0;
    while (t < transports_.size() && !transports_[t]->reaches(ctx, r)) ++t;
    if (t < transports_.size()) {
      peersOf[t].push_back(r);
      continue;
    }
    std::string names;
    for (size_t i = 0; i < allowed_.size(); ++i) {
      const std::string why = transports_[i]->absentReason();
      names += (names.empty() ? "" : ", ") + allowed_[i] + (why.empty() ? "" : " (absent: " + why + ")");
    }
    if (nodeOf(r) == nodeOf(rank_)) {
      LOOM_THROW_PEER(ErrorCode::InvalidArgument, rank_, r,
                      strFormat("no allowed transport (%s) reaches rank %d, on this rank's node: allow shm or tcp "
                                "in LOOM_TRANSPORT",
                                names.c_str(), r));
    }
    LOOM_THROW_PEER(ErrorCode::InvalidArgument, rank_, r,
                    strFormat("no allowed transport (%s) reaches rank %d, which is on another node (node %d; this "
                              "rank is on node %d): shared memory links only ranks of one node; allow tcp in "
                              "LOOM_TRANSPORT",
                              names.c_str(), r, nodeOf(r), nodeOf(rank_)));
  }
  return peersOf;
}

size_t LinkTable::reserveDescriptors(TransportContext& ctx, const std::vector<std::vector<int>>& peersOf, bool lazy) {
  const auto onDemand = [&](size_t t) { return lazy && transports_[t]->linksOnDemand(); };
  const auto perLink = [&](size_t t) {
    return static_cast<size_t>(std::max(0, transports_[t]->descriptorsPerLink(ctx)));
  };
  size_t now = 0;  // the links made now
  for (size_t t = 0; t < transports_.size(); ++t)
    if (!onDemand(t)) now += peersOf[t].size() * perLink(t);
  // Those made on first use: room for what a job that only runs collectives links (about
  // 2 log2 N peers), asked for now so that the soft limit is raised once, not failed on later.
  size_t likely = 0;
  size_t logN = 0;
  while ((size_t{1} << logN) < static_cast<size_t>(size_)) ++logN;
  for (size_t t = 0; t < transports_.size(); ++t)
    if (onDemand(t)) likely += std::min(peersOf[t].size(), 2 * logN + 2) * perLink(t);
  if (likely > 0) {
    const std::string why = makeRoomForDescriptors(likely, /*mustFit=*/false);
    if (why.empty())
      releaseDescriptors(likely);
    else
      LOOM_INFO("links made on first use may run short of descriptors: %s", why.c_str());
  }
  if (now == 0) return 0;
  const std::string why = makeRoomForDescriptors(now);
  if (!why.empty()) {
    LOOM_THROW(ErrorCode::System, rank_,
               strFormat("cannot link %d peers: %s. Raise the limit (ulimit -n), or use fewer sockets per peer "
                         "(LOOM_SOCKETS_PER_PEER), or link on first use (LOOM_CONNECT=lazy)",
                         size_ - 1, why.c_str()));
  }
  return now;
}

void LinkTable::makeLinks(TransportContext& ctx, const std::vector<std::vector<int>>& peersOf, bool lazy) {
  const auto n = static_cast<size_t>(size_);
  conns_.resize(n);
  names_.assign(n, "self");
  transportTo_.assign(n, nullptr);
  props_.assign(n, selfLinkProperties());
  for (size_t t = 0; t < transports_.size(); ++t) {
    if (peersOf[t].empty()) continue;
    std::vector<std::unique_ptr<Connection>> conns;
    if (lazy && transports_[t]->linksOnDemand()) {
      // Stand-ins, driven by the engine that will drive the links made behind them.
      ProgressEngine* driver = transports_[t]->prepareOnDemand(ctx, peersOf[t]);
      for (int peer : peersOf[t]) {
        conns.push_back(std::make_unique<OnDemandConnection>(rank_, peer, transports_[t].get()));
        (driver != nullptr ? *driver : engine_).add(conns.back().get());
      }
    } else {
      conns = transports_[t]->connect(ctx, peersOf[t]);
    }
    const LinkProperties props = transports_[t]->properties();  // settings read once, not per peer
    for (size_t i = 0; i < peersOf[t].size(); ++i) {
      const auto p = static_cast<size_t>(peersOf[t][i]);
      conns_[p] = std::move(conns[i]);
      names_[p] = transports_[t]->name();
      transportTo_[p] = transports_[t].get();
      props_[p] = props;
      props_[p].deviceBuffers = conns_[p]->takesDeviceBuffers();
    }
  }
}

void LinkTable::connect(TransportContext& ctx) {
  const std::vector<std::vector<int>> peersOf = peersByTransport(ctx);
  // Links made on first use hold no descriptor yet: room is made for them when they are.
  const bool lazy = lazyLinks(rank_, size_);
  // Promised to these links until they are open (ranks as threads of one process connect at once).
  struct Promise {
    size_t n;
    ~Promise() {
      if (n > 0) releaseDescriptors(n);
    }
  } promise{reserveDescriptors(ctx, peersOf, lazy)};
  makeLinks(ctx, peersOf, lazy);
  const auto n = static_cast<size_t>(size_);
  nodeLink_ = selfLinkProperties();
  if (size_ > 1) {
    TransportContext oneNode = ctx;
    oneNode.nodeOf.assign(n, 0);
    for (const auto& t : transports_)
      if (t->reaches(oneNode, (rank_ + 1) % size_)) {
        nodeLink_ = t->properties();
        break;
      }
  }
  conns_[static_cast<size_t>(rank_)] = std::make_unique<SelfConnection>(rank_);
  for (auto& c : conns_) c->attachAnySource(&anySource_);
  for (size_t t = 0; t < transports_.size(); ++t)
    if (!peersOf[t].empty() && lazy && transports_[t]->linksOnDemand())
      transports_[t]->linkOnDemand(ctx, peersOf[t], this);
  // A link made on first use says whether it will take device buffers once the transport knows
  // the peers (linkOnDemand).
  for (size_t p = 0; p < n; ++p)
    if (static_cast<int>(p) != rank_) props_[p].deviceBuffers = conns_[p]->takesDeviceBuffers();
  for (auto* e : engines_) e->seal();
  // The transports' services, found once here (every collective asks).
  for (const auto& t : transports_) {
    const Transport::Services s = t->services();
    if (arena_ == nullptr) arena_ = s.arena;
    if (ipcCache_ == nullptr) ipcCache_ = s.ipcCache;
  }
}

bool LinkTable::linked(int peer) const {
  if (peer == rank_) return false;
  const auto* c = dynamic_cast<const OnDemandConnection*>(conns_[static_cast<size_t>(peer)].get());
  return c == nullptr || c->linked();
}

int LinkTable::linkCount() const {
  int n = 0;
  for (int r = 0; r < size_; ++r) n += linked(r) ? 1 : 0;
  return n;
}

void LinkTable::adopt(int peer, Connection& conn) {
  conn.drivenThrough(*conns_[static_cast<size_t>(peer)]);
  conn.attachAnySource(&anySource_);
}

void LinkTable::linked(int peer, std::unique_ptr<Connection> conn) noexcept {
  static_cast<OnDemandConnection&>(*conns_[static_cast<size_t>(peer)]).install(std::move(conn));
}

void LinkTable::linkFailed(int peer, const Status& why) noexcept { conns_[static_cast<size_t>(peer)]->failAll(why); }

RegistrationStats LinkTable::registrationStats(int peer) const {
  Transport* t = transportTo_[static_cast<size_t>(peer)];
  return t != nullptr ? t->registrationStats() : RegistrationStats{};
}

Registration LinkTable::registerMemory(int peer, const void* addr, size_t bytes) const {
  Transport* t = transportTo_[static_cast<size_t>(peer)];
  return t != nullptr ? t->registerMemory(addr, bytes) : Transport::registerKeyless(addr, bytes);
}

bool LinkTable::pollAnother(int peer) noexcept {
  if (size_ <= 2) return false;
  // One of the others, in turn (never this rank, whose self connection needs no polling).
  unsigned k = nextPolled_.fetch_add(1, std::memory_order_relaxed) % static_cast<unsigned>(size_ - 1);
  int other = static_cast<int>(k) >= rank_ ? static_cast<int>(k) + 1 : static_cast<int>(k);
  if (other == peer) return false;
  return conns_[static_cast<size_t>(other)]->progress();
}

void LinkTable::pollBegin(int peer, bool alsoAttend) noexcept {
  Connection& c = *conns_[static_cast<size_t>(peer)];
  if (ProgressEngine* e = c.engine(); e != nullptr) e->pollBegin(c, alsoAttend);
}

void LinkTable::pollEnd(int peer, bool alsoAttend) noexcept {
  Connection& c = *conns_[static_cast<size_t>(peer)];
  if (ProgressEngine* e = c.engine(); e != nullptr) e->pollEnd(c, alsoAttend);
}

void LinkTable::attend(bool on) noexcept {
  for (auto* e : engines_) e->attend(on);
}

void LinkTable::waiting(bool on) noexcept {
  for (auto* e : engines_) e->waiting(on);
}

void LinkTable::irecvAny(const RequestPtr& req, const RecvSpec& spec) {
  std::vector<Connection*> links;
  for (auto& c : conns_)
    if (c) links.push_back(c.get());
  anySource_.post(req, spec, links);
}

void LinkTable::failAll(const Status& status) noexcept {
  for (auto& c : conns_)
    if (c) c->quiesce(status);
  anySource_.failAll(status);
  for (auto& c : conns_)
    if (c) c->failAll(status);
}

void LinkTable::stopThreads() noexcept {
  engine_.stop();
  sendEngine_.stop();
  for (auto& e : wordEngines_) e->stop();
}

void LinkTable::close(const Status& bye) noexcept {
  stopThreads();
  failAll(bye);
  conns_.clear();
  transports_.clear();
}

}  // namespace loom
