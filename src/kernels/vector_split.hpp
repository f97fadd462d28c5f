// How an element-wise kernel splits `count` elements over pointers that may not be aligned:
// scalar head elements until every pointer reaches a vector boundary, whole vectors, then a
// scalar tail. When the pointers are misaligned differently from one another no common boundary
// exists, and every element goes through the scalar path. Pure arithmetic, shared by the CUDA
// kernels (device code) and the unit tests (host code).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom {
namespace kernels {

/// Elements: `head` scalar ones, then `vectors` vectors of `perVector` elements, then `tail` scalar ones.
struct VectorSplit {
  size_t head = 0;
  size_t vectors = 0;
  size_t perVector = 1;
  size_t tail = 0;
};

/// The split for `count` elements of `elem` bytes at addresses `addrs[0..n)`, with vectors of
/// `vecBytes` (a power of two, a multiple of `elem`). Covers exactly `count` elements.
LOOM_HOST_DEVICE inline VectorSplit planVectorSplit(const uintptr_t* addrs, int n, size_t count, size_t elem,
                                                    size_t vecBytes = 16) {
  VectorSplit s;
  s.perVector = vecBytes / elem;
  const uintptr_t off = n > 0 ? addrs[0] % vecBytes : 0;
  bool common = off % elem == 0;
  for (int i = 1; i < n && common; ++i) common = addrs[i] % vecBytes == off;
  if (!common || s.perVector <= 1) {
    s.head = count;
    s.perVector = common ? s.perVector : 1;
    return s;
  }
  size_t head = off == 0 ? 0 : (vecBytes - off) / elem;
  if (head > count) head = count;
  s.head = head;
  s.vectors = (count - head) / s.perVector;
  s.tail = count - head - s.vectors * s.perVector;
  return s;
}

}  // namespace kernels
}  // namespace loom
