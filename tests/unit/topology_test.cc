// Topology from /sys-like trees: a recorded 2-socket, 8-GPU node written out by the test, a
// machine without NUMA information, and this machine; CPU lists; host identities.
#include "core/topology.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

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
