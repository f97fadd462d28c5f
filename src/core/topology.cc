#include "core/topology.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "core/format.hpp"
#include "core/param.hpp"

namespace loom {
namespace {

LOOM_PARAM_STR(hostIdParam, "LOOM_HOST_ID", "",
               "identity of this rank's host: ranks with equal ids may share memory (default: boot id, IPC "
               "namespace and /dev/shm)");

std::string readFirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> out;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

int intOr(const std::string& text, int fallback) {
  if (text.empty()) return fallback;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 0);
  return end == text.c_str() ? fallback : static_cast<int>(v);
}

// "Node 0 MemTotal:       32768 kB" -> bytes.
uint64_t memTotal(const std::string& meminfo) {
  std::ifstream f(meminfo);
  std::string line;
  while (std::getline(f, line)) {
    auto at = line.find("MemTotal:");
    if (at == std::string::npos) continue;
    std::istringstream in(line.substr(at + 9));
    uint64_t kb = 0;
    in >> kb;
    return kb * 1024;
  }
  return 0;
}

}  // namespace

std::string HostIdentity::key() const {
  if (!override_.empty()) return override_;
  return bootId + "|" + ipcNs + "|" + shmDev;
}

std::string HostIdentity::describe() const {
  if (!override_.empty()) return strFormat("%s (LOOM_HOST_ID=%s)", hostname.c_str(), override_.c_str());
  return strFormat("%s (boot %.8s, %s, /dev/shm %s)", hostname.c_str(), bootId.c_str(), ipcNs.c_str(), shmDev.c_str());
}

HostIdentity localHostIdentity() {
  HostIdentity id;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) id.hostname = host;
  id.bootId = readFirstLine("/proc/sys/kernel/random/boot_id");
  char link[256] = {};
  ssize_t n = readlink("/proc/self/ns/ipc", link, sizeof link - 1);
  if (n > 0) id.ipcNs.assign(link, static_cast<size_t>(n));
  struct stat st {};
  if (stat("/dev/shm", &st) == 0)
    id.shmDev =
        strFormat("%llx:%llx", static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino));
  // Without a boot id (no /proc), fall back to the hostname: the best guess left.
  if (id.bootId.empty()) id.bootId = "host:" + id.hostname;
  id.override_ = hostIdParam();
  return id;
}

std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty()) continue;
    auto dash = part.find('-');
    int lo = intOr(part.substr(0, dash), -1);
    int hi = dash == std::string::npos ? lo : intOr(part.substr(dash + 1), -1);
    if (lo < 0 || hi < lo || hi - lo > 1 << 20) continue;
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

int HostTopology::numaOfCpu(int cpu) const {
  for (const auto& n : numa)
    if (std::find(n.cpus.begin(), n.cpus.end(), cpu) != n.cpus.end()) return n.index;
  return -1;
}

HostTopology parseSysfs(const std::string& root) {
  HostTopology t;
  t.source = root == "/sys" ? "sysfs" : "sysfs at " + root;
  const std::string cpuDir = root + "/devices/system/cpu";
  std::vector<int> online = parseCpuList(readFirstLine(cpuDir + "/online"));
  t.cpus = static_cast<int>(online.size());
  std::set<std::pair<int, int>> cores;
  std::set<int> packages;
  for (int c : online) {
    const std::string topo = cpuDir + "/cpu" + std::to_string(c) + "/topology/";
    int pkg = intOr(readFirstLine(topo + "physical_package_id"), 0);
    int core = intOr(readFirstLine(topo + "core_id"), c);
    cores.insert({pkg, core});
    packages.insert(pkg);
  }
  t.cores = static_cast<int>(cores.size());
  t.packages = static_cast<int>(packages.size());
  // NUMA nodes; a machine (or kernel) without them is one node holding every CPU.
  const std::string nodeDir = root + "/devices/system/node";
  for (const auto& name : listDir(nodeDir)) {
    if (!startsWith(name, "node") || name.size() < 5 || !std::isdigit(static_cast<unsigned char>(name[4]))) continue;
    NumaNode n;
    n.index = intOr(name.substr(4), 0);
    n.cpus = parseCpuList(readFirstLine(nodeDir + "/" + name + "/cpulist"));
    n.memoryBytes = memTotal(nodeDir + "/" + name + "/meminfo");
    t.numa.push_back(std::move(n));
  }
  std::sort(t.numa.begin(), t.numa.end(), [](const NumaNode& a, const NumaNode& b) { return a.index < b.index; });
  if (t.numa.empty()) {
    NumaNode n;
    n.cpus = online;
    t.numa.push_back(std::move(n));
  }
  // Network interfaces backed by a device (virtual ones such as lo, veth or bridges have none).
  for (const auto& ifname : listDir(root + "/class/net")) {
    const std::string dev = root + "/class/net/" + ifname + "/device";
    struct stat st {};
    if (stat(dev.c_str(), &st) != 0) continue;
    PciDevice d;
    d.kind = PciDevice::Kind::Nic;
    d.name = ifname;
    char link[512] = {};
    ssize_t n = readlink(dev.c_str(), link, sizeof link - 1);
    if (n > 0) {
      std::string target(link, static_cast<size_t>(n));
      d.pciAddress = target.substr(target.find_last_of('/') + 1);
    }
    d.numaNode = intOr(readFirstLine(dev + "/numa_node"), -1);
    t.devices.push_back(std::move(d));
  }
  // GPUs: display or 3D controllers (PCI class 0x0300xx / 0x0302xx) from NVIDIA or AMD.
  const std::string pci = root + "/bus/pci/devices";
  for (const auto& addr : listDir(pci)) {
    const std::string cls = readFirstLine(pci + "/" + addr + "/class");
    const std::string vendor = readFirstLine(pci + "/" + addr + "/vendor");
    if (!(startsWith(cls, "0x0302") || startsWith(cls, "0x0300"))) continue;
    if (vendor != "0x10de" && vendor != "0x1002") continue;
    PciDevice d;
    d.kind = PciDevice::Kind::Gpu;
    d.name = addr;
    d.pciAddress = addr;
    d.numaNode = intOr(readFirstLine(pci + "/" + addr + "/numa_node"), -1);
    t.devices.push_back(std::move(d));
  }
  return t;
}

std::string describeTopology(const HostTopology& t) {
  std::string out = strFormat("%d package(s), %d core(s), %d CPU(s) online (from %s)\n", t.packages, t.cores, t.cpus,
                              t.source.c_str());
  for (const auto& n : t.numa) {
    std::string cpus;
    for (size_t i = 0; i < n.cpus.size(); ++i) {
      // Print runs compactly: 0-15,32-47.
      size_t j = i;
      while (j + 1 < n.cpus.size() && n.cpus[j + 1] == n.cpus[j] + 1) ++j;
      if (!cpus.empty()) cpus += ",";
      cpus += j > i ? strFormat("%d-%d", n.cpus[i], n.cpus[j]) : std::to_string(n.cpus[i]);
      i = j;
    }
    out += strFormat("  NUMA node %d: CPUs %s", n.index, cpus.c_str());
    if (n.memoryBytes > 0) out += strFormat(", %.1f GiB", static_cast<double>(n.memoryBytes) / (1u << 30));
    out += "\n";
    for (const auto& d : t.devices)
      if (d.numaNode == n.index)
        out += strFormat("    %s %s (%s)\n", d.kind == PciDevice::Kind::Gpu ? "GPU" : "NIC", d.name.c_str(),
                         d.pciAddress.c_str());
  }
  for (const auto& d : t.devices)
    if (d.numaNode < 0 ||
        std::none_of(t.numa.begin(), t.numa.end(), [&](const NumaNode& n) { return n.index == d.numaNode; }))
      out += strFormat("  %s %s (%s), NUMA node not reported\n", d.kind == PciDevice::Kind::Gpu ? "GPU" : "NIC",
                       d.name.c_str(), d.pciAddress.c_str());
  return out;
}

}  // namespace loom
