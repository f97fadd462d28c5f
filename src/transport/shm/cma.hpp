// Cross-memory attach (process_vm_readv): the single-copy path for large shared-memory messages,
// the receiver reading straight from the sender's buffer. Linux allows it only to a process that
// may ptrace the other (same user, and Yama's ptrace_scope 0 or a parent/child relation, no
// seccomp filter against it); containers often forbid it. Loom probes it once per pair at setup
// and falls back to copying through the ring where it is refused.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace loom {
namespace shm {

/// Reads n bytes at `remote` in process `pid` into `local`. Returns 0, or the errno that stopped it
/// (EPERM: refused; ESRCH: no such process; EFAULT: bad address).
int cmaRead(pid_t pid, void* local, uint64_t remote, size_t n) noexcept;

/// Whether reading 8 bytes at `remote` in `pid` gives `expected` (so the pid and address name the
/// peer's memory as seen from here, and the kernel allows it).
bool cmaProbe(pid_t pid, uint64_t remote, uint64_t expected) noexcept;

/// Test hook: when non-zero, every cmaRead and cmaProbe fails with this errno (as a container that
/// forbids cross-memory attach would).
std::atomic<int>& cmaForcedErrno();

}  // namespace shm
}  // namespace loom
