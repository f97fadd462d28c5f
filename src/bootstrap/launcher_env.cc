#include "bootstrap/launcher_env.hpp"

#include <cerrno>
#include <cstdlib>

#include "bootstrap/hostlist.hpp"
#include "core/format.hpp"
#include "core/param.hpp"
#include "core/status.hpp"

namespace loom {
namespace {

// Read through an injectable EnvLookup (the tests pass their own), so declared here for the
// settings list and read below.
LOOM_SETTING(rankSetting, "LOOM_RANK", "",
             "this process's rank, which beats every launcher's variable (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, "
             "SLURM_PROCID); set with LOOM_WORLD_SIZE");
LOOM_SETTING(worldSizeSetting, "LOOM_WORLD_SIZE", "",
             "the number of ranks, with LOOM_RANK (else WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS)");
LOOM_SETTING(localRankSetting, "LOOM_LOCAL_RANK", "",
             "this process's rank among the ranks of its node (else LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, "
             "MPI_LOCALRANKID, SLURM_LOCALID)");
LOOM_SETTING(localSizeSetting, "LOOM_LOCAL_WORLD_SIZE", "",
             "the number of ranks on this node, with LOOM_LOCAL_RANK (else LOCAL_WORLD_SIZE, "
             "OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS)");
LOOM_SETTING(masterAddrSetting, "LOOM_MASTER_ADDR", "",
             "host of rank 0's rendezvous store (else MASTER_ADDR, the first Slurm node, 127.0.0.1 when every "
             "rank is on this node, or mpirun's host)");
LOOM_SETTING(masterPortSetting, "LOOM_MASTER_PORT", "",
             "port of the rendezvous store (else MASTER_PORT, one derived from the Slurm or Open MPI job id, or "
             "29500)");
LOOM_SETTING(jobKeySetting, "LOOM_JOB_KEY", "",
             "the job's secret: every connection to the store and between ranks proves it (HMAC-SHA256 "
             "challenge-response); loomrun makes a random one; unset, a weaker key is derived from the job's "
             "identity");

struct PairSource {
  const char* rankVar;
  const char* sizeVar;
  const char* launcher;
};

// Innermost launcher first: see the header.
const PairSource kRankSources[] = {
    {"LOOM_RANK", "LOOM_WORLD_SIZE", "explicit"},
    {"RANK", "WORLD_SIZE", "environment"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi"},
    {"PMI_RANK", "PMI_SIZE", "hydra"},
    {"SLURM_PROCID", "SLURM_NTASKS", "slurm"},
};

const PairSource kLocalSources[] = {
    {"LOOM_LOCAL_RANK", "LOOM_LOCAL_WORLD_SIZE", "explicit"},
    {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "environment"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "openmpi"},
    {"MPI_LOCALRANKID", "MPI_LOCALNRANKS", "hydra"},
    {"SLURM_LOCALID", nullptr, "slurm"},
};

bool isSet(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr && *v != '\0';
}

// The host of an Open MPI daemon's contact URI ("1120010240.0;tcp://198.18.0.1,10.0.0.1:45125",
// "...;tcp6://[fe80::1]:45125"): its first address, or "".
std::string uriHost(const std::string& uri) {
  size_t at = uri.find("://");
  if (at == std::string::npos) return "";
  std::string rest = uri.substr(at + 3);
  if (!rest.empty() && rest[0] == '[') return rest.substr(1, rest.find(']') - 1);
  return rest.substr(0, rest.find_first_of(",:;"));
}

long long parseInt(const EnvLookup& env, const char* name, long long lo, long long hi) {
  const char* v = env(name);
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               strFormat("%s=\"%s\" is not an integer in [%lld, %lld]", name, v, lo, hi));
  }
  return x;
}

std::string from(long long value, const char* var) { return strFormat("%lld from %s", value, var); }

// A port in [20000, 32000) derived from a job identity, the same on every rank of the job. The
// range stays below Linux's ephemeral ports (32768 and up), which outgoing connections take.
int portFromIdentity(const std::string& identity) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : identity) h = (h ^ c) * 16777619u;
  return 20000 + static_cast<int>(h % 12000u);
}

}  // namespace

EnvLookup processEnv() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

int slurmTasksOnNode(const std::string& tasksPerNode, int nodeId) {
  // "2(x3),1": three nodes with 2 tasks, then one node with 1.
  int node = 0;
  size_t pos = 0;
  while (pos < tasksPerNode.size()) {
    size_t comma = tasksPerNode.find(',', pos);
    std::string item = tasksPerNode.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long count = std::strtol(item.c_str(), &end, 10);
    long repeat = 1;
    if (end == item.c_str() || count <= 0) return -1;
    if (*end == '(') {
      if (end[1] != 'x') return -1;
      char* end2 = nullptr;
      repeat = std::strtol(end + 2, &end2, 10);
      if (repeat <= 0 || *end2 != ')' || end2[1] != '\0') return -1;
    } else if (*end != '\0') {
      return -1;
    }
    if (nodeId < node + repeat) return static_cast<int>(count);
    node += static_cast<int>(repeat);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return -1;
}

namespace {

// Rank and world size: the first launcher whose variables are set (both of them). Returns the
// launcher's kind as its variables name it ("environment" for RANK/WORLD_SIZE).
std::string rankAndSize(const EnvLookup& env, LaunchInfo& info) {
  const PairSource* rankSource = nullptr;
  for (const auto& s : kRankSources) {
    bool r = isSet(env, s.rankVar), n = isSet(env, s.sizeVar);
    if (!r && !n) continue;
    if (r != n) {
      LOOM_THROW(ErrorCode::InvalidArgument, -1,
                 strFormat("%s is set but %s is not: set both, or neither", r ? s.rankVar : s.sizeVar,
                           r ? s.sizeVar : s.rankVar));
    }
    rankSource = &s;
    break;
  }
  if (rankSource == nullptr) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               "no launcher found in the environment: start the program with loomrun, torchrun, srun or mpirun, "
               "or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  }
  info.size = static_cast<int>(parseInt(env, rankSource->sizeVar, 1, 1 << 24));
  info.rank = static_cast<int>(parseInt(env, rankSource->rankVar, 0, info.size - 1));
  info.launcher = rankSource->launcher;
  const std::string launcherKind = info.launcher;
  if (launcherKind == "environment") {
    if (isSet(env, "LOOMRUN_JOB"))
      info.launcher = "loomrun";
    else if (isSet(env, "TORCHELASTIC_RUN_ID"))
      info.launcher = "torchrun";
  }
  info.provenance.emplace_back("rank", from(info.rank, rankSource->rankVar));
  info.provenance.emplace_back("world size", from(info.size, rankSource->sizeVar));
  return launcherKind;
}

// Local rank and local world size, where the launcher says.
void localRankAndSize(const EnvLookup& env, LaunchInfo& info) {
  for (const auto& s : kLocalSources) {
    if (!isSet(env, s.rankVar)) continue;
    info.localRank = static_cast<int>(parseInt(env, s.rankVar, 0, info.size - 1));
    info.provenance.emplace_back("local rank", from(info.localRank, s.rankVar));
    if (s.sizeVar != nullptr && isSet(env, s.sizeVar)) {
      info.localSize = static_cast<int>(parseInt(env, s.sizeVar, 1, info.size));
      info.provenance.emplace_back("local world size", from(info.localSize, s.sizeVar));
    } else if (s.sizeVar == nullptr) {  // Slurm
      if (isSet(env, "SLURM_NTASKS_PER_NODE")) {
        info.localSize = static_cast<int>(parseInt(env, "SLURM_NTASKS_PER_NODE", 1, info.size));
        info.provenance.emplace_back("local world size", from(info.localSize, "SLURM_NTASKS_PER_NODE"));
      } else if (isSet(env, "SLURM_TASKS_PER_NODE")) {
        int node = isSet(env, "SLURM_NODEID") ? static_cast<int>(parseInt(env, "SLURM_NODEID", 0, 1 << 24)) : 0;
        int n = slurmTasksOnNode(env("SLURM_TASKS_PER_NODE"), node);
        if (n <= 0) {
          LOOM_THROW(ErrorCode::InvalidArgument, -1,
                     strFormat("SLURM_TASKS_PER_NODE=\"%s\" is malformed", env("SLURM_TASKS_PER_NODE")));
        }
        info.localSize = n;
        info.provenance.emplace_back("local world size", from(n, "SLURM_TASKS_PER_NODE and SLURM_NODEID"));
      }
    }
    if (info.localSize > 0 && info.localRank >= info.localSize) {
      LOOM_THROW(ErrorCode::InvalidArgument, -1,
                 strFormat("local rank %d is not below the local world size %d", info.localRank, info.localSize));
    }
    break;
  }
}

// The rendezvous host: where rank 0 runs.
void masterAddress(const EnvLookup& env, const std::string& launcherKind, LaunchInfo& info) {
  const bool slurm = launcherKind == "slurm";
  if (isSet(env, "LOOM_MASTER_ADDR")) {
    info.masterAddr = env("LOOM_MASTER_ADDR");
    info.provenance.emplace_back("master address", info.masterAddr + " from LOOM_MASTER_ADDR");
  } else if (isSet(env, "MASTER_ADDR")) {
    info.masterAddr = env("MASTER_ADDR");
    info.provenance.emplace_back("master address", info.masterAddr + " from MASTER_ADDR");
  } else if (slurm && (isSet(env, "SLURM_STEP_NODELIST") || isSet(env, "SLURM_JOB_NODELIST"))) {
    const char* var = isSet(env, "SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    info.masterAddr = firstHost(env(var));
    info.provenance.emplace_back("master address", info.masterAddr + " (first host of " + var + ")");
  } else if (info.size == 1 || info.localSize == info.size) {
    info.masterAddr = "127.0.0.1";
    info.provenance.emplace_back("master address", "127.0.0.1 (every rank is on this node)");
  } else if (launcherKind == "openmpi" &&
             !uriHost(env("OMPI_MCA_orte_hnp_uri") ? env("OMPI_MCA_orte_hnp_uri") : "").empty()) {
    // Open MPI maps rank 0 to the first node of the job, which is mpirun's own when mpirun runs on
    // one of the job's nodes: every rank knows mpirun's address. Rank 0 checks that it is there
    // (its local daemon is mpirun) and says what to do when it is not.
    const std::string hnp = env("OMPI_MCA_orte_hnp_uri");
    info.masterAddr = uriHost(hnp);
    info.provenance.emplace_back("master address", info.masterAddr + " (mpirun's host, OMPI_MCA_orte_hnp_uri)");
    const char* local = env("OMPI_MCA_orte_local_daemon_uri");
    if (info.rank == 0 && local != nullptr && uriHost(local) != info.masterAddr) {
      LOOM_THROW(ErrorCode::InvalidArgument, 0,
                 strFormat("rank 0 runs on %s, not on mpirun's host %s, where the other ranks look for it: set "
                           "MASTER_ADDR to rank 0's host (with mpirun: -x MASTER_ADDR=%s), or run mpirun on the "
                           "first node of the job",
                           uriHost(local).c_str(), info.masterAddr.c_str(), uriHost(local).c_str()));
    }
  } else {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               strFormat("cannot tell which host runs rank 0 (launcher: %s): set MASTER_ADDR to its host name "
                         "or address (with mpirun: -x MASTER_ADDR=host)",
                         info.launcher.c_str()));
  }
}

// The job's identity, for the port when none is given and for the weaker default job key; "" where
// the launcher gives none.
std::string jobIdentity(const EnvLookup& env, const std::string& launcherKind) {
  const bool slurm = launcherKind == "slurm";
  std::string identity;
  if (slurm && isSet(env, "SLURM_JOB_ID")) {
    identity =
        std::string("slurm:") + env("SLURM_JOB_ID") + ":" + (isSet(env, "SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "");
  } else if (launcherKind == "openmpi" && (isSet(env, "PMIX_NAMESPACE") || isSet(env, "OMPI_MCA_ess_base_jobid"))) {
    identity = std::string("openmpi:") +
               (isSet(env, "PMIX_NAMESPACE") ? env("PMIX_NAMESPACE") : env("OMPI_MCA_ess_base_jobid"));
  } else if (isSet(env, "TORCHELASTIC_RUN_ID")) {
    identity = std::string("torchrun:") + env("TORCHELASTIC_RUN_ID");
  }
  return identity;
}

// The rendezvous port: given, else derived from the job's identity (every rank derives the same),
// else the default.
void masterPort(const EnvLookup& env, const std::string& identity, LaunchInfo& info) {
  const char* portVar =
      isSet(env, "LOOM_MASTER_PORT") ? "LOOM_MASTER_PORT" : (isSet(env, "MASTER_PORT") ? "MASTER_PORT" : nullptr);
  if (portVar != nullptr) {
    info.masterPort = static_cast<int>(parseInt(env, portVar, 0, 65535));
    if (info.masterPort == 0) {
      LOOM_THROW(ErrorCode::InvalidArgument, -1,
                 strFormat("%s=0: the other ranks cannot learn a port picked at random; give a fixed free port, or "
                           "start the job with loomrun, which picks one",
                           portVar));
    }
    info.provenance.emplace_back("master port", from(info.masterPort, portVar));
  } else if (!identity.empty()) {
    info.masterPort = portFromIdentity(identity);
    info.provenance.emplace_back("master port",
                                 strFormat("%d (derived from the job id %s)", info.masterPort, identity.c_str()));
  } else {
    info.masterPort = 29500;
    info.provenance.emplace_back("master port", "29500 (default; set MASTER_PORT)");
  }
}

// The seed of the job key: LOOM_JOB_KEY, else (weak) the job's identity or the rendezvous address.
void jobKey(const EnvLookup& env, std::string identity, LaunchInfo& info) {
  if (isSet(env, "LOOM_JOB_KEY")) {
    info.jobKeySeed = std::string("key:") + env("LOOM_JOB_KEY");
    info.jobKeyWeak = false;
    info.provenance.emplace_back("job key", "from LOOM_JOB_KEY");
  } else {
    if (identity.empty()) identity = strFormat("addr:%s:%d", info.masterAddr.c_str(), info.masterPort);
    info.jobKeySeed = identity;
    info.jobKeyWeak = true;
    info.provenance.emplace_back("job key",
                                 "derived from " + identity + " (weak: set LOOM_JOB_KEY to a random secret)");
  }
}

}  // namespace

LaunchInfo detectLaunch(const EnvLookup& env) {
  LaunchInfo info;
  const std::string launcherKind = rankAndSize(env, info);
  localRankAndSize(env, info);
  masterAddress(env, launcherKind, info);
  const std::string identity = jobIdentity(env, launcherKind);
  masterPort(env, identity, info);
  jobKey(env, identity, info);
  return info;
}

}  // namespace loom
