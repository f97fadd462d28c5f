#include "transport/shm/shm_engine.hpp"

#include <pthread.h>

namespace loom {
namespace shm {

void ShmEngine::start() {
  engine_.start([this] { pthread_mutex_lock(&mine_->alive); },
                [this] {
                  mine_->closed.store(1);
                  pthread_mutex_unlock(&mine_->alive);
                });
}

void ShmEngine::add(ShmConnection* c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.push_back(c);
  }
  engine_.add(c);
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

}  // namespace shm
}  // namespace loom
