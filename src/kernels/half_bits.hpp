// IEEE 754 binary16 <-> float conversions on the bits, in software, rounding to nearest with ties
// to even like the hardware. Used where the compiler has no _Float16 (clang 14 on x86-64, the
// fuzzing build); the unit tests check them against _Float16 for every half and for floats
// around every rounding boundary.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom {
namespace kernels {

inline float halfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // infinity; NaN: payload kept, made quiet
    if (man != 0) u |= 0x400000u;
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else {
    const float f = static_cast<float>(man) * 5.9604644775390625e-8f;  // subnormal: man * 2^-24, exact
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t floatToHalfBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  uint16_t out;
  if (u > 0x7f800000u) {
    out = static_cast<uint16_t>(0x7e00u | ((u >> 13) & 0x3ffu));  // NaN: quiet, the payload's top bits kept
  } else if (u >= 0x477ff000u) {
    out = 0x7c00u;  // 65520 and above round to infinity
  } else if (u < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5 lines the value's bits up with the
    // half's subnormal unit (2^-24, the float ulp at 0.5), and the FPU rounds to even.
    constexpr uint32_t kHalfBits = 126u << 23;
    float m, t;
    std::memcpy(&m, &kHalfBits, 4);
    std::memcpy(&t, &u, 4);
    t += m;
    uint32_t r;
    std::memcpy(&r, &t, 4);
    out = static_cast<uint16_t>(r - kHalfBits);
  } else {
    // Rebias the exponent (-112 << 23, modulo 2^32) and round on the 13 dropped bits, ties to
    // even; a carry out of the mantissa moves to the next power of two.
    u += 0xc8000fffu + ((u >> 13) & 1u);
    out = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(out | sign);
}

}  // namespace kernels
}  // namespace loom
