#include "transport/link_table.hpp"

#include <algorithm>

#include "core/descriptors.hpp"
#include "core/format.hpp"
#include "transport/self_connection.hpp"

namespace loom {

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

void LinkTable::connect(TransportContext& ctx) {
  const auto nodeOf = [&](int r) { return ctx.nodeOf[static_cast<size_t>(r)]; };
  std::vector<std::vector<int>> peersOf(transports_.size());
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    size_t t = 0;
    while (t < transports_.size() && !transports_[t]->reaches(ctx, r)) ++t;
    if (t == transports_.size()) {
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
    peersOf[t].push_back(r);
  }
  size_t descriptors = 0;
  for (size_t t = 0; t < transports_.size(); ++t)
    descriptors += peersOf[t].size() * static_cast<size_t>(std::max(0, transports_[t]->descriptorsPerLink(ctx)));
  // Promised to these links until they are open (ranks as threads of one process connect at once).
  struct Promise {
    size_t n;
    ~Promise() {
      if (n > 0) releaseDescriptors(n);
    }
  } promise{0};
  if (descriptors > 0) {
    const std::string why = makeRoomForDescriptors(descriptors);
    promise.n = why.empty() ? descriptors : 0;
    if (!why.empty()) {
      LOOM_THROW(ErrorCode::System, rank_,
                 strFormat("cannot link %d peers: %s. Raise the limit (ulimit -n), or use fewer sockets per peer "
                           "(LOOM_SOCKETS_PER_PEER)",
                           size_ - 1, why.c_str()));
    }
  }
  const auto n = static_cast<size_t>(size_);
  conns_.resize(n);
  names_.assign(n, "self");
  transportTo_.assign(n, nullptr);
  props_.assign(n, selfLinkProperties());
  for (size_t t = 0; t < transports_.size(); ++t) {
    if (peersOf[t].empty()) continue;
    auto conns = transports_[t]->connect(ctx, peersOf[t]);
    for (size_t i = 0; i < peersOf[t].size(); ++i) {
      const auto p = static_cast<size_t>(peersOf[t][i]);
      conns_[p] = std::move(conns[i]);
      names_[p] = transports_[t]->name();
      transportTo_[p] = transports_[t].get();
      props_[p] = transports_[t]->properties();
      props_[p].deviceBuffers = conns_[p]->takesDeviceBuffers();
    }
  }
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
  for (auto* e : engines_) e->seal();
  // The transports' services, found once here (every collective asks).
  for (const auto& t : transports_) {
    if (const auto* p = dynamic_cast<const shm::ArenaProvider*>(t.get()); p != nullptr && arena_ == nullptr)
      arena_ = p->arena();
    if (auto* p = dynamic_cast<cuda_ipc::IpcCacheProvider*>(t.get()); p != nullptr && ipcCache_ == nullptr)
      ipcCache_ = p->ipcCache();
  }
}

RegistrationStats LinkTable::registrationStats(int peer) const {
  Transport* t = transportTo_[static_cast<size_t>(peer)];
  return t != nullptr ? t->registrationStats() : RegistrationStats{};
}

Registration LinkTable::registerMemory(int peer, const void* addr, size_t bytes, Status* error) const {
  Transport* t = transportTo_[static_cast<size_t>(peer)];
  return t != nullptr ? t->registerMemory(addr, bytes, error) : Transport::registerKeyless(addr, bytes, error);
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
