// The registration cache (transport/registration_cache.hpp) against a registrar that records
// what is registered, and the memory monitor (transport/memory_monitor.hpp) that tells the cache
// when memory is freed and reused: the monitor must catch libc's own unmapping inside free(),
// which is where a stale registration would come from.
#include "transport/registration_cache.hpp"

#include <gnu/libc-version.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "transport/memory_monitor.hpp"

namespace loom {
namespace {

const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));

// Registers by handing out keys, and checks that every deregistration undoes a live registration.
class RecordingRegistrar : public Registrar {
 public:
  Status registerRange(uintptr_t begin, size_t bytes, RegisteredRange* out) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    if (failNext) {
      failNext = false;
      return Status::error(ErrorCode::Internal, "cannot pin: the locked-memory limit");
    }
    out->begin = begin;
    out->bytes = bytes;
    out->localKey = ++nextKey_;
    out->remoteKey = nextKey_ + 1000000;
    live_.insert(out->localKey);
    ++registered;
    return Status::success();
  }
  void deregisterRange(const RegisteredRange& r) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.erase(r.localKey) != 1) ++bogus;
  }
  size_t live() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  bool isLive(uint64_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(key) == 1;
  }
  std::atomic<int> registered{0};
  std::atomic<int> bogus{0};  // deregistrations of what was not registered
  bool failNext = false;

 private:
  std::mutex mu_;
  std::set<uint64_t> live_;
  uint64_t nextKey_ = 0;
};

// A fake monitor-less cache (memory that never changes) or one fed by the process's monitor.
RegistrationCache::Limits limits(size_t entries, size_t bytes = 0) {
  RegistrationCache::Limits l;
  l.maxEntries = entries;
  l.maxBytes = bytes;
  return l;
}

// The process's monitor, which this machine's glibc must allow; elsewhere the tests that need it
// say why they cannot run.
MemoryMonitor* monitorOrSkip() {
  MemoryMonitor* m = MemoryMonitor::get();
  if (m == nullptr) {
#if defined(__x86_64__)
    if (std::strcmp(gnu_get_libc_version(), "2.36") == 0)
      ADD_FAILURE() << "the memory hooks must install on x86-64 glibc 2.36: " << MemoryMonitor::reason();
#endif
    return nullptr;
  }
  return m;
}
#define NEED_MONITOR(m)                                                                                        \
  MemoryMonitor* m = monitorOrSkip();                                                                          \
  if (m == nullptr)                                                                                            \
    GTEST_SKIP()                                                                                               \
        << "the memory hooks are not installed here (" << MemoryMonitor::reason()                              \
        << "): they need x86-64 Linux with a glibc whose entries they know, and LOOM_MEMORY_HOOKS unset or 1"; \
  static_assert(true, "")

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerAllocator = true;  // its malloc maps and unmaps without libc
#else
constexpr bool kSanitizerAllocator = false;
#endif

// An anonymous mapping of `pages` pages.
char* mapPages(size_t pages, void* at = nullptr) {
  void* p = mmap(at, pages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED : 0), -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  return static_cast<char*>(p);
}

TEST(RegistrationCache, ACoveredRangeIsAHitOnTheSameRegistration) {
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(16), MemoryMonitor::get());
  char* buf = mapPages(4);
  Status err;
  Registration a = cache.acquire(buf + 100, 3 * kPage, &err);
  ASSERT_NE(a, nullptr) << err.message;
  EXPECT_EQ(a->begin, reinterpret_cast<uintptr_t>(buf));  // whole pages
  EXPECT_TRUE(a->covers(buf + 100, 3 * kPage));
  Registration b = cache.acquire(buf + kPage, 10, &err);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->localKey, a->localKey);
  EXPECT_EQ(reg.registered, 1);
  const RemoteMemory rm = b->remote(buf + kPage, 10);
  EXPECT_EQ(rm.addr, reinterpret_cast<uint64_t>(buf + kPage));
  EXPECT_EQ(rm.bytes, 10u);
  EXPECT_EQ(rm.key, a->remoteKey);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
  a.reset();
  b.reset();
  munmap(buf, 4 * kPage);
}

TEST(RegistrationCache, AnOverlappingRangeIsRegisteredAsTheUnion) {
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(16), MemoryMonitor::get());
  char* buf = mapPages(8);
  Status err;
  Registration held = cache.acquire(buf, 2 * kPage, &err);
  { Registration idle = cache.acquire(buf + 5 * kPage, kPage, &err); }
  Registration u = cache.acquire(buf + kPage, 5 * kPage, &err);  // overlaps both
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->begin, reinterpret_cast<uintptr_t>(buf));
  EXPECT_EQ(u->bytes, 6 * kPage);
  // The held one stays registered for its holder; the idle one went at once.
  EXPECT_TRUE(reg.isLive(held->localKey));
  EXPECT_EQ(reg.live(), 2u);
  held.reset();
  EXPECT_EQ(reg.live(), 1u);
  // Every piece is now a hit on the union.
  Registration again = cache.acquire(buf + 4 * kPage, 2 * kPage, &err);
  EXPECT_EQ(again->localKey, u->localKey);
  EXPECT_EQ(reg.bogus, 0);
  u.reset();
  again.reset();
  munmap(buf, 8 * kPage);
}

// A neighbour whose memory went behind the monitor's back (an allocator that unmaps with the
// system call itself, as sanitizers' do) makes the union unregistrable: the range asked for is
// registered alone, and the neighbour leaves the cache.
TEST(RegistrationCache, AUnionThatCannotBeRegisteredFallsBackToTheRangeAskedFor) {
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(16), MemoryMonitor::get());
  char* buf = mapPages(8);
  Status err;
  { Registration old = cache.acquire(buf, 2 * kPage, &err); }  // cached, idle
  reg.failNext = true;                                         // the union with it fails once
  Registration r = cache.acquire(buf + kPage, 4 * kPage, &err);
  ASSERT_NE(r, nullptr) << err.message;
  EXPECT_EQ(r->begin, reinterpret_cast<uintptr_t>(buf + kPage));
  EXPECT_EQ(r->bytes, 4 * kPage);
  EXPECT_EQ(reg.live(), 1u) << "the neighbour left the cache";
  Registration hit = cache.acquire(buf + 2 * kPage, kPage, &err);
  EXPECT_EQ(hit->localKey, r->localKey);
  reg.failNext = true;  // the range asked for itself fails: the error is the caller's
  Registration none = cache.acquire(buf + 6 * kPage, kPage, &err);
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(err.message.find("locked-memory"), std::string::npos);
  EXPECT_EQ(reg.bogus, 0);
  r.reset();
  hit.reset();
  munmap(buf, 8 * kPage);
}

TEST(RegistrationCache, LeastRecentlyUsedIdleRegistrationsGoFirst) {
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(2), MemoryMonitor::get());
  if (!cache.caching())
    GTEST_SKIP() << "the memory hooks are not installed here (" << MemoryMonitor::reason()
                 << "): they need x86-64 Linux with a glibc whose entries they know, and LOOM_MEMORY_HOOKS unset or 1";
  char* buf = mapPages(16);
  Status err;
  auto keyOf = [&](int page) { return cache.acquire(buf + page * 2 * kPage, kPage, &err)->localKey; };
  const uint64_t a = keyOf(0);
  const uint64_t b = keyOf(1);
  const uint64_t c = keyOf(2);  // a goes
  EXPECT_FALSE(reg.isLive(a));
  EXPECT_EQ(keyOf(1), b);       // a hit, and b is now the most recent
  const uint64_t d = keyOf(3);  // c goes, not b
  EXPECT_FALSE(reg.isLive(c));
  EXPECT_TRUE(reg.isLive(b));
  EXPECT_TRUE(reg.isLive(d));
  EXPECT_EQ(cache.stats().evictions, 2u);
  EXPECT_EQ(cache.stats().entries, 2u);
  munmap(buf, 16 * kPage);
}

TEST(RegistrationCache, ABytesBoundEvictsAndHeldRegistrationsAreNeverEvicted) {
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(100, 3 * kPage), MemoryMonitor::get());
  if (!cache.caching())
    GTEST_SKIP() << "the memory hooks are not installed here (" << MemoryMonitor::reason()
                 << "): they need x86-64 Linux with a glibc whose entries they know, and LOOM_MEMORY_HOOKS unset or 1";
  char* buf = mapPages(16);
  Status err;
  Registration x = cache.acquire(buf, 2 * kPage, &err);
  Registration y = cache.acquire(buf + 4 * kPage, 2 * kPage, &err);  // 4 pages held: over, kept
  EXPECT_EQ(reg.live(), 2u);
  EXPECT_EQ(cache.stats().evictions, 0u);
  x.reset();  // idle and over the bound: goes
  EXPECT_EQ(reg.live(), 1u);
  EXPECT_EQ(cache.stats().bytes, 2 * kPage);
  y.reset();  // within the bound: stays
  EXPECT_EQ(reg.live(), 1u);
  munmap(buf, 16 * kPage);
}

TEST(RegistrationCache, WithoutAMonitorNothingOutlivesItsHolders) {
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(16), nullptr);
  EXPECT_FALSE(cache.caching());
  char* buf = mapPages(2);
  Status err;
  Registration a = cache.acquire(buf, kPage, &err);
  Registration b = cache.acquire(buf, kPage, &err);  // shared while held
  EXPECT_EQ(a->localKey, b->localKey);
  a.reset();
  b.reset();
  EXPECT_EQ(reg.live(), 0u);
  { Registration c = cache.acquire(buf, kPage, &err); }
  EXPECT_EQ(reg.registered, 2);
  munmap(buf, 2 * kPage);
}

TEST(RegistrationCache, ErrorsAreReturnedNotThrown) {
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(16), MemoryMonitor::get());
  Status err;
  EXPECT_EQ(cache.acquire(nullptr, 8, &err), nullptr);
  EXPECT_EQ(err.code, ErrorCode::InvalidArgument);
  char* buf = mapPages(1);
  reg.failNext = true;
  EXPECT_EQ(cache.acquire(buf, 8, &err), nullptr);
  EXPECT_NE(err.message.find("locked-memory"), std::string::npos);
  Registration ok = cache.acquire(buf, 8, &err);  // the failure left nothing behind
  EXPECT_NE(ok, nullptr);
  ok.reset();
  munmap(buf, kPage);
}

TEST(RegistrationCache, RegistrationsMayOutliveTheCache) {
  RecordingRegistrar reg;
  char* buf = mapPages(2);
  Registration kept;
  {
    RegistrationCache cache(reg, limits(16), MemoryMonitor::get());
    Status err;
    kept = cache.acquire(buf, kPage, &err);
    { Registration idle = cache.acquire(buf + kPage, 1, &err); }
  }
  EXPECT_EQ(reg.live(), 0u);  // the cache deregistered everything, held or not
  kept.reset();               // and this release does nothing
  EXPECT_EQ(reg.bogus, 0);
  munmap(buf, 2 * kPage);
}

// ---- Freed and reused memory -------------------------------------------------------------

TEST(MemoryMonitor, SeesLibcFreeUnmapALargeBlock) {
  NEED_MONITOR(m);
  if (kSanitizerAllocator)
    GTEST_SKIP() << "a sanitizer's malloc replaces glibc's, whose free() this checks: the plain build runs it";
  uint64_t cursor = m->published();
  const size_t n = 64u << 20;  // far above malloc's mmap threshold: its own mapping
  char* p = static_cast<char*>(std::malloc(n));
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 4096);
  std::free(p);  // glibc unmaps it from inside free(), past any symbol interposition
  bool seen = false;
  m->drain(&cursor, [&](uintptr_t b, uintptr_t e) {
    if (b <= reinterpret_cast<uintptr_t>(p) && e >= reinterpret_cast<uintptr_t>(p) + n) seen = true;
  });
  EXPECT_TRUE(seen);
}

TEST(MemoryMonitor, SeesTheHeapShrink) {
  NEED_MONITOR(m);
  uint64_t cursor = m->published();
  // Nothing allocates between the two sbrk calls, so malloc's heap is left as it was.
  auto* top = static_cast<char*>(sbrk(0));
  ASSERT_NE(sbrk(static_cast<intptr_t>(2 * kPage)), reinterpret_cast<void*>(-1));
  ASSERT_NE(sbrk(-static_cast<intptr_t>(2 * kPage)), reinterpret_cast<void*>(-1));
  EXPECT_EQ(sbrk(0), top);  // the hook kept libc's idea of the break
  bool seen = false;
  m->drain(&cursor, [&](uintptr_t b, uintptr_t e) {
    if (b <= reinterpret_cast<uintptr_t>(top) && e >= reinterpret_cast<uintptr_t>(top) + 2 * kPage) seen = true;
  });
  EXPECT_TRUE(seen);
}

TEST(MemoryMonitor, HookedCallsBehaveAsLibcs) {
  NEED_MONITOR(m);
  errno = 0;
  EXPECT_EQ(munmap(reinterpret_cast<void*>(1), kPage), -1);  // unaligned
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(mmap(nullptr, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 1), MAP_FAILED);
  EXPECT_EQ(errno, EINVAL);
  char* p = mapPages(4);
  p[0] = 7;
  char* q = static_cast<char*>(mremap(p, 4 * kPage, 8 * kPage, MREMAP_MAYMOVE));
  ASSERT_NE(q, MAP_FAILED);
  EXPECT_EQ(q[0], 7);
  EXPECT_EQ(madvise(q, 8 * kPage, MADV_DONTNEED), 0);
  EXPECT_EQ(q[0], 0);  // the page was dropped: anonymous memory reads zero again
  EXPECT_EQ(madvise(q, kPage, 12345), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(munmap(q, 8 * kPage), 0);
}

// Each way a range comes to map other pages; after each, the cache registers it anew.
TEST(RegistrationCache, MemoryThatChangesIsRegisteredAgain) {
  NEED_MONITOR(m);
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(64), m);
  Status err;
  auto keyOf = [&](const void* p, size_t n) {
    Registration r = cache.acquire(p, n, &err);
    EXPECT_NE(r, nullptr) << err.message;
    return r->localKey;
  };

  // Freed and allocated again, at the same address or not. (A sanitizer's allocator keeps the
  // block mapped, so the same pages come back and the registration rightly stays.)
  if (!kSanitizerAllocator) {
    const size_t n = 32u << 20;
    void* a = std::malloc(n);
    const uint64_t k1 = keyOf(a, n);
    EXPECT_EQ(keyOf(a, n), k1);  // unchanged: a hit
    std::free(a);
    void* b = std::malloc(n);
    EXPECT_NE(keyOf(b, n), k1);
    std::free(b);
  }

  // Unmapped, then mapped again at the same address.
  char* p = mapPages(4);
  const uint64_t k2 = keyOf(p, 4 * kPage);
  munmap(p, 4 * kPage);
  ASSERT_EQ(mapPages(4, p), p);
  EXPECT_NE(keyOf(p, 4 * kPage), k2);

  // Mapped over in place (MAP_FIXED).
  const uint64_t k3 = keyOf(p, 4 * kPage);
  ASSERT_EQ(mapPages(2, p + kPage), p + kPage);
  EXPECT_NE(keyOf(p, 4 * kPage), k3);

  // Pages dropped by madvise (how malloc trims its arenas).
  const uint64_t k4 = keyOf(p, 4 * kPage);
  madvise(p + 2 * kPage, kPage, MADV_DONTNEED);
  EXPECT_NE(keyOf(p, 4 * kPage), k4);

  // Moved by mremap.
  const uint64_t k5 = keyOf(p, 4 * kPage);
  char* dest = mapPages(4);  // a place of our own to move to (MREMAP_FIXED replaces what is there)
  char* q = static_cast<char*>(mremap(p, 4 * kPage, 4 * kPage, MREMAP_MAYMOVE | MREMAP_FIXED, dest));
  ASSERT_EQ(q, dest);
  ASSERT_EQ(mapPages(4, p), p);
  EXPECT_NE(keyOf(p, 4 * kPage), k5);
  munmap(p, 4 * kPage);
  munmap(q, 4 * kPage);

  // A change elsewhere costs nothing.
  char* r = mapPages(2);
  const uint64_t k6 = keyOf(r, kPage);
  char* elsewhere = mapPages(1);
  munmap(elsewhere, kPage);
  EXPECT_EQ(keyOf(r, kPage), k6);
  munmap(r, 2 * kPage);

  EXPECT_GE(cache.stats().invalidations, kSanitizerAllocator ? 4u : 5u);
  EXPECT_EQ(reg.bogus, 0);
}

TEST(RegistrationCache, AReaderThatFellBehindTrustsNothing) {
  NEED_MONITOR(m);
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(64), m);
  char* p = mapPages(1);
  Status err;
  const uint64_t k = cache.acquire(p, 8, &err)->localKey;
  for (int i = 0; i < 5000; ++i) MemoryMonitor::note(kPage * 3, kPage * 4);  // more than the ring holds
  EXPECT_NE(cache.acquire(p, 8, &err)->localKey, k);
  munmap(p, kPage);
}

// Threads take and drop registrations of buffers that another thread keeps unmapping and
// mapping again; every registration a thread holds must be live, and nothing may leak.
TEST(RegistrationCache, StaysConsistentWhileMemoryChangesUnderIt) {
  NEED_MONITOR(m);
  RecordingRegistrar reg;
  RegistrationCache cache(reg, limits(8), m);
  constexpr int kBufs = 6;
  char* region = mapPages(kBufs * 4);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> users;
  for (int t = 0; t < 3; ++t) {
    users.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      while (!stop.load()) {
        const int i = static_cast<int>(rng() % kBufs);
        Status err;
        Registration r = cache.acquire(region + i * 4 * kPage + rng() % kPage, 1 + rng() % (2 * kPage), &err);
        if (r == nullptr || !reg.isLive(r->localKey)) failures.fetch_add(1);
      }
    });
  }
  std::thread changer([&] {
    for (int k = 0; k < 2000; ++k) {
      char* b = region + (k % kBufs) * 4 * kPage;
      if (k % 2 == 0) {
        mmap(b, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      } else {
        madvise(b, 4 * kPage, MADV_DONTNEED);
      }
    }
    stop.store(true);
  });
  changer.join();
  for (auto& u : users) u.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(reg.bogus, 0);
  EXPECT_EQ(reg.live(), cache.stats().entries);
  EXPECT_GT(cache.stats().invalidations, 0u);
  munmap(region, kBufs * 4 * kPage);
}

}  // namespace
}  // namespace loom
