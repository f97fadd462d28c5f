// CUDA reduction and copy kernels (see reduce_cuda.hpp for the contract).
//
// Layout of every element-wise kernel: planVectorSplit decides, from the pointers' alignment, how
// many leading elements go one at a time (head), how many 16-byte vectors follow, and how many
// elements trail (tail). Threads of the grid take vectors in a grid-stride loop; the head and tail
// are taken by the first threads. Each vector is loaded as a uint4 (one 16-byte transaction),
// reduced element by element in registers and stored as a uint4.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "core/format.hpp"
#include "core/status.hpp"
#include "kernels/reduce_cuda.hpp"
#include "kernels/vector_split.hpp"

namespace loom {
namespace kernels {
namespace cuda {
namespace {

// ---- Element arithmetic. Integers wrap (unsigned arithmetic); halves as on the CPU. ----

template <typename T>
struct Unsigned {
  using U = T;
};
template <>
struct Unsigned<int8_t> {
  using U = uint8_t;
};
template <>
struct Unsigned<int32_t> {
  using U = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using U = uint64_t;
};

// The type an n-input reduction accumulates in.
template <typename T>
struct Acc {
  using A = T;
  static __device__ __forceinline__ A in(T v) { return v; }
  static __device__ __forceinline__ T out(A v) { return v; }
};
template <>
struct Acc<__half> {
  using A = float;
  static __device__ __forceinline__ A in(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half out(A v) { return __float2half_rn(v); }
};
template <>
struct Acc<__nv_bfloat16> {
  using A = float;
  static __device__ __forceinline__ A in(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 out(A v) { return __float2bfloat16_rn(v); }
};

struct Sum {
  template <typename T>
  static __device__ __forceinline__ T apply(T a, T b) {
    using U = typename Unsigned<T>::U;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  static __device__ __forceinline__ float apply(float a, float b) { return a + b; }
  static __device__ __forceinline__ double apply(double a, double b) { return a + b; }
  static __device__ __forceinline__ __half apply(__half a, __half b) { return __hadd(a, b); }
  static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) { return __hadd(a, b); }
};
struct Prod {
  template <typename T>
  static __device__ __forceinline__ T apply(T a, T b) {
    using U = typename Unsigned<T>::U;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  }
  static __device__ __forceinline__ float apply(float a, float b) { return a * b; }
  static __device__ __forceinline__ double apply(double a, double b) { return a * b; }
  static __device__ __forceinline__ __half apply(__half a, __half b) { return __hmul(a, b); }
  static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmul(a, b); }
};
// Min and max compare as the CPU kernels do (a < b ? b : a), in float for the halves: the same
// operand wins on ties and NaNs, so both agree bit for bit.
struct Max {
  template <typename T>
  static __device__ __forceinline__ T apply(T a, T b) {
    return a < b ? b : a;
  }
  static __device__ __forceinline__ __half apply(__half a, __half b) {
    return __half2float(a) < __half2float(b) ? b : a;
  }
  static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __bfloat162float(a) < __bfloat162float(b) ? b : a;
  }
};
struct Min {
  template <typename T>
  static __device__ __forceinline__ T apply(T a, T b) {
    return b < a ? b : a;
  }
  static __device__ __forceinline__ __half apply(__half a, __half b) {
    return __half2float(b) < __half2float(a) ? b : a;
  }
  static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __bfloat162float(b) < __bfloat162float(a) ? b : a;
  }
};

// avg's division, as the CPU's divide(): integers divide in their own type, halves in float.
template <typename T>
__device__ __forceinline__ T divideBy(T v, int k) {
  return static_cast<T>(v / static_cast<T>(k));
}
template <>
__device__ __forceinline__ __half divideBy(__half v, int k) {
  return __float2half_rn(__half2float(v) / static_cast<float>(k));
}
template <>
__device__ __forceinline__ __nv_bfloat16 divideBy(__nv_bfloat16 v, int k) {
  return __float2bfloat16_rn(__bfloat162float(v) / static_cast<float>(k));
}

struct Inputs {
  const void* p[kMaxInputs];
  int n;
};

// One element of the n-input reduction: inputs in order, accumulated in Acc's type.
template <typename T, typename Op>
__device__ __forceinline__ T reduceOne(const Inputs& in, size_t i, int divisor) {
  using A = typename Acc<T>::A;
  A acc = Acc<T>::in(static_cast<const T*>(in.p[0])[i]);
  for (int k = 1; k < in.n; ++k) acc = Op::apply(acc, Acc<T>::in(static_cast<const T*>(in.p[k])[i]));
  T r = Acc<T>::out(acc);
  return divisor > 1 ? divideBy(r, divisor) : r;
}

template <typename T, typename Op>
__global__ void reduceKernel(T* dst, Inputs in, VectorSplit split, int divisor) {
  constexpr int kPer = 16 / sizeof(T);
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  // Scalar head and tail.
  for (size_t i = tid; i < split.head; i += stride) dst[i] = reduceOne<T, Op>(in, i, divisor);
  const size_t tailStart = split.head + split.vectors * kPer;
  for (size_t i = tid; i < split.tail; i += stride) dst[tailStart + i] = reduceOne<T, Op>(in, tailStart + i, divisor);
  // Vectors.
  using A = typename Acc<T>::A;
  for (size_t v = tid; v < split.vectors; v += stride) {
    const size_t base = split.head + v * kPer;
    A acc[kPer];
    {
      uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const T*>(in.p[0]) + base);
      T e[kPer];
      memcpy(e, &raw, 16);
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc[j] = Acc<T>::in(e[j]);
    }
    for (int k = 1; k < in.n; ++k) {
      uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const T*>(in.p[k]) + base);
      T e[kPer];
      memcpy(e, &raw, 16);
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc[j] = Op::apply(acc[j], Acc<T>::in(e[j]));
    }
    T out[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      out[j] = Acc<T>::out(acc[j]);
      if (divisor > 1) out[j] = divideBy(out[j], divisor);
    }
    uint4 raw;
    memcpy(&raw, out, 16);
    *reinterpret_cast<uint4*>(dst + base) = raw;
  }
}

// The two-input form computes in T itself (native half arithmetic): the same results as widening
// to float and rounding once, since float carries more than twice the halves' precision.
template <typename T, typename Op>
__global__ void reduce2Kernel(T* dst, const T* a, const T* b, VectorSplit split, int divisor) {
  constexpr int kPer = 16 / sizeof(T);
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  auto one = [&](size_t i) {
    T r = Op::apply(a[i], b[i]);
    dst[i] = divisor > 1 ? divideBy(r, divisor) : r;
  };
  for (size_t i = tid; i < split.head; i += stride) one(i);
  const size_t tailStart = split.head + split.vectors * kPer;
  for (size_t i = tid; i < split.tail; i += stride) one(tailStart + i);
  for (size_t v = tid; v < split.vectors; v += stride) {
    const size_t base = split.head + v * kPer;
    uint4 ra = *reinterpret_cast<const uint4*>(a + base);
    uint4 rb = *reinterpret_cast<const uint4*>(b + base);
    T x[kPer], y[kPer];
    memcpy(x, &ra, 16);
    memcpy(y, &rb, 16);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      x[j] = Op::apply(x[j], y[j]);
      if (divisor > 1) x[j] = divideBy(x[j], divisor);
    }
    memcpy(&ra, x, 16);
    *reinterpret_cast<uint4*>(dst + base) = ra;
  }
}

// ---- Reproducible mode's canonical tree (kernels/reduce_canonical.cc): x alone, or the tree of
// the first p inputs (p the largest power of two below k) combined with the tree of the rest,
// unrolled at compile time for each input count so that the values stay in registers. ----

__host__ __device__ constexpr int largestPowerOfTwoBelow(int k) {
  int p = 1;
  while (p * 2 < k) p *= 2;
  return p;
}

template <typename A, typename Op, int Lo, int K>
__device__ __forceinline__ A canonicalTree(const A* v) {
  if constexpr (K == 1) {
    return v[Lo];
  } else {
    constexpr int P = largestPowerOfTwoBelow(K);
    return Op::apply(canonicalTree<A, Op, Lo, P>(v), canonicalTree<A, Op, Lo + P, K - P>(v));
  }
}

template <typename T, typename Op, int N>
__device__ __forceinline__ typename Acc<T>::A canonicalOf(const Inputs& in, size_t i) {
  using A = typename Acc<T>::A;
  A v[N];
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = Acc<T>::in(static_cast<const T*>(in.p[k])[i]);
  return canonicalTree<A, Op, 0, N>(v);
}

// One element per thread and step (coalesced loads from every input); dst may be an input.
template <typename T, typename Op>
__global__ void canonicalKernel(T* dst, Inputs in, size_t count, bool avg) {
  using A = typename Acc<T>::A;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
    A r;
    switch (in.n) {  // the same for every thread: no divergence
      case 1:
        r = canonicalOf<T, Op, 1>(in, i);
        break;
      case 2:
        r = canonicalOf<T, Op, 2>(in, i);
        break;
      case 3:
        r = canonicalOf<T, Op, 3>(in, i);
        break;
      case 4:
        r = canonicalOf<T, Op, 4>(in, i);
        break;
      case 5:
        r = canonicalOf<T, Op, 5>(in, i);
        break;
      case 6:
        r = canonicalOf<T, Op, 6>(in, i);
        break;
      case 7:
        r = canonicalOf<T, Op, 7>(in, i);
        break;
      default:
        r = canonicalOf<T, Op, 8>(in, i);
        break;
    }
    if (avg) r = r / static_cast<A>(in.n);  // IEEE division (no fast math): the CPU's bits
    dst[i] = Acc<T>::out(r);
  }
}

__global__ void copy2DKernel(uint8_t* dst, size_t dstPitch, const uint8_t* src, size_t srcPitch, size_t width,
                             size_t rows, VectorSplit split) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  // The split is the same for every row when the pitches are multiples of 16; otherwise bytes.
  const size_t per = split.perVector;
  const size_t units = split.head + split.vectors + split.tail;  // work items per row
  for (size_t w = tid; w < units * rows; w += stride) {
    const size_t row = w / units, u = w % units;
    const uint8_t* s = src + row * srcPitch;
    uint8_t* d = dst + row * dstPitch;
    if (u < split.head) {
      d[u] = s[u];
    } else if (u < split.head + split.vectors) {
      const size_t off = split.head + (u - split.head) * per;
      *reinterpret_cast<uint4*>(d + off) = *reinterpret_cast<const uint4*>(s + off);
    } else {
      const size_t off = split.head + split.vectors * per + (u - split.head - split.vectors);
      d[off] = s[off];
    }
  }
}

// dst[i] = convert(src[i] * scale), through float32 (the halves' conversions round to nearest even).
template <typename D, typename S>
__global__ void convertKernel(D* dst, const S* src, size_t count, float scale) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count; i += stride)
    dst[i] = Acc<D>::out(Acc<S>::in(src[i]) * scale);
}

__global__ void spinWaitKernel(const volatile uint32_t* flag, uint32_t value) {
  while (static_cast<int32_t>(*flag - value) < 0) __nanosleep(1000);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    LOOM_THROW(ErrorCode::Cuda, -1, strFormat("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e)));
  }
}

// Enough blocks to fill the device with 512-thread blocks, no more than the work needs.
unsigned gridFor(size_t items) {
  constexpr size_t kMaxBlocks = 1024, kThreads = 512;
  size_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks == 0) blocks = 1;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename T, typename Op>
void launchN(void* dst, const Inputs& in, size_t count, int divisor, cudaStream_t s) {
  uintptr_t addrs[kMaxInputs + 1];
  addrs[0] = reinterpret_cast<uintptr_t>(dst);
  for (int k = 0; k < in.n; ++k) addrs[k + 1] = reinterpret_cast<uintptr_t>(in.p[k]);
  const VectorSplit split = planVectorSplit(addrs, in.n + 1, count, sizeof(T));
  size_t items = split.vectors;
  if (split.head > items) items = split.head;
  if (split.tail > items) items = split.tail;
  if (in.n == 2) {
    reduce2Kernel<T, Op><<<gridFor(items), 512, 0, s>>>(static_cast<T*>(dst), static_cast<const T*>(in.p[0]),
                                                        static_cast<const T*>(in.p[1]), split, divisor);
  } else {
    reduceKernel<T, Op><<<gridFor(items), 512, 0, s>>>(static_cast<T*>(dst), in, split, divisor);
  }
}

template <typename T>
void dispatchOp(void* dst, const Inputs& in, size_t count, ReduceOp op, int divisor, cudaStream_t s) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return launchN<T, Sum>(dst, in, count, divisor, s);
    case ReduceOp::Prod:
      return launchN<T, Prod>(dst, in, count, divisor, s);
    case ReduceOp::Max:
      return launchN<T, Max>(dst, in, count, divisor, s);
    case ReduceOp::Min:
      return launchN<T, Min>(dst, in, count, divisor, s);
  }
  LOOM_THROW(ErrorCode::InvalidArgument, -1, strFormat("unknown reduction op %d", static_cast<int>(op)));
}

void dispatch(void* dst, const Inputs& in, size_t count, DataType type, ReduceOp op, int divisor, void* stream) {
  if (count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case DataType::Int8:
      dispatchOp<int8_t>(dst, in, count, op, divisor, s);
      break;
    case DataType::Uint8:
      dispatchOp<uint8_t>(dst, in, count, op, divisor, s);
      break;
    case DataType::Int32:
      dispatchOp<int32_t>(dst, in, count, op, divisor, s);
      break;
    case DataType::Uint32:
      dispatchOp<uint32_t>(dst, in, count, op, divisor, s);
      break;
    case DataType::Int64:
      dispatchOp<int64_t>(dst, in, count, op, divisor, s);
      break;
    case DataType::Uint64:
      dispatchOp<uint64_t>(dst, in, count, op, divisor, s);
      break;
    case DataType::Float16:
      dispatchOp<__half>(dst, in, count, op, divisor, s);
      break;
    case DataType::Float32:
      dispatchOp<float>(dst, in, count, op, divisor, s);
      break;
    case DataType::Float64:
      dispatchOp<double>(dst, in, count, op, divisor, s);
      break;
    case DataType::Bfloat16:
      dispatchOp<__nv_bfloat16>(dst, in, count, op, divisor, s);
      break;
    default:
      LOOM_THROW(ErrorCode::InvalidArgument, -1, strFormat("unknown datatype %d", static_cast<int>(type)));
  }
  check(cudaGetLastError(), "reduction kernel launch");
}

}  // namespace

void reduce2(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op, int divisor,
             void* stream) {
  Inputs in{};
  in.p[0] = a;
  in.p[1] = b;
  in.n = 2;
  dispatch(dst, in, count, type, op, divisor, stream);
}

void reduceN(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op, int divisor,
             void* stream) {
  if (n < 1 || n > kMaxInputs) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1, strFormat("reduceN: %d inputs (1 to %d)", n, kMaxInputs));
  }
  Inputs in{};
  for (int k = 0; k < n; ++k) in.p[k] = srcs[k];
  // Two inputs take the native two-input kernel: for the halves its result equals accumulating in
  // float32 and rounding once (float32 carries more than twice their precision).
  in.n = n;
  dispatch(dst, in, count, type, op, divisor, stream);
}

void reduceCanonicalN(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op,
                      void* stream) {
  if (n < 1 || n > kMaxInputs) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1, strFormat("reduceCanonicalN: %d inputs (1 to %d)", n, kMaxInputs));
  }
  if (op != ReduceOp::Sum && op != ReduceOp::Avg && op != ReduceOp::Prod) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1, "reduceCanonicalN: only sum, avg and prod have a canonical order");
  }
  if (count == 0) return;
  Inputs in{};
  for (int k = 0; k < n; ++k) in.p[k] = srcs[k];
  in.n = n;
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = gridFor(count);
  const bool prod = op == ReduceOp::Prod, avg = op == ReduceOp::Avg;
  switch (type) {
    case DataType::Float16:
      if (prod) {
        canonicalKernel<__half, Prod><<<grid, 512, 0, s>>>(static_cast<__half*>(dst), in, count, false);
      } else {
        canonicalKernel<__half, Sum><<<grid, 512, 0, s>>>(static_cast<__half*>(dst), in, count, avg);
      }
      break;
    case DataType::Bfloat16:
      if (prod) {
        canonicalKernel<__nv_bfloat16, Prod><<<grid, 512, 0, s>>>(static_cast<__nv_bfloat16*>(dst), in, count, false);
      } else {
        canonicalKernel<__nv_bfloat16, Sum><<<grid, 512, 0, s>>>(static_cast<__nv_bfloat16*>(dst), in, count, avg);
      }
      break;
    case DataType::Float32:
      if (prod) {
        canonicalKernel<float, Prod><<<grid, 512, 0, s>>>(static_cast<float*>(dst), in, count, false);
      } else {
        canonicalKernel<float, Sum><<<grid, 512, 0, s>>>(static_cast<float*>(dst), in, count, avg);
      }
      break;
    case DataType::Float64:
      if (prod) {
        canonicalKernel<double, Prod><<<grid, 512, 0, s>>>(static_cast<double*>(dst), in, count, false);
      } else {
        canonicalKernel<double, Sum><<<grid, 512, 0, s>>>(static_cast<double*>(dst), in, count, avg);
      }
      break;
    default:
      LOOM_THROW(ErrorCode::InvalidArgument, -1, "reduceCanonicalN: only float types have a canonical order");
  }
  check(cudaGetLastError(), "canonical reduction kernel launch");
}

void copy2D(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width, size_t rows, void* stream) {
  if (width == 0 || rows == 0) return;
  uintptr_t addrs[4] = {reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src),
                        rows > 1 ? reinterpret_cast<uintptr_t>(dst) + dstPitch : reinterpret_cast<uintptr_t>(dst),
                        rows > 1 ? reinterpret_cast<uintptr_t>(src) + srcPitch : reinterpret_cast<uintptr_t>(src)};
  // Rows start at the same alignment only when the pitches keep it; the split checks row 0 and 1.
  const VectorSplit split = planVectorSplit(addrs, 4, width, 1);
  const size_t units = split.head + split.vectors + split.tail;
  copy2DKernel<<<gridFor(units * rows), 512, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint8_t*>(dst), dstPitch, static_cast<const uint8_t*>(src), srcPitch, width, rows, split);
  check(cudaGetLastError(), "copy kernel launch");
}

void convert(void* dst, DataType dstType, const void* src, DataType srcType, size_t count, float scale, void* stream) {
  if (count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned grid = gridFor(count);
  if (srcType == DataType::Float32 && dstType == DataType::Float16) {
    convertKernel<<<grid, 512, 0, s>>>(static_cast<__half*>(dst), static_cast<const float*>(src), count, scale);
  } else if (srcType == DataType::Float32 && dstType == DataType::Bfloat16) {
    convertKernel<<<grid, 512, 0, s>>>(static_cast<__nv_bfloat16*>(dst), static_cast<const float*>(src), count, scale);
  } else if (srcType == DataType::Float16 && dstType == DataType::Float32) {
    convertKernel<<<grid, 512, 0, s>>>(static_cast<float*>(dst), static_cast<const __half*>(src), count, scale);
  } else if (srcType == DataType::Bfloat16 && dstType == DataType::Float32) {
    convertKernel<<<grid, 512, 0, s>>>(static_cast<float*>(dst), static_cast<const __nv_bfloat16*>(src), count, scale);
  } else {
    LOOM_THROW(ErrorCode::InvalidArgument, -1, "convert kernel: only float32 to or from float16 or bfloat16");
  }
  check(cudaGetLastError(), "convert kernel launch");
}

namespace {

template <typename K>
void load(K kernel) {
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, kernel), "loading a kernel (cudaFuncGetAttributes)");
}

template <typename T>
void loadType() {
  load(reduceKernel<T, Sum>);
  load(reduceKernel<T, Prod>);
  load(reduceKernel<T, Max>);
  load(reduceKernel<T, Min>);
  load(reduce2Kernel<T, Sum>);
  load(reduce2Kernel<T, Prod>);
  load(reduce2Kernel<T, Max>);
  load(reduce2Kernel<T, Min>);
}

template <typename T>
void loadCanonical() {
  load(canonicalKernel<T, Sum>);
  load(canonicalKernel<T, Prod>);
}

}  // namespace

void preload() {
  loadType<int8_t>();
  loadType<uint8_t>();
  loadType<int32_t>();
  loadType<uint32_t>();
  loadType<int64_t>();
  loadType<uint64_t>();
  loadType<__half>();
  loadType<float>();
  loadType<double>();
  loadType<__nv_bfloat16>();
  loadCanonical<__half>();
  loadCanonical<__nv_bfloat16>();
  loadCanonical<float>();
  loadCanonical<double>();
  load(copy2DKernel);
  load(convertKernel<__half, float>);
  load(convertKernel<__nv_bfloat16, float>);
  load(convertKernel<float, __half>);
  load(convertKernel<float, __nv_bfloat16>);
  load(spinWaitKernel);
}

void spinWait(const volatile uint32_t* flag, uint32_t value, void* stream) {
  spinWaitKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag, value);
  check(cudaGetLastError(), "stream wait kernel launch");
}

}  // namespace cuda
}  // namespace kernels
}  // namespace loom
