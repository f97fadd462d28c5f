// Detection of rank, world size, local rank and rendezvous address from the variables that
// launchers set, so that users never compute them by hand.
//
// Rank and world size come as a pair from the first source present, innermost launcher first:
//   LOOM_RANK/LOOM_WORLD_SIZE (explicit) > RANK/WORLD_SIZE (loomrun, torchrun, by hand)
//   > OMPI_COMM_WORLD_RANK/SIZE (Open MPI) > PMI_RANK/PMI_SIZE (MPICH Hydra)
//   > SLURM_PROCID/SLURM_NTASKS (srun).
// (mpirun inside a Slurm allocation leaves SLURM_PROCID=0 in every rank: Open MPI must win.)
// The rendezvous host: LOOM_MASTER_ADDR > MASTER_ADDR > the first host of SLURM_STEP_NODELIST or
// SLURM_JOB_NODELIST (when Slurm gave the rank) > 127.0.0.1 when every rank is on this node >
// mpirun's host (Open MPI across nodes: rank 0 runs there when mpirun runs on the job's first node).
// The port: LOOM_MASTER_PORT > MASTER_PORT > one derived from the job id (Slurm, Open MPI; in 20000-31999, below the
// ephemeral ports) > 29500. The job key: LOOM_JOB_KEY, else (weaker, documented) the job's identity: Slurm job and step
// id, Open MPI's namespace, torchrun's run id, or the rendezvous address.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loom/loom.hpp"

namespace loom {

/// Looks a variable up; returns nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

/// The process environment as an EnvLookup.
EnvLookup processEnv();

/// The public Launch (loom.hpp), plus the secret the job's key comes from.
struct LaunchInfo : Launch {
  std::string jobKeySeed;  ///< the secret the job's key is derived from
  bool jobKeyWeak = true;  ///< true unless LOOM_JOB_KEY was set
};

/// Reads the launch from `env`. Throws loom::Error(InvalidArgument) naming the variable when a
/// value is malformed or inconsistent, or when no launcher variables are set at all.
LaunchInfo detectLaunch(const EnvLookup& env);

/// Parses SLURM_TASKS_PER_NODE ("2(x3),1") and returns the count of node `nodeId`, or -1.
int slurmTasksOnNode(const std::string& tasksPerNode, int nodeId);

}  // namespace loom
