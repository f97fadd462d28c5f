// The transport table and LOOM_TRANSPORT's narrowing of it (transport/registry.hpp).
#include "transport/registry.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/loom.hpp"
#include "loom_config.h"

namespace {

std::vector<std::string> names(const std::string& spec) {
  std::vector<std::string> out;
  for (const auto& t : loom::selectTransports(spec)) out.push_back(t.name);
  return out;
}

TEST(Registry, PreferenceOrderAndNarrowing) {
  using V = std::vector<std::string>;
  // InfiniBand sits between shared memory and TCP where the build has the verbs headers.
  const V all = LOOM_HAVE_IBVERBS ? V{"cuda_ipc", "shm", "ib", "tcp"} : V{"cuda_ipc", "shm", "tcp"};
  const V noIpc = LOOM_HAVE_IBVERBS ? V{"shm", "ib", "tcp"} : V{"shm", "tcp"};
  const V noShm = LOOM_HAVE_IBVERBS ? V{"ib", "tcp"} : V{"tcp"};
  EXPECT_EQ(names(""), all);
  EXPECT_EQ(names("tcp"), (V{"tcp"}));
  EXPECT_EQ(names("^cuda_ipc"), noIpc);
  EXPECT_EQ(names("shm,tcp"), (V{"shm", "tcp"}));
  // CUDA IPC carries host bytes over shared memory: excluding shared memory excludes it too;
  // naming it brings shared memory along inside it.
  EXPECT_EQ(names("^shm"), noShm);
  EXPECT_EQ(names("cuda_ipc,tcp"), (V{"cuda_ipc", "tcp"}));
  EXPECT_EQ(names("cuda_ipc"), (V{"cuda_ipc"}));
  EXPECT_EQ(names("^ib"), (V{"cuda_ipc", "shm", "tcp"}));
  try {
    names("verbs");
    ADD_FAILURE() << "a spec naming no transport of this build was accepted";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::ErrorCode::InvalidArgument);
    EXPECT_NE(e.message().find(LOOM_HAVE_IBVERBS ? "cuda_ipc, shm, ib, tcp" : "cuda_ipc, shm, tcp"), std::string::npos)
        << e.what();
  }
}

}  // namespace
