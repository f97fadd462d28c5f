// Pure planning of the device paths: how element-wise CUDA kernels split unaligned buffers into
// scalar heads, 16-byte vectors and tails, and how staged device collectives cut into chunks.
#include <gtest/gtest.h>

#include "comm/device_staging.hpp"
#include "kernels/vector_split.hpp"

using loom::coll::Coll;
using loom::kernels::planVectorSplit;

TEST(VectorSplit, CoversEveryElementOnceForEveryAlignmentAndLength) {
  for (size_t elem : {1, 2, 4, 8})
    for (uintptr_t misalign = 0; misalign < 16; misalign += elem)
      for (size_t count : {0, 1, 3, 7, 8, 15, 16, 17, 4097}) {
        const uintptr_t base = 0x10000 + misalign;
        uintptr_t addrs[3] = {base, base + 4096, base + 64};  // all three alike
        auto s = planVectorSplit(addrs, 3, count, elem);
        EXPECT_EQ(s.head + s.vectors * s.perVector + s.tail, count) << elem << " " << misalign << " " << count;
        EXPECT_EQ(s.perVector, 16 / elem);
        if (s.vectors > 0) {
          // The first vector starts on a 16-byte boundary, and the head is shorter than a vector.
          EXPECT_EQ((base + s.head * elem) % 16, 0u);
          EXPECT_LT(s.head, s.perVector);
          EXPECT_LT(s.tail, s.perVector);
        }
      }
}

TEST(VectorSplit, PointersMisalignedDifferentlyGoScalar) {
  uintptr_t addrs[2] = {0x1000, 0x2004};
  auto s = planVectorSplit(addrs, 2, 1000, 4);
  EXPECT_EQ(s.head, 1000u);
  EXPECT_EQ(s.vectors, 0u);
  EXPECT_EQ(s.tail, 0u);
  // An address not a multiple of the element size: no element boundary meets a vector boundary.
  uintptr_t odd[1] = {0x1001};
  s = planVectorSplit(odd, 1, 100, 4);
  EXPECT_EQ(s.head, 100u);
}

TEST(VectorSplit, AlignedBuffersAreAllVectors) {
  uintptr_t addrs[3] = {0x1000, 0x2000, 0x3000};
  auto s = planVectorSplit(addrs, 3, 1024, 2);
  EXPECT_EQ(s.head, 0u);
  EXPECT_EQ(s.vectors, 128u);
  EXPECT_EQ(s.tail, 0u);
}

TEST(DeviceChunks, SlotsHoldInputAndOutputOfEveryChunk) {
  const size_t slot = 4 << 20;
  for (int size : {1, 2, 3, 8})
    for (Coll k :
         {Coll::AllReduce, Coll::Broadcast, Coll::Reduce, Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll})
      for (size_t elem : {1, 2, 8})
        for (size_t count : {0, 1, 7, 1000003}) {
          auto d = loom::detail::planDeviceChunks(k, count, elem, size, slot);
          ASSERT_GE(d.elems, 1u);
          EXPECT_GE(d.chunks * d.elems, count);
          if (count > 0) {
            EXPECT_LT((d.chunks - 1) * d.elems, count);
          } else {
            EXPECT_EQ(d.chunks, 1u);
          }
          const size_t blocksIn = k == Coll::ReduceScatter || k == Coll::AllToAll ? size : 1;
          const size_t blocksOut = k == Coll::AllGather || k == Coll::AllToAll ? size : 1;
          EXPECT_LE((blocksIn + blocksOut) * d.elems * elem, slot);
        }
}
