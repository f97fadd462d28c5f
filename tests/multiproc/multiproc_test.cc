// Ranks as real processes: loomrun (the example, failure propagation, Ctrl-C), each launcher's
// environment (torchrun, Slurm with a compressed host list, Open MPI inside a Slurm allocation,
// MPICH Hydra), IPv6, and the real mpirun where Open MPI is installed. Every child has a deadline.
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
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

struct Proc {
  pid_t pid;
  std::string outFile;
};

// Starts argv with extra environment; output goes to a temporary file.
Proc start(const std::vector<std::string>& argv, const Env& env) {
  char tmpl[] = "/tmp/loom-mp-XXXXXX";
  int fd = mkstemp(tmpl);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own process group, so that finish() can stop what it started too
    dup2(fd, 1);
    dup2(fd, 2);
    for (const char* v :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
          "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "LOOM_JOB_KEY"})
      unsetenv(v);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fd);
  return Proc{pid, tmpl};
}

// Waits at most `limit` seconds; kills the process (and its process group) on expiry. Returns the exit code (128+sig).
int finish(const Proc& p, int limit, std::string* output) {
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit);
  for (;;) {
    pid_t r = waitpid(p.pid, &status, WNOHANG);
    if (r == p.pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-p.pid, SIGKILL);  // with the ranks a launcher started
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      ADD_FAILURE() << "process did not finish within " << limit << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (output != nullptr) {
    output->clear();
    if (FILE* f = std::fopen(p.outFile.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) output->append(buf, n);
      std::fclose(f);
    }
  }
  unlink(p.outFile.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A port nobody listens on now (the kernel picks it; released before use).
int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Runs n workers with per-rank environments; every one must succeed.
void runWorkers(int n, const std::function<Env(int)>& envOf) {
  std::vector<Proc> procs;
  for (int r = 0; r < n; ++r) {
    Env e = envOf(r);
    e["EXPECT_RANK"] = std::to_string(r);
    e["EXPECT_SIZE"] = std::to_string(n);
    e["LOOM_INIT_TIMEOUT"] = "30";
    e["LOOM_TIMEOUT"] = "30";
    procs.push_back(start({path("LOOM_TEST_WORKER"), "exchange"}, e));
  }
  for (int r = 0; r < n; ++r) {
    std::string out;
    EXPECT_EQ(finish(procs[r], 60, &out), 0) << "rank " << r << ":\n" << out;
    EXPECT_NE(out.find("ok"), std::string::npos) << out;
  }
}

Env torchEnv(int r, int n, const std::string& port) {
  return Env{{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(n)}, {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", port},       {"LOOM_INIT_TIMEOUT", "30"},       {"LOOM_TIMEOUT", "60"}};
}

std::set<std::string> loomSegments() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("loom-", 0) == 0) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

// Runs the "collectives" worker (all-reduce, broadcast, all-gather of 8 B to 8 MiB, checked; each
// link printed) as n processes with `extra` environment: each must pass and print all of `want`.
void runCollectives(int n, const Env& extra, const std::vector<std::string>& want) {
  const std::string port = std::to_string(freePort());
  std::vector<Proc> procs;
  for (int r = 0; r < n; ++r) {
    Env e = torchEnv(r, n, port);
    for (const auto& [k, v] : extra) e[k] = v;
    procs.push_back(start({path("LOOM_TEST_WORKER"), "collectives"}, e));
  }
  for (int r = 0; r < n; ++r) {
    std::string out;
    EXPECT_EQ(finish(procs[static_cast<size_t>(r)], 120, &out), 0) << "rank " << r << ":\n" << out;
    EXPECT_NE(out.find("of " + std::to_string(n) + " ok"), std::string::npos) << out;
    for (const auto& w : want) EXPECT_NE(out.find(w), std::string::npos) << "no \"" << w << "\":\n" << out;
  }
}

}  // namespace

// ---- Shared memory between processes. ----

// Each process maps its node's one file of segments (not one per peer), and nothing is left in
// /dev/shm.
TEST(SharedMemory, CollectivesBetweenProcessesUseSingleCopy) {
  const auto before = loomSegments();
  runCollectives(5, {}, {": shm,", "single copy (process_vm_readv)", "maps 1 shared-memory files"});
  EXPECT_EQ(loomSegments(), before);
}

// Container runtimes often forbid process_vm_readv (seccomp): the ranks find out at setup and copy
// large messages through the rings instead.
TEST(SharedMemory, ProcessVmReadvRefusedBySeccompFallsBackToTheRing) {
  runCollectives(3, {{"NO_CMA_SECCOMP", "1"}}, {"process_vm_readv refused"});
}

// Links made on first use (LOOM_CONNECT=lazy, the default above 8 ranks): none at init, the
// collectives' checks pass over those their algorithms make (cross-memory attach probed then),
// and nothing is left in /dev/shm.
TEST(SharedMemory, LinksOnFirstUseCarryTheCollectives) {
  const auto before = loomSegments();
  // The ring's all-reduce needs links (the node's direct area, which the others use, needs none).
  Env lazy;
  lazy["LOOM_CONNECT"] = "lazy";
  lazy["LOOM_ALGO"] = "allreduce:ring";
  runCollectives(3, lazy, {"shm, not linked", "link after: rank", "single copy (process_vm_readv)"});
  EXPECT_EQ(loomSegments(), before);
}

// A /dev/shm with no room for what links made on first use back (a tmpfs of 3 MiB in a mount
// namespace of its own, 10 ranks): init fits; the first link whose ring (1 MiB) finds no room, or
// the first collective whose direct area (8 MiB) does, fails with an error naming the segment, not
// SIGBUS at the first write; loomrun ends with that failure. Needs root (mount namespaces), as CI
// has.
TEST(SharedMemory, AFullDevShmAtFirstUseIsAClearErrorNotACrash) {
  if (geteuid() != 0 || std::system("unshare --mount --propagation private true >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "skipped: gives its ranks a 3 MiB /dev/shm of their own with unshare --mount, which needs root "
                    "(CI runs as root); run the multiproc suite as root to include it";
  struct Case {
    const char* scenario;
    const char* ringBytes;
    const char* directBytes;
    const char* said;
  };
  for (const Case& k :
       {Case{"fan", "1048576", "65536", "cannot back the ring of 1048576 bytes this rank writes in rank "},
        Case{"collectives", "65536", "8388608", "cannot back this rank's shared-memory direct area"}}) {
    const std::string cmd = "mount -t tmpfs -o size=3m,mode=1777 tmpfs /dev/shm && exec '" + path("LOOMRUN") +
                            "' -n 10 '" + path("LOOM_TEST_WORKER") + "' " + k.scenario;
    Env env;
    env["LOOM_SHM_RING_BYTES"] = k.ringBytes;
    env["LOOM_SHM_DIRECT_BYTES"] = k.directBytes;
    env["LOOM_CONNECT"] = "lazy";
    env["LOOM_TIMEOUT"] = "30";
    std::string out;
    const int rc =
        finish(start({"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", cmd}, env), 90, &out);
    EXPECT_EQ(rc, 1) << k.scenario << ":\n" << out;
    EXPECT_NE(out.find(k.said), std::string::npos) << k.scenario << ":\n" << out;
    EXPECT_NE(out.find("(a full /dev/shm?"), std::string::npos) << k.scenario << ":\n" << out;
    EXPECT_EQ(out.find("Bus error"), std::string::npos) << k.scenario << ":\n" << out;
    EXPECT_EQ(out.find("SIGBUS"), std::string::npos) << k.scenario << ":\n" << out;
  }
}

// A rank killed with SIGKILL in the middle of shared-memory all-reduces: the others fail within
// seconds with an error naming it, and /dev/shm holds no segment of the job afterwards; with the
// links made at init and on first use.
class SharedMemoryKill : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Links, SharedMemoryKill, ::testing::Values("eager", "lazy"));
TEST_P(SharedMemoryKill, SigkillInMidAllReduceIsNamedWithinSecondsAndLeavesNothing) {
  const std::string port = std::to_string(freePort());
  const auto before = loomSegments();
  const int n = 4, victim = 2;
  std::vector<Proc> procs;
  for (int r = 0; r < n; ++r) {
    Env e = torchEnv(r, n, port);
    e["LOOM_CONNECT"] = GetParam();
    procs.push_back(start({path("LOOM_TEST_WORKER"), "loop"}, e));
  }
  // Let them loop for a moment (every rank prints "looping" after a few all-reduces).
  bool looping = false;
  for (int i = 0; i < 300 && !looping; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    FILE* f = std::fopen(procs[victim].outFile.c_str(), "r");
    if (f != nullptr) {
      char buf[256] = {0};
      looping = std::fread(buf, 1, sizeof(buf) - 1, f) > 0 && std::string(buf).find("looping") != std::string::npos;
      std::fclose(f);
    }
  }
  ASSERT_TRUE(looping) << "the ranks did not start looping";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto killedAt = std::chrono::steady_clock::now();
  kill(procs[victim].pid, SIGKILL);
  for (int r = 0; r < n; ++r) {
    std::string out;
    int rc = finish(procs[r], 30, &out);
    if (r == victim) {
      EXPECT_EQ(rc, 128 + SIGKILL);
      continue;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count();
    EXPECT_EQ(rc, 1) << out;
    EXPECT_LT(secs, 10.0) << "rank " << r << " took " << secs << " s to notice:\n" << out;
    // Each survivor names the dead rank: directly, or through the first failure it heard of.
    EXPECT_NE(out.find("rank 2"), std::string::npos) << out;
    EXPECT_NE(out.find("failed:"), std::string::npos) << out;
  }
  EXPECT_EQ(loomSegments(), before);
}

// A rank that exits after its last collective without destroying its communicator (a training
// script's os._exit) leaves the others working: nothing waited on it. Their next collective, which
// needs it, fails at once naming it, whichever way it goes (the node's arena, or the links: ring).
TEST(SharedMemory, ARankThatExitsWithoutClosingFailsOnlyWhatNeedsIt) {
  for (const char* algo : {"", "allreduce:ring"}) {
    const std::string port = std::to_string(freePort());
    const auto before = loomSegments();
    const int n = 3, gone = 0;
    std::vector<Proc> procs;
    for (int r = 0; r < n; ++r) {
      Env e = torchEnv(r, n, port);
      e["LEAVE_RANK"] = std::to_string(gone);
      if (*algo != '\0') e["LOOM_ALGO"] = algo;
      procs.push_back(start({path("LOOM_TEST_WORKER"), "leave"}, e));
    }
    for (int r = 0; r < n; ++r) {
      std::string out;
      EXPECT_EQ(finish(procs[static_cast<size_t>(r)], 60, &out), 0) << "rank " << r << ":\n" << out;
      if (r == gone) continue;
      EXPECT_NE(out.find("still ok"), std::string::npos) << out;
      EXPECT_NE(out.find("exchanged"), std::string::npos) << out;
      EXPECT_NE(out.find("all-reduce failed in"), std::string::npos) << out;
      EXPECT_NE(out.find("rank 0"), std::string::npos) << out;
      EXPECT_NE(out.find("died"), std::string::npos) << out;
    }
    EXPECT_EQ(loomSegments(), before);
  }
}

// Two "nodes" of two processes each (LOOM_HOST_ID, as separate hosts or containers would have):
// shared memory within each, TCP across, as loom-info --links reports.
TEST(SharedMemory, LoomInfoReportsTheTransportOfEveryPair) {
  const std::string port = std::to_string(freePort());
  std::vector<Proc> procs;
  for (int r = 0; r < 4; ++r) {
    Env e = torchEnv(r, 4, port);
    e["LOOM_HOST_ID"] = r < 2 ? "node-a" : "node-b";
    procs.push_back(start({path("LOOM_INFO"), "--links"}, e));
  }
  for (int r = 0; r < 4; ++r) {
    std::string out;
    EXPECT_EQ(finish(procs[r], 60, &out), 0) << "rank " << r << ":\n" << out;
    if (r != 0) continue;
    EXPECT_NE(out.find("transports of 4 ranks on 2 node(s)"), std::string::npos) << out;
    EXPECT_NE(out.find("   0 n0    -  shm  tcp  tcp"), std::string::npos) << out;
    EXPECT_NE(out.find("   3 n1  tcp  tcp  shm    -"), std::string::npos) << out;
  }
}

// Progress threads run where LOOM_PROGRESS_CPUS says (by default: the NUMA nodes of the CPUs the
// rank is bound to; this machine has one node, so only the explicit list shows a difference).
TEST(SharedMemory, ProgressThreadsAreBoundAsConfigured) {
  const std::string port = std::to_string(freePort());
  std::vector<Proc> procs;
  for (int r = 0; r < 2; ++r) {
    Env e = torchEnv(r, 2, port);
    e["LOOM_PROGRESS_CPUS"] = "0";
    procs.push_back(start({path("LOOM_TEST_WORKER"), "threads"}, e));
  }
  for (int r = 0; r < 2; ++r) {
    std::string out;
    EXPECT_EQ(finish(procs[r], 60, &out), 0) << out;
    int progress = 0;
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("thread ", 0) != 0 || line.find("(main)") != std::string::npos) continue;
      // Every thread but main is a progress thread (receive, send, shared memory) or the op queue's.
      if (line.size() > 6 && line.compare(line.size() - 7, 7, " cpus 0") == 0) ++progress;
    }
    EXPECT_GE(progress, 3) << out;
  }
}

TEST(Loomrun, RunsTheExample) {
  std::string out;
  int rc = finish(start({path("LOOMRUN"), "-n", "4", path("LOOM_EXAMPLE")}, {}), 60, &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[1] rank 1 received tensor [1, 1, 1, 1, 1, 1, 1, 1, 1, 1] from rank 0"), std::string::npos)
      << out;
}

// Host collectives leave CUDA alone: no rank so much as maps the CUDA driver's library (the
// dynamic loader says what it opens: LD_DEBUG=files), let alone makes a context on a GPU, though
// Loom is built with CUDA and a libcuda.so.1 is on the library path (the toolkit's stub, where a GPU
// machine has its driver's). loom-info, which starts CUDA, opens it: the stub is where CUDA looks.
TEST(CudaIpc, HostCollectivesNeverStartCuda) {
  const std::string stub = path("LOOM_CUDA_STUB");
  if (stub.empty()) GTEST_SKIP() << "Loom is built without CUDA, or the toolkit has no lib64/stubs/libcuda.so";
  char dir[] = "/tmp/loom-cuda-stub-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string lib = std::string(dir) + "/libcuda.so.1";
  ASSERT_EQ(symlink(stub.c_str(), lib.c_str()), 0) << std::strerror(errno);
  const Env env{{"LD_LIBRARY_PATH", dir}, {"LD_DEBUG", "files"}};
  std::string out;
  EXPECT_EQ(finish(start({path("LOOM_INFO")}, env), 60, &out), 0) << out;
  const std::string opened = "opening file=" + lib;  // what the loader says when it maps the library
  EXPECT_NE(out.find(opened), std::string::npos) << "CUDA did not open the stub: " << out;
  EXPECT_NE(out.find("stub library"), std::string::npos) << out;
  const std::string port = std::to_string(freePort());
  std::vector<Proc> procs;
  for (int r = 0; r < 2; ++r) {
    Env e = torchEnv(r, 2, port);
    e.insert(env.begin(), env.end());
    procs.push_back(start({path("LOOM_TEST_WORKER"), "collectives"}, e));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(finish(procs[static_cast<size_t>(r)], 120, &out), 0) << "rank " << r << ":\n" << out;
    EXPECT_NE(out.find("of 2 ok"), std::string::npos) << out;
    EXPECT_NE(out.find("file=libloom.so"), std::string::npos) << "no LD_DEBUG output: " << out;
    // (Loom asking the loader whether libcuda is already there is not an opening: RTLD_NOLOAD.)
    EXPECT_EQ(out.find(opened), std::string::npos) << "rank " << r << " opened CUDA's driver: " << out;
  }
  unlink(lib.c_str());
  rmdir(dir);
}

// Device buffers between processes through CUDA IPC, on the emulated device (memfd-backed
// "device memory", mapped by the peers through /proc as cudaIpcOpenMemHandle maps a GPU
// allocation): the collectives matrix against the reference, each peer's buffer mapped once and
// then reused, every mapping closed with the communicator.
TEST(CudaIpc, DeviceBuffersAreMappedAcrossProcesses) {
  for (int n : {2, 3}) {
    std::string out;
    int rc =
        finish(start({path("LOOMRUN"), "-n", std::to_string(n), path("LOOM_DEVICE_WORKER"), "fake"}, {}), 240, &out);
    EXPECT_EQ(rc, 0) << out;
    for (int r = 0; r < n; ++r) {
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": device worker ok"), std::string::npos) << out;
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": "), std::string::npos) << out;
    }
    EXPECT_NE(out.find("peer buffers mapped, all closed"), std::string::npos) << out;
    for (int r = 0; r < n; ++r)
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": device send/recv through CUDA IPC"), std::string::npos)
          << out;
  }
}

TEST(Loomrun, StopsTheOthersAndReturnsTheFirstFailure) {
  std::string out;
  auto t0 = std::chrono::steady_clock::now();
  int rc = finish(
      start({path("LOOMRUN"), "-n", "3", "--grace", "2", path("LOOM_TEST_WORKER"), "fail"}, {{"FAIL_RANK", "1"}}), 30,
      &out);
  EXPECT_EQ(rc, 7) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  EXPECT_NE(out.find("rank 1 exited with status 7"), std::string::npos) << out;
}

TEST(Loomrun, CtrlCStopsEveryRank) {
  Proc p = start({path("LOOMRUN"), "-n", "2", path("LOOM_TEST_WORKER"), "sleep"}, {});
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  kill(p.pid, SIGINT);
  std::string out;
  EXPECT_EQ(finish(p, 20, &out), 130) << out;
  EXPECT_NE(out.find("interrupted"), std::string::npos) << out;
}

namespace {

int countOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Whether `pid` still runs (not gone, not a zombie awaiting its reaper).
bool running(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return false;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

}  // namespace

// loomrun killed outright (SIGKILL, the OOM killer) cannot stop its ranks itself: they must not
// live on without it.
TEST(Loomrun, RanksDoNotOutliveAKilledLoomrun) {
  Proc p = start({path("LOOMRUN"), "-n", "2", path("LOOM_TEST_WORKER"), "sleep"}, {});
  std::vector<pid_t> ranks;
  for (int i = 0; i < 200 && ranks.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f(p.outFile);
    std::stringstream ss;
    ss << f.rdbuf();
    if (countOf(ss.str(), "sleeping") < 2) continue;
    FILE* list = popen(("pgrep -P " + std::to_string(p.pid)).c_str(), "r");
    char line[32];
    while (list != nullptr && std::fgets(line, sizeof line, list) != nullptr) ranks.push_back(std::atoi(line));
    if (list != nullptr) pclose(list);
  }
  ASSERT_EQ(ranks.size(), 2u);
  kill(p.pid, SIGKILL);
  finish(p, 10, nullptr);
  for (pid_t r : ranks) {
    for (int i = 0; i < 100 && running(r); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(running(r)) << "rank process " << r << " outlived loomrun";
    kill(r, SIGKILL);  // (should it have)
  }
}

// With no more ranks than CPUs, each rank runs on its own block of them (as mpirun binds);
// --bind none, or more ranks than CPUs, leaves every rank with all of them.
TEST(Loomrun, BindsEachRankToItsOwnCpus) {
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  const int cpus = CPU_COUNT(&mine);
  auto allowed = [](const std::string& out, int rank) {
    const std::string key = "[" + std::to_string(rank) + "] Cpus_allowed_list:\t";
    size_t at = out.find(key);
    if (at == std::string::npos) return std::string("?");
    return out.substr(at + key.size(), out.find('\n', at) - at - key.size());
  };
  const std::vector<std::string> grep = {"grep", "Cpus_allowed_list", "/proc/self/status"};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), path("LOOMRUN"));
    args.insert(args.end(), grep.begin(), grep.end());
    std::string out;
    EXPECT_EQ(finish(start(args, {}), 30, &out), 0) << out;
    return out;
  };
  std::string unbound = run({"-n", "1", "--bind", "none"});
  const std::string all = allowed(unbound, 0);
  if (cpus >= 2) {
    std::string out = run({"-n", "2"});
    EXPECT_NE(allowed(out, 0), allowed(out, 1)) << out;
    EXPECT_NE(allowed(out, 0), all) << out;
  }
  std::string none = run({"-n", "2", "--bind", "none"});
  EXPECT_EQ(allowed(none, 0), all) << none;
  EXPECT_EQ(allowed(none, 1), all) << none;
  std::string crowded = run({"-n", std::to_string(cpus + 1)});
  for (int r = 0; r <= cpus; ++r) EXPECT_EQ(allowed(crowded, r), all) << crowded;
  std::string out;
  EXPECT_EQ(finish(start({path("LOOMRUN"), "--bind", "socket", "true"}, {}), 30, &out), 2) << out;
  EXPECT_NE(out.find("--bind wants auto, core or none"), std::string::npos) << out;
}

TEST(Loomrun, ManyRanksAndPrefixes) {
  std::string out;
  EXPECT_EQ(finish(start({path("LOOMRUN"), "-n", "8", path("LOOM_TEST_WORKER"), "exchange"}, {}), 90, &out), 0) << out;
  for (int r = 0; r < 8; ++r)
    EXPECT_NE(out.find("[" + std::to_string(r) + "] rank " + std::to_string(r) + " of 8 ok"), std::string::npos) << out;
}

// Processes whose records go down a tree of the ranks (LOOM_RECORD_TREE=2: every rank, though
// all share the store host's machine): each one gets them from its parent in the tree (none reads
// them from the store), and the collectives' checks pass.
TEST(Loomrun, RecordsDownATreeOfProcesses) {
  std::string out;
  Env env;
  env["LOOM_RECORD_TREE"] = "2";
  env["LOOM_DEBUG"] = "INFO";
  EXPECT_EQ(finish(start({path("LOOMRUN"), "-n", "13", path("LOOM_TEST_WORKER"), "collectives"}, env), 120, &out), 0)
      << out;
  int fromParent = 0;
  for (size_t at = 0; (at = out.find("from its parent in their tree", at)) != std::string::npos; ++at) ++fromParent;
  EXPECT_EQ(fromParent, 12) << out;  // all but the root, the last one in
  for (int r = 0; r < 13; ++r) EXPECT_NE(out.find("rank " + std::to_string(r) + " of 13 ok"), std::string::npos) << r;
  EXPECT_EQ(out.find("reading them from the store"), std::string::npos) << out;
  EXPECT_EQ(out.find("could not send the records"), std::string::npos) << out;
}

TEST(LauncherEnv, TorchrunVariables) {
  const std::string port = std::to_string(freePort());
  runWorkers(3, [&](int r) {
    return Env{{"RANK", std::to_string(r)},    {"WORLD_SIZE", "3"},          {"LOCAL_RANK", std::to_string(r)},
               {"LOCAL_WORLD_SIZE", "3"},      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port},
               {"TORCHELASTIC_RUN_ID", "test"}};
  });
}

TEST(LauncherEnv, SlurmVariablesWithCompressedHostList) {
  const std::string job = std::to_string(100000 + getpid());
  runWorkers(4, [&](int r) {
    return Env{{"SLURM_PROCID", std::to_string(r)},
               {"SLURM_NTASKS", "4"},
               {"SLURM_LOCALID", std::to_string(r)},
               {"SLURM_TASKS_PER_NODE", "4"},
               {"SLURM_NODEID", "0"},
               {"SLURM_STEP_NODELIST", "127.0.0.[1-4]"},
               {"SLURM_JOB_ID", job},
               {"SLURM_STEP_ID", "0"}};
  });
}

TEST(LauncherEnv, OpenMpiInsideASlurmAllocation) {
  const std::string ns = "prterun-test-" + std::to_string(getpid()) + "@1";
  runWorkers(3, [&](int r) {
    return Env{{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
               {"OMPI_COMM_WORLD_SIZE", "3"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
               {"PMIX_NAMESPACE", ns},
               {"SLURM_PROCID", "0"},
               {"SLURM_NTASKS", "1"},
               {"SLURM_JOB_ID", "5"}};
  });
}

TEST(LauncherEnv, MpichHydraVariables) {
  const std::string port = std::to_string(freePort());
  runWorkers(2, [&](int r) {
    return Env{{"PMI_RANK", std::to_string(r)},
               {"PMI_SIZE", "2"},
               {"MPI_LOCALRANKID", std::to_string(r)},
               {"MPI_LOCALNRANKS", "2"},
               {"MASTER_PORT", port}};
  });
}

TEST(LauncherEnv, Ipv6Loopback) {
  const std::string port = std::to_string(freePort());
  runWorkers(3, [&](int r) {
    return Env{{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"},           {"MASTER_ADDR", "::1"},
               {"MASTER_PORT", port},       {"LOOM_SOCKET_IFNAME", "=lo"}, {"LOOM_SOCKET_FAMILY", "AF_INET6"}};
  });
}

TEST(LauncherEnv, MissingRankIsNamedAtTheDeadline) {
  const std::string port = std::to_string(freePort());
  std::vector<Proc> procs;
  for (int r = 0; r < 2; ++r) {  // rank 2 of 3 never starts
    procs.push_back(start({path("LOOM_TEST_WORKER"), "exchange"}, {{"RANK", std::to_string(r)},
                                                                   {"WORLD_SIZE", "3"},
                                                                   {"MASTER_ADDR", "127.0.0.1"},
                                                                   {"MASTER_PORT", port},
                                                                   {"LOOM_INIT_TIMEOUT", "2"}}));
  }
  for (auto& p : procs) {
    std::string out;
    EXPECT_EQ(finish(p, 30, &out), 1) << out;
    EXPECT_NE(out.find("missing rank(s) 2"), std::string::npos) << out;
  }
}

TEST(RealLaunchers, OpenMpiMpirun) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "Open MPI's mpirun is not installed (apt-get install openmpi-bin)";
  }
  std::string out;
  int rc = finish(
      start({"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", path("LOOM_EXAMPLE")},
            {{"OMPI_MCA_mpi_yield_when_idle", "1"}}),
      120, &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("rank 1 received tensor [1, 1, 1, 1, 1, 1, 1, 1, 1, 1] from rank 0"), std::string::npos) << out;
}

// ---- The data-parallel example (examples/ddp_linear_regression.cc). ----

namespace {

// Checks a run of the DDP example: the loss printed by rank 0 only, once per epoch, falling; the
// checkpoint written once, by rank 0; the same weights checksum on every one of n ranks. Returns
// the checksum.
std::string checkDdpRun(const std::string& out, int n, const std::string& checkpoint, int epochs) {
  EXPECT_EQ(countOf(out, "epoch "), epochs) << out;
  EXPECT_EQ(countOf(out, "saved the checkpoint"), 1) << out;
  EXPECT_NE(out.find("rank 0 saved the checkpoint to " + checkpoint), std::string::npos) << out;
  std::ifstream ck(checkpoint, std::ios::binary | std::ios::ate);
  EXPECT_EQ(static_cast<long>(ck.tellg()), 33 * 4) << "checkpoint " << checkpoint;
  std::remove(checkpoint.c_str());
  // Loss of the first and the last epoch.
  const size_t first = out.find("loss "), last = out.rfind("loss ");
  if (first != std::string::npos && last != first) {
    EXPECT_LT(std::atof(out.c_str() + last + 5), std::atof(out.c_str() + first + 5)) << out;
  }
  std::set<std::string> sums;
  for (size_t at = out.find("weights checksum "); at != std::string::npos; at = out.find("weights checksum ", at + 1))
    sums.insert(out.substr(at + 17, 16));
  EXPECT_EQ(countOf(out, "weights checksum "), n) << out;
  EXPECT_EQ(sums.size(), 1u) << "replicas differ:\n" << out;
  return sums.empty() ? "" : *sums.begin();
}

}  // namespace

TEST(DdpExample, TrainsUnderLoomrunWithIdenticalReplicas) {
  for (int n : {1, 3, 4}) {
    const std::string ck = "/tmp/loom-ddp-test-" + std::to_string(getpid()) + ".bin";
    std::string out;
    const int rc = finish(
        start({path("LOOMRUN"), "-n", std::to_string(n), path("LOOM_DDP_EXAMPLE"), "--epochs", "4", "--checkpoint", ck},
              {}),
        120, &out);
    EXPECT_EQ(rc, 0) << out;
    checkDdpRun(out, n, ck, 4);
  }
}

TEST(DdpExample, MlpLearnsWithIdenticalReplicas) {
  const std::string ck = "/tmp/loom-ddp-mlp-" + std::to_string(getpid()) + ".bin";
  std::string out;
  const int rc =
      finish(start({path("LOOMRUN"), "-n", "3", path("LOOM_DDP_MLP_EXAMPLE"), "--epochs", "4", "--checkpoint", ck}, {}),
             120, &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(countOf(out, "epoch "), 4) << out;
  std::ifstream file(ck, std::ios::binary | std::ios::ate);
  EXPECT_EQ(static_cast<long>(file.tellg()), (16 * 64 + 64 + 64 * 4 + 4) * 4) << "checkpoint " << ck;
  std::remove(ck.c_str());
  const size_t first = out.find("loss "), last = out.rfind("loss ");
  ASSERT_NE(first, last) << out;
  EXPECT_LT(std::atof(out.c_str() + last + 5), std::atof(out.c_str() + first + 5)) << out;
  const size_t acc = out.rfind("accuracy ");
  ASSERT_NE(acc, std::string::npos) << out;
  EXPECT_GT(std::atof(out.c_str() + acc + 9), 80.0) << out;
  std::set<std::string> sums;
  for (size_t at = out.find("weights checksum "); at != std::string::npos; at = out.find("weights checksum ", at + 1))
    sums.insert(out.substr(at + 17, 16));
  EXPECT_EQ(countOf(out, "weights checksum "), 3) << out;
  EXPECT_EQ(sums.size(), 1u) << "replicas differ:\n" << out;
}

TEST(DdpExample, TrainsUnderMpirun) {
  if (system("command -v mpirun >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "Open MPI's mpirun is not installed (apt-get install openmpi-bin)";
  }
  const std::string ck = "/tmp/loom-ddp-mpi-" + std::to_string(getpid()) + ".bin";
  std::string out;
  const int rc = finish(start({"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "4",
                               path("LOOM_DDP_EXAMPLE"), "--epochs", "3", "--checkpoint", ck},
                              {{"OMPI_MCA_mpi_yield_when_idle", "1"}}),
                        120, &out);
  EXPECT_EQ(rc, 0) << out;
  checkDdpRun(out, 4, ck, 3);
}

// A real Slurm (tools/slurm-local: slurmctld, slurmd and munge on this machine): srun starts the
// ranks, which find their rank, world size and rendezvous host in Slurm's variables.
TEST(RealLaunchers, SlurmSrun) {
  if (geteuid() != 0) GTEST_SKIP() << "tools/slurm-local starts Slurm's daemons, which needs root";
  std::string setup;
  const int rc = finish(start({path("SLURM_LOCAL"), "start"}, {}), 180, &setup);
  if (rc != 0) GTEST_SKIP() << "could not start a local Slurm (tools/slurm-local start): " << setup;
  std::string out;
  EXPECT_EQ(finish(start({"srun", "-n", "4", path("LOOM_EXAMPLE")}, {}), 120, &out), 0) << out;
  EXPECT_NE(out.find("rank 1 received tensor [1, 1, 1, 1, 1, 1, 1, 1, 1, 1] from rank 0"), std::string::npos) << out;
  const std::string ck = "/tmp/loom-ddp-srun-" + std::to_string(getpid()) + ".bin";
  out.clear();
  EXPECT_EQ(
      finish(start({"srun", "-n", "4", path("LOOM_DDP_EXAMPLE"), "--epochs", "3", "--checkpoint", ck}, {}), 120, &out),
      0)
      << out;
  checkDdpRun(out, 4, ck, 3);
}

// ---- Faults: a rank killed, stopped, or never entering a collective. ----

namespace {

// Starts n loop workers (all-reduces of 4 MiB until one fails) and waits until rank `watch` loops;
// `only` is more environment for rank `watch` alone.
std::vector<Proc> startLooping(int n, int watch, const Env& extra, const Env& only = {}) {
  const std::string port = std::to_string(freePort());
  std::vector<Proc> procs;
  for (int r = 0; r < n; ++r) {
    Env e = torchEnv(r, n, port);
    for (const auto& [k, v] : extra) e[k] = v;
    if (r == watch)
      for (const auto& [k, v] : only) e[k] = v;
    procs.push_back(start({path("LOOM_TEST_WORKER"), "loop"}, e));
  }
  for (int i = 0; i < 300; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f(procs[static_cast<size_t>(watch)].outFile);
    std::stringstream ss;
    ss << f.rdbuf();
    if (ss.str().find("looping") != std::string::npos) break;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  return procs;
}

}  // namespace

// A rank killed in the middle of an all-reduce over TCP: every survivor fails within seconds (the
// connection's end, or a peer's word), naming the dead rank.
TEST(Faults, SigkillOverTcpIsNamedWithinSeconds) {
  const int n = 4, victim = 2;
  auto procs = startLooping(n, victim, {{"LOOM_TRANSPORT", "tcp"}});
  const auto killedAt = std::chrono::steady_clock::now();
  kill(procs[victim].pid, SIGKILL);
  for (int r = 0; r < n; ++r) {
    std::string out;
    const int rc = finish(procs[static_cast<size_t>(r)], 30, &out);
    if (r == victim) continue;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count();
    EXPECT_EQ(rc, 1) << out;
    EXPECT_LT(secs, 10.0) << "rank " << r << " took " << secs << " s:\n" << out;
    EXPECT_NE(out.find("rank 2"), std::string::npos) << out;
    EXPECT_NE(out.find("all_reduce"), std::string::npos) << out;
    std::printf("[ fault    ] SIGKILL over TCP: rank %d failed after %.2f s: %s", r, secs,
                out.substr(out.find("failed:")).c_str());
  }
}

// ---- Faults over InfiniBand, through the tests' verbs provider (each rank a process). ----

namespace {

class IbProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    if (path("LOOM_TEST_VERBS_PROVIDER").empty())
      GTEST_SKIP() << "LOOM_TEST_VERBS_PROVIDER is not set (meson sets it where the verbs headers are; by hand: "
                      "LOOM_TEST_VERBS_PROVIDER=build/tests/libloom_test_verbs.so)";
    char tmpl[] = "/tmp/loom-verbs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    env_ = {{"LOOM_TRANSPORT", "ib"},
            {"LOOM_IBVERBS_LIBRARY", path("LOOM_TEST_VERBS_PROVIDER")},
            {"LOOM_TEST_VERBS_DIR", dir_}};
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }
  // Runs 4 looping ranks, rank `victim` with `fault` planted (LOOM_TEST_VERBS_FAULT; empty: killed
  // once it loops); every other rank must fail within `limit` seconds, its error containing each
  // of `want`. Returns the outputs by rank.
  std::vector<std::string> run(int victim, const std::string& fault, const std::vector<std::string>& want,
                               double limit = 10.0) {
    const int n = 4;
    Env only;
    if (!fault.empty()) only["LOOM_TEST_VERBS_FAULT"] = fault;
    auto procs = startLooping(n, victim, env_, only);
    const auto from = std::chrono::steady_clock::now();
    if (fault.empty()) kill(procs[static_cast<size_t>(victim)].pid, SIGKILL);
    std::vector<std::string> outs(n);
    for (int r = 0; r < n; ++r) {
      const int rc = finish(procs[static_cast<size_t>(r)], 40, &outs[static_cast<size_t>(r)]);
      const std::string& out = outs[static_cast<size_t>(r)];
      if (r == victim && fault.empty()) continue;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count();
      EXPECT_EQ(rc, 1) << "rank " << r << ":\n" << out;
      EXPECT_LT(secs, limit) << "rank " << r << " took " << secs << " s:\n" << out;
      EXPECT_NE(out.find("all_reduce"), std::string::npos) << out;
      for (const auto& w : want)
        EXPECT_NE(out.find(w), std::string::npos) << "rank " << r << " lacks \"" << w << "\":\n" << out;
      const size_t at = out.find("failed:");
      std::printf("[ fault    ] %s: rank %d failed after %.2f s: %s", fault.empty() ? "SIGKILL over ib" : fault.c_str(),
                  r, secs, at == std::string::npos ? out.c_str() : out.substr(at).c_str());
    }
    return outs;
  }

  std::string dir_;
  Env env_;
};

}  // namespace

namespace {

// Why this machine has no RDMA device for the real-device test ("" when it has one).
std::string whyNoRdmaDevice() {
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return "libibverbs.so.1 is not installed (rdma-core's libibverbs1)";
  using GetList = void** (*)(int*);
  using FreeList = void (*)(void**);
  auto get = reinterpret_cast<GetList>(dlsym(lib, "ibv_get_device_list"));
  auto release = reinterpret_cast<FreeList>(dlsym(lib, "ibv_free_device_list"));
  if (get == nullptr || release == nullptr) return "libibverbs.so.1 lacks ibv_get_device_list";
  int n = 0;
  errno = 0;
  void** list = get(&n);
  const int err = errno;
  if (list != nullptr) release(list);
  if (list == nullptr)
    return std::string("ibv_get_device_list failed: ") + std::strerror(err) +
           (err == ENOSYS ? " (this kernel has no RDMA support)" : "");
  if (n == 0) return "ibv_get_device_list lists no device";
  return "";
}

}  // namespace

// On a machine with an RDMA adapter (InfiniBand or RoCE), the real libibverbs: three processes
// check all-reduce, broadcast and all-gather from 8 B to 8 MiB over ib alone. Elsewhere it skips.
TEST(IbRealDevice, CollectivesOverTheMachinesAdapter) {
  const std::string why = whyNoRdmaDevice();
  if (!why.empty()) GTEST_SKIP() << "no RDMA device here: " << why;
  runCollectives(3, {{"LOOM_TRANSPORT", "ib"}}, {": ib over "});
}

// The same run through the tests' verbs provider, so that the test above is known to work.
TEST_F(IbProcesses, CollectivesThroughTheProvider) { runCollectives(3, env_, {": ib over "}); }

// GPUDirect RDMA between processes, on the emulated device: device send/recv of every size goes
// from device memory to device memory by RDMA (registered as dma-bufs, once), with no copy
// through host memory; the collectives matrix on device buffers over ib (staged) after it.
TEST_F(IbProcesses, DeviceBuffersMoveByGpuDirectRdma) {
  for (int n : {2, 3}) {
    std::string out;
    const int rc = finish(
        start({path("LOOMRUN"), "-n", std::to_string(n), path("LOOM_DEVICE_WORKER"), "fake", "ib"}, env_), 240, &out);
    EXPECT_EQ(rc, 0) << out;
    for (int r = 0; r < n; ++r) {
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": device worker ok"), std::string::npos) << out;
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": device send/recv by GPUDirect RDMA"), std::string::npos)
          << out;
    }
  }
}

// A rank killed in the middle of an all-reduce over ib: every survivor fails within seconds,
// through the side channel (its queue pairs alone would wait out their retries, about 30 s).
TEST_F(IbProcesses, SigkillIsNamedWithinSeconds) { run(2, "", {"rank 2"}); }

// Links made on first use (LOOM_CONNECT=lazy, the default above 8 ranks): nothing linked at init,
// the collectives' checks pass, and a rank killed afterwards is named through the side channel
// that the link's first use made.
TEST_F(IbProcesses, LinksOnFirstUseCarryTheCollectivesAndNameAKilledRank) {
  env_["LOOM_CONNECT"] = "lazy";
  runCollectives(3, env_, {"ib, not linked"});
  run(2, "", {"rank 2"});
}

// A queue pair the adapter puts in error (IBV_EVENT_QP_FATAL) on one rank: that rank fails the
// link, naming the peer; the others hear why over their side channels.
TEST_F(IbProcesses, QueuePairInErrorIsNamedOnEveryRank) {
  auto outs = run(1, "qp-fatal:400", {"put a queue pair of the link in error", "the link to rank"});
  EXPECT_NE(outs[1].find("local work queue catastrophic error"), std::string::npos) << outs[1];
}

// An RDMA write with a key the target never gave: a remote access error where it was posted, an
// access violation on the target's queue pair (the cause every other rank hears), within seconds.
TEST_F(IbProcesses, WrongRemoteKeyIsARemoteAccessErrorOnEveryRank) {
  // The ring's 1 MiB chunks go as RDMA writes (the halving-doubling's 64 KiB ones go eager).
  env_["LOOM_ALGO"] = "ring";
  auto outs = run(1, "bad-rkey:60", {});
  // Whichever end's word spreads first: the writer's completion or the target's event.
  for (const auto& out : outs)
    EXPECT_TRUE(out.find("failed: remote access error (it refused the access") != std::string::npos ||
                out.find("(local access violation work queue error)") != std::string::npos)
        << out;
}

// The rank's port goes down (IBV_EVENT_PORT_ERR): every link of the rank fails at once, saying so.
TEST_F(IbProcesses, PortDownFailsEveryLinkOfTheRank) {
  auto outs = run(1, "port-down:400", {"went down"});
  EXPECT_NE(outs[1].find("port 1 of"), std::string::npos) << outs[1];
}

// A stopped rank (SIGSTOP) keeps its connections open: the others time out, and the error carries
// the hang report, which names the rank that did not answer.
TEST(Faults, SigstopIsATimeoutWhoseReportNamesTheStoppedRank) {
  const int n = 4, victim = 1;
  auto procs = startLooping(n, victim, {{"LOOM_TIMEOUT", "4"}});
  const auto stoppedAt = std::chrono::steady_clock::now();
  kill(procs[victim].pid, SIGSTOP);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    std::string out;
    const int rc = finish(procs[static_cast<size_t>(r)], 40, &out);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - stoppedAt).count();
    EXPECT_EQ(rc, 1) << out;
    EXPECT_LT(secs, 15.0) << out;
    // The first rank to time out explains; the others may report its failure instead.
    EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
    // (A rank whose report ran into the store closing, its host rank 0 having exited, says so.)
    if (out.find("hang report") != std::string::npos && out.find("store closed") == std::string::npos) {
      EXPECT_NE(out.find("rank 1 did not answer"), std::string::npos) << out;
    }
    std::printf("[ fault    ] SIGSTOP: rank %d failed after %.2f s: %s", r, secs,
                out.substr(out.find("failed:")).c_str());
  }
  kill(procs[victim].pid, SIGKILL);
  finish(procs[victim], 10, nullptr);
}

// A rank busy outside Loom while the others wait in a collective: loom-info --dump, run by hand
// against the live job, prints who waits and who did not answer; so does each rank on the dump
// signal (LOOM_DUMP_SIGNAL); at the deadline, each waiting rank's error carries the same report.
TEST(Faults, HangIsExplainedOnDemandAndAtTheDeadline) {
  Proc job = start({path("LOOMRUN"), "-n", "4", path("LOOM_TEST_WORKER"), "hang"},
                   {{"HANG_RANK", "2"}, {"LOOM_TIMEOUT", "14"}, {"LOOM_DUMP_SIGNAL", "USR1"}});
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f(job.outFile);
    std::stringstream ss;
    ss << f.rdbuf();
    if (countOf(ss.str(), "hanging") == 4) break;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // A rank's process, for loom-info to find the job from.
  std::string pid;
  {
    FILE* p = popen("pgrep -n -x loom_mp_worker", "r");
    char buf[32] = {0};
    if (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) pid = std::string(buf, std::strcspn(buf, "\n"));
    if (p != nullptr) pclose(p);
  }
  ASSERT_FALSE(pid.empty());
  std::string dump;
  EXPECT_EQ(finish(start({path("LOOM_INFO"), "--dump", "--pid", pid}, {}), 30, &dump), 0) << dump;
  EXPECT_NE(dump.find("hang report for all_reduce #1 of 1024 float32 (sum)"), std::string::npos) << dump;
  EXPECT_NE(dump.find("rank 2 did not answer"), std::string::npos) << dump;
  EXPECT_NE(dump.find("ranks 0-1,3 are waiting in it since"), std::string::npos) << dump;
  // Every rank prints its record on the signal; the waiting ones add the gathered report.
  EXPECT_EQ(std::system("pkill -USR1 -x loom_mp_worker"), 0);
  std::string out;
  EXPECT_NE(finish(job, 60, &out), 0);
  EXPECT_EQ(countOf(out, "its last collectives, oldest first"), 4) << out;
  EXPECT_EQ(countOf(out, "not inside a collective now"), 1) << out;  // rank 2
  // Three on the signal, then one at least at the deadline (loomrun stops the others once the
  // first rank exits, perhaps before they print theirs).
  EXPECT_GE(countOf(out, "hang report for all_reduce #1 of 1024 float32 (sum)"), 3 + 1) << out;
  EXPECT_NE(out.find("timed out after 14"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 2 did not answer"), std::string::npos) << out;
}

// A waiter polls for a budget of its own CPU time before it sleeps; however long that budget, it
// still looks at its deadline and answers the others' dump requests: a rank that never calls is
// named at the deadline by every waiting rank, and the waiting ranks are seen waiting.
TEST(Faults, ALongSpinBudgetStillMeetsTheDeadline) {
  const auto startedAt = std::chrono::steady_clock::now();
  Proc job = start({path("LOOMRUN"), "-n", "4", path("LOOM_TEST_WORKER"), "hang"},
                   {{"HANG_RANK", "2"},
                    {"LOOM_TRANSPORT", "tcp"},  // (its waits are the ones that poll a connection)
                    {"LOOM_TIMEOUT", "3"},
                    {"LOOM_SPIN_WAIT_US", "600000000"},
                    {"LOOM_CROWDED_SPIN_WAIT_US", "600000000"}});
  std::string out;
  EXPECT_NE(finish(job, 60, &out), 0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - startedAt).count();
  EXPECT_LT(secs, 30.0) << out;
  EXPECT_NE(out.find("timed out after 3"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 2 did not answer"), std::string::npos) << out;
  EXPECT_NE(out.find("are waiting in it since"), std::string::npos) << out;
}

// The recovery example: rank 2 dies at step 3; the others shrink the communicator and finish the
// run with 3 ranks (loomrun --keep-going leaves them running). Over shared memory and over TCP.
TEST(Faults, RecoveryExampleGoesOnWithTheSurvivors) {
  for (const char* transport : {"", "tcp"}) {
    std::string out;
    Env env;
    if (*transport) env["LOOM_TRANSPORT"] = transport;
    const int rc =
        finish(start({path("LOOMRUN"), "-n", "4", "--keep-going", path("LOOM_RECOVER_EXAMPLE")}, env), 90, &out);
    EXPECT_EQ(rc, 128 + SIGKILL) << out;  // the first failure: rank 2's
    for (int r : {0, 1, 3}) {
      const std::string me = "[" + std::to_string(r) + "] rank " + std::to_string(r);
      EXPECT_NE(out.find(me + ": step 3 failed: "), std::string::npos) << out;
      EXPECT_NE(out.find(me + ": going on as rank " + std::to_string(r == 3 ? 2 : r) + " of 3"), std::string::npos)
          << out;
      EXPECT_NE(out.find(me + ": step 5: every gradient sums to 3 over 3 ranks"), std::string::npos) << out;
    }
  }
}
