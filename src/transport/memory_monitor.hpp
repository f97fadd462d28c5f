// MemoryMonitor: tells registration caches when the process's address space changes under a
// range, so that a registration of it is stale.
//
// A transport that registers memory (an RDMA NIC pins the physical pages behind a virtual range)
// may keep a registration for reuse only while the range still maps the same pages. When user
// memory is freed and the same addresses are handed out again, they usually map new pages: glibc
// unmaps a large block on free() and maps a fresh one on the next malloc(), trims its heaps with
// madvise(MADV_DONTNEED) or by shrinking brk, and a program may mmap(MAP_FIXED) over a range. A
// cached registration would then move bytes to or from the old pages: silent corruption.
//
// The monitor sees every such change by redirecting the entry of libc's munmap, mmap, mremap,
// madvise and brk to hooks that note the range and then make the system call themselves (UCX's
// memory hooks do the same). This catches libc's own calls from free() and its heap trimming,
// which symbol interposition cannot. The redirection is installed once per process, on the first
// get(), and only over function entries whose bytes are known (glibc's system-call template and
// the forms Debian 12's glibc has); anything else, LOOM_MEMORY_HOOKS=0, or a refusal to write
// libc's code leaves the monitor unavailable (get() returns nullptr, reason() says why), and
// caches then keep no registration past its use, which is always correct. Not seen: raw system
// calls made without libc, shmdt, and changes by another process.
//
// The hooks run inside any thread's call to munmap etc., so they only append the range to a
// fixed ring (no lock, no allocation); caches read the ring from their own cursor when they next
// look up a registration, before reusing one.
#pragma once

#include <cstdint>
#include <string>

#include "core/function_ref.hpp"

namespace loom {

class MemoryMonitor {
 public:
  /// The process's monitor, installing its hooks on the first call; nullptr where unavailable.
  static MemoryMonitor* get();
  /// Why get() returns nullptr ("" when it does not).
  static std::string reason();

  /// How many changes have been noted so far: a cursor at this value has seen them all.
  uint64_t published() const;
  /// Calls `changed(begin, end)` for each change noted from *cursor on, and moves *cursor past
  /// them. Returns false when some were lost (the reader fell more than the ring's length behind):
  /// the reader must then treat every range as changed.
  bool drain(uint64_t* cursor, FunctionRef<void(uintptr_t, uintptr_t)> changed) const;
  /// Notes a change of [begin, end) (rounded out to pages). Called by the hooks; any thread;
  /// never blocks or allocates.
  static void note(uintptr_t begin, uintptr_t end) noexcept;
};

}  // namespace loom
