#include "core/progress_engine.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/affinity.hpp"
#include "core/format.hpp"
#include "core/futex.hpp"
#include "core/logging.hpp"
#include "core/progress_policy.hpp"
#include "core/status.hpp"

namespace loom {

ProgressEngine::ProgressEngine(int rank) : rank_(rank) {
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epollFd_ < 0 || wakeFd_ < 0) {
    const int err = errno;
    // The constructor throws: no destructor closes what was made.
    if (epollFd_ >= 0) ::close(epollFd_);
    if (wakeFd_ >= 0) ::close(wakeFd_);
    rlimit limit{};
    std::string advice;
    if (err == EMFILE && getrlimit(RLIMIT_NOFILE, &limit) == 0) {
      advice = strFormat(
          ": this process holds as many descriptors as its soft limit allows (%llu); raise the limit "
          "(ulimit -n)",
          static_cast<unsigned long long>(limit.rlim_cur));
    } else if (err == ENFILE) {
      advice = ": the system's descriptor table is full (sysctl fs.file-max)";
    }
    LOOM_THROW(
        ErrorCode::System, rank,
        strFormat("cannot make a progress engine (epoll, eventfd): %s%s", errnoText(err).c_str(), advice.c_str()));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the wake-up fd
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev);
  wake_.attending = &localAttending_;
  wake_.waiters = &localWaiters_;
  planProgressBinding();
  thread_ = std::thread([this] { runDescriptors(); });
}

ProgressEngine::ProgressEngine(int rank, WakeWord wake) : rank_(rank), wake_(wake) {
  if (wake_.word == nullptr || wake_.sleepers == nullptr)
    LOOM_THROW(ErrorCode::Internal, rank, "a wake-word engine needs the word and its sleepers count");
  if (wake_.attending == nullptr) wake_.attending = &localAttending_;
  if (wake_.waiters == nullptr) wake_.waiters = &localWaiters_;
}

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
  if (sealed_.load()) LOOM_THROW(ErrorCode::Internal, rank_, "a source added to a sealed progress engine");
  std::lock_guard<std::mutex> lock(mu_);
  source->engine_ = this;
  sources_.push_back(source);
  version_.fetch_add(1);
}

void ProgressEngine::attend(bool on) noexcept {
  if (wake_.word == nullptr) return;  // descriptors: readiness is the kernel's, nothing to hand over
  if (on) {
    wake_.attending->fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  if (wake_.attending->fetch_sub(1, std::memory_order_seq_cst) != 1) return;
  // Writers that saw the count did not wake the engine for what they left meanwhile.
  handOver(false);
}

void ProgressEngine::pollBegin(ProgressSource& source, bool alsoAttend) noexcept {
  source.pollers_.fetch_add(1, std::memory_order_acq_rel);
  if (alsoAttend) attend(true);
}

void ProgressEngine::pollEnd(ProgressSource& source, bool alsoAttend) noexcept {
  if (source.pollers_.fetch_sub(1, std::memory_order_acq_rel) == 1) source.resume(false);
  if (alsoAttend) attend(false);
}

void ProgressEngine::waiting(bool on) noexcept {
  if (!on) {
    wake_.waiters->fetch_sub(1, std::memory_order_seq_cst);
    return;
  }
  wake_.waiters->fetch_add(1, std::memory_order_seq_cst);
  // A writer that saw no waiter left its work without a wake-up: the engine must look now.
  handOver(true);
}

void ProgressEngine::handOver(bool sleeper) noexcept {
  const bool word = wake_.word != nullptr;
  auto run = [&](const std::vector<ProgressSource*>& sources) {
    bool wake = false;
    for (auto* s : sources) {
      s->resume(sleeper);
      if (!word) continue;
      // Taking in what is there from this thread costs less than waking the engine for it.
      if (!sleeper && s->hasWork()) s->progress();
      wake = wake || (sleeper ? s->hasWork() : s->needsEngine());
    }
    return wake;
  };
  bool wake;
  if (sealed_.load(std::memory_order_acquire)) {
    wake = run(sources_);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    wake = run(sources_);
  }
  if (wake) wakeWord();
}

void ProgressEngine::wakeWord() noexcept {
  // A thread that attends hands over itself when it leaves (attend).
  if (wake_.attending->load(std::memory_order_seq_cst) != 0) return;
  wake_.word->fetch_add(1, std::memory_order_seq_cst);
  if (wake_.sleepers->load(std::memory_order_seq_cst) > 0) futexWakeAll(wake_.word);
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
  const auto spin = progress::engineSpin();
  const auto maintainEvery = progress::maintenancePeriod();
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
