// A rank process for the multi-process tests. Scenarios:
//   exchange   fromEnv, check rank/size against EXPECT_RANK/EXPECT_SIZE, ring exchange, barrier
//   fail       rank FAIL_RANK exits with status 7 at once; the others sleep (to be stopped)
//   sleep      sleep 60 s (to be interrupted)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loom/loom.hpp"

int main(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "exchange";
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
