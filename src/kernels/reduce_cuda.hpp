// CUDA kernels, callable from plain C++ (no CUDA headers here; a stream is a cudaStream_t passed
// as void*). Every datatype and op; two-input and n-input reductions with 16-byte vector loads and
// stores where the pointers allow (kernels/vector_split.hpp), scalar heads and tails otherwise;
// float16 and bfloat16 computed natively in the two-input form and accumulated in float32 in the
// n-input form; avg as a sum then one division by `divisor`. Integer sums and products wrap, as on
// the CPU (kernels/reduce.hpp), so the two agree bit for bit on integers.
//
// Every launcher queues its kernel on `stream` and returns; a launch failure throws
// loom::Error(ErrorCode::Cuda). Built only with the `cuda` feature (src/kernels/reduce_cuda.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/loom.hpp"

namespace loom {
namespace kernels {
namespace cuda {

/// Inputs of the n-input reduction at most (peers of one node read at once).
constexpr int kMaxInputs = 8;

/// dst[i] = op(a[i], b[i]); then, when divisor > 1, dst[i] /= divisor (avg). dst may be a or b.
void reduce2(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op, int divisor,
             void* stream);

/// dst[i] = op over srcs[0..n)[i], in that order (1 <= n <= kMaxInputs; dst may be one of them);
/// float16 and bfloat16 accumulate in float32 and round once. divisor > 1 divides (avg).
void reduceN(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op, int divisor,
             void* stream);

/// Reproducible mode's canonical reduction (kernels::reduceCanonical, bit for bit): dst[i] = the
/// canonical tree over srcs[0..n)[i] (1 <= n <= kMaxInputs; dst may be one of them), float16 and
/// bfloat16 in float32 rounded once, avg divided once by n. Float types and sum, avg, prod only.
void reduceCanonicalN(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op,
                      void* stream);

/// Copies `rows` rows of `width` bytes, `srcPitch` and `dstPitch` bytes apart (one row: a plain copy).
void copy2D(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width, size_t rows, void* stream);

/// dst[i] = src[i] * scale converted: float32 to float16 or bfloat16 (rounded to nearest even),
/// or back. Other pairs throw InvalidArgument.
void convert(void* dst, DataType dstType, const void* src, DataType srcType, size_t count, float scale, void* stream);

/// Loads every kernel above into the current device's context. CUDA loads a module lazily, at its
/// first launch, by default (CUDA_MODULE_LOADING=LAZY), and that load waits for the device: a first
/// launch on Loom's op-queue thread while the caller's stream is held for that very operation never
/// returns. Called once per device before any stream is held (DeviceRuntime::prepare).
void preload();

/// Holds `stream` until (int32_t)(*flag - value) >= 0; `flag` is a device-visible address of host
/// memory the host stores to. The fallback of stream memory operations (device/cuda_runtime.cc).
void spinWait(const volatile uint32_t* flag, uint32_t value, void* stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace loom
