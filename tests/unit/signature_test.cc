// Collective signatures (core/signature.hpp): what they tell apart and how a mismatch reads.
#include "core/signature.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using loom::DataType;
using loom::ReduceOp;
using loom::SigKind;

TEST(Signature, DescribesEachField) {
  EXPECT_EQ(loom::describeSignature(loom::makeSignature(SigKind::AllReduce, DataType::Float32, ReduceOp::Sum, 0, 1024)),
            "all_reduce of 1024 float32 (sum)");
  EXPECT_EQ(loom::describeSignature(loom::makeSignature(SigKind::Broadcast, DataType::Int8, ReduceOp::Max, 3, 7)),
            "broadcast of 7 int8 from rank 3");
  EXPECT_EQ(loom::describeSignature(loom::makeSignature(SigKind::Barrier, DataType::Int8, ReduceOp::Max, 3, 7)),
            "barrier");
  EXPECT_EQ(loom::describeSignature(0), "a point-to-point message");
}

TEST(Signature, CountsSaturateWithoutTouchingOtherFields) {
  const uint64_t huge = loom::makeSignature(SigKind::Reduce, DataType::Float64, ReduceOp::Prod, 5, size_t{1} << 40);
  EXPECT_FALSE(loom::isOnDeviceBuffers(huge));
  EXPECT_EQ(loom::describeSignature(huge), "reduce of 17179869183 float64 to rank 5 (prod)");  // 2^34 - 1
}

// Gather and scatter: kinds of their own, with their root.
TEST(Signature, GatherAndScatterCarryTheirRoot) {
  const uint64_t gather = loom::makeSignature(SigKind::Gather, DataType::Int32, ReduceOp::Max, 2, 16);
  const uint64_t scatter = loom::makeSignature(SigKind::Scatter, DataType::Int32, ReduceOp::Max, 2, 16);
  EXPECT_EQ(loom::describeSignature(gather), "gather of 16 int32 to rank 2");
  EXPECT_EQ(loom::describeSignature(scatter), "scatter of 16 int32 from rank 2");
  EXPECT_FALSE(loom::signaturesAgree(gather, scatter));
  EXPECT_FALSE(
      loom::signaturesAgree(gather, loom::makeSignature(SigKind::Gather, DataType::Int32, ReduceOp::Sum, 1, 16)));
  EXPECT_EQ(gather, loom::makeSignature(SigKind::Gather, DataType::Int32, ReduceOp::Sum, 2, 16)) << "no op";
  EXPECT_FALSE(loom::isMarkedMessage(gather));
  EXPECT_FALSE(loom::isMarkedMessage(loom::makeSignature(SigKind::Barrier, DataType::Int32, ReduceOp::Sum, 0, 0)));
}

// Device and host buffers are different calls, and the mismatch says which rank passed which.
TEST(Signature, DeviceBuffersAreADifferentCall) {
  const uint64_t host = loom::makeSignature(SigKind::AllReduce, DataType::Bfloat16, ReduceOp::Avg, 0, 9);
  const uint64_t device = loom::onDeviceBuffers(host);
  EXPECT_TRUE(loom::isOnDeviceBuffers(device));
  EXPECT_FALSE(loom::signaturesAgree(host, device));
  EXPECT_EQ(loom::onDeviceBuffers(0), 0u) << "point-to-point messages match anything";
  EXPECT_EQ(loom::describeSignature(device), "all_reduce of 9 bfloat16 (avg) on device buffers");
  const loom::Status s = loom::signatureMismatch(1, host, 0, device);
  EXPECT_EQ(s.code, loom::ErrorCode::InvalidUsage);
  EXPECT_EQ(s.peer, 1);
  EXPECT_NE(s.message.find("rank 1 called all_reduce of 9 bfloat16 (avg) on host buffers where rank 0 called it on "
                           "device buffers"),
            std::string::npos)
      << s.message;
  const uint64_t other =
      loom::onDeviceBuffers(loom::makeSignature(SigKind::AllReduce, DataType::Bfloat16, ReduceOp::Avg, 0, 8));
  EXPECT_NE(loom::signatureMismatch(1, host, 0, other).message.find("on device buffers"), std::string::npos);
}

// A rank in reproducible mode among ranks that are not: a different call, and the error says so.
TEST(Signature, ReproducibleModeIsADifferentCall) {
  const uint64_t plain = loom::makeSignature(SigKind::Reduce, DataType::Float32, ReduceOp::Sum, 131071, 5);
  const uint64_t repro = loom::inReproducibleMode(plain);
  EXPECT_TRUE(loom::isInReproducibleMode(repro));
  EXPECT_FALSE(loom::isInReproducibleMode(plain));
  EXPECT_FALSE(loom::signaturesAgree(plain, repro));
  EXPECT_EQ(loom::inReproducibleMode(0), 0u);
  EXPECT_EQ(loom::describeSignature(repro), "reduce of 5 float32 to rank 131071 (sum) in reproducible mode");
  EXPECT_EQ(loom::describeSignature(loom::onDeviceBuffers(repro)),
            "reduce of 5 float32 to rank 131071 (sum) on device buffers in reproducible mode");
  const loom::Status s = loom::signatureMismatch(2, repro, 0, plain);
  EXPECT_EQ(s.peer, 2);
  EXPECT_NE(s.message.find("rank 2 is in reproducible mode where rank 0 is not"), std::string::npos) << s.message;
}

}  // namespace
