// The ib transport's large-message path, seen from the tests' verbs provider: payload written by
// RDMA straight from the sender's buffers into the receiver's (no byte of it through a bounce
// buffer or an eager slot), and registrations made once and reused over a training-like loop.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "comm/comm_impl.hpp"
#include "common/ranks.hpp"
#include "loom_config.h"
#include "verbs_provider/counters.h"

#if LOOM_HAVE_IBVERBS

namespace {

using loom::DataType;

struct Provider {
  const LoomTestVerbsCounters* (*counters)() = nullptr;
  void (*reset)() = nullptr;
};

// The provider the ib links load (the same handle: dlopen of a loaded library finds it).
Provider provider() {
  Provider p;
  const char* path = std::getenv("LOOM_TEST_VERBS_PROVIDER");
  if (path == nullptr) return p;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return p;
  p.counters = reinterpret_cast<const LoomTestVerbsCounters* (*)()>(dlsym(h, "loom_test_verbs_counters"));
  p.reset = reinterpret_cast<void (*)()>(dlsym(h, "loom_test_verbs_reset_counters"));
  return p;
}

// A training step's gradients: kBuckets buffers of kBucketBytes, one allocation (so that where the
// writes read from and land can be checked against it); rank 0 sends each bucket to rank 1, which
// answers with a small acknowledgement (eager).
constexpr int kBuckets = 6;
constexpr size_t kBucketBytes = (size_t{3} << 19) + 4096;  // 1.5 MiB + a page: two RDMA chunks each
constexpr int kSteps = 40;

TEST(IbZeroCopy, LargeMessagesAreWrittenInPlaceFromReusedRegistrations) {
  const Provider p = provider();
  if (p.counters == nullptr || p.reset == nullptr)
    GTEST_SKIP() << "LOOM_TEST_VERBS_PROVIDER does not name the tests' verbs provider (meson sets it where the verbs "
                    "headers are; by hand: LOOM_TEST_VERBS_PROVIDER=build/tests/libloom_test_verbs.so)";
  loomtest::TransportSetup links("ib");
  std::vector<uint8_t> grads(kBuckets * kBucketBytes), landing(kBuckets * kBucketBytes);
  loom::RegistrationStats warm[2]{}, end[2]{};
  LoomTestVerbsCounters during{};
  loomtest::runOk(2, [&](loom::Communicator& c) {
    const int peer = 1 - c.rank();
    auto step = [&](int s) {
      for (int b = 0; b < kBuckets; ++b) {
        uint8_t* at = (c.rank() == 0 ? grads.data() : landing.data()) + static_cast<size_t>(b) * kBucketBytes;
        int ack = 0;
        if (c.rank() == 0) {
          for (size_t i = 0; i < kBucketBytes; i += 4093) at[i] = loomtest::pattern(0, 1, s * kBuckets + b, i);
          c.send(at, kBucketBytes, DataType::Uint8, peer, b);
          c.recv(&ack, 1, DataType::Int32, peer, 100 + b);
        } else {
          c.recv(at, kBucketBytes, DataType::Uint8, peer, b);
          for (size_t i = 0; i < kBucketBytes; i += 4093)
            ASSERT_EQ(at[i], loomtest::pattern(0, 1, s * kBuckets + b, i)) << "step " << s << " bucket " << b;
          c.send(&ack, 1, DataType::Int32, peer, 100 + b);
        }
      }
    };
    step(0);  // the first step registers every bucket
    c.barrier();
    warm[c.rank()] = c.impl()->registrationStats(peer);
    c.barrier();
    if (c.rank() == 0) p.reset();
    c.barrier();
    for (int s = 1; s <= kSteps; ++s) step(s);
    c.barrier();
    end[c.rank()] = c.impl()->registrationStats(peer);
    if (c.rank() == 0) during = *p.counters();
  });
  const uint64_t payload = uint64_t{kSteps} * kBuckets * kBucketBytes;
  // Every payload byte went by RDMA write, read from the sender's buckets and written into the
  // receiver's: no staging buffer on either side.
  EXPECT_EQ(during.write_bytes, payload);
  EXPECT_GE(during.write_source_begin, reinterpret_cast<uint64_t>(grads.data()));
  EXPECT_LE(during.write_source_end, reinterpret_cast<uint64_t>(grads.data() + grads.size()));
  EXPECT_GE(during.write_target_begin, reinterpret_cast<uint64_t>(landing.data()));
  EXPECT_LE(during.write_target_end, reinterpret_cast<uint64_t>(landing.data() + landing.size()));
  // What went by SEND (headers, clear-to-sends, credits, the acknowledgements) is a sliver.
  EXPECT_LT(during.send_bytes, payload / 100) << "SEND bytes " << during.send_bytes;
  // No registration was made in the loop: every bucket found its own, rank 0's for its sends and
  // rank 1's for its receives (each rank's transport has its cache).
  EXPECT_EQ(during.registrations, 0u);
  EXPECT_EQ(during.unmapped_accesses, 0u);
  const uint64_t hits = end[0].hits - warm[0].hits + end[1].hits - warm[1].hits;
  const uint64_t misses = end[0].misses - warm[0].misses + end[1].misses - warm[1].misses;
  ASSERT_GT(hits + misses, 0u);
  const double hitRate = static_cast<double>(hits) / static_cast<double>(hits + misses);
  EXPECT_GE(hitRate, 0.99) << hits << " hits, " << misses << " misses";
  std::printf(
      "[ ib       ] %d steps of %d x %zu-byte buckets: %llu bytes written in place, %llu by SEND; "
      "registration hit rate %.2f%% (%llu of %llu)\n",
      kSteps, kBuckets, kBucketBytes, static_cast<unsigned long long>(during.write_bytes),
      static_cast<unsigned long long>(during.send_bytes), 100.0 * hitRate, static_cast<unsigned long long>(hits),
      static_cast<unsigned long long>(hits + misses));
}

}  // namespace

#endif  // LOOM_HAVE_IBVERBS
