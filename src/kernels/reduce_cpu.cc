#include <cpuid.h>
#include <immintrin.h>

#include <cstring>

#include "kernels/half_bits.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace kernels {
namespace {

// bfloat16 as its bits; converted inline so that the loops vectorise.
struct Bf16 {
  uint16_t bits;
};

#define LOOM_INLINE static inline __attribute__((always_inline))

LOOM_INLINE float toFloat(Bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
LOOM_INLINE Bf16 fromFloat(float f, Bf16) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>(u >> 16)};
}
#if defined(__FLT16_MAX__)
// float16 as the compiler's type (GCC 12; clang from 15 on).
using Half = _Float16;
LOOM_INLINE float toFloat(Half v) { return static_cast<float>(v); }
LOOM_INLINE Half fromFloat(float f, Half) { return static_cast<Half>(f); }
#else
// A compiler without _Float16 on this target (clang 14, which tools/fuzz.sh uses): float16 as its
// bits, converted in software with the same rounding (half_bits.hpp).
struct Half {
  uint16_t bits;
};
LOOM_INLINE float toFloat(Half v) { return halfBitsToFloat(v.bits); }
LOOM_INLINE Half fromFloat(float f, Half) { return Half{floatToHalfBits(f)}; }
#endif

// Integer arithmetic goes through the unsigned type: it wraps instead of overflowing.
template <typename T>
struct Wide {
  using U = T;
};
template <>
struct Wide<int8_t> {
  using U = uint8_t;
};
template <>
struct Wide<int32_t> {
  using U = uint32_t;
};
template <>
struct Wide<int64_t> {
  using U = uint64_t;
};

struct Sum {
  template <typename T>
  LOOM_INLINE T apply(T a, T b) {
    using U = typename Wide<T>::U;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  LOOM_INLINE float applyf(float a, float b) { return a + b; }
};
struct Prod {
  template <typename T>
  LOOM_INLINE T apply(T a, T b) {
    using U = typename Wide<T>::U;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  }
  LOOM_INLINE float applyf(float a, float b) { return a * b; }
};
struct Max {
  template <typename T>
  LOOM_INLINE T apply(T a, T b) {
    return a < b ? b : a;
  }
  LOOM_INLINE float applyf(float a, float b) { return a < b ? b : a; }
};
struct Min {
  template <typename T>
  LOOM_INLINE T apply(T a, T b) {
    return b < a ? b : a;
  }
  LOOM_INLINE float applyf(float a, float b) { return b < a ? b : a; }
};

// Element access that allows any address: operands are often not aligned to their type (a
// message's payload inside a socket's read buffer, a user's buffer at an odd offset). A
// fixed-size memcpy is one plain load or store, and the loops still vectorise.
template <typename T>
LOOM_INLINE T at(const T* p, size_t i) {
  T v;
  std::memcpy(&v, p + i, sizeof(T));
  return v;
}
template <typename T>
LOOM_INLINE void put(T* p, size_t i, T v) {
  std::memcpy(p + i, &v, sizeof(T));
}

template <typename T, typename Op>
LOOM_INLINE void loop(T* d, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) put(d, i, Op::template apply<T>(at(a, i), at(b, i)));
}
template <typename T, typename Op>
LOOM_INLINE void loopHalf(T* d, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) put(d, i, fromFloat(Op::applyf(toFloat(at(a, i)), toFloat(at(b, i))), T{}));
}

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer instruments the ifunc resolvers of target clones, which the dynamic loader runs
// before the sanitizer's runtime is up: one generic version there.
#define LOOM_CLONES
#else
#define LOOM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

// dst may alias a or b exactly: element i is read before it is written. (No __restrict: the
// compiler adds a run-time overlap check and still vectorises.)
#define LOOM_KERNEL(NAME, T, OP, BODY)                                                      \
  LOOM_CLONES void NAME(void* d, const void* a, const void* b, size_t n) {                  \
    BODY<T, OP>(static_cast<T*>(d), static_cast<const T*>(a), static_cast<const T*>(b), n); \
  }

#define LOOM_KERNELS_FOR(TN, T, BODY)   \
  LOOM_KERNEL(sum_##TN, T, Sum, BODY)   \
  LOOM_KERNEL(prod_##TN, T, Prod, BODY) \
  LOOM_KERNEL(max_##TN, T, Max, BODY)   \
  LOOM_KERNEL(min_##TN, T, Min, BODY)

LOOM_KERNELS_FOR(i8, int8_t, loop)
LOOM_KERNELS_FOR(u8, uint8_t, loop)
LOOM_KERNELS_FOR(i32, int32_t, loop)
LOOM_KERNELS_FOR(u32, uint32_t, loop)
LOOM_KERNELS_FOR(i64, int64_t, loop)
LOOM_KERNELS_FOR(u64, uint64_t, loop)
LOOM_KERNELS_FOR(f16generic, Half, loopHalf)

// The ops eight floats at a time, for the hand-vectorised half-precision loops below. Same operand
// order as the scalar ops (a < b ? b : a), so results match bit for bit.
struct VSum {
  static __attribute__((target("avx2"))) __m256 f(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
};
struct VProd {
  static __attribute__((target("avx2"))) __m256 f(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
};
struct VMax {
  static __attribute__((target("avx2"))) __m256 f(__m256 a, __m256 b) {
    return _mm256_blendv_ps(a, b, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  }
};
struct VMin {
  static __attribute__((target("avx2"))) __m256 f(__m256 a, __m256 b) {
    return _mm256_blendv_ps(a, b, _mm256_cmp_ps(b, a, _CMP_LT_OQ));
  }
};

// float16 with F16C: GCC 12 does not vectorise _Float16 conversions, so these convert eight at a
// time by hand.
template <typename V, typename Op>
__attribute__((target("avx2,f16c"))) void f16c(void* d, const void* a, const void* b, size_t n) {
  auto* dp = static_cast<uint16_t*>(d);
  auto* ap = static_cast<const uint16_t*>(a);
  auto* bp = static_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ap + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bp + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dp + i), _mm256_cvtps_ph(V::f(x, y), _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n)
    loopHalf<Half, Op>(reinterpret_cast<Half*>(dp + i), reinterpret_cast<const Half*>(ap + i),
                       reinterpret_cast<const Half*>(bp + i), n - i);
}

// bfloat16 with AVX2: GCC 12 vectorises neither the widening nor the rounding (its NaN branch) of
// loopHalf<Bf16> well (it ran at less than half of float32's rate), so these take sixteen at a
// time by hand, rounding exactly as fromFloat(float, Bf16) does. Widening interleaves
// zeros below each 16-bit value within 128-bit lanes (elements 0-3 and 8-11 in `lo`, 4-7 and 12-15
// in `hi`), and narrowing packs them back in that order: no lane crossing either way.
__attribute__((target("avx2"))) inline __m256i bf16Round(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i even = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, even), 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
}

template <typename V, typename Op>
__attribute__((target("avx2"))) void bf16avx2(void* d, const void* a, const void* b, size_t n) {
  auto* dp = static_cast<uint16_t*>(d);
  auto* ap = static_cast<const uint16_t*>(a);
  auto* bp = static_cast<const uint16_t*>(b);
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ap + i));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + i));
    const __m256 lo =
        V::f(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)), _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, y)));
    const __m256 hi =
        V::f(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, y)));
    // Every rounded word is <= 0xffff: the unsigned saturation of the pack never bites.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dp + i), _mm256_packus_epi32(bf16Round(lo), bf16Round(hi)));
  }
  if (i < n)
    loopHalf<Bf16, Op>(reinterpret_cast<Bf16*>(dp + i), reinterpret_cast<const Bf16*>(ap + i),
                       reinterpret_cast<const Bf16*>(bp + i), n - i);
}

bool haveAvx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
}

bool haveF16c() {
  static const bool yes = [] {
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;  // F16C is CPUID leaf 1, ECX (not every compiler names it)
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  }();
  return yes;
}

// The half types' entry points: the hand-vectorised loop where the CPU has what it needs, else
// the generic (target_clones) one.
#define LOOM_HALF(NAME, TN, HAVE, FAST, V, OP)                        \
  void NAME##_##TN(void* d, const void* a, const void* b, size_t n) { \
    if (HAVE()) return FAST<V, OP>(d, a, b, n);                       \
    NAME##_##TN##generic(d, a, b, n);                                 \
  }
#define LOOM_HALF_KERNELS(TN, HAVE, FAST)      \
  LOOM_HALF(sum, TN, HAVE, FAST, VSum, Sum)    \
  LOOM_HALF(prod, TN, HAVE, FAST, VProd, Prod) \
  LOOM_HALF(max, TN, HAVE, FAST, VMax, Max)    \
  LOOM_HALF(min, TN, HAVE, FAST, VMin, Min)

LOOM_HALF_KERNELS(f16, haveF16c, f16c)
LOOM_KERNELS_FOR(f32, float, loop)
LOOM_KERNELS_FOR(f64, double, loop)
LOOM_KERNELS_FOR(bf16generic, Bf16, loopHalf)
LOOM_HALF_KERNELS(bf16, haveAvx2, bf16avx2)

using Fn = void (*)(void*, const void*, const void*, size_t);
// Indexed by DataType, then by ReduceOp (Sum, Prod, Max, Min).
const Fn kTable[10][4] = {
    {sum_i8, prod_i8, max_i8, min_i8},     {sum_u8, prod_u8, max_u8, min_u8},
    {sum_i32, prod_i32, max_i32, min_i32}, {sum_u32, prod_u32, max_u32, min_u32},
    {sum_i64, prod_i64, max_i64, min_i64}, {sum_u64, prod_u64, max_u64, min_u64},
    {sum_f16, prod_f16, max_f16, min_f16}, {sum_f32, prod_f32, max_f32, min_f32},
    {sum_f64, prod_f64, max_f64, min_f64}, {sum_bf16, prod_bf16, max_bf16, min_bf16},
};

template <typename T>
void divideInt(T* p, size_t n, int k) {
  for (size_t i = 0; i < n; ++i) put(p, i, static_cast<T>(at(p, i) / static_cast<T>(k)));
}
template <typename T>
void divideHalf(T* p, size_t n, int k) {
  const float fk = static_cast<float>(k);
  for (size_t i = 0; i < n; ++i) put(p, i, fromFloat(toFloat(at(p, i)) / fk, T{}));
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op) {
  const int o = op == ReduceOp::Avg ? 0 : static_cast<int>(op);
  kTable[static_cast<int>(type)][o](dst, a, b, count);
}

void divide(void* buf, size_t n, DataType type, int k) {
  switch (type) {
    case DataType::Int8:
      return divideInt(static_cast<int8_t*>(buf), n, k);
    case DataType::Uint8:
      return divideInt(static_cast<uint8_t*>(buf), n, k);
    case DataType::Int32:
      return divideInt(static_cast<int32_t*>(buf), n, k);
    case DataType::Uint32:
      return divideInt(static_cast<uint32_t*>(buf), n, static_cast<int>(k));
    case DataType::Int64:
      return divideInt(static_cast<int64_t*>(buf), n, k);
    case DataType::Uint64:
      return divideInt(static_cast<uint64_t*>(buf), n, k);
    case DataType::Float16:
      return divideHalf(static_cast<Half*>(buf), n, k);
    case DataType::Bfloat16:
      return divideHalf(static_cast<Bf16*>(buf), n, k);
    case DataType::Float32: {
      auto* p = static_cast<float*>(buf);
      for (size_t i = 0; i < n; ++i) put(p, i, at(p, i) / static_cast<float>(k));
      return;
    }
    case DataType::Float64: {
      auto* p = static_cast<double*>(buf);
      for (size_t i = 0; i < n; ++i) put(p, i, at(p, i) / static_cast<double>(k));
      return;
    }
  }
}

const char* isaName() {
  __builtin_cpu_init();
#if defined(__clang__) && __clang_major__ < 16  // no micro-architecture levels: their main feature
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2")) return "avx2";
#else
  if (__builtin_cpu_supports("x86-64-v4")) return "avx512";
  if (__builtin_cpu_supports("x86-64-v3")) return "avx2";
#endif
  return "baseline";
}

float bf16ToFloat(uint16_t bits) { return toFloat(Bf16{bits}); }
uint16_t floatToBf16(float f) { return fromFloat(f, Bf16{}).bits; }
float fp16ToFloat(uint16_t bits) {
  Half h;
  std::memcpy(&h, &bits, 2);
  return toFloat(h);
}
uint16_t floatToFp16(float f) {
  const Half h = fromFloat(f, Half{});
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

}  // namespace kernels
}  // namespace loom
