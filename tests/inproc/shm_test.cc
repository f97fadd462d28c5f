// The shared-memory transport, ranks as threads of one process (one node): which transport each
// pair gets, the copy paths (single copy, ring fallback, refusal in mid-run), nothing left in
// /dev/shm, and bad input at setup (a name collision, a full /dev/shm, a segment of the wrong
// version or size). Collectives and point-to-point over shared memory are covered by the matrices in
// collectives_test.cc and p2p_test.cc; processes and SIGKILL by the multiproc suite.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/tcp_store_server.hpp"
#include "common/env_guard.hpp"
#include "common/ranks.hpp"
#include "transport/shm/cma.hpp"
#include "transport/shm/node_file.hpp"
#include "transport/shm/segment.hpp"

using loom::DataType;
using loomtest::pattern;

namespace {

std::set<std::string> loomSegments() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("loom-", 0) == 0) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

using EnvVar = loomtest::EnvGuard;

// Every rank sends every other rank one message of each size, all at once, and checks them.
void exchangeSizes(loom::Communicator& c, int round) {
  const int n = c.size(), me = c.rank();
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4093}, size_t{65536}, size_t{65537}, size_t{3} << 20}) {
    std::vector<std::vector<uint8_t>> out(n), in(n);
    std::vector<loom::Work> w;
    for (int p = 0; p < n; ++p) {
      in[p].assign(bytes, 0xEE);
      w.push_back(c.irecv(in[p].data(), bytes, DataType::Uint8, p, 3));
    }
    for (int p = 0; p < n; ++p) {
      out[p].resize(bytes);
      for (size_t i = 0; i < bytes; ++i) out[p][i] = pattern(me, p, round, i);
      w.push_back(c.isend(out[p].data(), bytes, DataType::Uint8, p, 3));
    }
    loom::waitAll(w);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < bytes; ++i)
        if (in[p][i] != pattern(p, me, round, i)) FAIL() << "byte " << i << " of " << bytes << " from rank " << p;
  }
}

// A segment of its own for the probe tests: a node file of one rank, its name gone at once.
struct LoneSegment {
  loom::shm::NodeFile file;
  loom::shm::Segment seg;
  explicit LoneSegment(const std::string& name) {
    loom::shm::NodeLayout layout;
    layout.ranks = 1;
    layout.ringBytes = 4096;
    const loom::Nonce id = loom::randomNonce();
    file = loom::shm::NodeFile::create(name, 0, layout, id);
    file.unlink();
    file.back(0, 0, false);
    seg = file.segment(0);
    seg.initialise(0, id);
  }
};

struct HookReset {
  ~HookReset() {
    loom::shm::segmentTestHooks() = {};
    loom::shm::cmaForcedErrno().store(0);
  }
};

}  // namespace

TEST(Shm, RanksOfOneNodeUseSharedMemoryAndLeaveNothingInDevShm) {
  const auto before = loomSegments();
  loomtest::runOk(4, [&](loom::Communicator& c) {
    for (int p = 0; p < c.size(); ++p) {
      EXPECT_EQ(c.transportOf(p), p == c.rank() ? "self" : "shm") << "peer " << p;
      if (p != c.rank()) {
        EXPECT_NE(c.describeLink(p).find("shm"), std::string::npos) << c.describeLink(p);
      }
    }
    // Joined: every segment is unlinked already, while the communicator lives.
    c.barrier();
    if (c.rank() == 0) {
      EXPECT_EQ(loomSegments(), before);
    }
    c.barrier();
    exchangeSizes(c, 0);
  });
  EXPECT_EQ(loomSegments(), before);
}

namespace {

// The store requests of an init of n ranks and an all-reduce, linked by `mode`, where the last rank's
// shared-memory segment is ready 300 ms after the others.
uint64_t initRequests(const std::string& mode, int n) {
  HookReset reset;
  loomtest::TransportSetup links(mode);
  loom::shm::segmentTestHooks().afterCreate = [n](loom::shm::SegmentHeader* h) {
    if (h->owner == static_cast<uint32_t>(n - 1)) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  const uint64_t before = loom::TcpStoreServer::servedInProcess();
  std::atomic<uint64_t> after{0};
  loomtest::runOk(n, [&](loom::Communicator& c) {
    EXPECT_EQ(c.transportOf((c.rank() + 1) % n), mode);
    int32_t x = c.rank();
    c.allReduce(&x, &x, 1, DataType::Int32, loom::ReduceOp::Sum);  // every rank is past init
    EXPECT_EQ(x, n * (n - 1) / 2);
    if (c.rank() == 0) after = loom::TcpStoreServer::servedInProcess();
  });
  return after.load() - before;
}

}  // namespace

// Segments are found by name and attached through their headers: a node's shared memory costs
// the store nothing but a rank's occasional look for a peer that gave up while it waits (each
// rank asked for every peer's endpoint and answer, polling every 2 ms: about 150 requests a rank
// while one segment was 300 ms late).
TEST(Shm, SetUpAsksTheStoreAlmostNothing) {
  const int n = 8;
  const uint64_t tcp = initRequests("tcp", n);  // links on first use: the join alone
  const uint64_t shm = initRequests("shm", n);
  std::printf("[ requests ] %d ranks, one segment 300 ms late: shm %llu, tcp %llu\n", n,
              static_cast<unsigned long long>(shm), static_cast<unsigned long long>(tcp));
  EXPECT_LE(shm, tcp + 12 * n) << "shm: " << shm << " requests, tcp: " << tcp << ", for " << n << " ranks";
}

// The liveness probe every rank runs on its peers' segments several times a second: alive while
// the owner's thread holds the robust mutex (read without a write), died once that thread ends
// holding it, closed once it let go after marking the segment closed.
TEST(Shm, TheLivenessProbeTellsAliveDiedAndClosed) {
  using loom::shm::PeerState;
  LoneSegment lone("/loom-test-probe-" + std::to_string(getpid()));
  loom::shm::SegmentHeader* h = lone.seg.header();
  std::atomic<int> stage{0};
  std::thread owner([&] {
    pthread_mutex_lock(&h->alive);
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
  });  // ends holding the mutex, as a killed process would
  while (stage.load() != 1) std::this_thread::yield();
  EXPECT_EQ(loom::shm::probeOwner(h), PeerState::Alive);
  EXPECT_EQ(loom::shm::probeOwner(h), PeerState::Alive);
  stage = 2;
  owner.join();
  EXPECT_EQ(loom::shm::probeOwner(h), PeerState::Died);
  std::thread closing([&] {
    pthread_mutex_lock(&h->alive);
    EXPECT_EQ(loom::shm::probeOwner(h), PeerState::Alive);  // the holder itself asks: still held
    h->closed.store(1);
    pthread_mutex_unlock(&h->alive);
  });
  closing.join();
  EXPECT_EQ(loom::shm::probeOwner(h), PeerState::Closed);
}

// A probe that finds the mutex held by another rank's probe (which holds it for a moment while it
// finds the owner dead, or gone cleanly) reads that, not "alive": the owner's thread id in the
// header tells the owner's hold from a prober's.
TEST(Shm, TheLivenessProbeIsNotFooledByAnotherProbersHold) {
  using loom::shm::PeerState;
  for (const bool clean : {false, true}) {
    LoneSegment lone("/loom-test-probe2-" + std::to_string(getpid()));
    loom::shm::SegmentHeader* h = lone.seg.header();
    std::thread owner([&] {
      pthread_mutex_lock(&h->alive);
      h->aliveHolder.store(static_cast<int32_t>(gettid()));
      if (clean) {
        h->closed.store(1);
        pthread_mutex_unlock(&h->alive);
      }
    });  // died holding the mutex, or closed
    owner.join();
    std::atomic<int> stage{0};
    std::thread prober([&] {  // another rank's probe, caught while it holds the mutex
      const int rc = pthread_mutex_trylock(&h->alive);
      EXPECT_EQ(rc, clean ? 0 : EOWNERDEAD);
      stage = 1;
      while (stage.load() != 2) std::this_thread::yield();
      if (rc == EOWNERDEAD) pthread_mutex_consistent(&h->alive);
      pthread_mutex_unlock(&h->alive);
    });
    while (stage.load() != 1) std::this_thread::yield();
    EXPECT_EQ(loom::shm::probeOwner(h), clean ? PeerState::Closed : PeerState::Died) << "clean " << clean;
    stage = 2;
    prober.join();
    EXPECT_EQ(loom::shm::probeOwner(h), clean ? PeerState::Closed : PeerState::Died) << "clean " << clean;
  }
}

// Opening the node's file: absent or not yet ready, ask again; one of another layout version (a
// leader running another Loom) is named at once, though it never says ready where this one looks.
TEST(Shm, OpeningWaitsForAReadyFileAndNamesAnotherVersionAtOnce) {
  const std::string name = "/loom-test-attach-" + std::to_string(getpid());
  const loom::Nonce id = loom::randomNonce();
  loom::shm::NodeFile file;
  EXPECT_FALSE(loom::shm::NodeFile::tryOpen(name, 0, 1, 2, id, &file));  // not there yet
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
  void* p = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  auto* h = static_cast<loom::shm::NodeHeader*>(p);
  h->magic = loom::shm::kNodeMagic;  // being written: no version yet
  EXPECT_FALSE(loom::shm::NodeFile::tryOpen(name, 0, 1, 2, id, &file));
  h->version = loom::shm::kSegmentVersion - 1;
  std::string error;
  try {
    loom::shm::NodeFile::tryOpen(name, 0, 1, 2, id, &file);
  } catch (const loom::Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("the shared-memory segment /dev/shm" + name + " of rank 1's node is unusable: its layout " +
                       "version is " + std::to_string(loom::shm::kSegmentVersion - 1)),
            std::string::npos)
      << error;
  munmap(p, 1 << 20);
  shm_unlink(name.c_str());
  EXPECT_FALSE(file.valid());
}

TEST(Shm, MixedNodesUseSharedMemoryWithinAndTcpAcross) {
  loomtest::TransportSetup links("mixed");  // even ranks on one "node", odd ranks on another
  loomtest::runOk(5, [&](loom::Communicator& c) {
    for (int p = 0; p < c.size(); ++p) {
      const char* want = p == c.rank() ? "self" : (p % 2 == c.rank() % 2 ? "shm" : "tcp");
      EXPECT_EQ(c.transportOf(p), want) << "rank " << c.rank() << " peer " << p;
    }
    exchangeSizes(c, 1);
  });
}

TEST(Shm, ExcludedByLoomTransport) {
  EnvVar only("LOOM_TRANSPORT", "^shm");
  loomtest::runOk(3, [&](loom::Communicator& c) {
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank()) {
        EXPECT_EQ(c.transportOf(p), "tcp");
      }
    exchangeSizes(c, 2);
  });
}

TEST(Shm, OnlySharedMemoryAcrossNodesIsAClearError) {
  EnvVar only("LOOM_TRANSPORT", "shm");
  loomtest::PerRankOptions nodes([](int r, loom::Options& o) { o.hostId = r == 0 ? "a" : "b"; });
  auto results = loomtest::runRanks(2, [](loom::Communicator&) {});
  for (const auto& r : results) {
    EXPECT_NE(r.error.find("no allowed transport (shm) reaches rank"), std::string::npos) << r.error;
  }
}

TEST(Shm, CopiesThroughTheRingWhereCrossMemoryAttachIsRefused) {
  HookReset reset;
  loom::shm::cmaForcedErrno().store(EPERM);  // as a container's seccomp policy would
  loomtest::runOk(3, [&](loom::Communicator& c) {
    const int peer = (c.rank() + 1) % c.size();
    EXPECT_NE(c.describeLink(peer).find("process_vm_readv refused"), std::string::npos) << c.describeLink(peer);
    exchangeSizes(c, 3);
    std::vector<float> v((8u << 20) / 4 + 3, 1.0f);
    c.allReduce(v.data(), v.data(), v.size(), DataType::Float32, loom::ReduceOp::Sum);
    for (float x : v)
      if (x != 3.0f) FAIL() << x;
  });
}

TEST(Shm, RefusalInMidRunFallsBackToTheRing) {
  HookReset reset;
  loomtest::runOk(2, [&](loom::Communicator& c) {
    EXPECT_NE(c.describeLink(1 - c.rank()).find("single copy"), std::string::npos) << c.describeLink(1 - c.rank());
    exchangeSizes(c, 4);
    c.barrier();
    if (c.rank() == 0) loom::shm::cmaForcedErrno().store(EPERM);
    c.barrier();
    exchangeSizes(c, 5);  // the large messages now find process_vm_readv refused
  });
}

TEST(Shm, ASegmentNameTakenByAnotherJobIsAClearError) {
  HookReset reset;
  const std::string taken = "/loom-test-collision-" + std::to_string(getpid());
  int fd = shm_open(taken.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  loom::shm::segmentTestHooks().rename = [&](const std::string& name) {
    return name.substr(name.size() - 2) == "-0" ? taken : name;  // the node's file, made by rank 0
  };
  auto results = loomtest::runRanks(2, [](loom::Communicator&) {});
  EXPECT_NE(results[0].error.find("/dev/shm" + taken + " already exists"), std::string::npos) << results[0].error;
  EXPECT_NE(results[1].error.find("already exists"), std::string::npos) << results[1].error;  // told at once
  shm_unlink(taken.c_str());
  EXPECT_EQ(loomSegments().count(taken.substr(1)), 0u);
}

TEST(Shm, AFullDevShmIsAClearError) {
  const auto before = loomSegments();
  EnvVar huge("LOOM_SHM_RING_BYTES", "1099511627776");  // 1 TiB per ring: more than any /dev/shm
  auto results = loomtest::runRanks(2, [](loom::Communicator&) {});
  for (const auto& r : results) EXPECT_NE(r.error, "");
  bool named = false;
  for (const auto& r : results)
    named |= r.error.find("no room in /dev/shm for shared-memory segment") != std::string::npos;
  EXPECT_TRUE(named) << results[0].error << "\n" << results[1].error;
  EXPECT_EQ(loomSegments(), before);  // the failed segment is removed, not left behind
}

TEST(Shm, ASegmentOfAnotherVersionIsAClearError) {
  HookReset reset;
  const auto before = loomSegments();
  loom::shm::segmentTestHooks().afterNodeCreate = [](loom::shm::NodeHeader* h) { h->version = 99; };
  auto results = loomtest::runRanks(3, [](loom::Communicator&) {});
  // The ranks opening the node's file (made by rank 0) say what is wrong with it; rank 0 hears why.
  EXPECT_NE(results[1].error.find("of rank 0's node is unusable"), std::string::npos) << results[1].error;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(results[r].error.find("version is 99"), std::string::npos) << "rank " << r << ": " << results[r].error;
  EXPECT_EQ(loomSegments(), before);
}

// The same on a node of 12 (the leader waits for the ranks in rank order, looking in the store only
// for the one it stopped at): every rank, and the leader, names what is wrong.
TEST(Shm, ASegmentOfAnotherVersionIsNamedByEveryRankOfALargeNode) {
  HookReset reset;
  const auto before = loomSegments();
  loom::shm::segmentTestHooks().afterNodeCreate = [](loom::shm::NodeHeader* h) { h->version = 99; };
  auto results = loomtest::runRanks(12, [](loom::Communicator&) {});  // a deadline's error would name no version
  for (int r = 0; r < 12; ++r)
    EXPECT_NE(results[r].error.find("version is 99"), std::string::npos) << "rank " << r << ": " << results[r].error;
  EXPECT_EQ(loomSegments(), before);
}

// Two nodes of 6, every link made on first use: the odd node's shared memory fails (its file, made
// by rank 1, is of another version), so its ranks fail; the even node's ranks, which link nothing
// with them at init, hear it at the end of init (every rank says how its set-up went) and name
// them at once, where they used to wait out their init deadline.
TEST(Shm, ANodeWhoseSetUpFailedIsNamedAtOnceByTheOtherNode) {
  HookReset reset;
  loomtest::TransportSetup links("mixed");  // even ranks on one "node", odd ranks on another
  loom::shm::segmentTestHooks().afterNodeCreate = [](loom::shm::NodeHeader* h) {
    if (h->leader == 1) h->version = 99;
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto results = loomtest::runRanks(12, [](loom::Communicator&) {});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));  // the deadline is 30 s
  for (int r = 0; r < 12; ++r) {
    EXPECT_NE(results[r].error.find("version is 99"), std::string::npos) << "rank " << r << ": " << results[r].error;
    if (r % 2 == 0) {
      EXPECT_NE(results[r].error.find("failed setting up their links"), std::string::npos)
          << "rank " << r << ": " << results[r].error;
    }
  }
}

// A node file whose header describes another size than the file has (a foreign or overwritten
// file of the same name): a clear error naming the file and its maker, on every rank, and nothing
// left in /dev/shm.
TEST(Shm, ASegmentOfTheWrongSizeIsAClearError) {
  HookReset reset;
  const auto before = loomSegments();
  loom::shm::segmentTestHooks().afterNodeCreate = [](loom::shm::NodeHeader* h) { h->totalBytes += 4096; };
  auto results = loomtest::runRanks(3, [](loom::Communicator&) {});
  EXPECT_NE(results[2].error.find("of rank 0's node is unusable"), std::string::npos) << results[2].error;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(results[r].error.find("bytes of its file"), std::string::npos)
        << "rank " << r << ": " << results[r].error;
  EXPECT_EQ(loomSegments(), before);
}

TEST(Shm, ManySmallMessagesThroughATinyRing) {
  // A ring smaller than most messages: every send waits for room, in pieces, both ways at once.
  EnvVar tiny("LOOM_SHM_RING_BYTES", "4096");
  EnvVar eager("LOOM_SHM_EAGER_BYTES", "20000");
  loomtest::runOk(3, [&](loom::Communicator& c) {
    for (int round = 10; round < 13; ++round) exchangeSizes(c, round);
    std::vector<int64_t> v(100003);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i) * (c.rank() + 1);
    c.allReduce(v.data(), v.data(), v.size(), DataType::Int64, loom::ReduceOp::Sum);
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != static_cast<int64_t>(i) * 6) FAIL() << i;
  });
}

// A plain (eager) message wakes no one while nobody on the receiving rank waits or attends: it
// must still complete a receive that is only tested, and one whose waiter sleeps at once.
TEST(Shm, MessagesLeftInTheRingCompleteTestedAndSleepingReceives) {
  EnvVar slowTick("LOOM_SHM_LIVENESS_MS", "3000");  // the engine's timed wake-ups cannot hide a missed one
  loomtest::runOk(2, [&](loom::Communicator& c) {
    std::vector<int32_t> v(1000, c.rank() == 0 ? 7 : 0);
    if (c.rank() == 0) {
      c.barrier();
      c.send(v.data(), v.size(), DataType::Int32, 1, 11);
      // Long after the receiver's wait gave up spinning and went to sleep.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      c.send(v.data(), v.size(), DataType::Int32, 1, 12);
    } else {
      auto tested = c.irecv(v.data(), v.size(), DataType::Int32, 0, 11);
      c.barrier();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!tested.test() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      EXPECT_TRUE(tested.test());
      EXPECT_EQ(v[999], 7);
      std::vector<int32_t> w(1000, 0);
      const auto t0 = std::chrono::steady_clock::now();
      c.recv(w.data(), w.size(), DataType::Int32, 0, 12);
      EXPECT_EQ(w[0], 7);
      // Woken by the message, not by the progress thread's 3 s tick.
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
    }
  });
}

// Across "nodes" with several ranks each, the cost model takes the node-aware algorithms where
// they cross the network fewer times; on one node, or forced there, the flat ones run.
TEST(Shm, NodeAwareAlgorithmsAreChosenAcrossNodes) {
  {
    // The default network figures (40 us a message): measured, this machine's loopback TCP is
    // nearly as cheap as shared memory and the flat algorithms rightly win.
    EnvVar untuned("LOOM_TUNE", "0");
    loomtest::TransportSetup links("mixed3");  // 7 ranks: nodes of 3, 2 and 2
    loomtest::runOk(7, [&](loom::Communicator& c) {
      EXPECT_EQ(c.nodeCount(), 3);
      EXPECT_EQ(c.algorithmFor("all_reduce", 1024), "hier");
      EXPECT_EQ(c.algorithmFor("broadcast", 1024), "hier");
      EXPECT_EQ(c.algorithmFor("all_gather", 1024), "rd");  // flat: Bruck's 3 steps, not the ring's 6
      std::vector<double> v(1000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) + c.rank();
      c.allReduce(v.data(), v.data(), v.size(), DataType::Float64, loom::ReduceOp::Avg);
      for (size_t i = 0; i < v.size(); ++i)
        if (v[i] != static_cast<double>(i) + 3.0) FAIL() << i << ": " << v[i];
    });
  }
  EnvVar forced("LOOM_ALGO", "hier");
  loomtest::runOk(3, [&](loom::Communicator& c) {  // one node: nothing node-aware to do
    EXPECT_NE(c.algorithmFor("all_reduce", 1024), "hier");
    EXPECT_THROW(c.algorithmFor("all_sorts", 8), loom::Error);
  });
}

// The direct all-reduce (ranks of one node reading each other's staged data in place): chosen from
// LOOM_SHM_DIRECT_MIN_BYTES up, correct across chunks of a small arena, and ranks that disagree on
// the count get an error instead of reading past each other's data.
TEST(Shm, DirectAllReduceAcrossChunksAndMismatches) {
  EnvVar small("LOOM_SHM_DIRECT_BYTES", "8192");  // many chunks, uneven last one
  loomtest::runOk(3, [&](loom::Communicator& c) {
    EXPECT_EQ(c.algorithmFor("all_reduce", 1u << 20), "direct");
    EXPECT_EQ(c.algorithmFor("all_reduce", 64), "direct");    // one-barrier form (up to 8192 / 4)
    EXPECT_NE(c.algorithmFor("all_reduce", 4096), "direct");  // between the two forms: the model's
    EXPECT_EQ(c.algorithmFor("broadcast", 1024), "direct");   // small broadcast and all-gather too
    EXPECT_EQ(c.algorithmFor("all_gather", 3 * 512), "direct");
    EXPECT_EQ(c.algorithmFor("broadcast", 1u << 20), "direct");  // chunked, at every size
    EXPECT_EQ(c.algorithmFor("all_gather", 3u << 18), "direct");
    EXPECT_EQ(c.algorithmFor("all_gather", 3u << 21), "direct");
    // Chunked broadcast and all-gather through halves of 2 KiB: hundreds of chunks, an uneven
    // last one, every root, in place and not.
    for (int root = 0; root < 3; ++root) {
      std::vector<int32_t> b(100003), out(100003, -1);
      for (size_t i = 0; i < b.size(); ++i) b[i] = c.rank() == root ? static_cast<int32_t>(i * 7 + root) : -2;
      c.broadcast(b.data(), out.data(), b.size(), DataType::Int32, root);
      c.broadcast(b.data(), b.data(), b.size(), DataType::Int32, root);
      for (size_t i = 0; i < b.size(); ++i)
        if (out[i] != static_cast<int32_t>(i * 7 + root) || b[i] != out[i])
          FAIL() << "chunked broadcast from " << root << " at " << i << ": " << out[i] << ", " << b[i];
    }
    const size_t block = 349529;  // 4 MiB in all: the chunked form
    std::vector<int32_t> mine(block), all(3 * block, -1), inplace(3 * block, -1);
    for (size_t i = 0; i < block; ++i)
      mine[i] = inplace[c.rank() * block + i] = static_cast<int32_t>(c.rank() * block + i);
    c.allGather(mine.data(), all.data(), block, DataType::Int32);
    c.allGather(inplace.data() + c.rank() * block, inplace.data(), block, DataType::Int32);
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] != static_cast<int32_t>(i) || inplace[i] != all[i])
        FAIL() << "chunked all-gather at " << i << ": " << all[i] << ", " << inplace[i];
    for (int root = 0; root < 3; ++root) {  // every root, each call in the other half
      std::vector<int16_t> b(300, c.rank() == root ? static_cast<int16_t>(root + 40) : -1);
      c.broadcast(b.data(), b.data(), b.size() * 2, DataType::Uint8, root);
      for (int16_t x : b)
        if (x != root + 40) FAIL() << "broadcast from " << root << ": " << x;
      std::vector<int16_t> mine(5, static_cast<int16_t>(c.rank() * 10 + root)), all(15, -1);
      c.allGather(mine.data(), all.data(), mine.size() * 2, DataType::Uint8);
      for (size_t i = 0; i < all.size(); ++i)
        if (all[i] != static_cast<int16_t>(static_cast<int>(i / 5) * 10 + root)) FAIL() << "all-gather " << i;
    }
    for (int round = 0; round < 50; ++round) {  // small calls alternate halves
      int32_t x[3] = {c.rank() + round, 1, -round};
      c.allReduce(x, x, 3, DataType::Int32, round % 2 ? loom::ReduceOp::Max : loom::ReduceOp::Sum);
      if (round % 2 == 0) {
        EXPECT_EQ(x[0], 3 * round + 3);
        EXPECT_EQ(x[1], 3);
      } else {
        EXPECT_EQ(x[0], round + 2);
      }
    }
    std::vector<int64_t> v(100003);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i % 1000) * (c.rank() + 1);
    c.allReduce(v.data(), v.data(), v.size(), DataType::Int64, loom::ReduceOp::Sum);
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != static_cast<int64_t>(i % 1000) * 6) FAIL() << i << ": " << v[i];
    std::vector<float> f(50001, 1.0f + static_cast<float>(c.rank())), g(50001, -1.0f);
    c.allReduce(f.data(), g.data(), f.size(), DataType::Float32, loom::ReduceOp::Max);
    for (float x : g)
      if (x != 3.0f) FAIL() << x;
  });
  loom::Options o;
  o.timeout = std::chrono::seconds(10);
  auto results = loomtest::runRanks(
      2,
      [](loom::Communicator& c) {
        std::vector<float> v(c.rank() == 0 ? 100000 : 100001, 1.0f);
        c.allReduce(v.data(), v.data(), v.size(), DataType::Float32, loom::ReduceOp::Sum);
      },
      o);
  // Each rank says who called what (from the call's signature, or the direct algorithm's check).
  for (const auto& r : results) {
    const bool named = r.error.find("of 100000 float32") != std::string::npos &&
                       r.error.find("of 100001 float32") != std::string::npos;
    EXPECT_TRUE(named || r.error.find("different counts") != std::string::npos) << r.error;
  }
}

// A peer that sends its last message and leaves at once (the last step of a barrier): the message
// is still delivered, to a receive posted after the link saw the peer go.
TEST(Shm, MessageSentJustBeforeThePeerLeftIsStillReceived) {
  auto results = loomtest::runRanks(2, [](loom::Communicator& c) {
    int32_t v = 0;
    if (c.rank() == 1) {
      v = 4242;
      c.send(&v, 1, DataType::Int32, 0, 7);
      return;  // destroys its communicator at once
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the link sees rank 1 close meanwhile
    c.recv(&v, 1, DataType::Int32, 1, 7);
    EXPECT_EQ(v, 4242);
  });
  EXPECT_EQ(results[0].error, "");
  EXPECT_EQ(results[1].error, "");
}

// A rank that leaves (or fails) while the others wait for it in a direct collective: they hear
// it at once, naming it, instead of at their deadline.
TEST(Shm, DirectCollectivesNameARankThatLeft) {
  loom::Options o;
  o.timeout = std::chrono::seconds(60);
  const auto t0 = std::chrono::steady_clock::now();
  auto results = loomtest::runRanks(
      3,
      [](loom::Communicator& c) {
        if (c.rank() == 1) return;  // destroys its communicator without joining the all-reduce
        float x = 1.0f;
        c.allReduce(&x, &x, 1, DataType::Float32, loom::ReduceOp::Sum);
      },
      o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_EQ(results[1].error, "");
  for (int r : {0, 2}) {
    EXPECT_NE(results[static_cast<size_t>(r)].error.find("rank 1"), std::string::npos)
        << results[static_cast<size_t>(r)].error;
  }
}

namespace {

// The rings of one segment stay within LOOM_SHM_RING_BUDGET: with many local peers they shrink
// (so that a node's shared memory grows linearly with its ranks), with few they keep their size,
// and an explicit LOOM_SHM_RING_BYTES is taken as given. Data moves correctly through the small
// rings, copied through them (no cross-memory attach).
std::string ringsOf(int ranks, const char* ringBytes) {
  EnvVar budget("LOOM_SHM_RING_BUDGET", std::to_string(4 << 20));
  EnvVar cma("LOOM_SHM_CMA", "0");
  EnvVar eager("LOOM_CONNECT", "eager");  // every link described from the start
  std::optional<EnvVar> explicitRing;
  if (ringBytes != nullptr) explicitRing.emplace("LOOM_SHM_RING_BYTES", ringBytes);
  std::vector<std::string> desc(static_cast<size_t>(ranks));
  loomtest::runOk(ranks, [&](loom::Communicator& c) {
    desc[static_cast<size_t>(c.rank())] = c.describeLink((c.rank() + 1) % c.size());
    const size_t count = (3u << 20) + 5;  // 12 MiB of int32: many times any ring
    std::vector<int32_t> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(i % 1000) * (c.rank() + 1);
    c.allReduce(in.data(), out.data(), count, DataType::Int32, loom::ReduceOp::Sum);
    const int32_t factor = ranks * (ranks + 1) / 2;
    for (size_t i = 0; i < count; i += 997) ASSERT_EQ(out[i], static_cast<int32_t>(i % 1000) * factor) << i;
  });
  // Every rank's segment has the same rings.
  auto rings = [](const std::string& d) {
    return d.substr(d.find("rings of"), d.find(" each way") - d.find("rings of"));
  };
  for (const auto& d : desc) EXPECT_EQ(rings(d), rings(desc[0])) << d;
  return desc[0];
}

TEST(Shm, RingsShrinkToTheirBudgetWithManyLocalPeers) {
  EXPECT_NE(ringsOf(9, nullptr).find("rings of 512.00 KiB"), std::string::npos);  // 8 peers in 4 MiB
  EXPECT_NE(ringsOf(3, nullptr).find("rings of 1.00 MiB"), std::string::npos);    // 2 peers fit at 1 MiB
  EXPECT_NE(ringsOf(9, "1048576").find("rings of 1.00 MiB"), std::string::npos);  // as asked
}

}  // namespace
