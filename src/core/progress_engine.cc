#include "core/progress_engine.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "core/affinity.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/status.hpp"

namespace loom {

ProgressEngine::ProgressEngine(int rank) : rank_(rank) {
  epollFd_ = epoll_create1(EPOLL_CLOEXEC);
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epollFd_ < 0 || wakeFd_ < 0) LOOM_THROW(ErrorCode::System, rank, "epoll/eventfd: " + errnoText(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the wake-up fd
  epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev);
  planProgressBinding();
  thread_ = std::thread([this] { run(); });
}

ProgressEngine::~ProgressEngine() {
  stop();
  close(epollFd_);
  close(wakeFd_);
}

void ProgressEngine::add(int fd, PollHandler* handler, uint32_t events) {
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

void ProgressEngine::stop() {
  if (stopping_.exchange(true)) {
    if (thread_.joinable() && !onEngineThread()) thread_.join();
    return;
  }
  uint64_t one = 1;
  (void)!write(wakeFd_, &one, sizeof(one));
  if (thread_.joinable() && !onEngineThread()) thread_.join();
}

void ProgressEngine::run() {
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

}  // namespace loom
