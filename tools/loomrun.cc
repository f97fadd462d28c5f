// loomrun: starts the local ranks of a Loom job, in the spirit of torchrun and mpirun.
//
//   loomrun -n 4 PROGRAM ARGS...                       4 ranks on this host, free port picked
//   loomrun --nnodes 2 --node-rank 0 --master-addr head --master-port 29500 -n 8 PROGRAM...
//   loomrun -n 4 --keep-going PROGRAM...               survivors of a failed rank go on
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT and LOOM_JOB_KEY (a random secret on one node; on several nodes, --job-key or
// LOOM_JOB_KEY, else one derived from the master address, with a warning). Output lines are
// prefixed with "[rank] " (--no-prefix turns it off). When a rank fails, or loomrun gets
// SIGINT/SIGTERM, the other ranks get SIGTERM, then SIGKILL after --grace seconds; loomrun
// returns the first non-zero exit status (128 + signal for a rank killed by a signal).
//
// Binding (--bind, as mpirun does by default): with no more ranks than the CPUs loomrun may use,
// each rank gets its own contiguous block of them (its progress threads follow it: core/affinity);
// with more ranks than CPUs, none is bound. A rank that shares its core with another or moves
// between cores pays for it in every message (1 MiB all-reduce over TCP, 2 ranks on 2 cores:
// 306-353 us bound, 311-470 us unbound).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  int nproc = 1;
  int nnodes = 1;
  int nodeRank = 0;
  std::string masterAddr;
  int masterPort = -1;
  std::string jobKey;
  bool prefix = true;
  int graceSeconds = 5;
  std::string bind = "auto";  // auto, core, none
  bool keepGoing = false;     // a failed rank does not stop the others
  int rankOffset = -1;        // first rank on this host (default nodeRank * nproc)
  int worldSize = -1;         // default nproc * nnodes
  std::vector<std::string> command;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int outFd = -1;
  int errFd = -1;
  std::string outBuf, errBuf;
  bool exited = false;
  int status = 0;
};

int signalPipe[2] = {-1, -1};

void onSignal(int sig) {
  unsigned char s = static_cast<unsigned char>(sig);
  (void)!write(signalPipe[1], &s, 1);
}

[[noreturn]] void usage(int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: loomrun [-n N] [--nnodes N --node-rank R --master-addr HOST --master-port PORT]\n"
               "               [--job-key KEY] [--no-prefix] [--grace SECONDS] [--bind auto|core|none]\n"
               "               PROGRAM [ARGS...]\n"
               "  -n, --nproc-per-node N  ranks to start on this host (default 1)\n"
               "  --nnodes N              hosts in the job (default 1); run loomrun once on each\n"
               "  --node-rank R           this host's index, 0 to N-1 (default 0)\n"
               "  --master-addr HOST      host of rank 0 (default 127.0.0.1 on one node)\n"
               "  --master-port PORT      rendezvous port (default: a free port on one node, 29500 on several)\n"
               "  --job-key KEY           secret shared by all ranks (default: random on one node)\n"
               "  --no-prefix             do not prefix output lines with the rank\n"
               "  --grace SECONDS         time ranks get after SIGTERM before SIGKILL (default 5)\n"
               "  --bind auto|core|none   core: each rank on its own block of this host's CPUs; auto (default):\n"
               "                          core when the ranks are no more than the CPUs, else none\n"
               "  --rank-offset B         first rank on this host, for hosts with different rank counts\n"
               "                          (default: node rank x ranks per host)\n"
               "  --world-size W          ranks in the whole job (default: hosts x ranks per host)\n"
               "  --keep-going            a rank that fails does not stop the others (for jobs that recover\n"
               "                          with Communicator::shrink); the first failure is still the status\n");
  std::exit(code);
}

int parseInt(const char* flag, const char* v, int lo, int hi) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > hi) {
    std::fprintf(stderr, "loomrun: %s wants an integer in [%d, %d], not \"%s\"\n", flag, lo, hi, v);
    std::exit(2);
  }
  return static_cast<int>(x);
}

Options parse(int argc, char** argv) {
  Options o;
  int i = 1;
  auto value = [&](const char* flag) -> const char* {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "loomrun: %s needs a value\n", flag);
      std::exit(2);
    }
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help")
      usage(0);
    else if (a == "-n" || a == "--nproc-per-node" || a == "--np")
      o.nproc = parseInt("-n", value("-n"), 1, 4096);
    else if (a == "--nnodes")
      o.nnodes = parseInt("--nnodes", value("--nnodes"), 1, 1 << 20);
    else if (a == "--node-rank")
      o.nodeRank = parseInt("--node-rank", value("--node-rank"), 0, 1 << 20);
    else if (a == "--master-addr")
      o.masterAddr = value("--master-addr");
    else if (a == "--master-port")
      o.masterPort = parseInt("--master-port", value("--master-port"), 1, 65535);
    else if (a == "--job-key")
      o.jobKey = value("--job-key");
    else if (a == "--no-prefix")
      o.prefix = false;
    else if (a == "--grace")
      o.graceSeconds = parseInt("--grace", value("--grace"), 0, 3600);
    else if (a == "--keep-going")
      o.keepGoing = true;
    else if (a == "--rank-offset")
      o.rankOffset = parseInt("--rank-offset", value("--rank-offset"), 0, 1 << 24);
    else if (a == "--world-size")
      o.worldSize = parseInt("--world-size", value("--world-size"), 1, 1 << 24);
    else if (a == "--bind" || a == "--bind-to") {
      o.bind = value("--bind");
      if (o.bind != "auto" && o.bind != "core" && o.bind != "none") {
        std::fprintf(stderr, "loomrun: --bind wants auto, core or none, not \"%s\"\n", o.bind.c_str());
        std::exit(2);
      }
    } else if (a == "--") {
      ++i;
      break;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "loomrun: unknown option %s\n", a.c_str());
      usage(2);
    } else {
      break;
    }
  }
  for (; i < argc; ++i) o.command.push_back(argv[i]);
  if (o.command.empty()) usage(2);
  if (o.nodeRank >= o.nnodes) {
    std::fprintf(stderr, "loomrun: --node-rank %d must be below --nnodes %d\n", o.nodeRank, o.nnodes);
    std::exit(2);
  }
  if (o.rankOffset < 0) o.rankOffset = o.nodeRank * o.nproc;
  if (o.worldSize < 0) o.worldSize = o.nproc * o.nnodes;
  if (o.rankOffset + o.nproc > o.worldSize) {
    std::fprintf(stderr, "loomrun: ranks %d to %d of this host do not fit a world of %d ranks\n", o.rankOffset,
                 o.rankOffset + o.nproc - 1, o.worldSize);
    std::exit(2);
  }
  return o;
}

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("loomrun: picking a free port");
    std::exit(1);
  }
  close(fd);
  return ntohs(a.sin_port);
}

std::string randomKey() {
  unsigned char b[32];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, b, sizeof(b)) != static_cast<ssize_t>(sizeof(b))) {
    std::perror("loomrun: /dev/urandom");
    std::exit(1);
  }
  close(fd);
  std::string s;
  char hex[3];
  for (unsigned char c : b) {
    std::snprintf(hex, sizeof(hex), "%02x", c);
    s += hex;
  }
  return s;
}

// Writes complete lines of buf (prefixed) to fd; keeps the unfinished tail.
void emitLines(std::string& buf, int fd, const std::string& prefix, bool flushAll) {
  size_t start = 0;
  for (;;) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::string line = prefix + buf.substr(start, nl - start + 1);
    (void)!write(fd, line.data(), line.size());
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flushAll && !buf.empty()) {
    std::string line = prefix + buf + "\n";
    (void)!write(fd, line.data(), line.size());
    buf.clear();
  }
}

// The CPU block of each local rank (empty: leave the ranks unbound).
std::vector<std::vector<int>> planBinding(const std::string& mode, int nproc) {
  std::vector<std::vector<int>> plan;
  if (mode == "none") return plan;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return plan;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const int n = static_cast<int>(cpus.size());
  if (n < nproc) {
    if (mode == "core")
      std::fprintf(stderr, "loomrun: --bind core: %d ranks but only %d CPUs here; leaving them unbound\n", nproc, n);
    return plan;
  }
  const int per = n / nproc;
  for (int l = 0; l < nproc; ++l) plan.emplace_back(cpus.begin() + l * per, cpus.begin() + (l + 1) * per);
  return plan;
}

int exitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  const int world = o.worldSize;
  if (o.masterAddr.empty()) {
    if (o.nnodes > 1) {
      std::fprintf(stderr, "loomrun: --master-addr is needed with --nnodes > 1 (the host of node rank 0)\n");
      return 2;
    }
    o.masterAddr = "127.0.0.1";
  }
  if (o.masterPort < 0) o.masterPort = o.nnodes == 1 ? freePort() : 29500;
  if (o.jobKey.empty() && std::getenv("LOOM_JOB_KEY") != nullptr) o.jobKey = std::getenv("LOOM_JOB_KEY");
  if (o.jobKey.empty()) {
    if (o.nnodes == 1) {
      o.jobKey = randomKey();
    } else {
      o.jobKey = "loomrun:" + o.masterAddr + ":" + std::to_string(o.masterPort);
      std::fprintf(stderr,
                   "loomrun: warning: no --job-key / LOOM_JOB_KEY: deriving the job key from the master address; "
                   "pass the same random key to loomrun on every node for a real secret\n");
    }
  }

  if (pipe2(signalPipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGCHLD, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const auto binding = planBinding(o.bind, o.nproc);
  const pid_t self = getpid();  // the ranks' parent, for their check that it still lives
  std::vector<Rank> ranks(static_cast<size_t>(o.nproc));
  for (int l = 0; l < o.nproc; ++l) {
    Rank& r = ranks[static_cast<size_t>(l)];
    r.rank = o.rankOffset + l;
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return 1;
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("loomrun: fork");
      return 1;
    }
    if (pid == 0) {
      setpgid(0, 0);  // its own group: loomrun stops the rank's whole process tree
      // A loomrun killed outright (SIGKILL, the OOM killer) cannot stop its ranks: the kernel does,
      // rather than leave them waiting on peers until their deadline. (Checked after the prctl, in
      // case loomrun went before it.)
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != self) _exit(128 + SIGKILL);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      signal(SIGCHLD, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      dup2(out[1], 1);
      dup2(err[1], 2);
      setenv("RANK", std::to_string(r.rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(l).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(o.nodeRank).c_str(), 1);
      setenv("MASTER_ADDR", o.masterAddr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(o.masterPort).c_str(), 1);
      setenv("LOOM_JOB_KEY", o.jobKey.c_str(), 1);
      setenv("LOOMRUN_JOB", "1", 1);
      if (!binding.empty()) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c : binding[static_cast<size_t>(l)]) CPU_SET(c, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) std::perror("loomrun: binding a rank");
      }
      std::vector<char*> args;
      for (auto& a : o.command) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "loomrun: cannot start %s: %s\n", args[0], std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    r.pid = pid;
    r.outFd = out[0];
    r.errFd = err[0];
  }

  int firstFailure = 0;
  bool stopping = false;
  auto stopDeadline = std::chrono::steady_clock::time_point::max();
  bool killed = false;
  auto stopAll = [&](const char* why) {
    if (stopping) return;
    stopping = true;
    if (why != nullptr) std::fprintf(stderr, "loomrun: %s; stopping the other ranks\n", why);
    for (auto& r : ranks)
      if (!r.exited) kill(-r.pid, SIGTERM);
    stopDeadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.graceSeconds);
  };

  for (;;) {
    // Reap.
    for (;;) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (auto& r : ranks) {
        if (r.pid != pid) continue;
        r.exited = true;
        r.status = status;
        int code = exitCodeOf(status);
        if (code != 0 && firstFailure == 0 && !stopping) {
          firstFailure = code;
          char why[128];
          if (WIFSIGNALED(status)) {
            std::snprintf(why, sizeof(why), "rank %d was killed by signal %d (%s)", r.rank, WTERMSIG(status),
                          strsignal(WTERMSIG(status)));
          } else {
            std::snprintf(why, sizeof(why), "rank %d exited with status %d", r.rank, code);
          }
          if (o.keepGoing) {
            std::fprintf(stderr, "loomrun: %s; the others go on (--keep-going)\n", why);
          } else {
            stopAll(why);
          }
        }
      }
    }
    bool pipesOpen = false;
    std::vector<pollfd> fds;
    fds.push_back({signalPipe[0], POLLIN, 0});
    for (auto& r : ranks) {
      fds.push_back({r.outFd, POLLIN, 0});
      fds.push_back({r.errFd, POLLIN, 0});
      pipesOpen = pipesOpen || r.outFd >= 0 || r.errFd >= 0;
    }
    bool allExited = true;
    for (auto& r : ranks) allExited = allExited && r.exited;
    if (allExited && !pipesOpen) break;
    if (stopping && !killed && std::chrono::steady_clock::now() >= stopDeadline) {
      for (auto& r : ranks)
        if (!r.exited) kill(-r.pid, SIGKILL);
      killed = true;
    }
    poll(fds.data(), fds.size(), 200);
    if (fds[0].revents & POLLIN) {
      unsigned char sig;
      while (read(signalPipe[0], &sig, 1) == 1) {
        if (sig == SIGINT || sig == SIGTERM) {
          if (firstFailure == 0) firstFailure = 128 + sig;
          if (stopping && sig == SIGINT) stopDeadline = std::chrono::steady_clock::now();  // second Ctrl-C
          stopAll(sig == SIGINT ? "interrupted" : "terminated");
        }
      }
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      std::string prefix = o.prefix ? "[" + std::to_string(r.rank) + "] " : "";
      for (int which = 0; which < 2; ++which) {
        int& fd = which == 0 ? r.outFd : r.errFd;
        std::string& buf = which == 0 ? r.outBuf : r.errBuf;
        if (fd < 0 || (fds[1 + 2 * i + which].revents & (POLLIN | POLLHUP)) == 0) continue;
        char tmp[65536];
        ssize_t n = read(fd, tmp, sizeof(tmp));
        if (n > 0) {
          buf.append(tmp, static_cast<size_t>(n));
          emitLines(buf, which == 0 ? 1 : 2, prefix, false);
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          emitLines(buf, which == 0 ? 1 : 2, prefix, true);
          close(fd);
          fd = -1;
        }
      }
    }
  }
  return firstFailure;
}
