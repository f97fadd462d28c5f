// MPI_Allreduce (float32 sum), for bench/compare. Prints one line per size:
// "mpi allreduce <ranks> <bytes> <time_us> <busbw>".
//   mpirun -np N mpi_allreduce_bench BYTES ITERS [BYTES ITERS ...]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int a = 1; a + 1 < argc; a += 2) {
    const size_t bytes = std::strtoull(argv[a], nullptr, 10);
    const int iters = std::atoi(argv[a + 1]);
    const int count = static_cast<int>(std::max<size_t>(1, bytes / 4));
    std::vector<float> in(static_cast<size_t>(count), 1.0f), out(static_cast<size_t>(count));
    for (int i = 0; i < std::max(2, iters / 5); ++i)
      MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double us = (MPI_Wtime() - t0) * 1e6 / iters, worst = 0;
    MPI_Allreduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      double busbw = static_cast<double>(count) * 4 / (worst * 1e-6) / 1e9 * 2.0 * (size - 1) / size;
      std::printf("mpi allreduce %d %zu %.2f %.4f\n", size, static_cast<size_t>(count) * 4, worst, busbw);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
