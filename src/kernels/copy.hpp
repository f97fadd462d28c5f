// Bulk copies of message data. glibc's memcpy copies mid-sized buffers (about 2 KiB to 1 MiB
// here) with `rep movsb`, which some x86 processors run at a tenth of their speed or less when the
// destination sits 1 to 63 bytes past the source modulo 4096: every store then seems to overlap a
// load still in flight. That is exactly where a buffer from malloc's mmap path (page + 16) meets a
// page-aligned shared-memory area (bench/copy_bench shows it; docs/performance.md). copy() takes a
// vector loop for those distances and leaves every other copy to memcpy.
//
// Pure functions: no allocation, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {
namespace kernels {

/// Copies shorter than this never take `rep movsb` (glibc's threshold is about 2 KiB).
constexpr size_t kSlowMemcpyMinBytes = 1024;

/// Whether copying n bytes from `src` to `dst` with memcpy would hit the slow distance above.
inline bool slowMemcpyDistance(const void* dst, const void* src, size_t n) {
  const uintptr_t d = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  return n >= kSlowMemcpyMinBytes && d != 0 && d < 64;
}

/// memcpy(dst, src, n) for buffers that do not overlap, at full speed whatever their distance.
void copy(void* dst, const void* src, size_t n);

/// The vector loop copy() takes at the slow distances, on its own (for tests and benchmarks).
void vectorCopy(void* dst, const void* src, size_t n);

}  // namespace kernels
}  // namespace loom
