// A job that needs more file descriptors than the soft limit allows: the link table raises the
// soft limit toward the hard one before it connects; where it may not (LOOM_RAISE_FD_LIMIT=0),
// every rank fails at init with an error naming the limit, not EMFILE inside a handshake. Links
// made on first use (the default) need few; a full mesh (LOOM_CONNECT=eager) needs one per peer.
#include "core/descriptors.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>

#include "bootstrap/launcher_env.hpp"
#include "bootstrap/rendezvous.hpp"
#include "common/env_guard.hpp"
#include "common/ranks.hpp"
#include "core/progress_engine.hpp"
#include "net/socket.hpp"

namespace {

constexpr int kRanks = 8;
constexpr int kSockets = 16;  // per peer (the most): 8 ranks x 7 peers x 16 = 896 sockets in this process

/// Sets the soft descriptor limit for a scope, and restores it.
class SoftLimit {
 public:
  explicit SoftLimit(rlim_t soft) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit l = saved_;
    l.rlim_cur = soft;
    setrlimit(RLIMIT_NOFILE, &l);
  }
  ~SoftLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }
  static rlim_t soft() {
    rlimit l{};
    getrlimit(RLIMIT_NOFILE, &l);
    return l.rlim_cur;
  }
  static rlim_t hard() {
    rlimit l{};
    getrlimit(RLIMIT_NOFILE, &l);
    return l.rlim_max;
  }

 private:
  rlimit saved_{};
};

loom::Options manySockets() {
  loom::Options o;
  o.socketsPerPeer = kSockets;
  return o;
}

TEST(Descriptors, TheSoftLimitIsRaisedForTheLinks) {
  loomtest::TransportSetup tcp("tcp");
  loomtest::EnvGuard eager("LOOM_CONNECT", "eager");  // a full mesh at init
  const rlim_t low = loom::openDescriptors() + 80;
  if (SoftLimit::hard() != RLIM_INFINITY && SoftLimit::hard() < low + 2000)
    GTEST_SKIP() << "the hard descriptor limit (ulimit -Hn) is " << SoftLimit::hard()
                 << ", too low to raise the soft one past " << low + 2000
                 << ": run the tests where the hard limit is higher (root may raise it: ulimit -Hn 65536)";
  SoftLimit limit(low);
  loomtest::runOk(
      kRanks,
      [](loom::Communicator& c) {
        uint64_t one = 1, sum = 0;
        c.allReduce(&one, &sum, 1, loom::DataType::Uint64, loom::ReduceOp::Sum);
        EXPECT_EQ(sum, static_cast<uint64_t>(kRanks));
      },
      manySockets());
  EXPECT_GT(SoftLimit::soft(), low + kRanks * (kRanks - 1) * kSockets);
}

TEST(Descriptors, ALimitThatMayNotBeRaisedIsAClearErrorOnEveryRank) {
  loomtest::TransportSetup tcp("tcp");
  loomtest::EnvGuard eager("LOOM_CONNECT", "eager");  // a full mesh at init
  loomtest::EnvGuard noRaise("LOOM_RAISE_FD_LIMIT", "0");
  SoftLimit limit(loom::openDescriptors() + 80);  // below one rank's 112 sockets
  auto results = loomtest::runRanks(
      kRanks, [](loom::Communicator&) {}, manySockets());
  for (int r = 0; r < kRanks; ++r) {
    const std::string& e = results[static_cast<size_t>(r)].error;
    EXPECT_NE(e.find("cannot link 7 peers"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("ulimit -n"), std::string::npos) << "rank " << r << ": " << e;
    EXPECT_NE(e.find("LOOM_RAISE_FD_LIMIT=0"), std::string::npos) << "rank " << r << ": " << e;
  }
}

// A progress engine (each communicator makes two) that finds no descriptor left says so, with the
// limit and what to do, and keeps none of those it made: with none free, and with one (its epoll
// made, its eventfd not).
TEST(Descriptors, AnEngineThatFindsNoDescriptorSaysWhatToDo) {
  auto lowestFree = [] {
    const int fd = ::dup(0);
    ::close(fd);
    return fd;
  };
  const int lowest = lowestFree();
  for (int room : {0, 1}) {
    std::string error;
    {
      SoftLimit limit(static_cast<rlim_t>(lowest + room));
      try {
        loom::ProgressEngine engine(3);
      } catch (const loom::Error& e) {
        error = e.what();
      }
    }
    EXPECT_NE(error.find("cannot make a progress engine (epoll, eventfd): "), std::string::npos) << error;
    EXPECT_NE(error.find("as many descriptors as its soft limit allows (" + std::to_string(lowest + room) +
                         "); raise the limit (ulimit -n)"),
              std::string::npos)
        << error;
    EXPECT_EQ(lowestFree(), lowest) << "room for " << room;
  }
}

// Rank 0 of a launched job serves the rendezvous store, which holds a socket per rank for the
// job's life: it makes room for them when it starts the store.
TEST(Descriptors, TheStoresHostMakesRoomForEveryRank) {
  const rlim_t low = loom::openDescriptors() + 80;
  if (SoftLimit::hard() != RLIM_INFINITY && SoftLimit::hard() < low + 2000)
    GTEST_SKIP() << "the hard descriptor limit (ulimit -Hn) is " << SoftLimit::hard()
                 << ", too low to raise the soft one past " << low + 2000
                 << ": run the tests where the hard limit is higher (root may raise it: ulimit -Hn 65536)";
  // A free port: bind one, close it, let the store take it.
  int err = 0;
  loom::Socket probe = loom::listenOn(loom::SockAddr::resolve("127.0.0.1", 0).front(), 4, &err);
  ASSERT_TRUE(probe.valid()) << err;
  const int port = loom::localAddress(probe.fd()).port();
  probe.reset();
  SoftLimit limit(low);
  loom::LaunchInfo launch;
  launch.launcher = "explicit";
  launch.rank = 0;
  launch.size = 1000;
  launch.masterAddr = "127.0.0.1";
  launch.masterPort = port;
  launch.jobKeySeed = "descriptors-test";
  auto access = loom::connectFromLaunch(launch, loom::Deadline(std::chrono::seconds(10)), std::chrono::seconds(10));
  EXPECT_GE(SoftLimit::soft(), low + 1000);
}

}  // namespace
