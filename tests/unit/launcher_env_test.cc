#include "bootstrap/launcher_env.hpp"

#include <gtest/gtest.h>

#include <map>

#include "loom/loom.hpp"

namespace {

loom::LaunchInfo detect(const std::map<std::string, std::string>& vars) {
  return loom::detectLaunch([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST(LauncherEnv, Torchrun) {
  auto i = detect({{"RANK", "3"},
                   {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "node01"},
                   {"MASTER_PORT", "29501"},
                   {"TORCHELASTIC_RUN_ID", "abc"}});
  EXPECT_EQ(i.launcher, "torchrun");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.size, 8);
  EXPECT_EQ(i.localRank, 1);
  EXPECT_EQ(i.localSize, 2);
  EXPECT_EQ(i.masterAddr, "node01");
  EXPECT_EQ(i.masterPort, 29501);
  EXPECT_TRUE(i.jobKeyWeak);
}

TEST(LauncherEnv, SlurmWithCompressedHostList) {
  auto i = detect({{"SLURM_PROCID", "5"},
                   {"SLURM_NTASKS", "8"},
                   {"SLURM_LOCALID", "1"},
                   {"SLURM_TASKS_PER_NODE", "2(x3),2"},
                   {"SLURM_NODEID", "2"},
                   {"SLURM_STEP_NODELIST", "gpu[07-09,12]"},
                   {"SLURM_JOB_NODELIST", "gpu[01-20]"},
                   {"SLURM_JOB_ID", "4242"},
                   {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(i.launcher, "slurm");
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.size, 8);
  EXPECT_EQ(i.localRank, 1);
  EXPECT_EQ(i.localSize, 2);
  EXPECT_EQ(i.masterAddr, "gpu07");  // the step's first node, not the job's
  EXPECT_GE(i.masterPort, 20000);
  EXPECT_LT(i.masterPort, 32000);  // below the ephemeral range
  // Every rank of the job derives the same port and key.
  auto j = detect({{"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "8"},
                   {"SLURM_STEP_NODELIST", "gpu[07-09,12]"},
                   {"SLURM_JOB_ID", "4242"},
                   {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(i.masterPort, j.masterPort);
  EXPECT_EQ(i.jobKeySeed, j.jobKeySeed);
}

TEST(LauncherEnv, SlurmNtasksPerNodeAndJobNodelistFallback) {
  auto i = detect({{"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "4"},
                   {"SLURM_LOCALID", "0"},
                   {"SLURM_NTASKS_PER_NODE", "4"},
                   {"SLURM_JOB_NODELIST", "node[01-04,07]"},
                   {"SLURM_JOB_ID", "1"}});
  EXPECT_EQ(i.localSize, 4);
  EXPECT_EQ(i.masterAddr, "node01");
}

TEST(LauncherEnv, OpenMpiInsideSlurmAllocationWins) {
  // mpirun inside an sbatch job: every rank inherits the batch step's SLURM_PROCID=0.
  auto i = detect({{"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "1"},
                   {"SLURM_JOB_NODELIST", "n[1-2]"},
                   {"OMPI_COMM_WORLD_RANK", "2"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                   {"PMIX_NAMESPACE", "prterun-host-123@1"}});
  EXPECT_EQ(i.launcher, "openmpi");
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.size, 4);
  EXPECT_EQ(i.localSize, 4);
  EXPECT_EQ(i.masterAddr, "127.0.0.1");  // every rank on this node
  EXPECT_NE(i.jobKeySeed.find("prterun-host-123@1"), std::string::npos);
}

TEST(LauncherEnv, OpenMpiAcrossNodesNeedsMasterAddr) {
  EXPECT_THROW(detect({{"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
               loom::Error);
  auto i = detect({{"OMPI_COMM_WORLD_RANK", "0"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"MASTER_ADDR", "head"},
                   {"MASTER_PORT", "1234"}});
  EXPECT_EQ(i.masterAddr, "head");
  EXPECT_EQ(i.masterPort, 1234);
}

TEST(LauncherEnv, OpenMpiAcrossNodesFindsRankZeroOnMpirunsHost) {
  // mpirun on the first node of a host file: rank 0 runs beside it, every rank knows its address.
  const std::map<std::string, std::string> base = {
      {"OMPI_COMM_WORLD_SIZE", "4"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
      {"OMPI_MCA_orte_hnp_uri", "1120010240.0;tcp://198.18.0.1,10.0.0.5:45125"},
      {"OMPI_MCA_ess_base_jobid", "1120010241"}};
  auto at = [&](const char* rank, const char* local, const char* daemon) {
    auto v = base;
    v["OMPI_COMM_WORLD_RANK"] = rank;
    v["OMPI_COMM_WORLD_LOCAL_RANK"] = local;
    v["OMPI_MCA_orte_local_daemon_uri"] = daemon;
    return detect(v);
  };
  auto i = at("3", "1", "1120010240.1;tcp://198.18.0.2:44191");
  EXPECT_EQ(i.masterAddr, "198.18.0.1");
  EXPECT_EQ(at("0", "0", "1120010240.0;tcp://198.18.0.1,10.0.0.5:45125").masterAddr, "198.18.0.1");
  // Rank 0 away from mpirun (mpirun on a login node): rank 0 says what to set.
  try {
    at("0", "0", "1120010240.1;tcp://198.18.0.2:44191");
    ADD_FAILURE() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 runs on 198.18.0.2, not on mpirun's host 198.18.0.1"),
              std::string::npos)
        << e.what();
  }
  auto v6 = base;
  v6["OMPI_COMM_WORLD_RANK"] = "1";
  v6["OMPI_MCA_orte_hnp_uri"] = "1120010240.0;tcp6://[fd00::1]:45125";
  EXPECT_EQ(detect(v6).masterAddr, "fd00::1");
}

TEST(LauncherEnv, MpichHydra) {
  auto i = detect({{"PMI_RANK", "1"},
                   {"PMI_SIZE", "2"},
                   {"MPI_LOCALRANKID", "1"},
                   {"MPI_LOCALNRANKS", "2"},
                   {"MASTER_PORT", "5000"}});
  EXPECT_EQ(i.launcher, "hydra");
  EXPECT_EQ(i.rank, 1);
  EXPECT_EQ(i.localRank, 1);
  EXPECT_EQ(i.masterAddr, "127.0.0.1");
}

TEST(LauncherEnv, ExplicitValuesBeatDetectedOnes) {
  auto i = detect({{"LOOM_RANK", "1"},
                   {"LOOM_WORLD_SIZE", "2"},
                   {"RANK", "7"},
                   {"WORLD_SIZE", "9"},
                   {"SLURM_PROCID", "3"},
                   {"SLURM_NTASKS", "4"},
                   {"LOOM_MASTER_ADDR", "a"},
                   {"MASTER_ADDR", "b"},
                   {"LOOM_MASTER_PORT", "1111"},
                   {"MASTER_PORT", "2222"},
                   {"LOOM_JOB_KEY", "s3cret"}});
  EXPECT_EQ(i.rank, 1);
  EXPECT_EQ(i.size, 2);
  EXPECT_EQ(i.masterAddr, "a");
  EXPECT_EQ(i.masterPort, 1111);
  EXPECT_FALSE(i.jobKeyWeak);
}

TEST(LauncherEnv, LoomrunIsNamed) {
  auto i =
      detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOOMRUN_JOB", "1"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "9"}});
  EXPECT_EQ(i.launcher, "loomrun");
}

TEST(LauncherEnv, MistakesAreNamed) {
  auto message = [](const std::map<std::string, std::string>& vars) {
    try {
      detect(vars);
    } catch (const loom::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}).find("no launcher found"), std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(message({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK=\"x\""), std::string::npos);
  EXPECT_NE(message({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=\"2\""), std::string::npos);
  EXPECT_NE(
      message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}}).find("MASTER_PORT=0"),
      std::string::npos);
  EXPECT_NE(message({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NODELIST", "n[1-"}}).find("malformed"),
            std::string::npos);
}

TEST(LauncherEnv, SlurmTasksPerNodeParsing) {
  EXPECT_EQ(loom::slurmTasksOnNode("2(x3),1", 0), 2);
  EXPECT_EQ(loom::slurmTasksOnNode("2(x3),1", 2), 2);
  EXPECT_EQ(loom::slurmTasksOnNode("2(x3),1", 3), 1);
  EXPECT_EQ(loom::slurmTasksOnNode("2(x3),1", 4), -1);
  EXPECT_EQ(loom::slurmTasksOnNode("4", 0), 4);
  EXPECT_EQ(loom::slurmTasksOnNode("x", 0), -1);
  EXPECT_EQ(loom::slurmTasksOnNode("2(y3)", 0), -1);
}
