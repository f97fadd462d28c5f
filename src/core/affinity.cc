#include "core/affinity.hpp"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <set>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"

namespace loom {
namespace {

LOOM_PARAM_STR(progressCpusParam, "LOOM_PROGRESS_CPUS", "",
               "CPUs for the progress threads (\"0-3,8\", or \"none\"); default: the NUMA nodes of the CPUs the "
               "rank is bound to, or unbound");

std::string cpuListText(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size(); ++i) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j > i ? strFormat("%d-%d", cpus[i], cpus[j]) : std::to_string(cpus[i]);
    i = j;
  }
  return out;
}

std::vector<int> plannedCpus() {
  static std::once_flag once;
  static std::vector<int> cpus;
  std::call_once(once, [] {
    const std::string env = progressCpusParam();
    if (env == "none") return;
    if (!env.empty()) {
      cpus = parseCpuList(env);
      LOOM_INFO("progress threads on CPUs %s (LOOM_PROGRESS_CPUS)", cpuListText(cpus).c_str());
      return;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
    std::vector<int> mine;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) mine.push_back(c);
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0 && static_cast<long>(mine.size()) >= online) return;  // unbound: leave it so
    const HostTopology topo = discoverTopology(/*devices=*/false);
    cpus = planProgressCpus(mine, topo);
    if (!cpus.empty()) {
      LOOM_INFO("progress threads on CPUs %s: the NUMA node(s) of this rank's CPUs %s", cpuListText(cpus).c_str(),
                cpuListText(mine).c_str());
    }
  });
  return cpus;
}

}  // namespace

std::vector<int> planProgressCpus(const std::vector<int>& callerCpus, const HostTopology& topo) {
  std::set<int> out, all;
  for (const auto& node : topo.numa) {
    all.insert(node.cpus.begin(), node.cpus.end());
    const bool near = std::any_of(node.cpus.begin(), node.cpus.end(), [&](int c) {
      return std::find(callerCpus.begin(), callerCpus.end(), c) != callerCpus.end();
    });
    if (near) out.insert(node.cpus.begin(), node.cpus.end());
  }
  // Unbound (or bound to every node): nothing to do. Nothing known: leave it too.
  if (out.empty() || out == all) return {};
  return std::vector<int>(out.begin(), out.end());
}

void planProgressBinding() { (void)plannedCpus(); }

void bindProgressThread() {
  const std::vector<int> cpus = plannedCpus();
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0)
    LOOM_WARN("could not bind a progress thread to CPUs %s: %s", cpuListText(cpus).c_str(), errnoText(rc).c_str());
}

}  // namespace loom
