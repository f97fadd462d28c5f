// device/presence.hpp: whether CUDA is in use in this process, found without starting it. Its own
// process, as it loads a stand-in for the driver's library (fake_libcuda.c) that no other test
// should meet.
#include "device/presence.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace {

TEST(Presence, TheDriverIsFoundOnceLoadedAndInUseOnceInitialised) {
  const char* fake = std::getenv("LOOM_FAKE_LIBCUDA");
  ASSERT_NE(fake, nullptr) << "LOOM_FAKE_LIBCUDA (set by meson test) names the stand-in libcuda.so.1";
  ASSERT_EQ(dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD), nullptr) << "a libcuda is already loaded here";
  EXPECT_FALSE(loom::device::cudaDriverInUse());
  EXPECT_FALSE(loom::device::cudaDriverInUse()) << "asked again with no new library: the same answer";
  void* lib = dlopen(fake, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  // Loaded, not initialised: not in use (cuDeviceGetCount says CUDA_ERROR_NOT_INITIALIZED).
  EXPECT_FALSE(loom::device::cudaDriverInUse());
  auto init = reinterpret_cast<void (*)()>(dlsym(lib, "fakeCuInit"));
  ASSERT_NE(init, nullptr);
  init();
  EXPECT_TRUE(loom::device::cudaDriverInUse());
  EXPECT_TRUE(loom::device::cudaDriverInUse()) << "and from then on";
}

// What the machine shows, read without CUDA: CUDA_VISIBLE_DEVICES empty hides every device. (Read
// once per process: only the first answer can be checked here.)
TEST(Presence, NoDeviceIsVisibleWhereCudaVisibleDevicesIsEmpty) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  EXPECT_FALSE(loom::device::cudaDevicesVisible());
}

}  // namespace
