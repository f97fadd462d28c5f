// A rank process for the multi-process tests. Scenarios:
//   exchange   fromEnv, check rank/size against EXPECT_RANK/EXPECT_SIZE, ring exchange, barrier
//   fail       rank FAIL_RANK exits with status 7 at once; the others sleep (to be stopped)
//   sleep      sleep 60 s (to be interrupted)
//   collectives all-reduce, broadcast and all-gather of 8 B to 8 MiB, checked; prints each link
//   loop       all-reduces of 4 MiB until one fails (a peer killed meanwhile); prints the error
//   threads    prints the CPUs each thread of the process may run on (progress-thread binding)
//   leave      an all-reduce (of argv[2] floats), then rank LEAVE_RANK exits at once without closing its communicator;
//              the others wait a second, check theirs, exchange a message among themselves, then
//              all-reduce (which must fail, naming it); each prints what it saw
//   hang       a broadcast, then every rank but HANG_RANK all-reduces while HANG_RANK sleeps
//              outside Loom (prints "hanging"); each prints the error it gets, then exits 1
//   fan        rank 0 sends to every other rank in turn (a link made on first use each), each of
//              them receives it; then a barrier (prints "fan ok")
// With NO_CMA_SECCOMP=1 the process first installs a seccomp filter that makes process_vm_readv
// fail with EPERM, as container runtimes' default profiles do.
#include <dirent.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.hpp"

namespace {

void refuseCrossMemoryAttach() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    std::perror("seccomp");
    std::exit(5);
  }
}

// Loom's /dev/shm files this process maps (unlinked by now: "(deleted)"), each counted once.
int sharedMemoryFilesMapped() {
  std::set<std::string> files;
  if (FILE* f = std::fopen("/proc/self/maps", "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (const char* at = std::strstr(line, "/dev/shm/loom-")) files.insert(std::string(at));
    std::fclose(f);
  }
  return static_cast<int>(files.size());
}

int collectives(loom::Communicator& c) {
  const int n = c.size(), me = c.rank();
  for (int p = 0; p < n; ++p)
    if (p != me) std::printf("rank %d link: %s\n", me, c.describeLink(p).c_str());
  // Every rank describes its links before any goes on to link more (links made on first use). On
  // one node this all-gather goes through the node's direct area, which needs no link.
  std::vector<int32_t> ids(static_cast<size_t>(n));
  const int32_t id = me;
  c.allGather(&id, ids.data(), 1, loom::DataType::Int32);
  for (size_t count : {size_t{2}, size_t{1021}, size_t{65537}, size_t{2} << 20}) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i % 100) + me);
    c.allReduce(v.data(), v.data(), count, loom::DataType::Float32, loom::ReduceOp::Sum);
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(n * (i % 100)) + static_cast<float>(n * (n - 1) / 2);
      if (v[i] != want) {
        std::fprintf(stderr, "rank %d: all_reduce element %zu is %g, not %g\n", me, i, v[i], want);
        return 4;
      }
    }
    std::vector<int32_t> b(count, me == n - 1 ? 77 : -1);
    c.broadcast(b.data(), b.data(), count, loom::DataType::Int32, n - 1);
    for (int32_t x : b)
      if (x != 77) {
        std::fprintf(stderr, "rank %d: broadcast gave %d\n", me, x);
        return 4;
      }
    std::vector<int32_t> mine(count, me), all(count * static_cast<size_t>(n), -1);
    c.allGather(mine.data(), all.data(), count, loom::DataType::Int32);
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] != static_cast<int32_t>(i / count)) {
        std::fprintf(stderr, "rank %d: all_gather element %zu is %d\n", me, i, all[i]);
        return 4;
      }
  }
  for (int p = 0; p < n; ++p)  // (links made on first use: those the collectives made)
    if (p != me) std::printf("rank %d link after: %s\n", me, c.describeLink(p).c_str());
  std::printf("rank %d maps %d shared-memory files\n", me, sharedMemoryFilesMapped());
  std::printf("rank %d of %d ok\n", me, n);
  return 0;
}

int loop(loom::Communicator& c) {
  std::vector<float> v(1u << 20, 1.0f);
  for (long i = 0;; ++i) {
    if (i == 3) {
      std::printf("rank %d looping\n", c.rank());
      std::fflush(stdout);
    }
    try {
      c.allReduce(v.data(), v.data(), v.size(), loom::DataType::Float32, loom::ReduceOp::Max);
    } catch (const loom::Error& e) {
      std::printf("rank %d failed: %s\n", c.rank(), e.what());
      return 1;
    }
  }
}

int leave(loom::Communicator& c, size_t count) {
  const int n = c.size(), me = c.rank(), gone = std::atoi(std::getenv("LEAVE_RANK"));
  std::vector<float> v(count, 1.0f);
  c.allReduce(v.data(), v.data(), v.size(), loom::DataType::Float32, loom::ReduceOp::Sum);
  if (me == gone) {
    std::printf("rank %d leaving\n", me);
    std::fflush(stdout);
    _exit(0);  // as a training script's os._exit: the communicator is never destroyed
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the progress threads see it go meanwhile
  try {
    c.checkError();
    std::printf("rank %d still ok\n", me);
    std::vector<int> survivors;
    for (int r = 0; r < n; ++r)
      if (r != gone) survivors.push_back(r);
    const size_t i = static_cast<size_t>(std::find(survivors.begin(), survivors.end(), me) - survivors.begin());
    const int to = survivors[(i + 1) % survivors.size()],
              from = survivors[(i + survivors.size() - 1) % survivors.size()];
    int32_t out = me, in = -1;
    auto r = c.irecv(&in, 1, loom::DataType::Int32, from);
    c.send(&out, 1, loom::DataType::Int32, to);
    r.wait();
    if (in != from) return 4;
    std::printf("rank %d exchanged\n", me);
  } catch (const loom::Error& e) {
    std::printf("rank %d failed early: %s\n", me, e.what());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    c.allReduce(v.data(), v.data(), v.size(), loom::DataType::Float32, loom::ReduceOp::Sum);
    std::printf("rank %d: the all-reduce without rank %d completed\n", me, gone);
    return 3;
  } catch (const loom::Error& e) {
    std::printf("rank %d all-reduce failed in %.1f s: %s\n", me,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), e.what());
    return 0;
  }
}

int fan(loom::Communicator& c) {
  int32_t v = 42;
  if (c.rank() == 0) {
    for (int p = 1; p < c.size(); ++p) c.send(&v, 1, loom::DataType::Int32, p);
  } else {
    v = 0;
    c.recv(&v, 1, loom::DataType::Int32, 0);
    if (v != 42) return 4;
  }
  c.barrier();
  std::printf("rank %d: fan ok\n", c.rank());
  return 0;
}

int threads(loom::Communicator& c) {
  c.barrier();
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return 6;
  const std::string self = std::to_string(getpid());
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream status(std::string("/proc/self/task/") + e->d_name + "/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("Cpus_allowed_list:", 0) == 0)
        std::printf("thread %s%s cpus %s\n", e->d_name, self == e->d_name ? " (main)" : "",
                    line.substr(line.find_first_not_of(" \t", 18)).c_str());
  }
  closedir(d);
  c.barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "exchange";
  if (const char* s = std::getenv("NO_CMA_SECCOMP"); s != nullptr && std::string(s) == "1") refuseCrossMemoryAttach();
  if (scenario == "fail") {
    if (std::getenv("RANK") != nullptr && std::atoi(std::getenv("RANK")) == std::atoi(std::getenv("FAIL_RANK")))
      return 7;
    sleep(60);
    return 0;
  }
  if (scenario == "sleep") {
    std::printf("sleeping\n");
    std::fflush(stdout);
    sleep(60);
    return 0;
  }
  try {
    loom::Communicator c = loom::Communicator::fromEnv();
    if (scenario == "collectives") return collectives(c);
    if (scenario == "loop") return loop(c);
    if (scenario == "threads") return threads(c);
    if (scenario == "fan") return fan(c);
    if (scenario == "leave") return leave(c, argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 1024);
    if (scenario == "hang") {
      std::vector<float> v(1024, 1.0f);
      c.broadcast(v.data(), v.data(), v.size(), loom::DataType::Float32, 0);
      std::printf("hanging\n");
      std::fflush(stdout);
      if (c.rank() == std::atoi(std::getenv("HANG_RANK"))) {
        // Busy outside Loom; a signal (LOOM_DUMP_SIGNAL) does not cut the sleep short.
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(600);
        while (std::chrono::steady_clock::now() < end) sleep(1);
        return 0;
      }
      c.allReduce(v.data(), v.data(), v.size(), loom::DataType::Float32, loom::ReduceOp::Sum);
      return 0;
    }
    if (const char* r = std::getenv("EXPECT_RANK"); r != nullptr && std::atoi(r) != c.rank()) {
      std::fprintf(stderr, "rank %d, expected %s\n", c.rank(), r);
      return 3;
    }
    if (const char* s = std::getenv("EXPECT_SIZE"); s != nullptr && std::atoi(s) != c.size()) {
      std::fprintf(stderr, "size %d, expected %s\n", c.size(), s);
      return 3;
    }
    const int n = c.size(), to = (c.rank() + 1) % n, from = (c.rank() + n - 1) % n;
    for (size_t count : {size_t{0}, size_t{1}, size_t{1021}, size_t{1} << 20}) {
      std::vector<int64_t> out(count), in(count, -1);
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(c.rank() * 1000003 + i);
      auto r = c.irecv(in.data(), count, loom::DataType::Int64, from);
      auto s = c.isend(out.data(), count, loom::DataType::Int64, to);
      s.wait();
      r.wait();
      for (size_t i = 0; i < count; ++i) {
        if (in[i] != static_cast<int64_t>(from * 1000003 + i)) {
          std::fprintf(stderr, "rank %d: element %zu from rank %d is wrong\n", c.rank(), i, from);
          return 4;
        }
      }
    }
    c.barrier();
    std::printf("rank %d of %d ok\n", c.rank(), c.size());
    return 0;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
