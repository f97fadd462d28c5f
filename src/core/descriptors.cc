#include "core/descriptors.hpp"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <mutex>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"

namespace loom {

LOOM_PARAM_INT(raiseLimitParam, "LOOM_RAISE_FD_LIMIT", 1,
               "1: raise the soft file-descriptor limit toward the hard one when the links need more; 0: never");

size_t openDescriptors() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  size_t n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n > 3 ? n - 3 : 0;  // ".", ".." and the directory's own
}

namespace {

std::mutex mu;
size_t promised = 0;  // guarded by mu

std::string roomLocked(size_t more) {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0) return std::string();
  // A margin for what the application and the rest of init open meanwhile; only the bare need
  // must fit for the link table to go ahead.
  const size_t open = openDescriptors() + promised, need = open + more, want = need + 64;
  if (l.rlim_cur == RLIM_INFINITY || want <= l.rlim_cur) return std::string();
  if (raiseLimitParam() == 0 || (l.rlim_max != RLIM_INFINITY && l.rlim_max <= l.rlim_cur)) {
    if (need <= l.rlim_cur) return std::string();
    return strFormat(
        "it needs about %zu more file descriptors, and %zu are open or about to be, but the soft limit (ulimit -n) "
        "is %llu%s",
        more, open, static_cast<unsigned long long>(l.rlim_cur),
        raiseLimitParam() == 0 ? " and LOOM_RAISE_FD_LIMIT=0" : ", as is the hard limit");
  }
  if (l.rlim_max != RLIM_INFINITY && need > l.rlim_max) {
    return strFormat(
        "it needs about %zu more file descriptors, and %zu are open or about to be, but the hard limit "
        "(ulimit -Hn) is %llu",
        more, open, static_cast<unsigned long long>(l.rlim_max));
  }
  const rlim_t old = l.rlim_cur;
  l.rlim_cur = l.rlim_max == RLIM_INFINITY ? static_cast<rlim_t>(want) : l.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &l) != 0) {
    return strFormat(
        "it needs about %zu more file descriptors, and the soft limit (ulimit -n) of %llu could "
        "not be raised",
        more, static_cast<unsigned long long>(old));
  }
  LOOM_INFO("raised the soft file-descriptor limit from %llu to %llu (the links need about %zu)",
            static_cast<unsigned long long>(old), static_cast<unsigned long long>(l.rlim_cur), more);
  return std::string();
}

}  // namespace

void releaseDescriptors(size_t more) {
  std::lock_guard<std::mutex> lock(mu);
  promised -= std::min(promised, more);
}

std::string makeRoomForDescriptors(size_t more, bool mustFit) {
  std::lock_guard<std::mutex> lock(mu);
  // Counting is a walk of /proc/self/fd, whose length grows with the links of every rank in the
  // process (ranks as threads: quadratic in all); skip it where no answer would change anything.
  if (!mustFit) {
    rlimit l{};
    if (getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur == RLIM_INFINITY || l.rlim_cur == l.rlim_max ||
        raiseLimitParam() == 0) {
      promised += more;  // as if counted: the caller releases it
      return std::string();
    }
  }
  const std::string why = roomLocked(more);
  if (why.empty()) promised += more;
  return why;
}

}  // namespace loom
