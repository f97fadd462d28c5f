// reproducible_check: all-reduces the same wide-ranging data at several sizes and prints a checksum
// of each result, so that runs under different algorithms, transports, node layouts or sizes can be
// compared (bench/reproducible runs the matrix). Element i of rank r's input depends on r and i
// alone, so the first elements of every size are the same sums: the `prefix` column, a checksum of
// the first 256 elements, must then agree across sizes too.
//
//   loomrun -n 4 build/bench/reproducible_check [-b 8] [-e 64M] [-f 4] [-d float|double|half|bfloat16]
//                                               [-o sum|avg|prod] [--inplace]
//
// Output (rank 0): size, count, checksum of the whole result, prefix checksum, whether every rank
// holds the same bits, the algorithm, the mode. Exit status 1 when ranks disagree.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/reduce.hpp"
#include "loom/loom.hpp"

namespace {

using loom::DataType;
using loom::ReduceOp;

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// A signed mantissa in [1, 2) times 2^e with e in [-20, 20] (float16: [-6, 6]; prod: near 1).
double value(int rank, size_t i, DataType t, ReduceOp op) {
  const uint64_t h = mix((static_cast<uint64_t>(rank) << 40) ^ i);
  const double mant = (1.0 + static_cast<double>(h & 0xfffff) / 1048576.0) * ((h >> 20) & 1 ? -1.0 : 1.0);
  if (op == ReduceOp::Prod) return mant * (((h >> 21) & 1) ? 0.5 : 1.0);
  const int span = t == DataType::Float16 ? 6 : 20;
  return std::ldexp(mant, static_cast<int>((h >> 24) % static_cast<uint64_t>(2 * span + 1)) - span);
}

void put(uint8_t* p, DataType t, double v) {
  if (t == DataType::Float64) {
    std::memcpy(p, &v, 8);
  } else if (t == DataType::Float32) {
    const auto f = static_cast<float>(v);
    std::memcpy(p, &f, 4);
  } else {
    const auto f = static_cast<float>(v);
    const uint16_t h = t == DataType::Float16 ? loom::kernels::floatToFp16(f) : loom::kernels::floatToBf16(f);
    std::memcpy(p, &h, 2);
  }
}

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  const char u = end != nullptr ? static_cast<char>(*end | 0x20) : 0;
  return static_cast<size_t>(v * (u == 'k' ? 1 << 10 : u == 'm' ? 1 << 20 : u == 'g' ? 1 << 30 : 1));
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: reproducible_check [-b minbytes] [-e maxbytes] [-f factor] [-d float|double|half|bfloat16] "
               "[-o sum|avg|prod] [--inplace]\n  launch with loomrun -n N (or srun, mpirun, torchrun)\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  size_t minBytes = 8, maxBytes = size_t{64} << 20, factor = 4;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  bool inPlace = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "-b" && more) {
      minBytes = parseSize(argv[++i]);
    } else if (a == "-e" && more) {
      maxBytes = parseSize(argv[++i]);
    } else if (a == "-f" && more) {
      factor = std::max<size_t>(2, parseSize(argv[++i]));
    } else if (a == "-d" && more) {
      const std::string d = argv[++i];
      type = d == "double"     ? DataType::Float64
             : d == "half"     ? DataType::Float16
             : d == "bfloat16" ? DataType::Bfloat16
             : d == "float"    ? DataType::Float32
                               : (usage(), DataType::Float32);
    } else if (a == "-o" && more) {
      const std::string o = argv[++i];
      op = o == "avg" ? ReduceOp::Avg : o == "prod" ? ReduceOp::Prod : o == "sum" ? ReduceOp::Sum : (usage(), op);
    } else if (a == "--inplace") {
      inPlace = true;
    } else {
      usage();
    }
  }
  try {
    loom::Communicator comm = loom::Communicator::fromEnv();
    const int me = comm.rank(), n = comm.size();
    const size_t elem = loom::sizeOf(type);
    bool agree = true;
    if (me == 0) {
      std::printf("# reproducible_check: %d ranks on %d node(s), %s %s%s, reproducible mode %s\n", n, comm.nodeCount(),
                  loom::toString(type), loom::toString(op), inPlace ? ", in place" : "",
                  comm.reproducible() ? "on" : "off");
      std::printf("# %12s %12s %16s %16s %6s %10s\n", "size(B)", "count", "checksum", "prefix", "ranks", "algo");
    }
    for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
      const size_t count = std::max<size_t>(1, bytes / elem);
      std::vector<uint8_t> in(count * elem), out(count * elem);
      for (size_t i = 0; i < count; ++i) put(in.data() + i * elem, type, value(me, i, type, op));
      uint8_t* result = inPlace ? in.data() : out.data();
      comm.allReduce(in.data(), result, count, type, op);
      const uint64_t sums[2] = {fnv1a(result, count * elem), fnv1a(result, std::min<size_t>(count, 256) * elem)};
      std::vector<uint64_t> all(2 * static_cast<size_t>(n));
      comm.allGather(sums, all.data(), 2, DataType::Uint64);
      bool same = true;
      for (int r = 0; r < n; ++r) same = same && all[2 * static_cast<size_t>(r)] == sums[0];
      agree = agree && same;
      if (me == 0)
        std::printf("  %12zu %12zu %016llx %016llx %6s %10s\n", count * elem, count,
                    static_cast<unsigned long long>(sums[0]), static_cast<unsigned long long>(sums[1]),
                    same ? "same" : "DIFFER", comm.algorithmFor("all_reduce", count * elem).c_str());
    }
    std::fflush(stdout);
    return agree ? 0 : 1;
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "reproducible_check: %s\n", e.what());
    return 1;
  }
}
