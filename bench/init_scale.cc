// What a communicator costs as the job grows (issue: scale): the time to initialise one, to run a
// first 8-byte all-reduce (links made on first use included), and to split it into groups; the
// links each rank holds and the file descriptors it uses. bench/scale runs it from 8 ranks up and
// sets Gloo's full mesh beside it.
//
//   init_scale --threads N [--groups G]     N ranks as threads of this process, one line
//   loomrun -n N init_scale [--groups G]    N ranks as processes, one line from rank 0
//
// The line: "loom <threads|processes> N init_ms first_ms split_ms links_per_rank fds_per_rank ok"
// (times: the slowest rank's, from a common start), or "... failed <why>" when a stage fails.
// Processes start one after another (loomrun forks them in turn): their init is timed from each
// one's own start, and the line ends with the init timed from the last one's start as well.
// Split: color rank / (N / G), key rank (G groups of N / G; fewer when G does not divide N).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/descriptors.hpp"
#include "loom/loom.hpp"

namespace {

using Clock = std::chrono::steady_clock;

int openDescriptors() { return static_cast<int>(loom::openDescriptors()); }

/// Raises the descriptor limit as far as the system lets this process: the full mesh needs many,
/// ranks as threads share one process's table (512 ranks over TCP hold about 20,000 sockets between
/// them), and what a rank uses is what this tool reports. The hard limit too where permitted
/// (root: up to fs.nr_open), else the soft one to the hard one.
void raiseDescriptorLimit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0) return;
  rlim_t most = 0;
  if (FILE* f = std::fopen("/proc/sys/fs/nr_open", "r")) {
    unsigned long long v = 0;
    if (std::fscanf(f, "%llu", &v) == 1) most = static_cast<rlim_t>(v);
    std::fclose(f);
  }
  if (most > l.rlim_max) {
    rlimit wider{most, most};
    if (setrlimit(RLIMIT_NOFILE, &wider) == 0) return;
  }
  if (l.rlim_cur < l.rlim_max) {
    l.rlim_cur = l.rlim_max;
    setrlimit(RLIMIT_NOFILE, &l);
  }
}

/// The wall clock in ms, which processes of one machine share (their steady clocks need not).
double wallMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double msSince(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}

/// One rank's figures: milliseconds from the common start to the end of each stage, its links.
struct Figures {
  double init = 0, first = 0, split = 0;
  int links = 0;
  std::string error;  // the first stage that failed, and why
};

/// Runs the stages on one rank. `sync` lines the ranks up between stages (so that each stage's
/// time is its own), and is given the communicator once there is one.
template <typename Sync>
Figures runRank(int rank, int size, const loom::UniqueId& id, int groups, Clock::time_point t0, Sync sync) {
  Figures f;
  std::optional<loom::Communicator> comm;
  try {
    loom::Options opt;
    opt.name = "scale";
    comm.emplace(rank, size, id, opt);
    f.init = msSince(t0, Clock::now());
  } catch (const std::exception& e) {
    f.error = std::string("init: ") + e.what();
    return f;
  }
  try {
    const Clock::time_point t1 = sync(*comm);
    uint64_t one = 1, sum = 0;
    comm->allReduce(&one, &sum, 1, loom::DataType::Uint64, loom::ReduceOp::Sum);
    f.first = msSince(t1, Clock::now());
    if (sum != static_cast<uint64_t>(size)) f.error = "first all-reduce: wrong sum " + std::to_string(sum);
    f.links = comm->linkCount();  // what a job that only all-reduces holds (made on first use)
    const Clock::time_point t2 = sync(*comm);
    const int per = std::max(1, size / std::max(1, groups));
    loom::Communicator sub = comm->split(rank / per, rank);
    f.split = msSince(t2, Clock::now());
    sync(*comm);
  } catch (const std::exception& e) {
    if (f.error.empty()) f.error = e.what();
  }
  return f;
}

std::string describe(const char* mode, int size, const std::vector<Figures>& all, double fdsPerRank) {
  for (const auto& f : all)
    if (!f.error.empty()) return "loom " + std::string(mode) + " " + std::to_string(size) + " failed " + f.error;
  Figures worst;
  int links = 0;
  for (const auto& f : all) {
    worst.init = std::max(worst.init, f.init);
    worst.first = std::max(worst.first, f.first);
    worst.split = std::max(worst.split, f.split);
    links = std::max(links, f.links);
  }
  char line[256];
  std::snprintf(line, sizeof line, "loom %s %d %.1f %.2f %.1f %d %.1f ok", mode, size, worst.init, worst.first,
                worst.split, links, fdsPerRank);
  return line;
}

/// Ranks as threads: a barrier of the process's own lines them up.
int runThreads(int size, int groups) {
  const int fds0 = openDescriptors();
  const loom::UniqueId id = loom::UniqueId::create();
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0, generation = 0, fdsAtFirst = 0;
  Clock::time_point released;
  auto barrier = [&](loom::Communicator&) {
    std::unique_lock<std::mutex> lock(mu);
    const int gen = generation;
    if (++arrived == size) {
      if (gen == 1) fdsAtFirst = openDescriptors();  // every rank initialised and through a first all-reduce
      arrived = 0;
      ++generation;
      released = Clock::now();
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
    return released;
  };
  std::vector<Figures> all(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  const Clock::time_point t0 = Clock::now();
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] { all[static_cast<size_t>(r)] = runRank(r, size, id, groups, t0, barrier); });
  for (auto& t : threads) t.join();
  const double perRank = static_cast<double>(std::max(0, fdsAtFirst - fds0)) / size;
  std::printf("%s\n", describe("threads", size, all, perRank).c_str());
  return 0;
}

/// Ranks as processes (under loomrun): the communicator's own barrier lines them up, and rank 0
/// gathers the figures.
int runProcesses(int groups) {
  const char* rankText = std::getenv("RANK");
  const char* sizeText = std::getenv("WORLD_SIZE");
  if (rankText == nullptr || sizeText == nullptr) {
    std::fprintf(stderr, "init_scale: start it with --threads N, or under loomrun -n N\n");
    return 2;
  }
  const int rank = std::atoi(rankText), size = std::atoi(sizeText);
  const int fds0 = openDescriptors();
  // The id comes through the launcher's store, as Communicator::fromEnv does; the clock starts
  // when this process starts its init (processes start at different times: the slowest counts).
  const Clock::time_point t0 = Clock::now();
  const double startWall = wallMs();
  Figures f;
  int fdsAfterInit = 0;  // after init and a first all-reduce
  std::optional<loom::Communicator> comm;
  try {
    loom::Options opt;
    opt.name = "scale";
    comm.emplace(loom::Communicator::fromEnv(opt));
    f.init = msSince(t0, Clock::now());
    const double initEndWall = wallMs();
    comm->barrier();
    Clock::time_point t1 = Clock::now();
    uint64_t one = 1, sum = 0;
    comm->allReduce(&one, &sum, 1, loom::DataType::Uint64, loom::ReduceOp::Sum);
    f.first = msSince(t1, Clock::now());
    f.links = comm->linkCount();  // after a barrier and an all-reduce (links are made on first use)
    fdsAfterInit = openDescriptors();
    comm->barrier();
    Clock::time_point t2 = Clock::now();
    const int per = std::max(1, size / std::max(1, groups));
    loom::Communicator sub = comm->split(rank / per, rank);
    f.split = msSince(t2, Clock::now());
    double figures[7] = {
        f.init,    f.first,    f.split, static_cast<double>(f.links), static_cast<double>(fdsAfterInit - fds0),
        startWall, initEndWall};
    double worst[7] = {0, 0, 0, 0, 0, 0, 0};
    comm->allReduce(figures, worst, 7, loom::DataType::Float64, loom::ReduceOp::Max);
    if (rank == 0)
      std::printf("loom processes %d %.1f %.2f %.1f %d %.1f ok %.1f\n", size, worst[0], worst[1], worst[2],
                  static_cast<int>(worst[3]), worst[4], worst[6] - worst[5]);
  } catch (const std::exception& e) {
    std::printf("loom processes %d failed rank %d: %s\n", size, rank, e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  raiseDescriptorLimit();
  int threads = 0, groups = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--groups" && i + 1 < argc) {
      groups = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s --threads N [--groups G] | loomrun -n N %s [--groups G]\n", argv[0], argv[0]);
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return threads > 0 ? runThreads(threads, groups) : runProcesses(groups);
}
