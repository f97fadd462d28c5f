// Test helper: runs `fn(comm)` on n ranks as threads of this process, each with its own
// Communicator joined through one unique id. A watchdog aborts every communicator when the ranks
// do not finish within `limit`, so a hang fails the test instead of stalling the suite.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/env_guard.hpp"
#include "loom/loom.hpp"
#include "loom_config.h"

namespace loomtest {

/// Every datatype Loom supports, for tests that loop over them.
inline constexpr loom::DataType kAllTypes[] = {
    loom::DataType::Int8,    loom::DataType::Uint8,   loom::DataType::Int32,   loom::DataType::Uint32,
    loom::DataType::Int64,   loom::DataType::Uint64,  loom::DataType::Float16, loom::DataType::Float32,
    loom::DataType::Float64, loom::DataType::Bfloat16};

/// A one-shot meeting point for ranks that are threads: each arrive() returns once all n have
/// arrived. Tests meet here before any rank touches a link, so that what a rank holds is not
/// changed by a peer that went ahead.
class Meet {
 public:
  explicit Meet(int n) : n_(n) {}
  void arrive() {
    arrived_.fetch_add(1);
    while (arrived_.load() < n_) std::this_thread::yield();
  }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
};

/// Per-rank option changes runRanks applies (e.g. a host identity per rank, to make "nodes" of
/// threads); set it for a scope with PerRankOptions.
inline std::function<void(int rank, loom::Options&)>& perRankOptions() {
  static std::function<void(int, loom::Options&)> fn;
  return fn;
}

class PerRankOptions {
 public:
  explicit PerRankOptions(std::function<void(int, loom::Options&)> fn) { perRankOptions() = std::move(fn); }
  ~PerRankOptions() { perRankOptions() = nullptr; }
  PerRankOptions(const PerRankOptions&) = delete;
  PerRankOptions& operator=(const PerRankOptions&) = delete;
};

/// How the ranks of a test are linked: "shm" (all on one node: shared memory, the default; with
/// a device runtime, CUDA IPC for device buffers), "noipc" (the same without CUDA IPC:
/// LOOM_TRANSPORT=^cuda_ipc), "tcp" (LOOM_TRANSPORT=tcp), "mixed" (two "nodes" by host identity, even and odd ranks:
/// shared memory within each, TCP between), "mixed3" (three such nodes, r % 3); any other name is
/// a transport of the registry, alone (LOOM_TRANSPORT=<name>); "ib" also loads the tests' verbs
/// provider (LOOM_IBVERBS_LIBRARY from LOOM_TEST_VERBS_PROVIDER, which meson sets). Where TCP or ib links
/// ranks, they are made on first use (LOOM_CONNECT=lazy, unless the test set LOOM_CONNECT): the
/// default links the few ranks of most tests at init, and the tests are to cover both. Sets it up
/// for the object's lifetime.
class TransportSetup {
 public:
  explicit TransportSetup(const std::string& mode) {
    if (mode == "mixed") {
      perRank_.emplace([](int r, loom::Options& o) { o.hostId = r % 2 == 0 ? "even-node" : "odd-node"; });
    } else if (mode == "mixed3") {
      perRank_.emplace([](int r, loom::Options& o) { o.hostId = "node-" + std::to_string(r % 3); });
    } else if (mode != "shm" && mode != "shm-lazy") {
      const char* old = std::getenv("LOOM_TRANSPORT");
      hadOld_ = old != nullptr;
      if (hadOld_) old_ = old;
      setenv("LOOM_TRANSPORT", mode == "noipc" ? "^cuda_ipc" : mode.c_str(), 1);
      restoreEnv_ = true;
    }
    if ((mode == "tcp" || mode == "mixed" || mode == "mixed3" || mode == "ib" || mode == "shm-lazy") &&
        std::getenv("LOOM_CONNECT") == nullptr)
      connect_.emplace("LOOM_CONNECT", "lazy");
    const char* provider = std::getenv("LOOM_TEST_VERBS_PROVIDER");
    if (mode == "ib" && provider != nullptr) verbsLibrary_.emplace("LOOM_IBVERBS_LIBRARY", provider);
  }
  ~TransportSetup() {
    if (!restoreEnv_) return;
    if (hadOld_) {
      setenv("LOOM_TRANSPORT", old_.c_str(), 1);
    } else {
      unsetenv("LOOM_TRANSPORT");
    }
  }
  TransportSetup(const TransportSetup&) = delete;
  TransportSetup& operator=(const TransportSetup&) = delete;

 private:
  bool restoreEnv_ = false, hadOld_ = false;
  std::string old_;
  std::optional<PerRankOptions> perRank_;
  std::optional<EnvGuard> verbsLibrary_;
  std::optional<EnvGuard> connect_;
};

/// The links every transport must pass the conformance tests over (tests/inproc/conformance_test.cc
/// and the link-parameterised point-to-point tests): a new transport proves itself by adding its
/// name here.
inline const char* const kConformanceLinks[] = {
    "shm",
    "tcp",
    "mixed",
#if LOOM_HAVE_IBVERBS
    "ib",
#endif
};

struct RankResult {
  std::string error;
};

/// The ErrorCode of the loom::Error `f` throws; Internal when it throws none.
inline loom::ErrorCode errorCodeOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const loom::Error& e) {
    return e.code();
  }
  return loom::ErrorCode::Internal;
}

inline std::vector<RankResult> runRanks(int n, const std::function<void(loom::Communicator&)>& fn,
                                        loom::Options options = {},
                                        std::chrono::seconds limit = std::chrono::seconds(90),
                                        const loom::UniqueId* givenId = nullptr) {
  // Waits time out after 30 s, or LOOM_TEST_TIMEOUT seconds (the sanitizer runs, several times
  // slower on a loaded 2-core machine, set 90); the test's own limit stays beyond that.
  const char* scaled = std::getenv("LOOM_TEST_TIMEOUT");
  const std::chrono::seconds waits(scaled != nullptr && std::atoi(scaled) > 0 ? std::atoi(scaled) : 30);
  if (options.timeout.count() == 0) options.timeout = waits;
  if (options.initTimeout.count() == 0) options.initTimeout = waits;
  if (limit < waits + std::chrono::seconds(60)) limit = waits + std::chrono::seconds(60);
  loom::UniqueId id = givenId != nullptr ? *givenId : loom::UniqueId::create();
  std::vector<RankResult> results(static_cast<size_t>(n));
  std::vector<loom::Communicator*> live(static_cast<size_t>(n), nullptr);
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        loom::Options mine = options;
        if (perRankOptions()) perRankOptions()(r, mine);
        loom::Communicator comm(r, n, id, mine);
        {
          std::lock_guard<std::mutex> lock(mu);
          live[static_cast<size_t>(r)] = &comm;
        }
        try {
          fn(comm);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          live[static_cast<size_t>(r)] = nullptr;
          throw;
        }
        std::lock_guard<std::mutex> lock(mu);
        live[static_cast<size_t>(r)] = nullptr;
      } catch (const std::exception& e) {
        results[static_cast<size_t>(r)].error = e.what();
      }
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, limit, [&] { return finished == n; })) {
      ADD_FAILURE() << "ranks did not finish within " << limit.count() << " s: aborting them";
      for (auto* c : live)
        if (c != nullptr) c->abort();
    }
  }
  for (auto& t : threads) t.join();
  return results;
}

/// Runs and expects every rank to succeed.
inline void runOk(int n, const std::function<void(loom::Communicator&)>& fn, loom::Options options = {}) {
  auto results = runRanks(n, fn, options);
  for (int r = 0; r < n; ++r) EXPECT_EQ(results[static_cast<size_t>(r)].error, "") << "rank " << r;
}

/// A byte that depends on sender, receiver, message number and index: any misplaced byte shows.
inline uint8_t pattern(int src, int dst, int msg, size_t i) {
  return static_cast<uint8_t>((src * 131 + dst * 31 + msg * 7 + i * 13 + (i >> 8) * 3) & 0xff);
}

}  // namespace loomtest
