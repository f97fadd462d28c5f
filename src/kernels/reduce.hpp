// CPU reduction kernels. Every datatype and op; vectorised by the compiler for three x86-64
// levels (AVX-512, AVX2+F16C+FMA, baseline SSE2) chosen at run time on the machine that runs it
// (GCC target_clones: one binary runs everywhere). float16 and bfloat16 are widened to float32 for
// the arithmetic and rounded back to nearest-even. Integer sums and products wrap (two's
// complement), as in NCCL. Avg is a sum followed by one division (divide()).
//
// Pure functions: no transport knowledge, no allocation, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/loom.hpp"

namespace loom {
namespace kernels {

/// dst[i] = op(a[i], b[i]) for i < count. dst may be a or b. ReduceOp::Avg reduces as a sum.
void reduce(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op);

/// Whether reproducible mode gives (type, op) a canonical order: float sum, avg and prod. The
/// others are exact in any order.
bool isCanonicalReduction(DataType type, ReduceOp op);

/// dst[i] = the canonical reduction of srcs[0][i] .. srcs[n-1][i] (reduce_canonical.cc: a fixed
/// tree over input order, half precision accumulated in float32 and rounded once, avg divided
/// once): the same bits for the same inputs, whoever computes it. dst may be one of srcs exactly.
/// Types and ops without a canonical order are reduced in input order.
void reduceCanonical(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op);

/// buf[i] /= divisor for i < count (integer division for integer types).
void divide(void* buf, size_t count, DataType type, int divisor);

/// The instruction set the kernels run with on this machine: "avx512", "avx2" or "baseline".
const char* isaName();

/// float <-> bfloat16 bits (round to nearest even; NaN stays NaN).
float bf16ToFloat(uint16_t bits);
uint16_t floatToBf16(float f);
/// float <-> IEEE binary16 bits (round to nearest even).
float fp16ToFloat(uint16_t bits);
uint16_t floatToFp16(float f);

}  // namespace kernels
}  // namespace loom
