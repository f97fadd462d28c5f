// Bulk copies (see copy.hpp): memcpy, but for the source-destination distances where its
// `rep movsb` path crawls, a loop of unaligned vector loads and aligned vector stores.
#include "kernels/copy.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom {
namespace kernels {
namespace {

#if defined(__x86_64__)
// Each loop aligns the destination first (a short memcpy), then copies whole vectors, four at a
// time, with unaligned loads and aligned stores, and ends with a short memcpy of the tail.
inline void alignHead(uint8_t*& d, const uint8_t*& s, size_t& n, size_t w) {
  const size_t head = std::min(n, (w - reinterpret_cast<uintptr_t>(d) % w) % w);
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
}

__attribute__((target("avx2"))) void copyAvx2(uint8_t* d, const uint8_t* s, size_t n) {
  alignHead(d, s, n, 32);
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  std::memcpy(d + i, s + i, n - i);
}

void copySse2(uint8_t* d, const uint8_t* s, size_t n) {
  alignHead(d, s, n, 16);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_store_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_store_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_store_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_store_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
}

using CopyFn = void (*)(uint8_t*, const uint8_t*, size_t);

CopyFn pickCopy() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? copyAvx2 : copySse2;
}
#endif

}  // namespace

void vectorCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  static const CopyFn fn = pickCopy();
  fn(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
#else
  std::memcpy(dst, src, n);
#endif
}

void copy(void* dst, const void* src, size_t n) {
  if (slowMemcpyDistance(dst, src, n))
    vectorCopy(dst, src, n);
  else if (n > 0)
    std::memcpy(dst, src, n);
}

}  // namespace kernels
}  // namespace loom
