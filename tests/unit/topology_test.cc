// Topology from /sys-like trees: a recorded 2-socket, 8-GPU node written out by the test, a
// machine without NUMA information, and this machine; CPU lists; host identities.
#include "core/topology.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/affinity.hpp"

namespace {

class FakeSys {
 public:
  FakeSys() {
    char tmpl[] = "/tmp/loom-sysfs-XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  ~FakeSys() { std::system(("rm -rf " + root_).c_str()); }
  const std::string& root() const { return root_; }
  void write(const std::string& rel, const std::string& text) {
    std::string path = root_ + "/" + rel;
    std::system(("mkdir -p " + path.substr(0, path.find_last_of('/'))).c_str());
    std::ofstream(path) << text << "\n";
  }
  void link(const std::string& rel, const std::string& target) {
    std::string path = root_ + "/" + rel;
    std::system(("mkdir -p " + path.substr(0, path.find_last_of('/'))).c_str());
    ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
  }

 private:
  std::string root_;
};

// A dual-socket server: 2 x 16 cores with hyper-threads (CPUs 0-15,32-47 on socket 0), 8 GPUs
// (4 per socket), two InfiniBand NICs (one per socket), an Ethernet NIC that reports no NUMA node,
// a virtual interface, and PCI devices that are not GPUs.
void writeDgxLike(FakeSys& fs) {
  fs.write("devices/system/cpu/online", "0-63");
  for (int c = 0; c < 64; ++c) {
    const int socket = (c % 32) / 16;
    fs.write("devices/system/cpu/cpu" + std::to_string(c) + "/topology/physical_package_id", std::to_string(socket));
    fs.write("devices/system/cpu/cpu" + std::to_string(c) + "/topology/core_id", std::to_string(c % 16));
  }
  fs.write("devices/system/node/node0/cpulist", "0-15,32-47");
  fs.write("devices/system/node/node0/meminfo", "Node 0 MemTotal:       263921628 kB\nNode 0 MemFree: 1 kB");
  fs.write("devices/system/node/node1/cpulist", "16-31,48-63");
  fs.write("devices/system/node/node1/meminfo", "Node 1 MemTotal:       264210432 kB");
  fs.write("devices/system/node/possible", "0-1");  // not a node directory
  const char* gpus[] = {"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
                        "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"};
  for (int g = 0; g < 8; ++g) {
    const std::string d = std::string("bus/pci/devices/") + gpus[g];
    fs.write(d + "/class", "0x030200");
    fs.write(d + "/vendor", "0x10de");
    fs.write(d + "/numa_node", g < 4 ? "0" : "1");
  }
  fs.write("bus/pci/devices/0000:0c:00.0/class", "0x020700");  // an InfiniBand controller
  fs.write("bus/pci/devices/0000:0c:00.0/vendor", "0x15b3");
  fs.write("bus/pci/devices/0000:03:00.0/class", "0x030000");  // the BMC's VGA: not a GPU we use
  fs.write("bus/pci/devices/0000:03:00.0/vendor", "0x1a03");
  fs.write("devices/pci0000:00/0000:0c:00.0/numa_node", "0");
  fs.write("devices/pci0000:80/0000:8c:00.0/numa_node", "1");
  fs.write("devices/pci0000:00/0000:01:00.0/numa_node", "-1");
  fs.link("class/net/ib0/device", fs.root() + "/devices/pci0000:00/0000:0c:00.0");
  fs.link("class/net/ib1/device", fs.root() + "/devices/pci0000:80/0000:8c:00.0");
  fs.link("class/net/eno1/device", fs.root() + "/devices/pci0000:00/0000:01:00.0");
  fs.write("class/net/lo/operstate", "unknown");  // virtual: no device link
}

}  // namespace

TEST(Topology, CpuLists) {
  EXPECT_EQ(loom::parseCpuList("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(loom::parseCpuList("5"), (std::vector<int>{5}));
  EXPECT_TRUE(loom::parseCpuList("").empty());
  EXPECT_TRUE(loom::parseCpuList("garbage").empty());
  EXPECT_EQ(loom::parseCpuList("3-1,2"), (std::vector<int>{2}));  // a reversed range is ignored
}

TEST(Topology, TwoSocketEightGpuNode) {
  FakeSys fs;
  writeDgxLike(fs);
  loom::HostTopology t = loom::parseSysfs(fs.root());
  EXPECT_EQ(t.cpus, 64);
  EXPECT_EQ(t.cores, 32);
  EXPECT_EQ(t.packages, 2);
  ASSERT_EQ(t.numa.size(), 2u);
  EXPECT_EQ(t.numa[0].cpus.size(), 32u);
  EXPECT_EQ(t.numa[0].memoryBytes, 263921628ull * 1024);
  EXPECT_EQ(t.numaOfCpu(40), 0);
  EXPECT_EQ(t.numaOfCpu(20), 1);
  EXPECT_EQ(t.numaOfCpu(64), -1);
  int gpus[2] = {0, 0}, nics = 0;
  for (const auto& d : t.devices) {
    if (d.kind == loom::PciDevice::Kind::Gpu) {
      ASSERT_GE(d.numaNode, 0);
      gpus[d.numaNode]++;
    } else {
      ++nics;
      const int expected = d.name == "ib0" ? 0 : d.name == "ib1" ? 1 : -1;
      EXPECT_EQ(d.numaNode, expected) << d.name;
      EXPECT_EQ(d.pciAddress, d.name == "ib1" ? "0000:8c:00.0" : d.name == "ib0" ? "0000:0c:00.0" : "0000:01:00.0");
    }
  }
  EXPECT_EQ(gpus[0], 4);
  EXPECT_EQ(gpus[1], 4);
  EXPECT_EQ(nics, 3);  // ib0, ib1, eno1; not lo
  std::string text = loom::describeTopology(t);
  EXPECT_NE(text.find("NUMA node 1: CPUs 16-31,48-63"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU 0000:b7:00.0"), std::string::npos) << text;
  EXPECT_NE(text.find("eno1 (0000:01:00.0), NUMA node not reported"), std::string::npos) << text;
}

TEST(Topology, NoNumaInformationMeansOneNode) {
  FakeSys fs;
  fs.write("devices/system/cpu/online", "0-3");
  loom::HostTopology t = loom::parseSysfs(fs.root());
  EXPECT_EQ(t.cpus, 4);
  ASSERT_EQ(t.numa.size(), 1u);
  EXPECT_EQ(t.numa[0].cpus.size(), 4u);
  EXPECT_TRUE(t.devices.empty());
}

TEST(Topology, ThisMachine) {
  loom::HostTopology t = loom::discoverTopology();
  EXPECT_GE(t.cpus, 1);
  EXPECT_GE(t.cores, 1);
  ASSERT_FALSE(t.numa.empty());
  EXPECT_GE(t.numaOfCpu(0), 0);
}

TEST(Topology, HostIdentity) {
  unsetenv("LOOM_HOST_ID");
  loom::HostIdentity a = loom::localHostIdentity(), b = loom::localHostIdentity();
  EXPECT_EQ(a.key(), b.key());
  EXPECT_FALSE(a.bootId.empty());
  EXPECT_NE(a.key().find(a.bootId), std::string::npos);
  // Two processes in different IPC namespaces differ even with the same boot id and hostname.
  loom::HostIdentity other = a;
  other.ipcNs = "ipc:[1]";
  EXPECT_NE(other.key(), a.key());
  setenv("LOOM_HOST_ID", "node-a", 1);
  EXPECT_EQ(loom::localHostIdentity().key(), "node-a");
  unsetenv("LOOM_HOST_ID");
}

// The hwloc path, on a recorded hwloc XML export of a 2-socket node with 4 GPUs and a NIC per
// socket (tests/unit/data/two_socket_8gpu.xml), and on this machine against /sys.
TEST(TopologyHwloc, RecordedTwoSocketEightGpuNode) {
  const char* dir = std::getenv("LOOM_TEST_DATA");
  ASSERT_NE(dir, nullptr) << "LOOM_TEST_DATA (set by meson test) names tests/unit/data";
  loom::HostTopology t;
  std::string why;
  if (!loom::loadHwloc(std::string(dir) + "/two_socket_8gpu.xml", &t, &why)) {
    if (why.find("built without hwloc") != std::string::npos) GTEST_SKIP() << why;
    FAIL() << why;
  }
  EXPECT_EQ(t.packages, 2);
  EXPECT_EQ(t.cores, 16);
  EXPECT_EQ(t.cpus, 32);
  ASSERT_EQ(t.numa.size(), 2u);
  EXPECT_EQ(t.numa[1].index, 1);
  EXPECT_EQ(t.numa[1].cpus.front(), 16);
  EXPECT_EQ(t.numa[1].cpus.back(), 31);
  EXPECT_EQ(t.numa[0].memoryBytes, 256ull << 30);
  EXPECT_EQ(t.numaOfCpu(20), 1);
  int gpus[2] = {0, 0};
  std::string nicNear[2];
  for (const auto& d : t.devices) {
    ASSERT_TRUE(d.numaNode == 0 || d.numaNode == 1) << d.name;
    if (d.kind == loom::PciDevice::Kind::Gpu) ++gpus[d.numaNode];
    if (d.kind == loom::PciDevice::Kind::Nic) nicNear[d.numaNode] = d.name + " " + d.pciAddress;
  }
  EXPECT_EQ(gpus[0], 4);
  EXPECT_EQ(gpus[1], 4);
  EXPECT_EQ(nicNear[0], "ens1f0np0 0000:30:00.0");
  EXPECT_EQ(nicNear[1], "ens2f0np0 0000:70:00.0");
  EXPECT_NE(loom::describeTopology(t).find("NUMA node 1: CPUs 16-31"), std::string::npos);
}

TEST(TopologyHwloc, ThisMachineAgreesWithSysfs) {
  loom::HostTopology h;
  std::string why;
  if (!loom::loadHwloc("", &h, &why)) GTEST_SKIP() << why;
  const loom::HostTopology s = loom::parseSysfs("/sys");
  EXPECT_EQ(h.cpus, s.cpus);
  EXPECT_EQ(h.cores, s.cores);
  EXPECT_EQ(h.numa.size(), s.numa.size());
}

// The progress-thread binding needs CPUs and NUMA nodes only: read without the PCI devices (whose
// configuration space costs milliseconds to read on a virtual machine), the same layout, no devices.
TEST(TopologyHwloc, WithoutDevicesTheSameCpusAndNodes) {
  const char* dir = std::getenv("LOOM_TEST_DATA");
  ASSERT_NE(dir, nullptr) << "LOOM_TEST_DATA (set by meson test) names tests/unit/data";
  loom::HostTopology full, cpusOnly;
  std::string why;
  if (!loom::loadHwloc(std::string(dir) + "/two_socket_8gpu.xml", &full, &why)) {
    if (why.find("built without hwloc") != std::string::npos) GTEST_SKIP() << why;
    FAIL() << why;
  }
  ASSERT_TRUE(loom::loadHwloc(std::string(dir) + "/two_socket_8gpu.xml", &cpusOnly, &why, /*devices=*/false)) << why;
  EXPECT_FALSE(full.devices.empty());
  EXPECT_TRUE(cpusOnly.devices.empty());
  EXPECT_EQ(cpusOnly.cpus, full.cpus);
  EXPECT_EQ(cpusOnly.cores, full.cores);
  ASSERT_EQ(cpusOnly.numa.size(), full.numa.size());
  for (size_t i = 0; i < full.numa.size(); ++i) EXPECT_EQ(cpusOnly.numa[i].cpus, full.numa[i].cpus);
  // And this machine, as the binding reads it.
  loom::HostTopology here;
  if (loom::loadHwloc("", &here, &why, /*devices=*/false)) {
    EXPECT_TRUE(here.devices.empty());
    EXPECT_EQ(here.cpus, loom::parseSysfs("/sys").cpus);
  }
}

TEST(TopologyHwloc, AnUnreadableFileFallsBackToSysfsAndSaysWhy) {
  loom::HostTopology t;
  std::string why;
  EXPECT_FALSE(loom::loadHwloc("/nonexistent/topology.xml", &t, &why));
  EXPECT_FALSE(why.empty());
}

TEST(Affinity, ProgressThreadsGoToTheNumaNodesOfTheRanksCpus) {
  loom::HostTopology t;
  for (int n = 0; n < 2; ++n) {
    loom::NumaNode node;
    node.index = n;
    for (int c = 0; c < 16; ++c) node.cpus.push_back(n * 16 + c);
    t.numa.push_back(node);
  }
  const std::vector<int> node0 = loom::parseCpuList("0-15"), node1 = loom::parseCpuList("16-31");
  EXPECT_EQ(loom::planProgressCpus({3}, t), node0);                            // bound to one core: its node
  EXPECT_EQ(loom::planProgressCpus({20, 21}, t), node1);                       // two cores of node 1
  EXPECT_TRUE(loom::planProgressCpus({3, 20}, t).empty());                     // spans both: every CPU, no binding
  EXPECT_TRUE(loom::planProgressCpus(loom::parseCpuList("0-31"), t).empty());  // unbound
  EXPECT_TRUE(loom::planProgressCpus({99}, t).empty());                        // unknown CPU: leave it
}
