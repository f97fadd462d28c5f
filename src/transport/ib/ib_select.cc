#include "transport/ib/ib_select.hpp"

#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "core/format.hpp"
#include "core/param.hpp"
#include "core/status.hpp"
#include "core/topology.hpp"
#include "device/runtime.hpp"

namespace loom {
namespace ib {
namespace {

LOOM_PARAM_STR(hcaParam, "LOOM_IB_HCA", "",
               "InfiniBand/RoCE devices and ports the ib transport may use, in NCCL_IB_HCA's syntax: mlx5_0:1,mlx5_1 "
               "(prefixes; =name for exact names; ^ to exclude); default: every active port, nearest first");
LOOM_PARAM_INT(gidIndexParam, "LOOM_IB_GID_INDEX", -1,
               "RoCE GID index for the ib transport's queue pairs (-1: the RoCE v2 GID of LOOM_IB_ADDR_FAMILY)");
LOOM_PARAM_STR(familyParam, "LOOM_IB_ADDR_FAMILY", "AF_INET",
               "address family of the RoCE GID the ib transport picks: AF_INET or AF_INET6");
LOOM_PARAM_INT(timeoutParam, "LOOM_IB_TIMEOUT", 20,
               "ib transport ack timeout exponent: each try waits 4.096 us * 2^value (1-31)");
LOOM_PARAM_INT(retryParam, "LOOM_IB_RETRY_CNT", 7, "ib transport retries of an unanswered packet (0-7)");
LOOM_PARAM_INT(tcParam, "LOOM_IB_TC", 0, "traffic class of the ib transport's packets (0-255)");
LOOM_PARAM_INT(slParam, "LOOM_IB_SL", 0, "InfiniBand service level of the ib transport's queue pairs (0-15)");
LOOM_PARAM_INT(qpsParam, "LOOM_IB_QPS_PER_CONNECTION", 1,
               "queue pairs per ib connection; large messages are striped over them (1-16)");

int inRange(const char* name, int64_t v, int lo, int hi) {
  if (v < lo || v > hi) {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               strFormat("%s=%lld is out of range (%d to %d)", name, static_cast<long long>(v), lo, hi));
  }
  return static_cast<int>(v);
}

}  // namespace

IbSettings ibSettingsFromEnv() {
  IbSettings s;
  s.hca = parseHcaSpec(hcaParam());
  s.gidIndex = inRange("LOOM_IB_GID_INDEX", gidIndexParam(), -1, 255);
  const std::string family = familyParam();
  if (family == "AF_INET" || family == "ipv4") {
    s.family = AF_INET;
  } else if (family == "AF_INET6" || family == "ipv6") {
    s.family = AF_INET6;
  } else {
    LOOM_THROW(ErrorCode::InvalidArgument, -1,
               strFormat("LOOM_IB_ADDR_FAMILY=\"%s\": write AF_INET or AF_INET6", family.c_str()));
  }
  s.timeout = inRange("LOOM_IB_TIMEOUT", timeoutParam(), 1, 31);
  s.retryCnt = inRange("LOOM_IB_RETRY_CNT", retryParam(), 0, 7);
  s.trafficClass = inRange("LOOM_IB_TC", tcParam(), 0, 255);
  s.serviceLevel = inRange("LOOM_IB_SL", slParam(), 0, 15);
  s.qpsPerConnection = inRange("LOOM_IB_QPS_PER_CONNECTION", qpsParam(), 1, 16);
  return s;
}

const PortInfo* choosePort(const std::vector<PortInfo>& ports, const HcaSpec& spec, const Locality& where,
                           std::string* why) {
  std::vector<const PortInfo*> usable;
  std::string seen;
  for (const auto& p : ports) {
    seen += strFormat("%s%s:%d (%s)", seen.empty() ? "" : ", ", p.device.c_str(), p.port, p.stateText().c_str());
    if (p.active() && hcaSelected(spec, p.device, p.port)) usable.push_back(&p);
  }
  if (usable.empty()) {
    if (why != nullptr) {
      *why = ports.empty() ? "no RDMA port found"
                           : strFormat("no active port among %s is selected (LOOM_IB_HCA=\"%s\")", seen.c_str(),
                                       hcaParam().c_str());
    }
    return nullptr;
  }
  // The ports that pass `keep`, or all of `from` if none does.
  auto narrow = [](const std::vector<const PortInfo*>& from, auto keep) {
    std::vector<const PortInfo*> out;
    for (const PortInfo* p : from)
      if (keep(*p)) out.push_back(p);
    return out.empty() ? from : out;
  };
  std::vector<const PortInfo*> pool = usable;
  if (!where.gpuPciPath.empty()) {
    int best = 0;
    for (const PortInfo* p : usable) best = std::max(best, sharedPciDepth(p->pciPath, where.gpuPciPath));
    if (best > 0) {
      pool = narrow(usable, [&](const PortInfo& p) { return sharedPciDepth(p.pciPath, where.gpuPciPath) == best; });
    } else if (where.gpuNumaNode >= 0) {
      pool = narrow(usable, [&](const PortInfo& p) { return p.numaNode == where.gpuNumaNode; });
    }
  } else if (where.numaNode >= 0) {
    pool = narrow(usable, [&](const PortInfo& p) { return p.numaNode == where.numaNode; });
  }
  return pool[static_cast<size_t>(std::max(0, where.localIndex)) % pool.size()];
}

int sharedPciDepth(const std::string& a, const std::string& b) {
  const std::string root = "/sys/devices/";
  if (a.compare(0, root.size(), root) != 0 || b.compare(0, root.size(), root) != 0) return 0;
  std::stringstream sa(a.substr(root.size())), sb(b.substr(root.size()));
  int depth = 0;
  for (std::string x, y; std::getline(sa, x, '/') && std::getline(sb, y, '/') && x == y;) {
    // Bridges only: a host bridge ("pci0000:00") and PCI addresses below it ("0000:00:01.0").
    if (x.compare(0, 3, "pci") != 0 && std::count(x.begin(), x.end(), ':') != 2) break;
    ++depth;
  }
  return depth;
}

namespace {

// The NUMA node most of the calling thread's allowed CPUs are on, or -1.
int callerNumaNode() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  static const HostTopology topo = discoverTopology(false);
  std::map<int, int> count;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) count[topo.numaOfCpu(c)]++;
  int best = -1, most = 0;
  for (const auto& [node, n] : count)
    if (node >= 0 && n > most) {
      best = node;
      most = n;
    }
  return best;
}

}  // namespace

Locality callerLocality(int localIndex) {
  Locality where;
  where.numaNode = callerNumaNode();
  where.localIndex = localIndex;
  std::string bus;
  if (device::DeviceRuntime* rt = device::runtime()) {
    try {
      if (rt->deviceCount() > 0) bus = rt->pciBusId(rt->currentDevice());
    } catch (const Error&) {
      bus.clear();  // a GPU that cannot say where it is: the CPUs decide
    }
  }
  if (!bus.empty()) {
    char path[PATH_MAX];
    if (realpath(("/sys/bus/pci/devices/" + bus).c_str(), path) != nullptr) {
      where.gpuPciPath = path;
      std::ifstream numa(where.gpuPciPath + "/numa_node");
      if (!(numa >> where.gpuNumaNode)) where.gpuNumaNode = -1;
    }
  }
  return where;
}

}  // namespace ib
}  // namespace loom
