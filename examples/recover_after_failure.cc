// Going on after a rank dies: the recovery recipe.
//
//   build/tools/loomrun -n 4 --keep-going build/examples/recover_after_failure
//
// Every rank adds its gradient into an all-reduce, step after step. At step 3, rank 2 dies
// (SIGKILL: no goodbye). The others get a loom::Error naming it within a fraction of a second
// (LOOM_TIMEOUT bounds it in any case). Each survivor then calls comm.shrink(): a new communicator
// of the ranks still here, renumbered in order, meeting through the same rendezvous store (so
// rank 0, which hosts it, must survive; if it does not, restart the job from a checkpoint). The
// failed step is redone on the new communicator, and the run goes on with one rank fewer.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "loom/loom.hpp"

int main() {
  loom::Communicator comm = loom::Communicator::fromEnv();
  const int original = comm.rank();  // this process's rank at the start, for the log lines
  std::vector<float> grad(1 << 16);
  for (int step = 0; step < 6;) {
    if (step == 3 && original == 2) raise(SIGKILL);  // the failure
    for (auto& g : grad) g = 1.0f;
    try {
      comm.allReduce(grad.data(), grad.data(), grad.size(), loom::DataType::Float32, loom::ReduceOp::Sum);
    } catch (const loom::Error& e) {
      std::printf("rank %d: step %d failed: %s\n", original, step, e.what());
      // Recovery: the survivors form a new communicator, then redo the step.
      comm = comm.shrink();
      std::printf("rank %d: going on as rank %d of %d\n", original, comm.rank(), comm.size());
      continue;
    }
    std::printf("rank %d: step %d: every gradient sums to %.0f over %d ranks\n", original, step, grad[0], comm.size());
    ++step;
  }
  comm.barrier();
  return 0;
}
