// The harness behind every *_perf tool, following nccl-tests so that its users read the output
// without a manual: the same flags (-b -e -f -i -n -w -c -o -d -r) and columns (size, count, type,
// redop, root, then time/algbw/busbw/#wrong out of place and in place), the same busbw factors
// (all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast, reduce,
// send/recv 1), and the same footer. -c checks every element against values that are exactly
// predictable whatever the reduction order; #wrong is summed over ranks. Ranks join from the
// launcher's environment (loomrun, srun, mpirun, torchrun).
#pragma once

namespace loom {
namespace bench {

enum class Kind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Gather, Scatter, SendRecv };

/// Runs the benchmark of `kind` with nccl-tests' command line; returns the process exit status.
int perfMain(int argc, char** argv, Kind kind);

}  // namespace bench
}  // namespace loom
