#include "transport/ib/ib_transport.hpp"

#include <fcntl.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "transport/memory_monitor.hpp"

namespace loom {
namespace ib {
namespace {

LOOM_PARAM_INT(latencyParam, "LOOM_IB_LATENCY_US", 3, "one-way latency (us) the cost model assumes for ib links");

constexpr const char* kGaveUp = "error: ";
// Appended to a link's queue pair addresses by a rank that has GPUDirect RDMA.
constexpr const char* kGpuDirect = "|gpu";

// Where a rank says whether it has GPUDirect RDMA ("1" or "0"; in its record).
std::string gpuKey(int rank) { return "ibgpu/" + std::to_string(rank); }

}  // namespace

// The completion channel of every connection's queue, in the receive engine: an event names the
// queue, whose connection takes what it holds.
class IbTransport::ChannelWatch : public PollHandler {
 public:
  ChannelWatch(const Verbs& v, ibv_comp_channel* ch) : v_(v), ch_(ch) {}
  void onPollEvents(uint32_t) noexcept override {
    for (;;) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      if (v_.getCqEvent(ch_, &cq, &context) != 0) return;  // drained (the descriptor is non-blocking)
      v_.ackCqEvents(cq, 1);
      static_cast<IbConnection*>(context)->onCompletionEvent();
    }
  }

 private:
  const Verbs& v_;
  ibv_comp_channel* ch_;
};

// The device's asynchronous events, in the receive engine (the descriptor is non-blocking).
class IbTransport::AsyncWatch : public PollHandler {
 public:
  explicit AsyncWatch(IbTransport& t) : t_(t) {}
  void onPollEvents(uint32_t) noexcept override { t_.dispatchAsync(); }

 private:
  IbTransport& t_;
};

IbTransport::IbTransport() = default;

IbTransport::~IbTransport() {
  // The link table stopped the engines and destroyed the connections (and their queues) first;
  // the ends of links still in their exchange (or failed in it) go before the port.
  onDemand_.reset();
  exchanges_.clear();
  if (cache_) {
    const RegistrationStats s = cache_->stats();
    if (s.hits + s.misses > 0)
      LOOM_INFO(
          "ib: registration cache: %llu buffer(s) registered, %llu use(s) of a registration made before "
          "(%.1f%%), %llu dropped as their memory changed",
          static_cast<unsigned long long>(s.misses), static_cast<unsigned long long>(s.hits),
          100.0 * static_cast<double>(s.hits) / static_cast<double>(s.hits + s.misses),
          static_cast<unsigned long long>(s.invalidations));
  }
  if (deviceRegs_) {
    const RegistrationStats s = deviceRegs_->stats();
    if (s.hits + s.misses > 0)
      LOOM_INFO("ib: device memory: %llu allocation(s) registered (%s), %llu use(s) of a registration made before",
                static_cast<unsigned long long>(s.misses), toString(gpuDirect_.mode),
                static_cast<unsigned long long>(s.hits));
  }
  deviceRegs_.reset();
  cache_.reset();
  if (channel_ != nullptr) port_->context().verbs->destroyCompChannel(channel_);
}

LinkProperties IbTransport::properties() const {
  LinkProperties p;
  p.latencyUs = static_cast<double>(latencyParam());
  // What a port of this speed sustains one way, less the headers' share.
  const double gbits = port_ ? port_->context().port.speed.gbps() : 100.0;
  p.gbps = std::max(1.0, gbits / 8.0 * 0.9);
  p.ringChunkBytes = size_t{1} << 20;
  p.parallelChannels = true;
  p.oneSidedWrites = true;
  p.needsRegistration = true;
  return p;
}

bool IbTransport::reaches(const TransportContext& ctx, int peer) const {
  (void)ctx;
  (void)peer;
  return port_ != nullptr;
}

void IbTransport::publish(TransportContext& ctx) {
  std::string why;
  Locality where;
  const Verbs* v = verbs(&why);
  if (v != nullptr) {
    // Ranks of a node are usually numbered in a row: the rank spreads them over the node's ports.
    const int rank = ctx.rank;
    port_ = OpenPort::open(
        *v, ibSettingsFromEnv(),
        [&where, rank] {
          where = callerLocality(rank);
          return where;
        },
        &why);
  }
  if (!port_) {
    why_ = why;
    LOOM_INFO("ib: not used: %s", why.c_str());
    return;
  }
  if (!side_.publish(ctx, &why)) {
    why_ = why;
    LOOM_INFO("ib: not used: %s", why.c_str());
    port_.reset();
    return;
  }
  channel_ = v->createCompChannel(port_->context().context);
  if (channel_ == nullptr) {
    why_ = strFormat("cannot create a completion channel: %s", std::strerror(errno));
    LOOM_INFO("ib: not used: %s", why_.c_str());
    port_.reset();
    return;
  }
  fcntl(channel_->fd, F_SETFL, fcntl(channel_->fd, F_GETFL) | O_NONBLOCK);
  watch_ = std::make_unique<ChannelWatch>(*v, channel_);
  ctx.engine->add(channel_->fd, watch_.get(), EPOLLIN);
  ibv_context* device = port_->context().context;
  fcntl(device->async_fd, F_SETFL, fcntl(device->async_fd, F_GETFL) | O_NONBLOCK);
  asyncWatch_ = std::make_unique<AsyncWatch>(*this);
  ctx.engine->add(device->async_fd, asyncWatch_.get(), EPOLLIN);
  cache_ = std::make_unique<RegistrationCache>(static_cast<Registrar&>(*this), RegistrationCache::Limits::fromEnv(),
                                               MemoryMonitor::get());
  gpuDirect_ = chooseGpuDirect(port_->context());
  if (gpuDirect_.mode != GpuDirectMode::Off) {
    deviceRegs_ = std::make_unique<DeviceRegistrations>(port_->context(), gpuDirect_.mode,
                                                        RegistrationCache::Limits::fromEnv().maxEntries);
  }
  // Whether device buffers can go by RDMA from this end: links made on first use are planned with it
  // at init, before the queue pairs' addresses (which say it too) are swapped.
  ctx.store->setString(gpuKey(ctx.rank), deviceRegs_ ? "1" : "0");
  LOOM_INFO("ib: GPUDirect RDMA %s: %s", gpuDirect_.mode == GpuDirectMode::Off ? "not used" : "through",
            gpuDirect_.mode == GpuDirectMode::Off
                ? gpuDirect_.why.c_str()
                : strFormat("%s (%s)", toString(gpuDirect_.mode), gpuDirect_.why.c_str()).c_str());
  const std::string& gpu = where.gpuPciPath;
  LOOM_INFO("ib: rank %d uses %s%s%s", ctx.rank, port_->describe().c_str(), gpu.empty() ? "" : ", for its GPU at ",
            gpu.empty() ? "" : gpu.substr(gpu.rfind('/') + 1).c_str());
}

Registration IbTransport::registerMemory(const void* addr, size_t bytes) {
  if (!cache_) return registerKeyless(addr, bytes);
  Status error;
  Registration r = cache_->acquire(addr, bytes, &error);
  if (r == nullptr) throw error.toError(-1);
  return r;
}

Status IbTransport::registerRange(uintptr_t begin, size_t bytes, RegisteredRange* out) noexcept {
  const PortContext& pc = port_->context();
  ibv_mr* mr = pc.verbs->regMr(pc.pd, reinterpret_cast<void*>(begin), bytes,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (mr == nullptr) {
    const int e = errno;
    return Status::error(ErrorCode::System,
                         strFormat("ib: registering %zu bytes at %#zx with %s failed: %s%s", bytes,
                                   static_cast<size_t>(begin), pc.port.device.c_str(), std::strerror(e),
                                   e == ENOMEM ? " (the locked-memory limit? raise ulimit -l)" : ""));
  }
  out->begin = begin;
  out->bytes = bytes;
  out->localKey = mr->lkey;
  out->remoteKey = mr->rkey;
  out->handle = mr;
  return Status::success();
}

void IbTransport::deregisterRange(const RegisteredRange& range) noexcept {
  port_->context().verbs->deregMr(static_cast<ibv_mr*>(range.handle));
}

std::vector<std::string> IbTransport::awaitFromPeers(TransportContext& ctx, const std::vector<std::string>& keys,
                                                     const std::vector<int>& peers, const char* what) {
  std::vector<std::string> out(keys.size());
  std::vector<size_t> missing(keys.size());
  for (size_t i = 0; i < missing.size(); ++i) missing[i] = i;
  // The first round reads the keys alone (those in the records are answered without the store);
  // the next ones the peers' give-up marks too.
  for (bool first = true;; first = false) {
    const size_t stride = first ? 1 : 2;
    std::vector<std::string> ask;
    for (size_t i : missing) {
      ask.push_back(keys[i]);
      if (!first) ask.push_back("ib/" + std::to_string(peers[i]));
    }
    const auto got = ctx.store->tryGetMany(ask);
    std::vector<size_t> still;
    for (size_t k = 0; k < missing.size(); ++k) {
      const size_t i = missing[k];
      const std::optional<Bytes>& v = got[stride * k];
      const std::optional<Bytes>* gaveUp = first ? nullptr : &got[stride * k + 1];
      if (v) {
        out[i].assign(v->begin(), v->end());
      } else if (gaveUp != nullptr && gaveUp->has_value()) {
        const std::string text((*gaveUp)->begin(), (*gaveUp)->end());
        LOOM_THROW_PEER(ErrorCode::Remote, ctx.rank, peers[i],
                        strFormat("rank %d gave up setting up its ib links: %s", peers[i],
                                  text.substr(std::strlen(kGaveUp)).c_str()));
      } else {
        still.push_back(i);
      }
    }
    missing.swap(still);
    if (missing.empty()) return out;
    if (ctx.deadline.expired()) {
      std::string names;
      for (size_t k = 0; k < missing.size() && k < 16; ++k)
        names += (k > 0 ? ", " : "") + std::to_string(peers[missing[k]]);
      if (missing.size() > 16) names += strFormat(" and %zu more", missing.size() - 16);
      LOOM_THROW_PEER(
          ErrorCode::Timeout, ctx.rank, peers[missing.front()],
          strFormat("rank(s) %s did not %s within %.0f s", names.c_str(), what, ctx.deadline.totalSeconds()));
    }
    // Wait on the store's side for the first key missing, a slice at a time: a peer that gave up
    // is read in the next round.
    constexpr std::chrono::milliseconds kSlice{200};
    ctx.store->get(keys[missing.front()],
                   Deadline(std::min(kSlice, std::chrono::milliseconds(ctx.deadline.remainingMs()))));
  }
}

std::vector<std::unique_ptr<Connection>> IbTransport::connect(TransportContext& ctx, const std::vector<int>& peers) {
  try {
    return setUp(ctx, peers);
  } catch (const Error& e) {
    ctx.store->setString("ib/" + std::to_string(ctx.rank), std::string(kGaveUp) + e.what());
    throw;
  }
}

std::vector<std::unique_ptr<Connection>> IbTransport::setUp(TransportContext& ctx, const std::vector<int>& peers) {
  const int rank = ctx.rank;
  if (!port_) LOOM_THROW(ErrorCode::Internal, rank, "ib: connect without a port: " + why_);
  std::vector<IbConnection*> mine;
  std::vector<std::unique_ptr<Connection>> out;
  std::vector<std::pair<std::string, Bytes>> addresses;
  std::vector<std::string> theirKeys, sideKeys;
  for (int p : peers) {
    auto c = makeLink(rank, p, ctx.failure);
    const std::string mineText = addressesOf(*c);
    addresses.emplace_back(strFormat("ib/%d/%d", rank, p), Bytes(mineText.begin(), mineText.end()));
    theirKeys.push_back(strFormat("ib/%d/%d", p, rank));
    sideKeys.push_back(SideChannels::key(p));
    mine.push_back(c.get());
    out.push_back(std::move(c));
  }
  // Every pair's queue pair addresses in one request, those meant for this rank in a few.
  ctx.store->setMany(addresses);
  const std::vector<std::string> theirAddresses = awaitFromPeers(ctx, theirKeys, peers, "publish its ib queue pairs");
  for (size_t i = 0; i < peers.size(); ++i) connectTo(*mine[i], theirAddresses[i]);
  // No word that the peers' queue pairs are up: nothing is sent before every rank's links are set
  // up (the communicator's meeting says so, once every rank's transports have connected).
  const std::vector<std::string> sideRecords =
      awaitFromPeers(ctx, sideKeys, peers, "publish its ib side-channel address");
  std::map<int, Bytes> records;
  for (size_t i = 0; i < peers.size(); ++i) records[peers[i]] = Bytes(sideRecords[i].begin(), sideRecords[i].end());
  std::map<int, Socket> sides = side_.connect(ctx, records);
  for (size_t i = 0; i < peers.size(); ++i) mine[i]->watchSide(std::move(sides[peers[i]]), ctx.engine, ctx.lastWordOf);
  std::lock_guard<std::mutex> lock(connsMu_);
  conns_.insert(conns_.end(), mine.begin(), mine.end());
  return out;
}

std::unique_ptr<IbConnection> IbTransport::makeLink(int rank, int peer, std::shared_ptr<FailureState> failure) {
  IbOptions options;
  options.qps = port_->context().settings.qpsPerConnection;
  const std::string desc = strFormat(
      "rank %d <-> rank %d: ib over %s, %d queue pair(s), eager up to %s, larger "
      "messages written in place (RDMA) from registered memory",
      rank, peer, port_->describe().c_str(), options.qps, bytesText(IbConnection::eagerLimit(options)).c_str());
  auto c = std::make_unique<IbConnection>(rank, peer, port_->context(), channel_, *cache_, std::move(failure), options,
                                          desc);
  c->setAdapterReason([this, link = c.get()] { return adapterReason(*link); });
  return c;
}

std::string IbTransport::addressesOf(const IbConnection& c) const {
  return c.addresses() + (deviceRegs_ ? kGpuDirect : "");
}

void IbTransport::connectTo(IbConnection& c, std::string theirs) {
  const size_t flag = theirs.find(kGpuDirect);
  const bool peerGpuDirect = flag != std::string::npos;
  if (peerGpuDirect) theirs.resize(flag);
  c.connect(theirs);
  if (peerGpuDirect && deviceRegs_) c.takeDeviceBuffers(deviceRegs_.get());
}

void IbTransport::linkOnDemand(TransportContext& ctx, const std::vector<int>& peers, LinkSink* sink) {
  if (!port_) LOOM_THROW(ErrorCode::Internal, ctx.rank, "ib: linking without a port: " + why_);
  // The peers' side-channel addresses are in their records: no request to the store.
  std::map<int, Bytes> records;
  for (int p : peers) {
    const auto r = ctx.store->tryGet(SideChannels::key(p));
    if (!r) LOOM_THROW_PEER(ErrorCode::Remote, ctx.rank, p, strFormat("ib: rank %d published no side channel", p));
    records[p] = *r;
    const auto gpu = ctx.store->tryGet(gpuKey(p));
    if (gpu && !gpu->empty() && (*gpu)[0] == '1') gpuPeers_.insert(p);
  }
  lazy_.rank = ctx.rank;
  lazy_.engine = ctx.engine;
  lazy_.failure = ctx.failure;
  lazy_.lastWordOf = ctx.lastWordOf;
  lazy_.timeout = ctx.deadline.total();
  lazy_.sink = sink;
  TransportContext one = ctx;
  one.socketsPerPeer = 1;  // the side channel; the queue pairs carry the data
  onDemand_ = std::make_unique<sockets::OnDemandLinks>(
      one, side_.interfaces(), side_.listeners(),
      std::make_shared<const std::map<int, sockets::Endpoints>>(SideChannels::endpoints(ctx.rank, records)), sink,
      [this](int peer, std::vector<Socket> sockets, double tookMs) { formOnDemand(peer, std::move(sockets), tookMs); },
      "ib side-channel port");
}

void IbTransport::linkTo(int peer) noexcept {
  if (onDemand_) onDemand_->linkTo(peer);
}

void IbTransport::formOnDemand(int peer, std::vector<Socket> sockets, double tookMs) {
  const auto began = std::chrono::steady_clock::now();
  auto conn = makeLink(lazy_.rank, peer, lazy_.failure);
  const std::string mine = addressesOf(*conn);
  LinkExchange::Steps steps;
  steps.connect = [this, peer](IbConnection& c, const std::string& theirs) {
    connectTo(c, theirs);
    // From here the peer may send (it has our word once we say "up"): the link takes messages
    // for the communicator's receives, from any source too, before it is handed on.
    lazy_.sink->adopt(peer, c);
  };
  steps.done = [this, peer, tookMs, began](std::unique_ptr<IbConnection> c, Socket side) {
    c->watchSide(std::move(side), lazy_.engine, lazy_.lastWordOf);
    {
      std::lock_guard<std::mutex> lock(connsMu_);
      conns_.push_back(c.get());
    }
    LOOM_INFO("%s (linked on first use, in %.1f ms)", c->describe().c_str(),
              tookMs + std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
    lazy_.sink->linked(peer, std::move(c));
  };
  steps.failed = [this, peer](const Status& why, std::unique_ptr<IbConnection> c) {
    lazy_.failure->fail(why);
    if (c) {
      lazy_.sink->linked(peer, std::move(c));  // failed: what is kept for it fails too
    } else {
      lazy_.sink->linkFailed(peer, why);
    }
  };
  if (lazy_.lastWordOf)
    steps.lastWord = [lastWordOf = lazy_.lastWordOf, peer](std::chrono::milliseconds wait) {
      return lastWordOf(peer, wait);
    };
  exchanges_.push_back(std::make_unique<LinkExchange>(lazy_.rank, peer, std::move(conn), mine, std::move(sockets.at(0)),
                                                      lazy_.engine, lazy_.timeout, std::move(steps)));
}

void IbTransport::drainAsyncLocked() noexcept {
  const PortContext& pc = port_->context();
  ibv_async_event e;
  while (pc.verbs->getAsyncEvent(pc.context, &e) == 0) {
    stash_.push_back(e);
    // Acknowledged at once: destroying a queue pair waits for its events' acknowledgements.
    pc.verbs->ackAsyncEvent(&e);
  }
}

void IbTransport::dispatchAsync() noexcept {
  std::vector<ibv_async_event> events;
  {
    std::lock_guard<std::mutex> lock(asyncMu_);
    drainAsyncLocked();
    events.swap(stash_);
    // Kept for adapterReason: a link may meet the consequence (a refused post) while its event
    // is on its way to it here, and must still say why.
    for (const ibv_async_event& e : events) {
      if (said_.size() == kSaidKept) said_.pop_front();
      said_.push_back(e);
    }
  }
  for (const ibv_async_event& e : events) {
    std::vector<IbConnection*> hit;
    {
      std::lock_guard<std::mutex> lock(connsMu_);
      for (IbConnection* c : conns_)
        if (isAbout(e, *c)) hit.push_back(c);
    }
    const std::string what = describeEvent(e);
    if (hit.empty()) LOOM_INFO("ib: event: %s", what.c_str());
    for (IbConnection* c : hit) c->onAdapterEvent(what);
  }
}

std::string IbTransport::adapterReason(const IbConnection& c) noexcept {
  std::lock_guard<std::mutex> lock(asyncMu_);
  drainAsyncLocked();
  for (const ibv_async_event& e : stash_)
    if (isAbout(e, c)) return describeEvent(e);
  for (auto e = said_.rbegin(); e != said_.rend(); ++e)
    if (isAbout(*e, c)) return describeEvent(*e);
  return std::string();
}

bool IbTransport::isAbout(const ibv_async_event& e, const IbConnection& c) const {
  switch (e.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR:
      return c.owns(e.element.qp);
    case IBV_EVENT_CQ_ERR:
      return c.owns(e.element.cq);
    case IBV_EVENT_PORT_ERR:
      return e.element.port_num == port_->context().port.port;
    case IBV_EVENT_DEVICE_FATAL:
      return true;
    default:
      return false;
  }
}

std::string IbTransport::describeEvent(const ibv_async_event& e) const {
  const PortContext& pc = port_->context();
  const char* name = pc.verbs->eventTypeStr(e.event_type);
  const char* dev = pc.port.device.c_str();
  switch (e.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR:
      return strFormat("%s put a queue pair of the link in error (%s)", dev, name);
    case IBV_EVENT_CQ_ERR:
      return strFormat("%s put the link's completion queue in error (%s)", dev, name);
    case IBV_EVENT_PORT_ERR:
      return strFormat("port %d of %s went down (%s)", e.element.port_num, dev, name);
    case IBV_EVENT_DEVICE_FATAL:
      return strFormat("%s failed (%s)", dev, name);
    default:
      return strFormat("%s on %s port %d", name, dev, pc.port.port);
  }
}

}  // namespace ib
}  // namespace loom
