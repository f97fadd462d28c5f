// Across nodes: virtual clusters of network namespaces (tools/vcluster), each "node" with its own
// network, IPC namespace and /dev/shm, joined by a bridge. Every test makes its own cluster and
// removes it when it ends, passed or failed (Cluster's destructor; vcluster cleans up after a
// killed job too). Where the machine forbids namespaces, every test is skipped saying so.
//
// What runs on the nodes is net_worker (every collective checked against the reference), the
// all_reduce_perf benchmark, loom-info, and the real mpirun (its remote daemons started through
// `vcluster exec`).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Env = std::map<std::string, std::string>;

std::string path(const char* var) {
  const char* v = std::getenv(var);
  return v != nullptr ? v : "";
}

struct Result {
  int code = -1;
  std::string out;
};

// Runs argv with extra environment, output captured; killed (with its process group) after
// `limit` seconds, or after `interruptAfterMs` with SIGINT when that is set.
Result runCmd(const std::vector<std::string>& argv, const Env& env, int limit, int interruptAfterMs = -1) {
  char tmpl[] = "/tmp/loom-net-XXXXXX";
  int fd = mkstemp(tmpl);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fd);
  setpgid(pid, pid);
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  bool interrupted = false;
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    const auto elapsed = std::chrono::steady_clock::now() - t0;
    if (interruptAfterMs >= 0 && !interrupted && elapsed > std::chrono::milliseconds(interruptAfterMs)) {
      kill(pid, SIGINT);  // the launcher only, as a terminal's Ctrl-C reaches the foreground command
      interrupted = true;
    }
    if (elapsed > std::chrono::seconds(limit)) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << argv[0] << " " << (argv.size() > 1 ? argv[1] : "") << " did not finish within " << limit << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Result r;
  std::ifstream in(tmpl);
  std::stringstream ss;
  ss << in.rdbuf();
  r.out = ss.str();
  unlink(tmpl);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

Result vcluster(std::vector<std::string> args, const Env& env = {}, int limit = 300) {
  args.insert(args.begin(), path("VCLUSTER"));
  return runCmd(args, env, limit);
}

// Why namespaces cannot be used here ("" when they can), asked once.
const std::string& whyNoNamespaces() {
  static const std::string why = [] {
    if (geteuid() != 0) return std::string("not root");
    Result r = vcluster({"check"}, {}, 30);
    return r.code == 0 ? std::string() : r.out;
  }();
  return why;
}

#define SKIP_WITHOUT_NAMESPACES()                                                                    \
  do {                                                                                               \
    if (!whyNoNamespaces().empty())                                                                  \
      GTEST_SKIP() << "network namespaces are not available on this machine: " << whyNoNamespaces(); \
  } while (0)

// Names of the namespaces and links that exist now, for the leak checks.
std::string namespacesAndLinks() {
  Result ns = runCmd({"ip", "netns", "list"}, {}, 10);
  Result links = runCmd({"ip", "-o", "link", "show"}, {}, 10);
  return ns.out + links.out;
}

bool leftBehind(const std::string& name) {
  const std::string all = namespacesAndLinks();
  return all.find(name + "-n") != std::string::npos || all.find(name + "-br") != std::string::npos;
}

// A cluster for one test, removed when the test ends however it ends.
class Cluster {
 public:
  Cluster(int nodes, std::vector<std::string> extra = {}) : name_(nextName()) {
    std::vector<std::string> args = {"create", "--name", name_, "--nodes", std::to_string(nodes)};
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = vcluster(args);
    ok_ = r.code == 0;
    EXPECT_TRUE(ok_) << r.out;
  }
  ~Cluster() {
    vcluster({"destroy", "--name", name_});
    EXPECT_FALSE(leftBehind(name_)) << "cluster " << name_ << " left namespaces or links behind";
  }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& name() const { return name_; }

  /// `vcluster run` with ranks per node ("2" or "2,1,3") of argv; fails the test unless it exits 0.
  Result run(const std::string& ranks, const std::vector<std::string>& argv, const Env& env = {}, int limit = 300) {
    std::vector<std::string> args = {
        "run", "--name", name_, "--ranks-per-node", ranks, "--timeout", std::to_string(limit - 10), "--"};
    args.insert(args.end(), argv.begin(), argv.end());
    Env e = env;
    e.emplace("LOOM_TIMEOUT", "60");
    e.emplace("LOOM_INIT_TIMEOUT", "60");
    return vcluster(args, e, limit);
  }

 private:
  static std::string nextName() {
    static int k = 0;
    return "t" + std::to_string(getpid() % 1000) + std::to_string(k++ % 100);  // at most 6 characters
  }
  std::string name_;
  bool ok_ = false;
};

int countOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

// ---- Correctness across nodes: every collective, datatype, op and placement. ----

// Layout ("2x3": 2 nodes of 3 ranks; "2,1,3": uneven) and forced algorithms ("" = the model's).
using Layout = std::tuple<const char*, const char*>;
class NetMatrix : public ::testing::TestWithParam<Layout> {};

TEST_P(NetMatrix, EveryCollectiveTypeOpAndPlacement) {
  SKIP_WITHOUT_NAMESPACES();
  const std::string layout = std::get<0>(GetParam());
  std::string ranks;
  int nodes = 0;
  if (layout.find('x') != std::string::npos) {
    nodes = std::stoi(layout.substr(0, layout.find('x')));
    ranks = layout.substr(layout.find('x') + 1);
  } else {
    ranks = layout;
    nodes = countOf(layout, ",") + 1;
  }
  Cluster cl(nodes);
  ASSERT_TRUE(cl.ok());
  Env env;
  if (*std::get<1>(GetParam()) != '\0') env["LOOM_ALGO"] = std::get<1>(GetParam());
  Result r = cl.run(ranks, {path("NET_WORKER"), "matrix"}, env);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("net_worker matrix: OK"), std::string::npos) << r.out;
}

std::string layoutName(const ::testing::TestParamInfo<Layout>& info) {
  std::string s =
      std::string(std::get<0>(info.param)) + "_" + (*std::get<1>(info.param) ? std::get<1>(info.param) : "auto");
  for (auto& ch : s)
    if (ch == ',' || ch == '-') ch = '_';
  return s;
}

// 2 to 4 nodes of 1 to 3 ranks, and uneven nodes, with the model's choice ...
INSTANTIATE_TEST_SUITE_P(Layouts, NetMatrix,
                         ::testing::Combine(::testing::Values("2x1", "2x2", "2x3", "3x1", "3x2", "4x1", "4x3", "2,1,3"),
                                            ::testing::Values("")),
                         layoutName);
// ... and every algorithm forced, on a regular and an uneven layout.
INSTANTIATE_TEST_SUITE_P(Algorithms, NetMatrix,
                         ::testing::Combine(::testing::Values("3x2", "2,1,3"),
                                            ::testing::Values("ring", "rd,tree", "dbtree,chain", "hier")),
                         layoutName);

TEST(Net, LargeCountsOnEvenAndUnevenNodes) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(3);
  ASSERT_TRUE(cl.ok());
  // Uneven nodes run the leaders' node-aware all-reduce, even ones its 2D form.
  for (const char* ranks : {"2,1,3", "2"})
    for (const char* algo : {"", "ring", "hier"}) {
      Result r = cl.run(ranks, {path("NET_WORKER"), "large"}, *algo ? Env{{"LOOM_ALGO", algo}} : Env{});
      EXPECT_EQ(r.code, 0) << ranks << " ranks per node, LOOM_ALGO=" << algo << "\n" << r.out;
    }
}

// ---- Transports and interfaces. ----

TEST(Net, SharedMemoryWithinANodeAndTcpBetweenNodes) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(3);
  ASSERT_TRUE(cl.ok());
  for (const char* ranks : {"2", "3,1,2"}) {
    Result r = cl.run(ranks, {path("NET_WORKER"), "links"});
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("nodes 3"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("via eth0 198.18.0."), std::string::npos) << r.out;
  }
}

TEST(Net, SocketIfnameIsHonoured) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(2, {"--links", "2"});
  ASSERT_TRUE(cl.ok());
  for (const char* iface : {"eth1", "eth0"}) {
    Result r = cl.run("1", {path("NET_WORKER"), "links"}, {{"LOOM_SOCKET_IFNAME", iface}});
    EXPECT_EQ(r.code, 0) << r.out;
    const std::string subnet = std::string(iface) == "eth1" ? "198.18.1." : "198.18.0.";
    EXPECT_NE(r.out.find(std::string("via ") + iface + " " + subnet), std::string::npos) << r.out;
  }
}

// With two interfaces and nothing narrowing the choice, each pair's sockets are split over both,
// and a large message crosses both links (each carries about half of it).
TEST(Net, SocketsAreStripedOverEveryInterface) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(2, {"--links", "2"});
  ASSERT_TRUE(cl.ok());
  Result r = cl.run("1", {path("NET_WORKER"), "links"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("via eth0 198.18.0.1 -> 198.18.0.2:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", eth1 198.18.1.1 -> 198.18.1.2:"), std::string::npos) << r.out;
  auto sent = [&](const char* dev) {
    Result s = vcluster(
        {"exec", "--name", cl.name(), "0", "--", "cat", std::string("/sys/class/net/") + dev + "/statistics/tx_bytes"});
    return std::stoll(s.out.empty() ? "0" : s.out);
  };
  const long long eth0 = sent("eth0"), eth1 = sent("eth1");
  r = cl.run("1", {path("ALL_REDUCE_PERF"), "-b", "64M", "-e", "64M", "-n", "2", "-w", "0", "-c", "0"});
  EXPECT_EQ(r.code, 0) << r.out;
  // Each rank sends 64 MiB per all-reduce of 2 ranks (half in each phase), 2 runs and 2 placements.
  EXPECT_GT(sent("eth0") - eth0, 64LL << 20) << r.out;
  EXPECT_GT(sent("eth1") - eth1, 64LL << 20) << r.out;
}

// ---- Node-aware algorithms. ----

TEST(Net, HierarchicalAllReduceIsChosenAcrossNodesOfSeveralRanks) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(2);
  ASSERT_TRUE(cl.ok());
  // With the default network figures (40 us a message) the node-aware all-reduce crosses the
  // network fewer times; one rank per node has nothing to gain from it.
  Env untuned{{"LOOM_TUNE", "0"}};
  Result r = cl.run("2", {path("NET_WORKER"), "algo", "all_reduce", "1024", "hier"}, untuned);
  EXPECT_EQ(r.code, 0) << r.out;
  r = cl.run("1", {path("NET_WORKER"), "algo", "all_reduce", "1024", "rd"}, untuned);
  EXPECT_EQ(r.code, 0) << r.out;
}

// The data-parallel example across two nodes of two ranks (shared memory within, TCP between):
// the loss printed once per epoch, by rank 0; the same weights on all four ranks.
TEST(Net, DdpExampleTrainsAcrossNodesWithIdenticalReplicas) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(2);
  ASSERT_TRUE(cl.ok());
  Result r = cl.run("2", {path("DDP_EXAMPLE"), "--epochs", "3", "--checkpoint", "/tmp/loom-ddp-net.bin"});
  EXPECT_EQ(r.code, 0) << r.out;
  size_t epochs = 0, sums = 0;
  std::string first;
  bool same = true;
  for (size_t at = r.out.find("epoch "); at != std::string::npos; at = r.out.find("epoch ", at + 1)) ++epochs;
  for (size_t at = r.out.find("weights checksum "); at != std::string::npos;
       at = r.out.find("weights checksum ", at + 1)) {
    const std::string sum = r.out.substr(at + 17, 16);
    if (first.empty()) first = sum;
    same = same && sum == first;
    ++sums;
  }
  EXPECT_EQ(epochs, 3u) << r.out;
  EXPECT_EQ(sums, 4u) << r.out;
  EXPECT_TRUE(same) << "replicas differ:\n" << r.out;
  std::remove("/tmp/loom-ddp-net.bin");
}

// ---- Launchers and the benchmark across nodes. ----

TEST(Net, AllReducePerfAcrossNodesWithLoomrun) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(3, {"--rate", "2gbit"});
  ASSERT_TRUE(cl.ok());
  Result r = cl.run("2", {path("ALL_REDUCE_PERF"), "-b", "8", "-e", "4M", "-f", "8", "-c", "1", "-n", "3", "-w", "1"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Out of bounds values : 0 OK"), std::string::npos) << r.out;
  // The table's last column names the algorithm that ran: the node-aware one, at every size.
  EXPECT_NE(r.out.find(" hier\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" ring\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" rd\n"), std::string::npos) << r.out;
  // The summary knows the link rate vcluster gave (LOOM_LINK_RATE).
  EXPECT_NE(r.out.find("link 2.000 Gbit/s"), std::string::npos) << r.out;
}

// InfiniBand between nodes, through the tests' verbs provider (its queue pairs reach each other
// over the cluster's network; shared memory within a node): every collective checked, on even
// and uneven nodes, and all_reduce_perf with nothing wrong. Through the provider this is a
// functional check, not a speed figure.
TEST(Net, IbBetweenNodesThroughTheTestVerbsProvider) {
  SKIP_WITHOUT_NAMESPACES();
  if (path("VERBS_PROVIDER").empty())
    GTEST_SKIP() << "built without the verbs headers (libibverbs-dev), so without the tests' verbs provider";
  Cluster cl(4);
  ASSERT_TRUE(cl.ok());
  char dir[] = "/tmp/loom-net-verbs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const Env env = {{"LOOM_IBVERBS_LIBRARY", path("VERBS_PROVIDER")},
                   {"LOOM_TEST_VERBS_DIR", dir},
                   {"LOOM_TRANSPORT", "shm,ib"},
                   {"LOOM_DEBUG", "INFO"}};
  for (const char* ranks : {"1", "2,1,1,2"}) {
    Result r = cl.run(ranks, {path("NET_WORKER"), "matrix"}, env);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("net_worker matrix: OK"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("ib over mlx5_0:1 (InfiniBand"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("tcp to rank"), std::string::npos) << "a TCP link where ib was asked for\n" << r.out;
  }
  Result r = cl.run(
      "1", {path("ALL_REDUCE_PERF"), "-b", "8", "-e", "4M", "-f", "8", "-c", "1", "-n", "3", "-w", "1"},
      {{"LOOM_IBVERBS_LIBRARY", path("VERBS_PROVIDER")}, {"LOOM_TEST_VERBS_DIR", dir}, {"LOOM_TRANSPORT", "ib"}});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Out of bounds values : 0 OK"), std::string::npos) << r.out;
  runCmd({"rm", "-rf", dir}, {}, 10);
}

TEST(Net, AllReducePerfAcrossNodesWithMpirun) {
  SKIP_WITHOUT_NAMESPACES();
  if (path("MPIRUN").empty() || access(path("MPIRUN").c_str(), X_OK) != 0)
    GTEST_SKIP() << "Open MPI's mpirun is not installed (tools/install-deps.sh installs it)";
  Cluster cl(2);
  ASSERT_TRUE(cl.ok());
  // A host file naming the nodes; mpirun runs on node 0 and starts its daemons through vcluster.
  char hosts[] = "/tmp/loom-net-hosts-XXXXXX";
  int fd = mkstemp(hosts);
  const std::string text = "198.18.0.1 slots=2\n198.18.0.2 slots=2\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  Env env{{"VCLUSTER", path("VCLUSTER")}, {"VCLUSTER_NAME", cl.name()}};
  Result r = vcluster({"exec",
                       "--name",
                       cl.name(),
                       "0",
                       "--",
                       path("MPIRUN"),
                       "--allow-run-as-root",
                       "--oversubscribe",
                       "--bind-to",
                       "none",
                       "--mca",
                       "mpi_yield_when_idle",
                       "1",
                       "--mca",
                       "plm_rsh_agent",
                       path("VCLUSTER_RSH"),
                       "--mca",
                       "plm_rsh_no_tree_spawn",
                       "1",
                       "--mca",
                       "oob_tcp_if_include",
                       "eth0",
                       "--hostfile",
                       hosts,
                       "-np",
                       "4",
                       path("ALL_REDUCE_PERF"),
                       "-b",
                       "8",
                       "-e",
                       "1M",
                       "-f",
                       "32",
                       "-c",
                       "1",
                       "-n",
                       "3",
                       "-w",
                       "1"},
                      env, 240);
  unlink(hosts);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("4 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Out of bounds values : 0 OK"), std::string::npos) << r.out;
}

// ---- vcluster itself: failures, timeouts and Ctrl-C leave nothing behind. ----

TEST(Vcluster, AFailingJobReturnsItsStatusAndLeavesNothing) {
  SKIP_WITHOUT_NAMESPACES();
  const std::string name = "ntf" + std::to_string(getpid() % 1000);
  Result r = vcluster({"run", "--name", name, "--nodes", "2", "--", "sh", "-c", "exit 3"}, {}, 60);
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_FALSE(leftBehind(name));
}

TEST(Vcluster, AJobPastItsTimeoutIsStoppedAndLeavesNothing) {
  SKIP_WITHOUT_NAMESPACES();
  const std::string name = "ntt" + std::to_string(getpid() % 1000);
  const auto t0 = std::chrono::steady_clock::now();
  Result r = vcluster({"run", "--name", name, "--nodes", "2", "--timeout", "2", "--", "sleep", "600"}, {}, 60);
  EXPECT_EQ(r.code, 124) << r.out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_FALSE(leftBehind(name));
}

TEST(Vcluster, CtrlCStopsTheJobAndLeavesNothing) {
  SKIP_WITHOUT_NAMESPACES();
  const std::string name = "ntc" + std::to_string(getpid() % 1000);
  Result r = runCmd({path("VCLUSTER"), "run", "--name", name, "--nodes", "3", "--", "sleep", "600"}, {}, 60, 1500);
  EXPECT_EQ(r.code, 130) << r.out;
  EXPECT_FALSE(leftBehind(name));
}

TEST(Vcluster, NodesHaveTheirOwnSharedMemoryAndAddresses) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(2, {"--links", "2", "--rate", "100mbit"});
  ASSERT_TRUE(cl.ok());
  // A file made in node 0's /dev/shm is not in node 1's, nor in the machine's.
  Result w = vcluster({"exec", "--name", cl.name(), "0", "--", "sh", "-c", "echo x > /dev/shm/" + cl.name()});
  EXPECT_EQ(w.code, 0) << w.out;
  Result r0 = vcluster({"exec", "--name", cl.name(), "0", "--", "ls", "/dev/shm"});
  Result r1 = vcluster({"exec", "--name", cl.name(), "1", "--", "ls", "/dev/shm"});
  EXPECT_NE(r0.out.find(cl.name()), std::string::npos) << r0.out;
  EXPECT_EQ(r1.out.find(cl.name()), std::string::npos) << r1.out;
  EXPECT_NE(access(("/dev/shm/" + cl.name()).c_str(), F_OK), 0);
  Result a = vcluster({"exec", "--name", cl.name(), "1", "--", "ip", "-o", "addr", "show"});
  EXPECT_NE(a.out.find("198.18.0.2/24"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("198.18.1.2/24"), std::string::npos) << a.out;
  Result q = vcluster({"exec", "--name", cl.name(), "1", "--", "tc", "qdisc", "show", "dev", "eth1"});
  EXPECT_NE(q.out.find("tbf"), std::string::npos) << q.out;
}

// A node whose network vanishes without a word (no reset, no end of file: its link goes down)
// is named by the heartbeat on its links within seconds, not at the collective's deadline.
TEST(Net, AVanishedNodeIsNamedByTheHeartbeat) {
  SKIP_WITHOUT_NAMESPACES();
  Cluster cl(2);
  ASSERT_TRUE(cl.ok());
  std::vector<std::string> args = {path("VCLUSTER"),   "run", "--name", cl.name(), "--timeout", "100", "--",
                                   path("NET_WORKER"), "loop"};
  // The job in the background; the link of node 1 goes down once it loops.
  char tmpl[] = "/tmp/loom-net-XXXXXX";
  int fd = mkstemp(tmpl);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("LOOM_TIMEOUT", "90", 1);
    setenv("LOOM_TCP_KEEPALIVE_S", "2", 1);
    std::vector<char*> a;
    for (auto& s : args) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  close(fd);
  auto output = [&] {
    std::ifstream in(tmpl);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  for (int i = 0; i < 200 && output().find("rank 0 looping") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Result down = vcluster({"exec", "--name", cl.name(), "1", "--", "ip", "link", "set", "eth0", "down"});
  EXPECT_EQ(down.code, 0) << down.out;
  int status = 0;
  for (int i = 0; i < 600 && waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  const std::string out = output();
  unlink(tmpl);
  const size_t at = out.find("rank 0 failed ");
  ASSERT_NE(at, std::string::npos) << out;
  const double after = std::atof(out.c_str() + at + 14);
  EXPECT_LT(after, 30.0) << out;  // the heartbeat's few seconds, not the 90 s deadline
  EXPECT_NE(out.find("rank 1", at), std::string::npos) << out;
  std::printf("[ fault    ] link down: %s", out.substr(at, out.find('\n', at) - at + 1).c_str());
}

// ---- Reproducible mode (docs/reproducibility.md) across real node layouts. ----

namespace {

// Size -> checksum of the result, from reproducible_check's output; fails the test when the ranks
// of a run disagree or the run fails.
std::map<std::string, std::string> checksumsOf(const Result& r) {
  EXPECT_EQ(r.code, 0) << r.out;
  std::map<std::string, std::string> sums;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (!w.empty() && w[0].front() == '[') w.erase(w.begin());
    if (w.size() != 6 || w[0].find_first_not_of("0123456789") != std::string::npos) continue;
    EXPECT_EQ(w[4], "same") << line;
    sums[w[0]] = w[2];
  }
  EXPECT_EQ(sums.size(), 5u) << r.out;
  return sums;
}

}  // namespace

// The same all-reduce (4 ranks, float32 sum of wide-ranging data, 16 B to 1 MiB) on 1 node over
// shared memory and over TCP, on 2 nodes of 2 and 4 nodes of 1, under the model's algorithm and
// forced ones: one checksum per size with LOOM_REPRODUCIBLE=1; without it, the layouts differ.
TEST(Reproducible, OneChecksumPerSizeOnEveryLayoutAndAlgorithm) {
  SKIP_WITHOUT_NAMESPACES();
  const std::vector<std::string> check = {path("REPRODUCIBLE_CHECK"), "-b", "16", "-e", "1M", "-f", "16"};
  std::vector<std::string> local = {path("LOOMRUN"), "-n", "4"};
  local.insert(local.end(), check.begin(), check.end());
  Cluster two(2), four(4);
  ASSERT_TRUE(two.ok() && four.ok());
  std::map<std::string, std::map<std::string, std::string>> on, off;  // run -> size -> checksum
  for (const char* algo : {"", "ring", "hier", "rd"}) {
    for (int mode : {1, 0}) {
      if (mode == 0 && std::string(algo) == "rd") continue;
      Env env = {{"LOOM_REPRODUCIBLE", std::to_string(mode)}, {"LOOM_ALGO", algo}};
      auto& into = mode == 1 ? on : off;
      const std::string tag = std::string("LOOM_ALGO=") + algo;
      into[tag + " 1x4 shm"] = checksumsOf(runCmd(local, env, 120));
      Env tcp = env;
      tcp["LOOM_TRANSPORT"] = "tcp";
      into[tag + " 1x4 tcp"] = checksumsOf(runCmd(local, tcp, 120));
      into[tag + " 2x2"] = checksumsOf(two.run("2", check, env, 120));
      into[tag + " 4x1"] = checksumsOf(four.run("1", check, env, 120));
    }
  }
  const auto& first = on.begin()->second;
  for (const auto& [run, sums] : on) EXPECT_EQ(sums, first) << run << " differs from " << on.begin()->first;
  int differing = 0;
  for (const auto& [run, sums] : off) differing += sums != first ? 1 : 0;
  EXPECT_GT(differing, 0) << "the default mode should differ somewhere on this data";
  std::printf("[ repro    ] %zu runs with the mode: one checksum per size; %d of %zu without it differ\n", on.size(),
              differing, off.size());
}
