// The transport table and LOOM_TRANSPORT's narrowing of it (transport/registry.hpp).
#include "transport/registry.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/loom.hpp"

namespace {

std::vector<std::string> names(const std::string& spec) {
  std::vector<std::string> out;
  for (const auto& t : loom::selectTransports(spec)) out.push_back(t.name);
  return out;
}

TEST(Registry, PreferenceOrderAndNarrowing) {
  using V = std::vector<std::string>;
  EXPECT_EQ(names(""), (V{"cuda_ipc", "shm", "tcp"}));
  EXPECT_EQ(names("tcp"), (V{"tcp"}));
  EXPECT_EQ(names("^cuda_ipc"), (V{"shm", "tcp"}));
  EXPECT_EQ(names("shm,tcp"), (V{"shm", "tcp"}));
  // CUDA IPC carries host bytes over shared memory: excluding shared memory excludes it too;
  // naming it brings shared memory along inside it.
  EXPECT_EQ(names("^shm"), (V{"tcp"}));
  EXPECT_EQ(names("cuda_ipc,tcp"), (V{"cuda_ipc", "tcp"}));
  EXPECT_EQ(names("cuda_ipc"), (V{"cuda_ipc"}));
  try {
    names("ib");
    ADD_FAILURE() << "a spec naming no transport of this build was accepted";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
    EXPECT_NE(e.message().find("cuda_ipc, shm, tcp"), std::string::npos) << e.what();
  }
}

}  // namespace
