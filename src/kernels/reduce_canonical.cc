// The canonical reduction of reproducible mode (reduce.hpp, reduceCanonical): every element of
// n inputs combined along one fixed tree over input order, whatever the caller's algorithm.
//
// The tree: canon(x[lo, lo + k)) = x[lo] for k = 1, else op(canon(x[lo, lo + p)), canon(x[lo + p,
// lo + k))) with p the largest power of two below k. Up to 8 inputs it is unrolled per element;
// beyond, it is built block by block, streaming, like a binary counter:
// each input is pushed as a subtree of one leaf, two subtrees of equal size on top are combined,
// and what remains is combined from the top down. Half-precision inputs are widened to float32
// and the result rounded once; avg divides the canonical sum once, in the accumulator's type.
// Only IEEE additions, multiplications and one division: every instruction set (the target
// clones) and the CUDA kernel compute the same bits.
#include <algorithm>
#include <cstring>

#include "kernels/half_bits.hpp"
#include "kernels/reduce.hpp"

namespace loom {
namespace kernels {
namespace {

#define LOOM_INLINE static inline __attribute__((always_inline))

#if defined(__SANITIZE_THREAD__)
#define LOOM_CLONES  // (reduce_cpu.cc: ThreadSanitizer and ifunc resolvers)
#else
#define LOOM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

constexpr size_t kBlock = 256;  // elements per pass: every level's accumulator stays in L1
constexpr int kLevels = 33;     // subtrees on the stack: at most log2(n) + 1

// Loads and stores that allow any alignment, widening the half types to float.
struct F32 {
  using Acc = float;
  LOOM_INLINE float load(const void* p, size_t i) {
    float v;
    std::memcpy(&v, static_cast<const float*>(p) + i, 4);
    return v;
  }
  LOOM_INLINE void store(void* p, size_t i, float v) { std::memcpy(static_cast<float*>(p) + i, &v, 4); }
};
struct F64 {
  using Acc = double;
  LOOM_INLINE double load(const void* p, size_t i) {
    double v;
    std::memcpy(&v, static_cast<const double*>(p) + i, 8);
    return v;
  }
  LOOM_INLINE void store(void* p, size_t i, double v) { std::memcpy(static_cast<double*>(p) + i, &v, 8); }
};
LOOM_INLINE uint16_t bits16(const void* p, size_t i) {
  uint16_t b;
  std::memcpy(&b, static_cast<const uint16_t*>(p) + i, 2);
  return b;
}
struct Bf16 {
  using Acc = float;
  LOOM_INLINE float load(const void* p, size_t i) {
    const uint32_t u = static_cast<uint32_t>(bits16(p, i)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  LOOM_INLINE void store(void* p, size_t i, float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      b = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    } else {
      b = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    std::memcpy(static_cast<uint16_t*>(p) + i, &b, 2);
  }
};
struct F16 {
  using Acc = float;
#if defined(__FLT16_MAX__)
  LOOM_INLINE float load(const void* p, size_t i) {
    _Float16 h;
    std::memcpy(&h, static_cast<const _Float16*>(p) + i, 2);
    return static_cast<float>(h);
  }
  LOOM_INLINE void store(void* p, size_t i, float f) {
    const auto h = static_cast<_Float16>(f);
    std::memcpy(static_cast<_Float16*>(p) + i, &h, 2);
  }
#else
  LOOM_INLINE float load(const void* p, size_t i) { return halfBitsToFloat(bits16(p, i)); }
  LOOM_INLINE void store(void* p, size_t i, float f) {
    const uint16_t b = floatToHalfBits(f);
    std::memcpy(static_cast<uint16_t*>(p) + i, &b, 2);
  }
#endif
};

struct Add {
  template <typename A>
  LOOM_INLINE A f(A a, A b) {
    return a + b;
  }
};
struct Mul {
  template <typename A>
  LOOM_INLINE A f(A a, A b) {
    return a * b;
  }
};

// One block of `len` elements from `offset`: the stack of subtrees, combined as described above.
template <typename T, typename Op>
LOOM_INLINE void block(void* dst, const void* const* srcs, int n, size_t offset, size_t len, bool avg) {
  using A = typename T::Acc;
  alignas(64) A acc[kLevels][kBlock];
  int leaves[kLevels];
  int depth = 0;
  for (int s = 0; s < n; ++s) {
    const void* src = srcs[s];
    if (depth > 0 && leaves[depth - 1] == 1) {
      // The common step, fused: a leaf meets a leaf on top.
      A* top = acc[depth - 1];
      for (size_t i = 0; i < len; ++i) top[i] = Op::f(top[i], T::load(src, offset + i));
      leaves[depth - 1] = 2;
    } else {
      A* top = acc[depth];
      for (size_t i = 0; i < len; ++i) top[i] = T::load(src, offset + i);
      leaves[depth++] = 1;
    }
    while (depth >= 2 && leaves[depth - 1] == leaves[depth - 2]) {
      A* left = acc[depth - 2];
      const A* right = acc[depth - 1];
      for (size_t i = 0; i < len; ++i) left[i] = Op::f(left[i], right[i]);
      leaves[depth - 2] *= 2;
      --depth;
    }
  }
  for (; depth >= 2; --depth) {
    A* left = acc[depth - 2];
    const A* right = acc[depth - 1];
    for (size_t i = 0; i < len; ++i) left[i] = Op::f(left[i], right[i]);
  }
  if (avg) {
    const A k = static_cast<A>(n);
    for (size_t i = 0; i < len; ++i) acc[0][i] = acc[0][i] / k;
  }
  for (size_t i = 0; i < len; ++i) T::store(dst, offset + i, acc[0][i]);
}

// Up to 8 inputs, the common case (ranks of a node, nodes of a job): the tree unrolled at compile
// time, one pass over the elements with the values in registers.
constexpr int largestPowerOfTwoBelow(int k) {
  int p = 1;
  while (p * 2 < k) p *= 2;
  return p;
}

template <typename A, typename Op, int Lo, int K>
LOOM_INLINE A tree(const A* v) {
  if constexpr (K == 1) {
    return v[Lo];
  } else {
    constexpr int P = largestPowerOfTwoBelow(K);
    return Op::f(tree<A, Op, Lo, P>(v), tree<A, Op, Lo + P, K - P>(v));
  }
}

template <typename T, typename Op, int N>
LOOM_INLINE void unrolled(void* dst, const void* const* srcs, size_t count, bool avg) {
  using A = typename T::Acc;
  const void* s[N];
  for (int k = 0; k < N; ++k) s[k] = srcs[k];
  const A divisor = static_cast<A>(N);
  for (size_t i = 0; i < count; ++i) {
    A v[N];
    for (int k = 0; k < N; ++k) v[k] = T::load(s[k], i);
    A r = tree<A, Op, 0, N>(v);
    if (avg) r = r / divisor;
    T::store(dst, i, r);  // element i read from every input before it is written
  }
}

// dst may be one of srcs: each element (unrolled) or block (more inputs) is read in full before its
// result is written. (Functions, not a template: clang does not multiversion templates.)
#define LOOM_CANONICAL(NAME, T, OP)                                                          \
  LOOM_CLONES void NAME(void* dst, const void* const* srcs, int n, size_t count, bool avg) { \
    switch (n) {                                                                             \
      case 1:                                                                                \
        return unrolled<T, OP, 1>(dst, srcs, count, avg);                                    \
      case 2:                                                                                \
        return unrolled<T, OP, 2>(dst, srcs, count, avg);                                    \
      case 3:                                                                                \
        return unrolled<T, OP, 3>(dst, srcs, count, avg);                                    \
      case 4:                                                                                \
        return unrolled<T, OP, 4>(dst, srcs, count, avg);                                    \
      case 5:                                                                                \
        return unrolled<T, OP, 5>(dst, srcs, count, avg);                                    \
      case 6:                                                                                \
        return unrolled<T, OP, 6>(dst, srcs, count, avg);                                    \
      case 7:                                                                                \
        return unrolled<T, OP, 7>(dst, srcs, count, avg);                                    \
      case 8:                                                                                \
        return unrolled<T, OP, 8>(dst, srcs, count, avg);                                    \
      default:                                                                               \
        for (size_t off = 0; off < count; off += kBlock)                                     \
          block<T, OP>(dst, srcs, n, off, std::min(kBlock, count - off), avg);               \
    }                                                                                        \
  }
LOOM_CANONICAL(sumF32, F32, Add)
LOOM_CANONICAL(prodF32, F32, Mul)
LOOM_CANONICAL(sumF64, F64, Add)
LOOM_CANONICAL(prodF64, F64, Mul)
LOOM_CANONICAL(sumF16, F16, Add)
LOOM_CANONICAL(prodF16, F16, Mul)
LOOM_CANONICAL(sumBf16, Bf16, Add)
LOOM_CANONICAL(prodBf16, Bf16, Mul)

using Canonical = void (*)(void*, const void* const*, int, size_t, bool);

}  // namespace

bool isCanonicalReduction(DataType type, ReduceOp op) {
  const bool floating =
      type == DataType::Float16 || type == DataType::Float32 || type == DataType::Float64 || type == DataType::Bfloat16;
  return floating && (op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Prod);
}

void reduceCanonical(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op) {
  if (count == 0 || n <= 0) return;
  if (!isCanonicalReduction(type, op)) {
    // Exact whatever the order (integers wrap; min and max pick): rank order, as pairs.
    if (n == 1) {
      if (dst != srcs[0]) std::memmove(dst, srcs[0], count * sizeOf(type));
    } else {
      reduce(dst, srcs[0], srcs[1], count, type, op);
      for (int s = 2; s < n; ++s) reduce(dst, dst, srcs[s], count, type, op);
    }
    if (op == ReduceOp::Avg) divide(dst, count, type, n);
    return;
  }
  const bool prod = op == ReduceOp::Prod;
  Canonical fn = nullptr;
  switch (type) {
    case DataType::Float32:
      fn = prod ? prodF32 : sumF32;
      break;
    case DataType::Float64:
      fn = prod ? prodF64 : sumF64;
      break;
    case DataType::Float16:
      fn = prod ? prodF16 : sumF16;
      break;
    default:
      fn = prod ? prodBf16 : sumBf16;
      break;
  }
  fn(dst, srcs, n, count, op == ReduceOp::Avg);
}

}  // namespace kernels
}  // namespace loom
