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
