#include "core/progress_engine.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/affinity.hpp"
#include "core/format.hpp"
#include "core/futex.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/status.hpp"

namespace loom {
namespace {

// The names say shared memory: its doorbell is the only wake word so far, and users set these.
LOOM_PARAM_INT(engineSpinParam, "LOOM_SHM_ENGINE_SPIN_US", 20,
               "microseconds a progress engine woken through a wake word (shared memory's) keeps looking for "
               "work before it sleeps");
LOOM_PARAM_INT(livenessMsParam, "LOOM_SHM_LIVENESS_MS", 100,
               "how often (ms) a progress engine woken through a wake word checks that its peers still run");

}  // namespace

ProgressEngine::ProgressEngine(int rank) : rank_(rank) {
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epollFd_ < 0 || wakeFd_ < 0) LOOM_THROW(ErrorCode::System, rank, "epoll/eventfd: " + errnoText(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the wake-up fd
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev);
  planProgressBinding();
  thread_ = std::thread([this] { runDescriptors(); });
}

ProgressEngine::ProgressEngine(int rank, WakeWord wake) : rank_(rank), wake_(wake) {}

ProgressEngine::~ProgressEngine() {
  stop();
  if (epollFd_ >= 0) close(epollFd_);
  if (wakeFd_ >= 0) close(wakeFd_);
}

void ProgressEngine::add(int fd, PollHandler* handler, uint32_t events) {
  if (epollFd_ < 0) LOOM_THROW(ErrorCode::Internal, rank_, "a descriptor added to an engine over a wake word");
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    LOOM_THROW(ErrorCode::System, rank_, "epoll_ctl add: " + errnoText(errno));
  }
}

void ProgressEngine::modify(int fd, PollHandler* handler, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  epoll_ctl(epollFd_, EPOLL_CTL_MOD, fd, &ev);
}

void ProgressEngine::remove(int fd) { epoll_ctl(epollFd_, EPOLL_CTL_DEL, fd, nullptr); }

void ProgressEngine::add(ProgressSource* source) {
  if (wake_.word == nullptr) LOOM_THROW(ErrorCode::Internal, rank_, "a source added to an engine over descriptors");
  std::lock_guard<std::mutex> lock(mu_);
  sources_.push_back(source);
  version_.fetch_add(1);
}

void ProgressEngine::start(std::function<void()> atStart, std::function<void()> atExit) {
  if (wake_.word == nullptr || thread_.joinable())
    LOOM_THROW(ErrorCode::Internal, rank_, "start() of an engine over descriptors, or started twice");
  atExit_ = std::move(atExit);
  std::atomic<int> started{0};
  planProgressBinding();
  thread_ = std::thread([this, &started, &atStart] {
    setThreadLogRank(rank_);
    bindProgressThread();
    if (atStart) atStart();
    started.store(1);
    runSources();
    if (atExit_) atExit_();
  });
  while (started.load() == 0) std::this_thread::yield();
}

void ProgressEngine::stop() {
  if (stopping_.exchange(true)) {
    if (thread_.joinable() && !onEngineThread()) thread_.join();
    return;
  }
  if (wake_.word != nullptr) {
    wake_.word->fetch_add(1);
    futexWakeAll(wake_.word);
  } else {
    uint64_t one = 1;
    (void)!write(wakeFd_, &one, sizeof(one));
  }
  if (thread_.joinable() && !onEngineThread()) thread_.join();
}

void ProgressEngine::runDescriptors() {
  setThreadLogRank(rank_);
  bindProgressThread();
  epoll_event events[64];
  while (!stopping_.load(std::memory_order_acquire)) {
    int n = epoll_wait(epollFd_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOOM_WARN("progress engine: epoll_wait failed: %s", errnoText(errno).c_str());
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (stopping_.load(std::memory_order_acquire)) return;
      auto* h = static_cast<PollHandler*>(events[i].data.ptr);
      if (h == nullptr) continue;  // wake-up
      h->onPollEvents(events[i].events);
    }
  }
}

void ProgressEngine::runSources() {
  const auto spin = std::chrono::microseconds(engineSpinParam());
  const auto maintainEvery = std::chrono::milliseconds(std::max<int64_t>(10, livenessMsParam()));
  std::vector<ProgressSource*> sources;
  uint32_t seenVersion = ~0u;
  auto lastMaintain = std::chrono::steady_clock::now();
  auto lastMove = lastMaintain;
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (version_.load() != seenVersion) {
      std::lock_guard<std::mutex> lock(mu_);
      sources = sources_;
      seenVersion = version_.load();
    }
    // Read before looking, so that work left after the look (a bumped word) is not slept through.
    const uint32_t seen = wake_.word->load(std::memory_order_seq_cst);
    bool moved = false;
    for (auto* s : sources) moved |= s->progress();
    const auto now = std::chrono::steady_clock::now();
    if (now - lastMaintain >= maintainEvery) {
      for (auto* s : sources) s->maintain();
      lastMaintain = now;
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
    for (auto* s : sources) work |= s->needsEngine();
    if (work) {
      // Work another thread held the lock of for a moment: look again soon.
      std::this_thread::yield();
      continue;
    }
    wake_.sleepers->fetch_add(1, std::memory_order_seq_cst);
    if (!stopping_.load()) futexWait(wake_.word, seen, static_cast<int>(maintainEvery.count()));
    wake_.sleepers->fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace loom
