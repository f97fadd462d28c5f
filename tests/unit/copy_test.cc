// kernels::copy and its vector loop against memcpy's definition: every byte of the destination
// written, nothing around it touched, for lengths around the vector widths and the unrolled
// loop's step, destinations at every alignment and at the source distances (1 to 63 bytes past it
// modulo 4096) that copy() routes through the loop.
#include "kernels/copy.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace k = loom::kernels;

namespace {

constexpr size_t kGuard = 256;

// Copies `n` bytes from page offset `srcOff` to page offset `dstOff` of two separate page-aligned
// buffers with `fn`, and checks the destination and the guard bytes on both sides.
template <typename Fn>
void checkCopy(Fn fn, size_t n, size_t srcOff, size_t dstOff) {
  const size_t span = n + 2 * kGuard + 8192;
  auto* src = static_cast<uint8_t*>(std::aligned_alloc(4096, (span + 4095) / 4096 * 4096));
  auto* dst = static_cast<uint8_t*>(std::aligned_alloc(4096, (span + 4095) / 4096 * 4096));
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  for (size_t i = 0; i < span; ++i) {
    src[i] = static_cast<uint8_t>(i * 131 + 7);
    dst[i] = 0xA5;
  }
  uint8_t* d = dst + kGuard + dstOff;
  const uint8_t* s = src + kGuard + srcOff;
  fn(d, s, n);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += d[i] != s[i];
  for (uint8_t* p = dst; p < d; ++p) wrong += *p != 0xA5;
  for (uint8_t* p = d + n; p < dst + span; ++p) wrong += *p != 0xA5;
  EXPECT_EQ(wrong, 0u) << "n " << n << ", source offset " << srcOff << ", destination offset " << dstOff;
  std::free(src);
  std::free(dst);
}

const std::vector<size_t> kLengths = {0,   1,   15,   16,   17,   31,   32,   33,   63,   64,   65,    127,    128,
                                      129, 255, 1023, 1024, 1025, 2176, 4095, 4096, 4097, 8191, 65543, 131072, 300007};

}  // namespace

TEST(Copy, VectorLoopCopiesEveryByteAndNothingElse) {
  for (size_t n : kLengths)
    for (size_t srcOff : {0, 1, 16, 33})
      for (size_t dstOff = 0; dstOff < 70; dstOff += (n > 8192 ? 7 : 1)) checkCopy(k::vectorCopy, n, srcOff, dstOff);
}

TEST(Copy, CopyIsMemcpyAtEveryDistance) {
  for (size_t n : kLengths)
    for (size_t dstOff : {0, 1, 16, 17, 48, 63, 64, 65, 2048, 4080})
      checkCopy([](void* d, const void* s, size_t len) { k::copy(d, s, len); }, n, 0, dstOff);
}

TEST(Copy, OnlyShortForwardDistancesAreRerouted) {
  alignas(4096) static uint8_t page[3 * 4096];
  const size_t big = k::kSlowMemcpyMinBytes;
  EXPECT_TRUE(k::slowMemcpyDistance(page + 16, page + 4096, big));
  EXPECT_TRUE(k::slowMemcpyDistance(page + 4096 + 1, page, big));
  EXPECT_TRUE(k::slowMemcpyDistance(page + 63, page + 8192, big));
  EXPECT_FALSE(k::slowMemcpyDistance(page + 4096, page, big));           // same page offset
  EXPECT_FALSE(k::slowMemcpyDistance(page + 64, page + 4096, big));      // 64 bytes past: fine
  EXPECT_FALSE(k::slowMemcpyDistance(page, page + 16, big));             // destination behind the source
  EXPECT_FALSE(k::slowMemcpyDistance(page + 16, page + 4096, big - 1));  // too short for rep movsb
}
