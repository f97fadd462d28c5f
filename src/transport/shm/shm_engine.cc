#include "transport/shm/shm_engine.hpp"

#include <chrono>

#include "core/affinity.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"

namespace loom {
namespace shm {
namespace {

LOOM_PARAM_INT(engineSpinParam, "LOOM_SHM_ENGINE_SPIN_US", 20,
               "microseconds the shared-memory progress thread keeps looking for work before it sleeps");
LOOM_PARAM_INT(livenessMsParam, "LOOM_SHM_LIVENESS_MS", 100,
               "how often (ms) the shared-memory progress thread checks that its peers still run");

}  // namespace

void ShmEngine::start() {
  std::atomic<int> started{0};
  planProgressBinding();
  thread_ = std::thread([this, &started] { run(&started); });
  while (started.load() == 0) std::this_thread::yield();
}

void ShmEngine::add(ShmConnection* c) {
  std::lock_guard<std::mutex> lock(mu_);
  conns_.push_back(c);
  version_.fetch_add(1);
}

void ShmEngine::attend(bool on) noexcept {
  if (on) {
    mine_->attending.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  if (mine_->attending.fetch_sub(1, std::memory_order_seq_cst) != 1) return;
  // Bytes peers wrote meanwhile did not ring. Take in what is there from this thread (plain
  // messages land in their receives or the unexpected queue; announcements queue their reads),
  // which costs less than waking the engine, and wake it only for what needs it now.
  handOver(false);
}

void ShmEngine::waiting(bool on) noexcept {
  if (!on) {
    mine_->waiters.fetch_sub(1, std::memory_order_seq_cst);
    return;
  }
  mine_->waiters.fetch_add(1, std::memory_order_seq_cst);
  // A writer that saw no waiter left its bytes without a wake-up: look for them now.
  handOver(true);
}

void ShmEngine::handOver(bool anyWork) noexcept {
  auto decide = [&](const std::vector<ShmConnection*>& conns) {
    bool wake = false;
    for (auto* c : conns) {
      if (!anyWork && c->hasWork()) c->progress();
      wake = wake || (anyWork ? c->hasWork() : c->needsEngine());
    }
    return wake;
  };
  bool wake;
  if (sealed_.load(std::memory_order_acquire)) {
    wake = decide(conns_);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    wake = decide(conns_);
  }
  if (wake) ring(mine_, true);
}

void ShmEngine::stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  mine_->doorbell.fetch_add(1);
  futexWakeAll(&mine_->doorbell);
  thread_.join();
}

void ShmEngine::run(std::atomic<int>* started) {
  setThreadLogRank(rank_);
  bindProgressThread();
  pthread_mutex_lock(&mine_->alive);
  started->store(1);
  const auto spin = std::chrono::microseconds(engineSpinParam());
  const auto liveness = std::chrono::milliseconds(std::max<int64_t>(10, livenessMsParam()));
  std::vector<ShmConnection*> conns;
  uint32_t seenVersion = ~0u;
  auto lastCheck = std::chrono::steady_clock::now();
  auto lastMove = lastCheck;
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (version_.load() != seenVersion) {
      std::lock_guard<std::mutex> lock(mu_);
      conns = conns_;
      seenVersion = version_.load();
    }
    const uint32_t seen = mine_->doorbell.load(std::memory_order_seq_cst);
    bool moved = false;
    for (auto* c : conns) moved |= c->progress();
    const auto now = std::chrono::steady_clock::now();
    if (now - lastCheck >= liveness) {
      for (auto* c : conns) c->checkPeer();
      lastCheck = now;
    }
    if (moved) {
      lastMove = now;
      continue;
    }
    if (now - lastMove < spin) {
      std::this_thread::yield();
      continue;
    }
    bool work = false;
    for (auto* c : conns) work |= c->needsEngine();
    if (work) {
      // Work another thread held the lock of for a moment: look again soon.
      std::this_thread::yield();
      continue;
    }
    mine_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!stopping_.load()) futexWait(&mine_->doorbell, seen, static_cast<int>(liveness.count()));
    mine_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  mine_->closed.store(1);
  pthread_mutex_unlock(&mine_->alive);
}

}  // namespace shm
}  // namespace loom
