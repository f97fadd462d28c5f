// The reduction kernels against a scalar definition written here: random inputs (including
// negative zero, halfway cases and the unaligned tails of the vector loops), every op, the
// half-precision types bit for bit, and avg's division.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/canonical_tree.hpp"
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

// ---- The canonical reduction of reproducible mode (kernels::reduceCanonical). ----

namespace {

// A float spread over 2^-20 .. 2^20 with either sign, where orders of addition give other bits.
float wide(std::mt19937& rng) {
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> e(-20, 20), s(0, 1);
  return std::ldexp(mant(rng), e(rng)) * (s(rng) ? -1.0f : 1.0f);
}

}  // namespace

// Every input count from 1 to 40 (powers of two and not), float32 and float64, sum, prod and avg,
// counts across the kernel's blocks, unaligned inputs and output, and the output being an input.
TEST(CanonicalKernel, MatchesTheTreeBitForBit) {
  std::mt19937 rng(7);
  const size_t count = 1000;  // several 256-element blocks and a tail
  for (int n = 1; n <= 40; ++n) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Avg}) {
      std::vector<std::vector<uint8_t>> f32(static_cast<size_t>(n)), f64(static_cast<size_t>(n));
      std::vector<const void*> p32, p64;
      for (int s = 0; s < n; ++s) {
        f32[static_cast<size_t>(s)].resize(count * 4 + 1);
        f64[static_cast<size_t>(s)].resize(count * 8 + 3);
        for (size_t i = 0; i < count; ++i) {
          const float v = op == ReduceOp::Prod ? std::ldexp(wide(rng), 0) / std::ldexp(1.0f, 20) + 1.0f : wide(rng);
          const double d = static_cast<double>(wide(rng)) * (1.0 + 1e-9 * static_cast<double>(i));
          std::memcpy(f32[static_cast<size_t>(s)].data() + 1 + i * 4, &v, 4);  // unaligned
          std::memcpy(f64[static_cast<size_t>(s)].data() + 3 + i * 8, &d, 8);
        }
        p32.push_back(f32[static_cast<size_t>(s)].data() + 1);
        p64.push_back(f64[static_cast<size_t>(s)].data() + 3);
      }
      std::vector<uint8_t> out32(count * 4 + 2), out64(count * 8 + 1);
      k::reduceCanonical(out32.data() + 2, p32.data(), n, count, DataType::Float32, op);
      k::reduceCanonical(out64.data() + 1, p64.data(), n, count, DataType::Float64, op);
      const bool mul = op == ReduceOp::Prod;
      for (size_t i = 0; i < count; ++i) {
        std::vector<float> x32;
        std::vector<double> x64;
        for (int s = 0; s < n; ++s) {
          float a;
          double b;
          std::memcpy(&a, static_cast<const uint8_t*>(p32[static_cast<size_t>(s)]) + i * 4, 4);
          std::memcpy(&b, static_cast<const uint8_t*>(p64[static_cast<size_t>(s)]) + i * 8, 8);
          x32.push_back(a);
          x64.push_back(b);
        }
        float w32 = loomtest::canonicalTree(x32, 0, x32.size(), mul);
        double w64 = loomtest::canonicalTree(x64, 0, x64.size(), mul);
        if (op == ReduceOp::Avg) {
          w32 /= static_cast<float>(n);
          w64 /= static_cast<double>(n);
        }
        ASSERT_EQ(std::memcmp(out32.data() + 2 + i * 4, &w32, 4), 0) << "float32 n " << n << " element " << i;
        ASSERT_EQ(std::memcmp(out64.data() + 1 + i * 8, &w64, 8), 0) << "float64 n " << n << " element " << i;
      }
      // In place: the output is one of the inputs (here the third, or the only one).
      std::vector<uint8_t> again(out32.begin() + 2, out32.end());
      const size_t at = static_cast<size_t>(std::min(2, n - 1));
      k::reduceCanonical(const_cast<void*>(p32[at]), p32.data(), n, count, DataType::Float32, op);
      ASSERT_EQ(std::memcmp(p32[at], again.data(), count * 4), 0) << "in place, n " << n;
    }
  }
}

// float16 and bfloat16: widened, the tree in float32, rounded once (not after every step).
TEST(CanonicalKernel, HalfTypesRoundOnce) {
  std::mt19937 rng(11);
  const size_t count = 777;
  for (DataType t : {DataType::Float16, DataType::Bfloat16}) {
    for (int n : {2, 3, 5, 8, 13}) {
      std::vector<std::vector<uint16_t>> in(static_cast<size_t>(n), std::vector<uint16_t>(count));
      std::vector<const void*> ptrs;
      for (auto& v : in) {
        for (auto& h : v) {
          const float f = std::ldexp(wide(rng), -14);  // within float16's range
          h = t == DataType::Float16 ? k::floatToFp16(f) : k::floatToBf16(f);
        }
        ptrs.push_back(v.data());
      }
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        std::vector<uint16_t> out(count);
        k::reduceCanonical(out.data(), ptrs.data(), n, count, t, op);
        int roundedOnceDiffers = 0;
        for (size_t i = 0; i < count; ++i) {
          std::vector<float> x;
          for (int s = 0; s < n; ++s) {
            const uint16_t h = in[static_cast<size_t>(s)][i];
            x.push_back(t == DataType::Float16 ? k::fp16ToFloat(h) : k::bf16ToFloat(h));
          }
          float w = loomtest::canonicalTree(x, 0, x.size(), false);
          if (op == ReduceOp::Avg) w /= static_cast<float>(n);
          const uint16_t want = t == DataType::Float16 ? k::floatToFp16(w) : k::floatToBf16(w);
          ASSERT_EQ(out[i], want) << "type " << static_cast<int>(t) << " n " << n << " element " << i;
          // Rounding after every step (the default mode's pairs) gives other bits somewhere.
          uint16_t stepwise = in[0][i];
          for (int s = 1; s < n; ++s) {
            uint16_t r;
            k::reduce(&r, &stepwise, &in[static_cast<size_t>(s)][i], 1, t, ReduceOp::Sum);
            stepwise = r;
          }
          if (op == ReduceOp::Sum && stepwise != want) ++roundedOnceDiffers;
        }
        if (op == ReduceOp::Sum && n >= 3) {
          EXPECT_GT(roundedOnceDiffers, 0) << "n " << n;
        }
      }
    }
  }
}

// Integers and min/max have no canonical order to keep (exact in any order): rank order, avg
// divided once, as the default kernels do.
TEST(CanonicalKernel, ExactTypesAndOpsKeepTheirResults) {
  EXPECT_FALSE(k::isCanonicalReduction(DataType::Int32, ReduceOp::Sum));
  EXPECT_FALSE(k::isCanonicalReduction(DataType::Float32, ReduceOp::Max));
  EXPECT_TRUE(k::isCanonicalReduction(DataType::Bfloat16, ReduceOp::Avg));
  const int32_t a[] = {INT32_MAX, -7, 9}, b[] = {1, 3, -9}, c[] = {5, 5, 5};
  const void* srcs[] = {a, b, c};
  int32_t out[3];
  k::reduceCanonical(out, srcs, 3, 3, DataType::Int32, ReduceOp::Sum);
  EXPECT_EQ(out[0], INT32_MIN + 5);  // wraps
  EXPECT_EQ(out[1], 1);
  EXPECT_EQ(out[2], 5);
  k::reduceCanonical(out, srcs, 3, 3, DataType::Int32, ReduceOp::Min);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], -7);
  k::reduceCanonical(out, srcs, 3, 3, DataType::Int32, ReduceOp::Avg);
  EXPECT_EQ(out[1], 0);  // (-7 + 3 + 5) / 3
}
