// Where the progress threads run: near the rank's data. A rank whose launcher bound it to some
// CPUs (srun --cpu-bind, mpirun --bind-to, numactl, taskset) gets its progress threads on the CPUs
// of the NUMA nodes those CPUs belong to: the memory they copy is that node's, and a thread bound
// to the rank's own single core would fight the rank for it. An unbound rank's threads stay
// unbound. LOOM_PROGRESS_CPUS sets the list explicitly ("0-3,8"), or "none".
#pragma once

#include <string>
#include <vector>

#include "core/topology.hpp"

namespace loom {

/// The CPUs for progress threads of a rank allowed to run on `callerCpus`: the CPUs of every NUMA
/// node holding one of them; empty (no binding) when that is every CPU of the machine.
std::vector<int> planProgressCpus(const std::vector<int>& callerCpus, const HostTopology& topo);

/// Makes the plan bindProgressThread follows, on the calling thread: called where a progress
/// thread is created, so that the topology is read before the thread runs (the new thread shares
/// the rank's own CPU until it binds itself, and the rank's first collectives would wait for it).
void planProgressBinding();

/// Binds the calling progress thread as planned from its own (inherited) affinity, the machine's
/// topology and LOOM_PROGRESS_CPUS. The plan is made once per process and logged at INFO.
/// Never fails: a binding the kernel refuses is logged and skipped.
void bindProgressThread();

}  // namespace loom
