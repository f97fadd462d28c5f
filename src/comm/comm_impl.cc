#include "comm/comm_impl.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <thread>

#include "bootstrap/auth.hpp"
#include "collectives/plan.hpp"
#include "comm/dump_signal.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/signature.hpp"
#include "core/topology.hpp"
#include "transport/registry.hpp"
#include "transport/self_connection.hpp"

namespace loom {
namespace detail {
namespace {

LOOM_PARAM_INT(timeoutParam, "LOOM_TIMEOUT", 300,
               "seconds any wait may last (Options::timeout per communicator, Work::wait(timeout) per call); a "
               "timeout names what was awaited from whom, carries the hang report, and fails the communicator");
LOOM_PARAM_INT(initTimeoutParam, "LOOM_INIT_TIMEOUT", 120,
               "seconds all ranks have to join a communicator; the error names the ranks that did not");
LOOM_PARAM_INT(socketsPerPeerParam, "LOOM_SOCKETS_PER_PEER", 2, "TCP sockets striped per peer (1 to 16)");

// A failing rank's word in the store (leaveWord / lastWordOf): its first error, this long at most.
constexpr size_t kMaxWordBytes = 4096;
// Each store request on a failure path gives up after this (a stopped store host must not add
// the whole operation timeout to an error that is already known).
constexpr std::chrono::milliseconds kStoreNoteLimit(2000);
// The request number a departing rank's final flight record answers: every one.
constexpr int64_t kFinalRecord = std::numeric_limits<int64_t>::max();

std::string lastWordKey(int rank) { return "left/" + std::to_string(rank); }

std::string hostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

CommImpl::CommImpl(int rank, int size, StoreAccess access, const Options& options, const std::string& origin)
    : rank_(rank),
      size_(size),
      options_(options),
      name_(options.name.empty() ? "loom" : options.name),
      failure_(std::make_shared<FailureState>()),
      access_(std::move(access)) {
  LogRankScope logScope(rank);
  timeout_ = options.timeout.count() > 0 ? options.timeout : std::chrono::milliseconds(timeoutParam() * 1000);
  const auto initTimeout =
      options.initTimeout.count() > 0 ? options.initTimeout : std::chrono::milliseconds(initTimeoutParam() * 1000);
  const int sockets = options.socketsPerPeer > 0 ? options.socketsPerPeer : static_cast<int>(socketsPerPeerParam());
  if (sockets < 1 || sockets > 16) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank, strFormat("sockets per peer must be 1 to 16, not %d", sockets));
  }
  Deadline deadline(initTimeout);
  Store& store = *access_.store;

  // 1. Announce ourselves (host identity first: join/ says that both are there), so that a rank
  // that waits can say who is missing.
  HostIdentity host = localHostIdentity();
  if (!options.hostId.empty()) host.override_ = options.hostId;
  store.setString("host/" + std::to_string(rank), host.key());
  // The machine (its CPUs), which network namespaces or containers may split into several nodes.
  store.setString("machine/" + std::to_string(rank), host.bootId);
  const std::string me = strFormat("%s pid %d", hostName().c_str(), static_cast<int>(getpid()));
  store.setString("join/" + std::to_string(rank), me);

  // 2. Publish every transport's endpoint, then wait for everyone to have joined.
  engine_ = std::make_unique<ProgressEngine>(rank);
  sendEngine_ = std::make_unique<ProgressEngine>(rank);
  try {
    join(options, sockets, deadline, origin);
  } catch (...) {
    // Members are destroyed in reverse order without the destructor: stop the engine thread
    // first so that it never touches a connection being freed.
    engine_->stop();
    sendEngine_->stop();
    for (auto& t : transports_) t->stop();
    conns_.clear();
    throw;
  }
  registerForDump(this);
}

void CommImpl::join(const Options& options, int sockets, const Deadline& deadline, const std::string& origin) {
  const int rank = rank_, size = size_;
  Store& store = *access_.store;
  auto entries = selectTransports(options.transports);
  TransportContext ctx;
  ctx.rank = rank;
  ctx.size = size;
  ctx.store = &store;
  ctx.key = access_.key;
  ctx.commId = access_.commId;
  ctx.engine = engine_.get();
  ctx.sendEngine = sendEngine_.get();
  ctx.failure = failure_;
  ctx.deadline = deadline;
  ctx.socketsPerPeer = sockets;
  ctx.lastWordOf = [store = access_.store](int peer, std::chrono::milliseconds wait) {
    auto v = store->getBounded(lastWordKey(peer), Deadline(wait), kStoreNoteLimit);
    return v ? std::string(v->begin(), v->end()) : std::string();
  };
  for (const auto& e : entries) {
    transports_.push_back(e.make());
    transports_.back()->publish(ctx);
  }

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("join/" + std::to_string(r));
  std::vector<std::string> missing;
  // The rank hosting the store waits a little longer than the others, so that they can still
  // ask the store who is missing when their own deadline passes.
  const bool hosting = access_.keepAlive != nullptr;
  const Deadline joinDeadline(std::chrono::milliseconds(deadline.remainingMs()) +
                              (hosting ? std::chrono::milliseconds(2000) : std::chrono::milliseconds(0)));
  if (!store.waitAll(keys, joinDeadline, &missing)) {
    std::vector<int> absent;
    for (const auto& k : missing) absent.push_back(std::stoi(k.substr(5)));
    LOOM_THROW(ErrorCode::Timeout, rank,
               strFormat("only %d of %d ranks joined communicator \"%s\" at %s within %.0f s; missing rank(s) %s. "
                         "Did they start, with the same world size and MASTER_ADDR/MASTER_PORT? (LOOM_INIT_TIMEOUT "
                         "sets the wait)",
                         size - static_cast<int>(absent.size()), size, name_.c_str(), access_.endpoint.c_str(),
                         deadline.totalSeconds(), rankList(absent).c_str()));
  }

  // 2'. Which ranks share a node: equal host identities, numbered in order of their lowest rank.
  mapNodes(store, deadline);

  noteRanksOnThisMachine(ranksOnThisMachine_);

  // 3. Connect to every peer with the first transport that reaches it (shared memory within a
  // node, then the network). Every rank runs the transports in the same order, and each one's
  // setup waits only on the peers it connects, so no two ranks wait on each other crosswise.
  ctx.nodeOf = nodes_.nodeOf;
  std::vector<std::vector<int>> peersOf(transports_.size());
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    size_t t = 0;
    while (t < transports_.size() && !transports_[t]->reaches(ctx, r)) ++t;
    if (t == transports_.size()) {
      std::string names;
      for (const auto& e : entries) names += (names.empty() ? "" : ", ") + std::string(e.name);
      LOOM_THROW_PEER(ErrorCode::InvalidArgument, rank, r,
                      strFormat("no allowed transport (%s) reaches rank %d, which is on another node (node %d; this "
                                "rank is on node %d): shared memory links only ranks of one node; allow tcp in "
                                "LOOM_TRANSPORT",
                                names.c_str(), r, nodeOf(r), nodeOf(rank)));
    }
    peersOf[t].push_back(r);
  }
  conns_.resize(static_cast<size_t>(size));
  transportOf_.assign(static_cast<size_t>(size), "self");
  links_.assign(static_cast<size_t>(size), selfLinkProperties());
  for (size_t t = 0; t < transports_.size(); ++t) {
    if (peersOf[t].empty()) continue;
    auto conns = transports_[t]->connect(ctx, peersOf[t]);
    for (size_t i = 0; i < peersOf[t].size(); ++i) {
      conns_[static_cast<size_t>(peersOf[t][i])] = std::move(conns[i]);
      transportOf_[static_cast<size_t>(peersOf[t][i])] = transports_[t]->name();
      links_[static_cast<size_t>(peersOf[t][i])] = transports_[t]->properties();
    }
  }
  // The link two ranks of one node would get, decided alike on every rank (a rank alone on its
  // node included): the first transport that reaches a peer when every rank shares this node.
  nodeLink_ = selfLinkProperties();
  if (size > 1) {
    TransportContext oneNode = ctx;
    oneNode.nodeOf.assign(static_cast<size_t>(size), 0);
    for (const auto& t : transports_)
      if (t->reaches(oneNode, (rank + 1) % size)) {
        nodeLink_ = t->properties();
        break;
      }
  }
  conns_[static_cast<size_t>(rank)] = std::make_unique<SelfConnection>(rank);

  // 4. Wait until every rank is connected, so nobody leaves while another still needs the store.
  store.setString("ready/" + std::to_string(rank), "1");
  keys.clear();
  for (int r = 0; r < size; ++r) keys.push_back("ready/" + std::to_string(r));
  if (!store.waitAll(keys, deadline, &missing)) {
    std::vector<int> absent;
    for (const auto& k : missing) absent.push_back(std::stoi(k.substr(6)));
    LOOM_THROW(ErrorCode::Timeout, rank,
               strFormat("rank(s) %s did not finish connecting within %.0f s", rankList(absent).c_str(),
                         deadline.totalSeconds()));
  }

  queue_ = std::make_unique<OpQueue>(rank);
  failure_->setHook([this](const Status& s) {
    leaveWord(s);
    failEverything(s);
  });
  progress_ = std::make_shared<ProgressHook>(this);
  if (logLevel() >= LogLevel::Info) {
    LOOM_INFO("communicator \"%s\": rank %d of %d ready (%s; store %s; timeout %.0f s)", name_.c_str(), rank, size,
              origin.c_str(), access_.endpoint.c_str(), static_cast<double>(timeout_.count()) / 1000.0);
    LOOM_INFO("node %d of %d, local rank %d of %d", nodeOf(rank), nodeCount(), localRank(), localSize());
    for (int r = 0; r < size; ++r)
      if (r != rank) LOOM_INFO("%s", conns_[static_cast<size_t>(r)]->describe().c_str());
  }
  if (logLevel() >= LogLevel::Info) {
    std::map<std::string, std::vector<int>> byTransport;
    for (int r = 0; r < size; ++r)
      if (r != rank) byTransport[transportOf_[static_cast<size_t>(r)]].push_back(r);
    std::string summary;
    for (const auto& [t, ranks] : byTransport)
      summary += strFormat("%s%s to rank(s) %s", summary.empty() ? "" : "; ", t.c_str(), rankList(ranks).c_str());
    LOOM_INFO("transports: %s", summary.empty() ? "none (one rank)" : summary.c_str());
  }
}

void CommImpl::mapNodes(Store& store, const Deadline& deadline) {
  std::vector<std::string> keys(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    // Set before join/<r>, which every rank has seen by now: no wait in practice.
    auto v = store.get("host/" + std::to_string(r), deadline);
    if (!v) LOOM_THROW(ErrorCode::Timeout, rank_, strFormat("rank %d's host identity did not arrive in time", r));
    keys[static_cast<size_t>(r)].assign(v->begin(), v->end());
  }
  // Ranks that share this machine's CPUs (same boot id), whatever node they count as: they decide
  // whether waiters may spin or must yield their core (request.hpp).
  const std::string myMachine = localHostIdentity().bootId;
  ranksOnThisMachine_ = 0;
  for (int r = 0; r < size_; ++r) {
    auto v = store.get("machine/" + std::to_string(r), deadline);
    if (v && std::string(v->begin(), v->end()) == myMachine) ++ranksOnThisMachine_;
  }
  nodes_.nodeOf.assign(static_cast<size_t>(size_), -1);
  nodes_.ranks.clear();
  for (int r = 0; r < size_; ++r) {
    if (nodes_.nodeOf[static_cast<size_t>(r)] >= 0) continue;
    const int node = nodes_.count();
    nodes_.ranks.emplace_back();
    for (int q = r; q < size_; ++q)
      if (keys[static_cast<size_t>(q)] == keys[static_cast<size_t>(r)]) {
        nodes_.nodeOf[static_cast<size_t>(q)] = node;
        nodes_.ranks.back().push_back(q);
      }
  }
}

CommImpl::~CommImpl() {
  unregisterForDump(this);
  failure_->setHook(nullptr);
  if (failure_->failed()) leaveRecord();
  if (progress_) progress_->detach();
  // The peers still connected learn why this rank goes: the failure that stopped it, if any
  // (their own error then names the rank that caused it), else that it was destroyed.
  Status bye = failure_->failed()
                   ? failure_->first()
                   : Status::error(ErrorCode::Aborted, strFormat("communicator \"%s\" was destroyed", name_.c_str()));
  if (queue_) queue_->shutdown(bye);
  engine_->stop();
  sendEngine_->stop();
  for (auto& t : transports_) t->stop();
  for (auto& c : conns_)
    if (c) c->failAll(bye);
  conns_.clear();
  transports_.clear();
}

void CommImpl::leaveWord(const Status& status) {
  // Before the links close: a peer that sees one break without a word looks here (lastWordOf).
  if (size_ == 1) return;
  const std::string word = status.message.substr(0, kMaxWordBytes);
  if (!access_.store->setBounded(lastWordKey(rank_), Bytes(word.begin(), word.end()), kStoreNoteLimit))
    LOOM_INFO("could not leave this rank's word in the rendezvous store");
}

void CommImpl::leaveRecord() noexcept {
  // A failed rank's record no longer changes: it answers every dump request, those made after it
  // left too (a peer whose hang report is still gathering when this rank's wait failed because
  // another rank went, and this rank leaves before it looked for the request again).
  if (size_ == 1) return;
  try {
    std::lock_guard<std::mutex> lock(dumpMu_);
    const std::string text = publishedFlight(kFinalRecord, flight_.serialize());
    if (access_.store->setBounded(flightKey(rank_), Bytes(text.begin(), text.end()), kStoreNoteLimit))
      answeredDump_ = kFinalRecord;
  } catch (...) {
    // The store is gone (rank 0 left): nobody can ask.
  }
}

void CommImpl::failEverything(const Status& status) {
  // Connections first: that fails the request a queued collective waits on, so that the queue's
  // worker returns and shutdown() can join it.
  for (auto& c : conns_)
    if (c) c->failAll(status);
  if (queue_) queue_->shutdown(status);
}

StoreAccess CommImpl::shrinkAccess(std::chrono::milliseconds wait, int* newRank, int* newSize) {
  Store& store = *access_.store;
  const std::string gen = "shrink-" + std::to_string(shrinks_++);
  const Deadline joinBy(std::chrono::milliseconds(wait) + std::chrono::milliseconds(30000));
  try {
    store.setString(gen + "/alive/" + std::to_string(rank_), "1");
    if (rank_ == 0) {
      // Rank 0 hosts the store: it decides who is in, after `wait` or once everyone is there.
      std::vector<std::string> keys;
      for (int r = 0; r < size_; ++r) keys.push_back(gen + "/alive/" + std::to_string(r));
      std::vector<std::string> missing;
      store.waitAll(keys, Deadline(wait), &missing);
      std::string members;
      for (int r = 0; r < size_; ++r)
        if (store.tryGet(gen + "/alive/" + std::to_string(r))) members += std::to_string(r) + ",";
      Nonce id = randomNonce();
      store.set(gen + "/commid", Bytes(id.begin(), id.end()));
      store.setString(gen + "/members", members);
    }
    auto v = store.get(gen + "/members", joinBy);
    auto idBytes = store.get(gen + "/commid", joinBy);
    if (!v || !idBytes || idBytes->size() != Nonce().size()) {
      LOOM_THROW(ErrorCode::Timeout, rank_,
                 "shrink: rank 0 did not publish the survivors: it may be gone too (it hosts the rendezvous store); "
                 "restart the job");
    }
    std::vector<int> members;
    std::string text(v->begin(), v->end());
    for (size_t at = 0; at < text.size();) {
      size_t comma = text.find(',', at);
      members.push_back(std::stoi(text.substr(at, comma - at)));
      at = comma + 1;
    }
    auto me = std::find(members.begin(), members.end(), rank_);
    if (me == members.end()) {
      LOOM_THROW(ErrorCode::Timeout, rank_,
                 strFormat("shrink: this rank came after the survivors had been counted (%s); it is left out",
                           rankList(members).c_str()));
    }
    *newRank = static_cast<int>(me - members.begin());
    *newSize = static_cast<int>(members.size());
    LOOM_INFO("shrink: rank %d of %d goes on as rank %d of %d (survivors: %s)", rank_, size_, *newRank, *newSize,
              rankList(members).c_str());
    StoreAccess a;
    a.store = std::make_shared<PrefixStore>(gen, access_.store);
    a.endpoint = access_.endpoint;
    a.key = access_.key;
    std::memcpy(a.commId.data(), idBytes->data(), a.commId.size());
    a.keepAlive = access_.keepAlive;
    return a;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    LOOM_THROW(ErrorCode::Remote, rank_,
               strFormat("shrink: the rendezvous store at %s is unreachable (%s): rank 0 is gone; restart the job",
                         access_.endpoint.c_str(), e.what()));
  }
}

void CommImpl::abort() {
  if (aborted_.exchange(true)) return;
  LOOM_INFO("communicator \"%s\" aborted", name_.c_str());
  failure_->fail(Status::error(ErrorCode::Aborted, strFormat("communicator \"%s\" was aborted", name_.c_str())));
}

void CommImpl::checkOk() const {
  if (failure_->failed()) throw failure_->first().toError(rank_);
}

void CommImpl::checkPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank_,
               strFormat("%s: rank %d is out of range for a communicator of %d ranks (0 to %d)", what, peer, size_,
                         size_ - 1));
  }
}

size_t CommImpl::checkBuffer(const void* buf, size_t count, DataType type, const char* what) const {
  const int t = static_cast<int>(type);
  if (t < 0 || t > static_cast<int>(DataType::Bfloat16)) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank_, strFormat("%s: unknown datatype %d", what, t));
  }
  const size_t elem = sizeOf(type);
  if (count > SIZE_MAX / elem || count > static_cast<size_t>(INT64_MAX) / elem) {
    LOOM_THROW(
        ErrorCode::InvalidArgument, rank_,
        strFormat("%s: count %zu of %s overflows (negative count passed as size_t?)", what, count, toString(type)));
  }
  if (buf == nullptr && count > 0) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank_, strFormat("%s: null buffer with count %zu", what, count));
  }
  return count * elem;
}

RequestPtr CommImpl::postSend(int peer, const void* buf, size_t bytes, uint32_t tag, const std::string& what) {
  auto req = std::make_shared<Request>(rank_, peer, what, timeout_, failure_, progress_);
  conns_[static_cast<size_t>(peer)]->isend(req, buf, bytes, tag);
  return req;
}

RequestPtr CommImpl::postRecv(int peer, void* buf, size_t bytes, uint32_t tag, const std::string& what) {
  auto req = std::make_shared<Request>(rank_, peer, what, timeout_, failure_, progress_);
  conns_[static_cast<size_t>(peer)]->irecv(req, buf, bytes, tag);
  return req;
}

RequestPtr CommImpl::postSend(int peer, const void* buf, size_t bytes, uint32_t tag, const Label& label, uint64_t sig) {
  auto req = std::make_shared<Request>(rank_, peer, label, timeout_, failure_, progress_);
  req->signature = sig;
  conns_[static_cast<size_t>(peer)]->isend(req, buf, bytes, tag);
  return req;
}

RequestPtr CommImpl::postRecv(int peer, void* buf, size_t bytes, uint32_t tag, const Label& label, uint64_t sig,
                              std::shared_ptr<ReceiveConsumer> consumer) {
  auto req = std::make_shared<Request>(rank_, peer, label, timeout_, failure_, progress_);
  req->signature = sig;
  req->consumer = std::move(consumer);
  req->consumerBuffer = buf;
  conns_[static_cast<size_t>(peer)]->irecv(req, buf, bytes, tag);
  return req;
}

RequestPtr CommImpl::isend(const void* buf, size_t count, DataType type, int peer, uint32_t tag) {
  checkOk();
  checkPeer(peer, "send");
  size_t bytes = checkBuffer(buf, count, type, "send");
  if (tag >= kCollectiveTagBit)
    LOOM_THROW(ErrorCode::InvalidArgument, rank_, strFormat("send: tag %u is not below 2^31", tag));
  Label l;
  l.send = true;
  l.count = count;
  l.type = toString(type);
  l.tag = tag;
  return postSend(peer, buf, bytes, tag, l);
}

RequestPtr CommImpl::irecv(void* buf, size_t count, DataType type, int peer, uint32_t tag) {
  checkOk();
  checkPeer(peer, "recv");
  size_t bytes = checkBuffer(buf, count, type, "recv");
  if (tag >= kCollectiveTagBit)
    LOOM_THROW(ErrorCode::InvalidArgument, rank_, strFormat("recv: tag %u is not below 2^31", tag));
  Label l;
  l.count = count;
  l.type = toString(type);
  l.tag = tag;
  return postRecv(peer, buf, bytes, tag, l);
}

RequestPtr CommImpl::submit(const std::string& what, std::function<void(int64_t)> body, uint64_t sig, int64_t seqs) {
  checkOk();
  const int64_t seq = nextSeq_.fetch_add(seqs);
  auto done = std::make_shared<Request>(rank_, -1, strFormat("%s #%lld", what.c_str(), static_cast<long long>(seq)),
                                        timeout_, failure_);
  done->setQueue(progress_);
  done->diagnoseOnTimeout = true;
  for (int64_t k = 0; k < seqs; ++k) flight_.queued(seq + k, sig);
  queue_->submit(done, [this, body = std::move(body), seq] {
    AttendScope attend(progress_);
    runRecorded(seq, body);
  });
  return done;
}

RequestPtr CommImpl::submitUnnumbered(const std::string& what, std::function<size_t()> body) {
  checkOk();
  auto done = std::make_shared<Request>(rank_, -1, what, timeout_, failure_);
  done->setQueue(progress_);
  Request* d = done.get();  // the queue's item holds `done` while this runs
  queue_->submit(done, [this, d, body = std::move(body)] {
    AttendScope attend(progress_);
    d->complete(body());  // before the queue's own completion (with 0), which is then a no-op
  });
  return done;
}

std::shared_ptr<void> CommImpl::deviceState(const std::function<std::shared_ptr<void>()>& make) {
  std::lock_guard<std::mutex> lock(deviceMu_);
  if (!deviceState_) deviceState_ = make();
  return deviceState_;
}

void CommImpl::runRecorded(int64_t seq, FunctionRef<void(int64_t)> body) {
  try {
    body(seq);
  } catch (...) {
    flight_.finished(seq, false);
    throw;
  }
  flight_.finished(seq, true);
}

bool CommImpl::runInlineIfIdle(FunctionRef<void(int64_t)> body, uint64_t sig) {
  // The sequence number is taken inside, so that it follows call order.
  return queue_->runInlineIfIdle([&] {
    AttendScope attend(progress_);
    const int64_t seq = nextSeq_.fetch_add(1);
    flight_.queued(seq, sig);
    runRecorded(seq, body);
  });
}

void CommImpl::runQueued(const detail::Request* done) noexcept {
  if (queue_) queue_->runQueuedUntil(done);
}

bool CommImpl::pollPeer(int peer) noexcept {
  return peer >= 0 && peer < size_ && conns_[static_cast<size_t>(peer)]->poll();
}
bool CommImpl::pollAnother(int peer) noexcept {
  if (size_ <= 2) return false;
  // One of the others, in turn (never this rank, whose self connection needs no polling).
  unsigned k = nextPolled_.fetch_add(1, std::memory_order_relaxed) % static_cast<unsigned>(size_ - 1);
  int other = static_cast<int>(k) >= rank_ ? static_cast<int>(k) + 1 : static_cast<int>(k);
  if (other == peer) return false;
  return conns_[static_cast<size_t>(other)]->poll();
}
void CommImpl::beginPolling(int peer) noexcept {
  if (peer >= 0 && peer < size_) conns_[static_cast<size_t>(peer)]->pollBegin();
}
void CommImpl::endPolling(int peer) noexcept {
  if (peer >= 0 && peer < size_) conns_[static_cast<size_t>(peer)]->pollEnd();
}

void CommImpl::attend(bool on) noexcept {
  for (auto& t : transports_) t->attend(on);
}

void CommImpl::enterCall(int64_t seq, uint64_t sig, const char* algo) {
  flight_.running(seq, sig, algo);
  currentSig_.store(sig, std::memory_order_relaxed);
  currentSeq_.store(seq, std::memory_order_release);
  if (const LocalArena* a = arena())
    publishCall(a->current[static_cast<size_t>(a->me)], static_cast<uint64_t>(seq), sig);
}

Status CommImpl::localCallMismatch(int64_t seq, uint64_t sig) const {
  const LocalArena* a = arena();
  if (a == nullptr || sig == 0) return Status::success();
  for (size_t i = 0; i < a->current.size(); ++i) {
    if (static_cast<int>(i) == a->me) continue;
    uint64_t theirSeq = 0, theirSig = 0;
    if (!readCall(a->current[i], &theirSeq, &theirSig)) continue;
    if (theirSeq == static_cast<uint64_t>(seq) && !signaturesAgree(sig, theirSig)) {
      Status s = signatureMismatch(a->ranks[i], theirSig, rank_, sig);
      s.seq = seq;
      return s;
    }
  }
  return Status::success();
}

void CommImpl::check() noexcept {
  // About once a second of sleeping: answer a dump request (a timed-out peer, or loom-info --dump)
  // with this rank's flight record.
  const int64_t now = Clock::now().time_since_epoch().count();
  int64_t last = lastDumpPoll_.load(std::memory_order_relaxed);
  if (now - last >= std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(1)).count() &&
      lastDumpPoll_.compare_exchange_strong(last, now)) {
    try {
      answerDumpRequests();
    } catch (...) {
      // The store is gone (rank 0 left): nothing to answer.
    }
  }
  const int64_t seq = currentSeq_.load(std::memory_order_acquire);
  if (seq < 0 || failure_->failed()) return;
  Status s = localCallMismatch(seq, currentSig_.load(std::memory_order_relaxed));
  if (s.ok) return;
  failure_->fail(s);  // (s.seq names the collective)
}

std::string CommImpl::diagnose() noexcept {
  const int64_t seq = currentSeq_.load(std::memory_order_acquire);
  if (seq < 0) return "";
  try {
    return hangReport(seq, std::chrono::milliseconds(2500));
  } catch (const std::exception& e) {
    return std::string("no hang report: ") + e.what();
  }
}

std::string CommImpl::dumpText() {
  std::string out = strFormat("loom: rank %d of %d, communicator \"%s\": its last collectives, oldest first\n", rank_,
                              size_, name_.c_str());
  const std::vector<FlightEntry> entries = flight_.snapshot();
  out += formatFlight(entries, 16);
  int64_t seq = -1;  // the oldest collective this rank is in
  for (const FlightEntry& e : entries)
    if (e.state == FlightEntry::State::Running && (seq < 0 || e.seq < seq)) seq = e.seq;
  if (seq >= 0 && !failure_->failed()) {
    try {
      out += hangReport(seq, std::chrono::milliseconds(2500)) + "\n";
    } catch (const std::exception& e) {
      out += strFormat("  no hang report: %s\n", e.what());
    }
  } else {
    out += "  not inside a collective now\n";
  }
  return out;
}

void CommImpl::answerDumpRequests() {
  // Requests are numbered by the store's counter; a record answers every request up to its number.
  const int64_t wanted = access_.store->add(kDumpRequestKey, 0);
  std::lock_guard<std::mutex> lock(dumpMu_);
  if (wanted <= answeredDump_) return;
  access_.store->setString(flightKey(rank_), publishedFlight(wanted, flight_.serialize()));
  answeredDump_ = wanted;
}

std::string CommImpl::hangReport(int64_t seq, std::chrono::milliseconds waitFor) {
  // Ask every rank for its record (sleeping waiters look about once a second, and ranks that are
  // asking too answer here), then take what has come when the time is up.
  const int64_t request = access_.store->add(kDumpRequestKey, 1);
  std::map<int, std::vector<FlightEntry>> records;
  std::string cut;
  const Deadline deadline(waitFor);
  for (;;) {
    try {
      answerDumpRequests();
      for (int r = 0; r < size_; ++r) {
        if (records.count(r) != 0) continue;
        if (auto v = access_.store->tryGet(flightKey(r))) {
          if (auto entries = readPublishedFlight(std::string(v->begin(), v->end()), request))
            records[r] = std::move(*entries);
        }
      }
    } catch (const std::exception& e) {
      // The store went away meanwhile (its host, rank 0, exited): report what had come.
      cut = strFormat("\n  (the rendezvous store closed before every rank could answer: %s)", e.what());
      break;
    }
    if (static_cast<int>(records.size()) == size_ || deadline.expired()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (records.count(rank_) == 0) records[rank_] = parseFlight(flight_.serialize());
  return loom::hangReport(size_, records, seq) + cut;
}

void CommImpl::waiting(bool on) noexcept {
  for (auto& t : transports_) t->waiting(on);
}

uint8_t* CommImpl::scratch(size_t bytes, int slot) {
  auto& v = scratch_[slot];
  if (v.size() < bytes) {
    v.clear();
    v.shrink_to_fit();
    v.resize(bytes);
  }
  return v.data();
}

void CommImpl::barrierBody(int64_t seq) {
  const uint32_t tag = collectiveTag(seq);
  const uint64_t sig = makeSignature(SigKind::Barrier, DataType::Uint8, ReduceOp::Sum, 0, 0);
  enterCall(seq, sig, "dissemination");
  uint8_t token = 0, sink = 0;
  for (const auto& round : planDisseminationBarrier(rank_, size_)) {
    Label in, out;
    in.coll = out.coll = "barrier";
    in.algo = out.algo = "dissemination";
    in.seq = out.seq = seq;
    out.send = true;
    auto r = postRecv(round.from, &sink, 0, tag, in, sig);
    auto s = postSend(round.to, &token, 0, tag, out, sig);
    s->wait();
    r->wait();
  }
}

}  // namespace detail
}  // namespace loom
