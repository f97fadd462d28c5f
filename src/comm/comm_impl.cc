#include "comm/comm_impl.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <thread>

#include "bootstrap/auth.hpp"
#include "collectives/context.hpp"
#include "collectives/plan.hpp"
#include "collectives/select.hpp"
#include "comm/device_state.hpp"
#include "comm/dump_signal.hpp"
#include "comm/store_keys.hpp"
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
LOOM_PARAM_INT(reproducibleParam, "LOOM_REPRODUCIBLE", 0,
               "1: reproducible mode (Options::reproducible): float sum, avg and prod reductions return the same bits "
               "whatever the size, algorithm, transport, buffer location and node layout (docs/reproducibility.md)");
LOOM_PARAM_STR(recordTreeParam, "LOOM_RECORD_TREE", "auto",
               "how a new communicator's records reach its ranks: from the store's host to each (off), or down a tree "
               "of the ranks: auto (from 64 ranks, to those not on the store host's machine) or N (from N ranks, to "
               "every rank)");
LOOM_PARAM_INT(socketsPerPeerParam, "LOOM_SOCKETS_PER_PEER", 2, "TCP sockets striped per peer (1 to 16)");

// Whether the records go down a tree (LOOM_RECORD_TREE): their gain is the bytes the store's host
// need not send to every rank over the network.
RecordTree recordTree(int size) {
  RecordTree tree;
  const std::string setting = recordTreeParam();
  char* end = nullptr;
  const long n = std::strtol(setting.c_str(), &end, 10);
  if (end != setting.c_str() && *end == '\0') {
    tree.on = n > 0 && size >= n;
    tree.everyRank = true;
  } else if (setting != "off") {
    if (setting != "auto") LOOM_WARN("LOOM_RECORD_TREE=%s is not auto, off or a number; using auto", setting.c_str());
    tree.on = size >= 64;
  }
  return tree;
}

std::string hostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

std::chrono::milliseconds opTimeoutOf(const Options& o) {
  return o.timeout.count() > 0 ? o.timeout : std::chrono::milliseconds(timeoutParam() * 1000);
}

std::chrono::milliseconds initTimeoutOf(const Options& o) {
  return o.initTimeout.count() > 0 ? o.initTimeout : std::chrono::milliseconds(initTimeoutParam() * 1000);
}

CommImpl::CommImpl(int rank, int size, StoreAccess access, const Options& options, const std::string& origin,
                   Meeting* meeting)
    : rank_(rank),
      size_(size),
      options_(options),
      name_(options.name.empty() ? "loom" : options.name),
      failure_(std::make_shared<FailureState>()),
      access_(std::move(access)),
      joinStore_(std::make_shared<JoinStore>(access_.store)),
      diag_(rank, size, name_, access_.store, failure_),
      links_(rank, size) {
  LogRankScope logScope(rank);
  timeout_ = opTimeoutOf(options);
  reproducible_ = options.reproducible >= 0 ? options.reproducible != 0 : reproducibleParam() != 0;
  const auto initTimeout = initTimeoutOf(options);
  const int sockets = options.socketsPerPeer > 0 ? options.socketsPerPeer : static_cast<int>(socketsPerPeerParam());
  if (sockets < 1 || sockets > 16) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank, strFormat("sockets per peer must be 1 to 16, not %d", sockets));
  }
  Deadline deadline(initTimeout);
  Store& store = *joinStore_;

  // 1. This rank's record: its host, its machine, and (join) what its transports publish.
  joinStore_->record(true);
  HostIdentity host = localHostIdentity();
  if (!options.hostId.empty()) host.override_ = options.hostId;
  store.setString("host/" + std::to_string(rank), host.key());
  // The machine (its CPUs), which network namespaces or containers may split into several nodes.
  store.setString("machine/" + std::to_string(rank), host.bootId);
  const std::string me = strFormat("%s pid %d", hostName().c_str(), static_cast<int>(getpid()));
  store.setString("join/" + std::to_string(rank), me);

  // 2. Publish every transport's endpoint, meet the others, link.
  // A join that throws leaves the link table to its destructor, which stops its threads before
  // the links go.
  RecordTree tree = recordTree(size);
  tree.key = access_.key;
  tree.commId = access_.commId;
  StoreMeeting throughStore(*access_.store, rank, size, name_, access_.endpoint, access_.keepAlive != nullptr, tree);
  join(options, sockets, deadline, origin, meeting != nullptr ? *meeting : throughStore);
  registerForDump(this);
}

CommImpl::~CommImpl() {
  unregisterForDump(this);
  failure_->setHook(nullptr);
  if (failure_->failed()) diag_.leaveRecord();
  if (progress_) progress_->detach();
  // The peers still connected learn why this rank goes: the failure that stopped it, if any
  // (their own error then names the rank that caused it), else that it was destroyed.
  Status bye = failure_->failed()
                   ? failure_->first()
                   : Status::error(ErrorCode::Aborted, strFormat("communicator \"%s\" was destroyed", name_.c_str()));
  if (queue_) queue_->shutdown(bye);
  links_.close(bye);
}

void CommImpl::failEverything(const Status& status) {
  // Connections first: that fails the request a queued collective waits on, so that the queue's
  // worker returns and shutdown() can join it.
  links_.failAll(status);
  if (queue_) queue_->shutdown(status);
}

void CommImpl::abort() {
  if (aborted_.exchange(true)) return;
  LOOM_INFO("communicator \"%s\" aborted", name_.c_str());
  failure_->fail(Status::error(ErrorCode::Aborted, strFormat("communicator \"%s\" was aborted", name_.c_str())));
}

void CommImpl::checkOk(const char* call) const {
  if (!failure_->failed()) return;
  Status s = failure_->first();
  if (call != nullptr) s.message = strFormat("%s: this communicator had already failed: %s", call, s.message.c_str());
  throw s.toError(rank_);
}

void CommImpl::checkPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_) {
    LOOM_THROW(ErrorCode::InvalidArgument, rank_,
               strFormat("%s: rank %d is out of range for a communicator of %d ranks (0 to %d)", what, peer, size_,
                         size_ - 1));
  }
}

Registration CommImpl::registerMemory(int peer, const void* addr, size_t bytes) const {
  checkPeer(peer, "registerMemory");
  try {
    return links_.registerMemory(peer, addr, bytes);
  } catch (const Error& e) {
    throw Error(e.code(), e.message(), rank_, e.peer());  // as this rank's
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

RequestPtr CommImpl::postSend(int peer, const void* buf, size_t bytes, uint32_t tag, const Label& label, uint64_t sig) {
  auto req = std::make_shared<Request>(rank_, peer, label, timeout_, failure_, progress_);
  links_.to(peer).isend(req, SendSpec{buf, bytes, tag, sig});
  return req;
}

RequestPtr CommImpl::postRecv(int peer, void* buf, size_t bytes, uint32_t tag, const Label& label, uint64_t sig,
                              std::shared_ptr<ReceiveConsumer> consumer) {
  auto req = std::make_shared<Request>(rank_, peer, label, timeout_, failure_, progress_);
  if (consumer) {
    req->consumer = consumer;  // for the waiter, where the link did not hand the bytes on
    req->consumerBuffer = buf;
  }
  if (peer == kAnyPeer) {
    links_.irecvAny(req, RecvSpec{buf, bytes, tag, sig, std::move(consumer)});
    return req;
  }
  links_.to(peer).irecv(req, RecvSpec{buf, bytes, tag, sig, std::move(consumer)});
  return req;
}

RequestPtr CommImpl::isend(const void* buf, size_t count, DataType type, int peer, uint32_t tag) {
  checkOk("send");
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
  checkOk("recv");
  if (peer != kAnyPeer) checkPeer(peer, "recv");
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
  checkOk(what.c_str());
  const int64_t seq = nextSeq_.fetch_add(seqs);
  auto done = std::make_shared<Request>(rank_, -1, strFormat("%s #%lld", what.c_str(), static_cast<long long>(seq)),
                                        timeout_, failure_);
  done->setQueue(progress_);
  done->diagnoseOnTimeout = true;
  for (int64_t k = 0; k < seqs; ++k) diag_.flight().queued(seq + k, sig);
  queue_->submit(done, [this, body = std::move(body), seq] {
    AttendScope attend(progress_);
    runRecorded(seq, body);
  });
  return done;
}

RequestPtr CommImpl::submitUnnumbered(const std::string& what, std::function<size_t(Request& done)> body) {
  checkOk();
  auto done = std::make_shared<Request>(rank_, -1, what, timeout_, failure_);
  done->setQueue(progress_);
  Request* d = done.get();  // the queue's item holds `done` while this runs
  queue_->submit(done, [this, d, body = std::move(body)] {
    AttendScope attend(progress_);
    d->complete(body(*d));  // before the queue's own completion (with 0), which is then a no-op
  });
  return done;
}

std::shared_ptr<detail::DeviceState> CommImpl::deviceState(device::DeviceRuntime& rt) {
  std::lock_guard<std::mutex> lock(deviceMu_);
  if (!deviceState_) deviceState_ = std::make_shared<detail::DeviceState>(rt);
  return deviceState_;
}

void CommImpl::runRecorded(int64_t seq, FunctionRef<void(int64_t)> body) {
  try {
    body(seq);
  } catch (...) {
    diag_.flight().finished(seq, false);
    throw;
  }
  diag_.flight().finished(seq, true);
}

bool CommImpl::runInlineIfIdle(FunctionRef<void(int64_t)> body, uint64_t sig) {
  // The sequence number is taken inside, so that it follows call order.
  return queue_->runInlineIfIdle([&] {
    AttendScope attend(progress_);
    const int64_t seq = nextSeq_.fetch_add(1);
    diag_.flight().queued(seq, sig);
    runRecorded(seq, body);
  });
}

void CommImpl::runQueued(const detail::Request* done) noexcept {
  if (queue_) queue_->runQueuedUntil(done);
}

bool CommImpl::pollPeer(int peer) noexcept {
  if (peer == kAnyPeer) return links_.pollAnother(peer);  // a receive from any source: each link in turn
  return peer >= 0 && peer < size_ && links_.poll(peer);
}

bool CommImpl::pollAnother(int peer) noexcept { return links_.pollAnother(peer); }

void CommImpl::beginPolling(int peer) noexcept {
  // A thread inside an attended operation counts once (AttendScope), not once more per link.
  if (peer >= 0 && peer < size_) links_.pollBegin(peer, AttendScope::current() == nullptr);
}

void CommImpl::endPolling(int peer) noexcept {
  if (peer >= 0 && peer < size_) links_.pollEnd(peer, AttendScope::current() == nullptr);
}

void CommImpl::attend(bool on) noexcept { links_.attend(on); }

void CommImpl::waiting(bool on) noexcept { links_.waiting(on); }

uint8_t* CommImpl::scratch(size_t bytes, int slot) {
  auto& v = scratch_[slot];
  if (v.size() < bytes) {
    v.clear();
    v.shrink_to_fit();
    v.resize(bytes);
  }
  return v.data();
}

}  // namespace detail
}  // namespace loom
