// MPI_Allreduce (float32 sum), MPI_Bcast or MPI_Allgather, for bench/compare. Prints one line per
// size: "mpi <collective> <ranks> <bytes> <time_us> <busbw>" (nccl-tests conventions: all-gather's
// size is the whole output).
//   mpirun -np N mpi_allreduce_bench [allreduce|bcast|allgather] BYTES ITERS [BYTES ITERS ...]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int first = 1;
  std::string coll = "allreduce";
  if (argc > 1 && (argv[1][0] < '0' || argv[1][0] > '9')) {
    coll = argv[1];
    first = 2;
  }
  for (int a = first; a + 1 < argc; a += 2) {
    const size_t bytes = std::strtoull(argv[a], nullptr, 10);
    const int iters = std::atoi(argv[a + 1]);
    int count = static_cast<int>(std::max<size_t>(1, bytes / 4));
    if (coll == "allgather") count = std::max(1, count / size);  // per rank
    const size_t total = static_cast<size_t>(count) * 4 * (coll == "allgather" ? static_cast<size_t>(size) : 1);
    std::vector<float> in(static_cast<size_t>(count), 1.0f), out(total / 4);
    auto once = [&] {
      if (coll == "bcast") {
        MPI_Bcast(out.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
      } else if (coll == "allgather") {
        MPI_Allgather(in.data(), count, MPI_FLOAT, out.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
      } else {
        MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
    };
    for (int i = 0; i < std::max(2, iters / 5); ++i) once();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) once();
    double us = (MPI_Wtime() - t0) * 1e6 / iters, worst = 0;
    MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      const double algbw = static_cast<double>(total) / (worst * 1e-6) / 1e9;
      const double factor =
          coll == "bcast" ? 1.0 : (coll == "allgather" ? (size - 1.0) / size : 2.0 * (size - 1) / size);
      std::printf("mpi %s %d %zu %.2f %.4f\n", coll.c_str(), size, total, worst, algbw * factor);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
