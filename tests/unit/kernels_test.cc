// The reduction kernels against a scalar definition written here: random inputs (including
// negative zero, halfway cases and the unaligned tails of the vector loops), every op, the
// half-precision types bit for bit, and avg's division.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/half_bits.hpp"
#include "kernels/reduce.hpp"

using loom::DataType;
using loom::ReduceOp;
namespace k = loom::kernels;

namespace {

float scalarOp(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return a + b;
    case ReduceOp::Prod:
      return a * b;
    case ReduceOp::Max:
      return a < b ? b : a;
    case ReduceOp::Min:
      return b < a ? b : a;
  }
  return 0;
}

}  // namespace

TEST(Kernels, HalfTypesMatchTheScalarDefinitionBitForBit) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-70.0f, 70.0f);
  for (DataType t : {DataType::Float16, DataType::Bfloat16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min})
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{31}, size_t{1000}, size_t{4099}}) {
        auto toBits = t == DataType::Float16 ? k::floatToFp16 : k::floatToBf16;
        auto toF = t == DataType::Float16 ? k::fp16ToFloat : k::bf16ToFloat;
        std::vector<uint16_t> a(n + 1), b(n + 1), d(n + 1);
        for (size_t i = 0; i < n + 1; ++i) {
          a[i] = toBits(i % 17 == 0 ? -0.0f : dist(rng));
          b[i] = toBits(i % 13 == 0 ? 0.0f : dist(rng));
        }
        // Offset by one element: the vector loads are unaligned.
        k::reduce(d.data() + 1, a.data() + 1, b.data() + 1, n, t, op);
        for (size_t i = 1; i < n + 1; ++i) {
          uint16_t want = toBits(scalarOp(op, toF(a[i]), toF(b[i])));
          ASSERT_EQ(d[i], want) << loom::toString(t) << " " << loom::toString(op) << " n=" << n << " i=" << i;
        }
      }
}

// Every 16-bit pattern against special partners (zeros, one, the largest finite values, whose sums
// round to infinity, infinities, NaNs, subnormals, a value with a halfway tail): the vector loops
// (AVX2 for bfloat16, F16C for float16) round, saturate and quiet NaNs exactly as the scalar
// conversions do.
TEST(Kernels, HalfTypesMatchTheScalarDefinitionOnEveryBitPattern) {
  const uint16_t partners[] = {0x0000, 0x8000, 0x3f80, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc1, 0xffa0, 0x0001,
                               0x8003, 0x4049, 0x3c00, 0x7bff, 0xfbff, 0x7c00, 0x7e01, 0x0201, 0x3555, 0xc0a7};
  for (DataType t : {DataType::Float16, DataType::Bfloat16}) {
    auto toBits = t == DataType::Float16 ? k::floatToFp16 : k::floatToBf16;
    auto toF = t == DataType::Float16 ? k::fp16ToFloat : k::bf16ToFloat;
    std::vector<uint16_t> a(65536), b(65536), d(65536);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i);
    for (uint16_t p : partners)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min}) {
        std::fill(b.begin(), b.end(), p);
        k::reduce(d.data(), a.data(), b.data(), a.size(), t, op);
        for (size_t i = 0; i < a.size(); ++i) {
          const float want = scalarOp(op, toF(a[i]), toF(p));
          uint16_t wantBits = toBits(want);
          // NaNs: any quiet NaN is right; the payload is the hardware's choice.
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(toF(d[i])))
                << loom::toString(t) << " " << loom::toString(op) << " a=" << a[i] << " b=" << p;
            continue;
          }
          ASSERT_EQ(d[i], wantBits) << loom::toString(t) << " " << loom::toString(op) << " a=" << a[i] << " b=" << p;
        }
      }
  }
}

#if defined(__FLT16_MAX__)
// The software float16 conversions (the fuzzing build's, whose clang has no _Float16) against the
// compiler's: every half, and floats at and beside every rounding boundary.
TEST(Kernels, SoftwareHalfConversionsMatchTheHardware) {
  auto bitsOf = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  auto floatOf = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  auto hw = [](float f) {
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
  };
  for (uint32_t h = 0; h < 0x10000; ++h) {
    _Float16 x;
    const uint16_t b = static_cast<uint16_t>(h);
    std::memcpy(&x, &b, 2);
    ASSERT_EQ(bitsOf(k::halfBitsToFloat(b)), bitsOf(static_cast<float>(x))) << std::hex << h;
    // Each half, the midpoint to the next one up, and one float ulp either side of both.
    const uint32_t at = bitsOf(static_cast<float>(x));
    if (std::isnan(static_cast<float>(x))) {
      ASSERT_TRUE(std::isnan(k::halfBitsToFloat(k::floatToHalfBits(floatOf(at)))));
      continue;
    }
    _Float16 up;
    const uint16_t ub = static_cast<uint16_t>(h + 1);
    std::memcpy(&up, &ub, 2);
    const float mid = (static_cast<float>(x) + static_cast<float>(up)) / 2;
    for (uint32_t base : {at, bitsOf(mid)})
      for (int d = -1; d <= 1; ++d) {
        const float f = floatOf(base + static_cast<uint32_t>(d));
        if (std::isnan(f)) continue;
        ASSERT_EQ(k::floatToHalfBits(f), hw(f)) << std::hex << "float bits " << bitsOf(f);
      }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 1000000; ++i) {
    const float f = floatOf(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(k::floatToHalfBits(f), hw(f)) << std::hex << "float bits " << bitsOf(f);
  }
}
#endif

TEST(Kernels, IntegersWrapAndFloatsAreExact) {
  int8_t a[3] = {127, -128, 100}, b[3] = {1, -1, 100}, d[3];
  k::reduce(d, a, b, 3, DataType::Int8, ReduceOp::Sum);
  EXPECT_EQ(d[0], -128);
  EXPECT_EQ(d[1], 127);
  EXPECT_EQ(d[2], -56);
  uint64_t x = ~0ull, y = 2, z = 0;
  k::reduce(&z, &x, &y, 1, DataType::Uint64, ReduceOp::Prod);
  EXPECT_EQ(z, ~0ull - 1);
  double p[2] = {1.5, -2.0}, q[2] = {2.25, 3.0}, r[2];
  k::reduce(r, p, q, 2, DataType::Float64, ReduceOp::Max);
  EXPECT_EQ(r[0], 2.25);
  EXPECT_EQ(r[1], 3.0);
}

TEST(Kernels, AvgDividesOnce) {
  int32_t v[3] = {7, -7, 9};
  k::divide(v, 3, DataType::Int32, 2);
  EXPECT_EQ(v[0], 3);
  EXPECT_EQ(v[1], -3);  // truncation, as C
  EXPECT_EQ(v[2], 4);
  uint16_t h = k::floatToBf16(3.0f);
  k::divide(&h, 1, DataType::Bfloat16, 2);
  EXPECT_EQ(k::bf16ToFloat(h), 1.5f);
  EXPECT_STRNE(k::isaName(), "");
}

// Operands at any byte address, as a message's payload sits in a socket's read buffer: every type
// and op, destination and operands each off their type's alignment, against the same reduction
// on aligned copies. (Under UndefinedBehaviorSanitizer a typed load from such an address fails.)
TEST(Kernels, OperandsAtAnyByteAddress) {
  std::mt19937 rng(5);
  const DataType types[] = {DataType::Int8,    DataType::Uint8,   DataType::Int32,   DataType::Uint32,
                            DataType::Int64,   DataType::Uint64,  DataType::Float16, DataType::Float32,
                            DataType::Float64, DataType::Bfloat16};
  for (DataType t : types)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg})
      for (size_t n : {size_t{1}, size_t{3}, size_t{17}, size_t{1031}}) {
        const size_t bytes = n * loom::sizeOf(t);
        std::vector<uint8_t> a(bytes), b(bytes);
        for (auto& x : a) x = static_cast<uint8_t>(rng() % 64);  // small finite values in every type
        for (auto& x : b) x = static_cast<uint8_t>(rng() % 64);
        std::vector<uint8_t> want(bytes);
        k::reduce(want.data(), a.data(), b.data(), n, t, op);
        if (op == ReduceOp::Avg) k::divide(want.data(), n, t, 2);
        for (size_t off : {size_t{1}, size_t{3}, size_t{5}}) {
          std::vector<uint8_t> ua(bytes + 8), ub(bytes + 8), ud(bytes + 8);
          std::memcpy(ua.data() + off, a.data(), bytes);
          std::memcpy(ub.data() + off + 1, b.data(), bytes);
          k::reduce(ud.data() + off + 2, ua.data() + off, ub.data() + off + 1, n, t, op);
          if (op == ReduceOp::Avg) k::divide(ud.data() + off + 2, n, t, 2);
          ASSERT_EQ(std::memcmp(ud.data() + off + 2, want.data(), bytes), 0)
              << loom::toString(t) << " " << loom::toString(op) << " n=" << n << " offset " << off;
        }
      }
}
