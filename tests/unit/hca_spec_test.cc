// LOOM_IB_HCA's syntax (transport/ib/hca_spec.hpp), as NCCL_IB_HCA users write it.
#include "transport/ib/hca_spec.hpp"

#include <gtest/gtest.h>

#include "loom/loom.hpp"

namespace loom {
namespace ib {
namespace {

TEST(HcaSpec, EmptySelectsEverything) {
  const HcaSpec s = parseHcaSpec("");
  EXPECT_TRUE(hcaSelected(s, "mlx5_0", 1));
  EXPECT_TRUE(hcaSelected(s, "bnxt_re0", 2));
}

TEST(HcaSpec, NamesArePrefixesWithOptionalPorts) {
  const HcaSpec s = parseHcaSpec("mlx5_0:1,mlx5_1");
  EXPECT_TRUE(hcaSelected(s, "mlx5_0", 1));
  EXPECT_FALSE(hcaSelected(s, "mlx5_0", 2)) << "only the port named";
  EXPECT_TRUE(hcaSelected(s, "mlx5_1", 1));
  EXPECT_TRUE(hcaSelected(s, "mlx5_1", 2));
  EXPECT_TRUE(hcaSelected(s, "mlx5_10", 1)) << "a prefix, as in NCCL";
  EXPECT_FALSE(hcaSelected(s, "mlx5_2", 1));
}

TEST(HcaSpec, EqualsMeansExactNames) {
  const HcaSpec s = parseHcaSpec("=mlx5_1");
  EXPECT_TRUE(hcaSelected(s, "mlx5_1", 1));
  EXPECT_FALSE(hcaSelected(s, "mlx5_10", 1));
}

TEST(HcaSpec, CaretExcludes) {
  const HcaSpec s = parseHcaSpec("^mlx5_2,mlx5_0:2");
  EXPECT_TRUE(hcaSelected(s, "mlx5_0", 1));
  EXPECT_FALSE(hcaSelected(s, "mlx5_0", 2));
  EXPECT_FALSE(hcaSelected(s, "mlx5_2", 1));
  EXPECT_TRUE(hcaSelected(s, "mlx5_1", 1));
  const HcaSpec exact = parseHcaSpec("^=mlx5_1");
  EXPECT_FALSE(hcaSelected(exact, "mlx5_1", 1));
  EXPECT_TRUE(hcaSelected(exact, "mlx5_10", 1));
}

TEST(HcaSpec, BadPortsAreClearErrors) {
  for (const char* bad : {"mlx5_0:", "mlx5_0:x", "mlx5_0:0", "mlx5_0:256", ":1", "mlx5_0:1:2"}) {
    try {
      parseHcaSpec(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("LOOM_IB_HCA"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ib
}  // namespace loom
