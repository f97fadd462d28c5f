// Fault to error: how long the surviving ranks of a job take to get a clear error after a fault,
// and what the error says. Ranks are real processes (forked, rendezvous through MASTER_ADDR /
// MASTER_PORT with rank 0 hosting the store); each reports its times over a pipe, on the
// machine's monotonic clock, which all processes share.
//
//   fault_times [--ranks N] [--repeats R] [--timeout S] [--only NAME]
//
// Faults: a rank killed with SIGKILL mid all-reduce (over TCP, shared memory and ib); a rank
// stopped with SIGSTOP (a timeout, with the hang report); a rank that never enters the
// collective (timeout); abort() from another thread; mismatched calls (count and datatype);
// a stray client and a malformed request on the rendezvous port while the job runs (rejected,
// logged, the job completes). Prints, per fault, the median over the repeats of the first and
// the last survivor's time to error, and one survivor's error.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store_protocol.hpp"
#include "loom/loom.hpp"
#include "net/socket.hpp"

using namespace std::chrono_literals;
using loom::DataType;
using loom::ReduceOp;

namespace {

using Clock = std::chrono::steady_clock;

double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

struct Settings {
  int ranks = 4;
  int repeats = 3;
  int timeout = 5;  // LOOM_TIMEOUT of the timeout faults
  std::string only;
};

// What one rank tells the parent, one line each: "ready T", "enter T", "error T TEXT", "done T".
void say(int fd, const std::string& what, const std::string& text = "") {
  std::string line = what + " " + std::to_string(now());
  if (!text.empty()) {
    std::string flat = text;
    std::replace(flat.begin(), flat.end(), '\n', ' ');
    line += " " + flat;
  }
  line += "\n";
  if (::write(fd, line.data(), line.size()) < 0) std::perror("write");
}

struct Report {
  double ready = 0, enter = 0, error = 0, done = 0;
  std::string text;
};

// A job of n forked ranks running `body`; the parent drives the fault.
class Job {
 public:
  Job(int n, const std::map<std::string, std::string>& env,
      const std::function<void(loom::Communicator&, int fd)>& body)
      : n_(n), reports_(static_cast<size_t>(n)) {
    int err = 0;
    loom::Socket probe = loom::listenOn(loom::SockAddr::resolve("127.0.0.1", 0).front(), 1, &err);
    port_ = loom::localAddress(probe.fd()).port();
    probe.reset();
    key_ = "fault-times-" + std::to_string(::getpid()) + "-" + std::to_string(port_);
    for (int r = 0; r < n; ++r) {
      int p[2];
      if (::pipe(p) != 0) std::abort();
      std::fflush(nullptr);  // or the child flushes the parent's buffered output again
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(p[0]);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port_).c_str(), 1);
        ::setenv("LOOM_RANK", std::to_string(r).c_str(), 1);
        ::setenv("LOOM_WORLD_SIZE", std::to_string(n).c_str(), 1);
        ::setenv("LOOM_JOB_KEY", key_.c_str(), 1);
        ::setenv("LOOM_DEBUG", "NONE", 1);
        for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
        int rc = 0;
        try {
          loom::Communicator c = loom::Communicator::fromEnv();
          say(p[1], "ready");
          body(c, p[1]);
          say(p[1], "done");
        } catch (const std::exception& e) {
          say(p[1], "error", e.what());
          rc = 1;
        }
        ::close(p[1]);
        std::fflush(nullptr);
        ::_exit(rc);
      }
      ::close(p[1]);
      ::fcntl(p[0], F_SETFL, O_NONBLOCK);
      pids_.push_back(pid);
      fds_.push_back(p[0]);
      partial_.emplace_back();
    }
  }
  ~Job() {
    for (pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
    for (int fd : fds_) ::close(fd);
  }
  pid_t pid(int r) const { return pids_[static_cast<size_t>(r)]; }
  int port() const { return port_; }
  const std::string& key() const { return key_; }
  const Report& report(int r) const { return reports_[static_cast<size_t>(r)]; }

  // Reads reports until pred() holds or `seconds` pass; false on expiry.
  bool until(const std::function<bool()>& pred, double seconds) {
    const double end = now() + seconds;
    while (!pred()) {
      if (now() > end) return false;
      std::vector<pollfd> p;
      for (int fd : fds_) p.push_back({fd, POLLIN, 0});
      ::poll(p.data(), p.size(), 50);
      for (size_t r = 0; r < fds_.size(); ++r) drain(r);
    }
    return true;
  }
  bool allReady(const std::vector<int>& ranks) {
    return until([&] { return std::all_of(ranks.begin(), ranks.end(), [&](int r) { return report(r).ready > 0; }); },
                 30);
  }
  bool allEnded(const std::vector<int>& ranks, double seconds) {
    return until(
        [&] {
          return std::all_of(ranks.begin(), ranks.end(),
                             [&](int r) { return report(r).error > 0 || report(r).done > 0; });
        },
        seconds);
  }

 private:
  void drain(size_t r) {
    char buf[8192];
    for (;;) {
      const ssize_t k = ::read(fds_[r], buf, sizeof buf);
      if (k <= 0) break;
      partial_[r].append(buf, static_cast<size_t>(k));
    }
    size_t nl;
    while ((nl = partial_[r].find('\n')) != std::string::npos) {
      const std::string line = partial_[r].substr(0, nl);
      partial_[r].erase(0, nl + 1);
      const size_t sp = line.find(' ');
      const std::string what = line.substr(0, sp);
      char* rest = nullptr;
      const double t = std::strtod(line.c_str() + sp + 1, &rest);
      Report& rep = reports_[r];
      if (what == "ready") rep.ready = t;
      if (what == "enter" && rep.enter == 0) rep.enter = t;
      if (what == "done") rep.done = t;
      if (what == "error") {
        rep.error = t;
        rep.text = *rest == ' ' ? rest + 1 : rest;
      }
    }
  }

  int n_, port_ = 0;
  std::string key_;
  std::vector<pid_t> pids_;
  std::vector<int> fds_;
  std::vector<std::string> partial_;
  std::vector<Report> reports_;
};

// All-reduces of 4 MiB until one fails.
void loopAllReduce(loom::Communicator& c, int fd) {
  std::vector<float> v(1u << 20, 1.0f);
  say(fd, "enter");
  for (;;) c.allReduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
}

// One row of the table: per repeat, the first and the last survivor's seconds to error.
struct Row {
  std::string fault;
  std::vector<double> first, last;
  std::string text;
  std::string note;
  std::string skipped;  ///< why the fault cannot be tried here
};

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Adds one repeat to the row: the survivors' errors measured from `t0` (0: from each rank's own
// entry into the collective).
bool record(Row& row, const Job& job, const std::vector<int>& survivors, double t0) {
  double first = 1e9, last = 0;
  for (int r : survivors) {
    const Report& rep = job.report(r);
    if (rep.error == 0) {
      row.note = "rank " + std::to_string(r) + " got no error";
      return false;
    }
    const double from = t0 > 0 ? t0 : rep.enter;
    first = std::min(first, rep.error - from);
    last = std::max(last, rep.error - from);
    if (row.text.empty()) row.text = rep.text;
  }
  row.first.push_back(first);
  row.last.push_back(last);
  return true;
}

std::vector<int> allBut(int n, int victim) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r)
    if (r != victim) v.push_back(r);
  return v;
}

// Whether the kernel lists an RDMA device.
bool hasRdmaDevice() {
  DIR* d = opendir("/sys/class/infiniband");
  if (d == nullptr) return false;
  bool any = false;
  while (dirent* e = readdir(d)) any = any || e->d_name[0] != '.';
  closedir(d);
  return any;
}

Row killed(const Settings& s, const char* transport) {
  const char* lib = std::getenv("LOOM_IBVERBS_LIBRARY");
  const bool provider = std::string(transport) == "ib" && lib != nullptr && std::strstr(lib, "loom_test_verbs");
  Row row{std::string("SIGKILL mid all-reduce (") + transport + (provider ? ", tests' verbs provider)" : ")"),
          {},
          {},
          "",
          "",
          ""};
  // ib runs where an adapter is, or through the tests' verbs provider (LOOM_IBVERBS_LIBRARY).
  if (std::string(transport) == "ib" && lib == nullptr && !hasRdmaDevice()) {
    row.skipped =
        "no RDMA device (LOOM_IBVERBS_LIBRARY=build/tests/libloom_test_verbs.so runs it through the tests' "
        "verbs provider)";
    return row;
  }
  const int victim = s.ranks / 2;
  for (int k = 0; k < s.repeats; ++k) {
    Job job(s.ranks, {{"LOOM_TRANSPORT", transport}, {"LOOM_TIMEOUT", "60"}}, loopAllReduce);
    if (!job.allReady(allBut(s.ranks, -1))) return row.note = "job did not form", row;
    std::this_thread::sleep_for(300ms);
    const double t0 = now();
    ::kill(job.pid(victim), SIGKILL);
    job.allEnded(allBut(s.ranks, victim), 70);
    if (!record(row, job, allBut(s.ranks, victim), t0)) break;
  }
  return row;
}

Row stopped(const Settings& s) {
  Row row{"SIGSTOP mid all-reduce (LOOM_TIMEOUT=" + std::to_string(s.timeout) + ")", {}, {}, "", "", ""};
  const int victim = 1;
  for (int k = 0; k < s.repeats; ++k) {
    Job job(s.ranks, {{"LOOM_TIMEOUT", std::to_string(s.timeout)}}, loopAllReduce);
    if (!job.allReady(allBut(s.ranks, -1))) return row.note = "job did not form", row;
    std::this_thread::sleep_for(300ms);
    const double t0 = now();
    ::kill(job.pid(victim), SIGSTOP);
    job.allEnded(allBut(s.ranks, victim), s.timeout + 60);
    ::kill(job.pid(victim), SIGKILL);
    if (!record(row, job, allBut(s.ranks, victim), t0)) break;
  }
  return row;
}

// Rank `victim` does something else (sleeps outside Loom) while the others wait in an all-reduce.
Row neverEnters(const Settings& s) {
  Row row{"a rank never enters (LOOM_TIMEOUT=" + std::to_string(s.timeout) + ")", {}, {}, "", "", ""};
  const int victim = s.ranks - 1;
  const int timeout = s.timeout;
  for (int k = 0; k < s.repeats; ++k) {
    Job job(s.ranks, {{"LOOM_TIMEOUT", std::to_string(timeout)}}, [&](loom::Communicator& c, int fd) {
      std::vector<float> v(1024, 1.0f);
      if (c.rank() == victim) {
        std::this_thread::sleep_for(std::chrono::seconds(timeout + 60));
        return;
      }
      say(fd, "enter");
      c.allReduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
    });
    job.allEnded(allBut(s.ranks, victim), timeout + 60);
    if (!record(row, job, allBut(s.ranks, victim), 0)) break;
  }
  return row;
}

// Rank 0 waits in an all-reduce nobody else enters; another of its threads aborts the
// communicator after 0.5 s. Measured from the abort() call.
Row aborted(const Settings& s) {
  Row row{"abort() from another thread", {}, {}, "", "", ""};
  for (int k = 0; k < s.repeats; ++k) {
    Job job(s.ranks, {{"LOOM_TIMEOUT", "60"}}, [&](loom::Communicator& c, int fd) {
      if (c.rank() != 0) {
        std::this_thread::sleep_for(30s);
        return;
      }
      std::thread aborter([&] {
        std::this_thread::sleep_for(500ms);
        say(fd, "enter");  // the moment of the abort
        c.abort();
      });
      std::vector<float> v(1024, 1.0f);
      try {
        c.allReduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
      } catch (...) {
        aborter.join();
        throw;
      }
      aborter.join();
    });
    job.allEnded({0}, 30);
    if (!record(row, job, {0}, 0)) break;
  }
  return row;
}

// Rank 1 calls the all-reduce with another count (or datatype) than the others. Measured from the
// moment the last rank entered.
Row mismatch(const Settings& s, bool datatype) {
  Row row{datatype ? "mismatched datatype (float32 / int32)" : "mismatched count (1M / 1M+1)", {}, {}, "", "", ""};
  for (int k = 0; k < s.repeats; ++k) {
    Job job(s.ranks, {{"LOOM_TIMEOUT", "60"}}, [&](loom::Communicator& c, int fd) {
      std::vector<float> v((1u << 20) + 1, 1.0f);
      const bool odd = c.rank() == 1;
      const size_t count = (1u << 20) + (odd && !datatype ? 1 : 0);
      const DataType t = odd && datatype ? DataType::Int32 : DataType::Float32;
      say(fd, "enter");
      c.allReduce(v.data(), v.data(), count, t, ReduceOp::Sum);
    });
    const auto everyone = allBut(s.ranks, -1);
    job.allEnded(everyone, 70);
    double lastEntry = 0;
    for (int r : everyone) lastEntry = std::max(lastEntry, job.report(r).enter);
    if (!record(row, job, everyone, lastEntry)) break;
  }
  return row;
}

// A stranger on the rendezvous port while the job runs 300 all-reduces: the time until the store
// closes the connection, and whether the job completed. `malformed`: the stranger knows the job
// key (a buggy peer) and sends a request whose length field is absurd.
Row stranger(const Settings& s, bool malformed) {
  Row row{malformed ? "malformed request (authenticated, length 4 GiB)" : "stray client (HTTP) on the store port",
          {},
          {},
          "",
          ""};
  for (int k = 0; k < s.repeats; ++k) {
    Job job(s.ranks, {{"LOOM_TIMEOUT", "60"}}, [&](loom::Communicator& c, int fd) {
      std::vector<float> v(16384, 1.0f);
      say(fd, "enter");
      for (int i = 0; i < 300; ++i) {
        c.allReduce(v.data(), v.data(), v.size(), DataType::Float32, ReduceOp::Sum);
        if (v[0] != static_cast<float>(c.size())) throw std::runtime_error("wrong sum");
        std::fill(v.begin(), v.end(), 1.0f);
      }
    });
    if (!job.allReady(allBut(s.ranks, -1))) return row.note = "job did not form", row;
    int err = 0;
    loom::Socket sock =
        loom::connectTo(loom::SockAddr::resolve("127.0.0.1", job.port()).front(), loom::Deadline(2000ms), &err);
    if (!sock.valid()) return row.note = "could not connect", row;
    loom::Bytes bytes;
    if (malformed) {
      uint8_t hello[loom::storewire::kServerHello];
      loom::recvAll(sock.fd(), hello, sizeof hello, loom::Deadline(2000ms));
      const loom::JobKey key = loom::deriveJobKey("key:" + job.key());
      loom::Nonce serverNonce, clientNonce = loom::randomNonce();
      std::memcpy(serverNonce.data(), hello + 8, 16);
      const loom::Mac proof = loom::computeMac(key, "store-client", serverNonce, clientNonce);
      uint8_t reply[loom::storewire::kClientHello];
      std::memcpy(reply, loom::storewire::kClientMagic, 8);
      std::memcpy(reply + 8, clientNonce.data(), 16);
      std::memcpy(reply + 24, proof.data(), 32);
      uint8_t serverProof[loom::storewire::kServerProof];
      loom::sendAll(sock.fd(), reply, sizeof reply, loom::Deadline(2000ms));
      if (loom::recvAll(sock.fd(), serverProof, sizeof serverProof, loom::Deadline(2000ms)) != 0)
        return row.note = "the handshake failed", row;
      bytes = {0xF0, 0xFF, 0xFF, 0xFF, 1, 0, 0, 0, 0};
    } else {
      const char* http = "GET / HTTP/1.0\r\n\r\n";
      bytes.assign(http, http + std::strlen(http));
    }
    const double t0 = now();
    loom::sendAll(sock.fd(), bytes.data(), bytes.size(), loom::Deadline(2000ms));
    double closed = 0;
    uint8_t sink[256];
    while (now() < t0 + 10) {
      const ssize_t got = ::recv(sock.fd(), sink, sizeof sink, 0);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        closed = now();
        break;
      }
      pollfd p{sock.fd(), POLLIN, 0};
      ::poll(&p, 1, 20);
    }
    if (closed == 0) return row.note = "the store kept the connection open", row;
    const auto everyone = allBut(s.ranks, -1);
    job.allEnded(everyone, 60);
    for (int r : everyone)
      if (job.report(r).done == 0)
        return row.note = "the job did not complete: rank " + std::to_string(r) + ": " + job.report(r).text, row;
    row.first.push_back(closed - t0);
    row.last.push_back(closed - t0);
    row.text = "connection closed and logged (WARN); the job completed its 300 all-reduces";
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks") {
      s.ranks = std::max(2, std::atoi(next()));
    } else if (a == "--repeats") {
      s.repeats = std::max(1, std::atoi(next()));
    } else if (a == "--timeout") {
      s.timeout = std::max(1, std::atoi(next()));
    } else if (a == "--only") {
      s.only = next();
    } else {
      std::fprintf(stderr,
                   "usage: fault_times [--ranks N] [--repeats R] [--timeout S] [--only "
                   "kill|stop|enter|abort|mismatch|stray|malformed]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  ::signal(SIGPIPE, SIG_IGN);
  std::printf("# fault to error on the surviving ranks: %d ranks on this host, median of %d runs\n", s.ranks,
              s.repeats);
  std::printf("%-50s %9s %9s  %s\n", "# fault", "first s", "last s", "error on a survivor");
  const std::vector<std::pair<std::string, std::function<Row()>>> faults = {
      {"kill", [&] { return killed(s, "tcp"); }},       {"kill", [&] { return killed(s, "shm"); }},
      {"kill", [&] { return killed(s, "ib"); }},        {"stop", [&] { return stopped(s); }},
      {"enter", [&] { return neverEnters(s); }},        {"abort", [&] { return aborted(s); }},
      {"mismatch", [&] { return mismatch(s, false); }}, {"mismatch", [&] { return mismatch(s, true); }},
      {"stray", [&] { return stranger(s, false); }},    {"malformed", [&] { return stranger(s, true); }},
  };
  int status = 0;
  for (const auto& [name, run] : faults) {
    if (!s.only.empty() && s.only != name) continue;
    const Row row = run();
    if (!row.skipped.empty()) {
      std::printf("%-50s  skipped: %s\n", row.fault.c_str(), row.skipped.c_str());
      continue;
    }
    if (!row.note.empty() || row.first.empty()) {
      std::printf("%-50s  FAILED: %s\n", row.fault.c_str(), row.note.c_str());
      status = 1;
      continue;
    }
    std::string text = row.text;
    if (text.size() > 400) text = text.substr(0, 400) + "...";
    std::printf("%-50s %9.4f %9.4f  %s\n", row.fault.c_str(), median(row.first), median(row.last), text.c_str());
    std::fflush(stdout);
  }
  return status;
}
