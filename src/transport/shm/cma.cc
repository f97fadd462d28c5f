#include "transport/shm/cma.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>

namespace loom {
namespace shm {

std::atomic<int>& cmaForcedErrno() {
  static std::atomic<int> forced{0};
  return forced;
}

int cmaRead(pid_t pid, void* local, uint64_t remote, size_t n) noexcept {
  if (int forced = cmaForcedErrno().load(std::memory_order_relaxed)) return forced;
  auto* dst = static_cast<uint8_t*>(local);
  size_t done = 0;
  while (done < n) {
    // The kernel moves at most a little under 2 GiB per call; it may also stop short.
    const size_t piece = std::min<size_t>(n - done, size_t{1} << 30);
    iovec l{dst + done, piece};
    iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote + done)), piece};
    ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT;
    done += static_cast<size_t>(got);
  }
  return 0;
}

bool cmaProbe(pid_t pid, uint64_t remote, uint64_t expected) noexcept {
  uint64_t got = 0;
  return cmaRead(pid, &got, remote, sizeof(got)) == 0 && got == expected;
}

}  // namespace shm
}  // namespace loom
