// Topology: which ranks share a host, and what the host is made of.
//
// Host identity. Two ranks are on the same node, for Loom, only if they can share memory: the same
// kernel (boot id), the same IPC namespace, and the same /dev/shm file system. A hostname is not
// enough: containers and network namespaces on one machine often share it, or differ while
// sharing memory. LOOM_HOST_ID replaces the whole identity (tests, unusual setups).
//
// Host layout. NUMA nodes with their CPUs and memory, physical cores, and the network interfaces
// and GPUs with the NUMA node each sits near: through hwloc when Loom is built with it
// (topology_hwloc.cc), else from /sys (the fallback that always works). `parseSysfs` reads any directory laid out like
// /sys, so that tests can check recorded machines.
//
// Pure functions of the files they read; no thread, no state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct HostIdentity {
  std::string hostname;
  std::string bootId;     ///< /proc/sys/kernel/random/boot_id
  std::string ipcNs;      ///< the target of /proc/self/ns/ipc, e.g. "ipc:[4026531839]"
  std::string shmDev;     ///< device and inode of /dev/shm
  std::string override_;  ///< LOOM_HOST_ID, when set

  /// The key compared between ranks: equal keys can share memory.
  std::string key() const;
  /// For logs: "node01 (boot 1f2e..., ipc:[4026531839])".
  std::string describe() const;
};

/// This process's identity (LOOM_HOST_ID overrides).
HostIdentity localHostIdentity();

struct NumaNode {
  int index = 0;
  std::vector<int> cpus;
  uint64_t memoryBytes = 0;
};

struct PciDevice {
  enum class Kind { Nic, Gpu };
  Kind kind = Kind::Nic;
  std::string name;  ///< interface name for NICs, PCI address for GPUs
  std::string pciAddress;
  int numaNode = -1;  ///< -1: the firmware does not say
};

struct HostTopology {
  std::string source;  ///< "sysfs" (or the root directory parsed)
  int cpus = 0;        ///< logical CPUs online
  int cores = 0;       ///< physical cores (distinct package/core pairs)
  int packages = 0;    ///< sockets
  std::vector<NumaNode> numa;
  std::vector<PciDevice> devices;
  /// NUMA node of `cpu`, or -1.
  int numaOfCpu(int cpu) const;
};

/// Parses a /sys-like tree under `root` ("/sys" for this machine): devices/system/node,
/// devices/system/cpu, class/net, bus/pci/devices.
HostTopology parseSysfs(const std::string& root);
/// Reads the layout through hwloc: this machine (xmlPath empty) or a recorded hwloc XML export.
/// Returns false with the reason when hwloc is not built in or cannot read it. Without `devices`,
/// CPUs and NUMA nodes only: finding the PCI devices reads their configuration space, which takes
/// milliseconds on a virtual machine, with interrupts off on the CPU that reads it.
bool loadHwloc(const std::string& xmlPath, HostTopology* out, std::string* why, bool devices = true);
/// This machine's topology: hwloc when built with it, else /sys (LOOM_TOPO: hwloc, sysfs, or an
/// XML file). Without `devices`, HostTopology::devices stays empty (see loadHwloc).
HostTopology discoverTopology(bool devices = true);
/// Several lines for loom-info.
std::string describeTopology(const HostTopology& t);
/// Parses a Linux CPU list ("0-3,8,10-11").
std::vector<int> parseCpuList(const std::string& text);

}  // namespace loom
