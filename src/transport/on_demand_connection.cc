#include "transport/on_demand_connection.hpp"

#include <thread>
#include <utility>
#include <vector>

#include "core/format.hpp"
#include "transport/any_source.hpp"

namespace loom {

OnDemandConnection::OnDemandConnection(int rank, int peer, Transport* transport)
    : rank_(rank), peer_(peer), transport_(transport) {}

OnDemandConnection::~OnDemandConnection() {
  failAll(Status::error(ErrorCode::Aborted, "the communicator was destroyed", peer_));
}

bool OnDemandConnection::keep(Kept&& op) noexcept {
  bool ask = false;
  Status failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inner_.load(std::memory_order_relaxed) != nullptr) return false;
    if (failed_) {
      failure = failure_;
    } else {
      kept_.push_back(std::move(op));
      ask = !asked_;
      asked_ = true;
    }
  }
  if (!failure.ok) {
    op.req->fail(failure);
    return true;
  }
  if (ask) transport_->linkTo(peer_);
  return true;
}

void OnDemandConnection::isend(const RequestPtr& req, const SendSpec& spec) noexcept {
  if (Connection* c = link()) return c->isend(req, spec);
  if (!keep(Kept{req, true, spec, {}})) link()->isend(req, spec);
}

void OnDemandConnection::irecv(const RequestPtr& req, const RecvSpec& spec) noexcept {
  if (Connection* c = link()) return c->irecv(req, spec);
  RecvSpec kept = spec;
  if (hub_ != nullptr) kept.posted = AnySource::stamp();
  if (!keep(Kept{req, false, {}, std::move(kept)})) link()->irecv(req, spec);
}

void OnDemandConnection::install(std::unique_ptr<Connection> conn) noexcept {
  Connection* c = conn.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    own_ = std::move(conn);
    if (failed_) {
      // Too late: the communicator failed (or closed) while the link was being made.
      kept_.clear();
      c->failAll(failure_);
      return;
    }
  }
  // What was kept goes first, one operation at a time, in order; what is posted meanwhile is kept
  // behind it. Once the link is stopped (quiesce: the communicator is failing) nothing more is
  // posted: failAll fails what is still kept, and a caller woken by a failed request may free its
  // buffers at once.
  for (;;) {
    Kept op;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_ || stopped_) return;
      if (kept_.empty()) {
        inner_.store(c, std::memory_order_release);
        return;
      }
      op = std::move(kept_.front());
      kept_.pop_front();
      posting_ = std::this_thread::get_id();
    }
    if (op.send)
      c->isend(op.req, op.sendSpec);
    else
      c->irecv(op.req, op.recvSpec);
    {
      std::lock_guard<std::mutex> lock(mu_);
      posting_ = std::thread::id();
    }
    posted_.notify_all();
  }
}

void OnDemandConnection::quiesce(const Status& why) noexcept {
  Connection* c = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopped_ = true;
    // An operation being handed to the link lands there first (unless this thread is handing it:
    // the link failed under it).
    if (posting_ != std::thread::id() && posting_ != std::this_thread::get_id())
      posted_.wait(lock, [&] { return posting_ == std::thread::id(); });
    c = own_.get();  // set once, kept until destruction
  }
  if (c != nullptr) c->quiesce(why);
}

uint64_t OnDemandConnection::firstKept(uint32_t tag) {
  Connection* c = link();
  return c != nullptr ? c->firstKept(tag) : AnySource::kNone;
}

bool OnDemandConnection::irecvKept(const RequestPtr& req, const RecvSpec& spec, uint64_t stamp) noexcept {
  Connection* c = link();
  return c != nullptr && c->irecvKept(req, spec, stamp);
}

void OnDemandConnection::failAll(const Status& status) noexcept {
  std::list<Kept> kept;
  Connection* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) {
      failed_ = true;
      failure_ = status;
    }
    kept.swap(kept_);
    c = own_.get();
  }
  for (auto& op : kept) op.req->fail(status);
  if (c != nullptr) c->failAll(status);
}

std::string OnDemandConnection::describe() const {
  if (Connection* c = link()) return c->describe();
  std::lock_guard<std::mutex> lock(mu_);
  return strFormat("rank %d <-> rank %d: %s, not linked (%s)", rank_, peer_, transport_->name(),
                   failed_  ? "failed"
                   : asked_ ? "being linked"
                            : "linked on first use");
}

bool OnDemandConnection::progress() noexcept {
  Connection* c = link();
  return c != nullptr && c->progress();
}

bool OnDemandConnection::needsEngine() const noexcept {
  Connection* c = link();
  return c != nullptr && c->needsEngine();
}

bool OnDemandConnection::hasWork() const noexcept {
  Connection* c = link();
  return c != nullptr && c->hasWork();
}

void OnDemandConnection::maintain() noexcept {
  if (Connection* c = link()) c->maintain();
}

void OnDemandConnection::resume(bool sleeper) noexcept {
  if (Connection* c = link()) c->resume(sleeper);
}

}  // namespace loom
