#include "comm/dump_signal.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "comm/comm_impl.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"

namespace loom {
namespace detail {
namespace {

LOOM_PARAM_STR(dumpSignalParam, "LOOM_DUMP_SIGNAL", "",
               "signal (USR1, USR2 or a number) on which every communicator of the process prints its flight "
               "record and hang report to stderr (default: none)");

struct Registry {
  std::mutex mu;  // held while dumping: a communicator is not destroyed under a dump
  std::set<CommImpl*> live;
  std::once_flag installed;
  int pipe[2] = {-1, -1};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the watcher thread outlives main()
  return *r;
}

void onSignal(int) {
  const int saved = errno;
  const char byte = 1;
  if (::write(registry().pipe[1], &byte, 1) < 0) {
    // The pipe is full: a dump is already pending.
  }
  errno = saved;
}

void watch() {
  Registry& reg = registry();
  for (;;) {
    char byte;
    const ssize_t n = ::read(reg.pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::lock_guard<std::mutex> lock(reg.mu);
    for (CommImpl* c : reg.live) {
      const std::string text = c->diagnostics().dumpText();
      std::fprintf(stderr, "%s", text.c_str());
      std::fflush(stderr);
    }
  }
}

void install() {
  const std::string text = dumpSignalParam();
  const int sig = dumpSignalNumber(text);
  if (sig == 0) return;
  if (sig < 0) {
    LOOM_WARN("LOOM_DUMP_SIGNAL=%s is not a signal (USR1, USR2 or a number): no dump on signal", text.c_str());
    return;
  }
  Registry& reg = registry();
  if (::pipe2(reg.pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
  // The reading end blocks: the watcher sleeps on it.
  const int flags = ::fcntl(reg.pipe[0], F_GETFL);
  ::fcntl(reg.pipe[0], F_SETFL, flags & ~O_NONBLOCK);
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(sig, &sa, nullptr) != 0) return;
  std::thread(watch).detach();
  LOOM_INFO("signal %d (LOOM_DUMP_SIGNAL) prints every communicator's flight record", sig);
}

}  // namespace

int dumpSignalNumber(const std::string& text) {
  std::string name = text;
  if (name.empty()) return 0;
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  if (name == "USR1") return SIGUSR1;
  if (name == "USR2") return SIGUSR2;
  char* end = nullptr;
  const long n = std::strtol(name.c_str(), &end, 10);
  if (end == name.c_str() || *end != '\0' || n <= 0 || n >= NSIG || n == SIGKILL || n == SIGSTOP) return -1;
  return static_cast<int>(n);
}

void registerForDump(CommImpl* comm) {
  Registry& reg = registry();
  std::call_once(reg.installed, install);
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.live.insert(comm);
}

void unregisterForDump(CommImpl* comm) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.live.erase(comm);
}

}  // namespace detail
}  // namespace loom
