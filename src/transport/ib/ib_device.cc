#include "transport/ib/ib_device.hpp"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include "core/format.hpp"

namespace loom {
namespace ib {
namespace {

std::string readLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

// Where the library cannot say (before rdma-core 32), the kernel's GID table says in sysfs.
GidType sysfsGidType(const std::string& ibdevPath, int port, int index) {
  const std::string t = readLine(strFormat("%s/ports/%d/gid_attrs/types/%d", ibdevPath.c_str(), port, index));
  if (t.find("v2") != std::string::npos) return GidType::RoCEv2;
  if (t.find("RoCE") != std::string::npos) return GidType::RoCEv1;
  return GidType::Unknown;
}

GidType fromVerbs(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB:
      return GidType::IB;
    case IBV_GID_TYPE_ROCE_V1:
      return GidType::RoCEv1;
    case IBV_GID_TYPE_ROCE_V2:
      return GidType::RoCEv2;
    default:
      return GidType::Unknown;
  }
}

const char* gidTypeText(GidType t) {
  switch (t) {
    case GidType::IB:
      return "IB";
    case GidType::RoCEv1:
      return "RoCE v1";
    case GidType::RoCEv2:
      return "RoCE v2";
    default:
      return "type unknown";
  }
}

void readPort(const Verbs& v, ibv_context* ctx, const std::string& ibdevPath, int port, PortInfo* p) {
  ibv_port_attr attr;
  std::memset(&attr, 0, sizeof attr);
  if (v.queryPort(ctx, static_cast<uint8_t>(port), &attr) != 0) return;
  p->state = attr.state;
  p->ethernet = attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  p->lid = attr.lid;
  p->activeMtu = attr.active_mtu;
  p->speed = linkSpeed(attr.active_speed, attr.active_width);
  for (int i = 0; i < attr.gid_tbl_len && i < 256; ++i) {
    GidInfo g;
    g.index = i;
    bool typed = false;
    if (v.queryGidEx != nullptr) {
      ibv_gid_entry e;
      std::memset(&e, 0, sizeof e);
      if (v.queryGidEx(ctx, static_cast<uint32_t>(port), static_cast<uint32_t>(i), &e, 0, sizeof e) == 0) {
        std::memcpy(g.raw, e.gid.raw, 16);
        g.type = fromVerbs(e.gid_type);
        typed = true;
      } else {
        continue;  // an empty entry (ENODATA) or none: the table may have holes
      }
    } else {
      ibv_gid gid;
      if (v.queryGid(ctx, static_cast<uint8_t>(port), i, &gid) != 0) continue;
      std::memcpy(g.raw, gid.raw, 16);
    }
    bool zero = true;
    for (uint8_t b : g.raw) zero = zero && b == 0;
    if (zero) continue;
    if (!typed) g.type = p->ethernet ? sysfsGidType(ibdevPath, port, i) : GidType::IB;
    p->gids.push_back(g);
  }
}

}  // namespace

std::string GidInfo::text() const {
  char buf[INET6_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET6, raw, buf, sizeof buf);
  return buf;
}

bool GidInfo::ipv4() const {
  for (int i = 0; i < 10; ++i)
    if (raw[i] != 0) return false;
  return raw[10] == 0xff && raw[11] == 0xff;
}

bool GidInfo::linkLocal() const { return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80; }

LinkSpeed linkSpeed(uint8_t activeSpeed, uint8_t activeWidth) {
  LinkSpeed s;
  switch (activeWidth) {
    case 1:
      s.lanes = 1;
      break;
    case 2:
      s.lanes = 4;
      break;
    case 4:
      s.lanes = 8;
      break;
    case 8:
      s.lanes = 12;
      break;
    case 16:
      s.lanes = 2;
      break;
    default:
      s.lanes = 0;
  }
  // Data rates per lane after encoding, as `ibstat` reports them.
  switch (activeSpeed) {
    case 1:
      s = {s.lanes, 2.5, "SDR"};
      break;
    case 2:
      s = {s.lanes, 5.0, "DDR"};
      break;
    case 4:
      s = {s.lanes, 10.0, "QDR"};
      break;
    case 8:
      s = {s.lanes, 10.0, "FDR10"};
      break;
    case 16:
      s = {s.lanes, 14.0, "FDR"};
      break;
    case 32:
      s = {s.lanes, 25.0, "EDR"};
      break;
    case 64:
      s = {s.lanes, 50.0, "HDR"};
      break;
    case 128:
      s = {s.lanes, 100.0, "NDR"};
      break;
    default:
      break;
  }
  return s;
}

int mtuBytes(int mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << mtu : 0; }

bool PortInfo::active() const { return state == IBV_PORT_ACTIVE; }

std::string PortInfo::stateText() const {
  switch (state) {
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
    default:
      return strFormat("state %d", state);
  }
}

std::string PortInfo::describe() const {
  std::string s = strFormat("%s port %d: %s, %s", device.c_str(), port, stateText().c_str(),
                            ethernet ? "RoCE (Ethernet)" : "InfiniBand");
  if (speed.lanes > 0 && speed.laneGbps > 0) {
    s += strFormat(", %dx %s (%.0f Gb/s)", speed.lanes, speed.name, speed.gbps());
  }
  if (!ethernet) s += strFormat(", LID %u", static_cast<unsigned>(lid));
  if (mtuBytes(activeMtu) > 0) s += strFormat(", MTU %d", mtuBytes(activeMtu));
  s += numaNode >= 0 ? strFormat(", NUMA node %d", numaNode) : std::string(", NUMA node unknown");
  if (pciPath.compare(0, 13, "/sys/devices/") == 0) s += ", PCI " + pciPath.substr(pciPath.rfind('/') + 1);
  if (gids.empty()) {
    s += ", no GID";
  } else {
    s += "; GIDs:";
    for (const auto& g : gids) s += strFormat(" [%d] %s (%s)", g.index, g.text().c_str(), gidTypeText(g.type));
  }
  return s;
}

std::vector<PortInfo> listPorts(const Verbs& v, std::string* why) {
  std::vector<PortInfo> out;
  int n = 0;
  errno = 0;
  ibv_device** list = v.getDeviceList(&n);
  if (list == nullptr || n == 0) {
    if (why != nullptr) {
      // rdma-core says ENOSYS where the kernel has no RDMA support at all.
      *why = list == nullptr ? strFormat("ibv_get_device_list failed: %s%s", std::strerror(errno),
                                         errno == ENOSYS ? " (this kernel has no RDMA support)" : "")
                             : "no RDMA device found";
    }
    if (list != nullptr) v.freeDeviceList(list);
    return out;
  }
  for (int d = 0; d < n; ++d) {
    ibv_context* ctx = v.openDevice(list[d]);
    const std::string name = v.getDeviceName(list[d]);
    if (ctx == nullptr) continue;
    ibv_device_attr dattr;
    std::memset(&dattr, 0, sizeof dattr);
    if (v.queryDevice(ctx, &dattr) == 0) {
      const std::string ibdevPath = list[d]->ibdev_path;
      const std::string numa = readLine(ibdevPath + "/device/numa_node");
      char pci[PATH_MAX];
      const std::string pciPath = realpath((ibdevPath + "/device").c_str(), pci) != nullptr ? pci : "";
      for (int port = 1; port <= dattr.phys_port_cnt; ++port) {
        PortInfo p;
        p.device = name;
        p.port = port;
        p.numaNode = numa.empty() ? -1 : std::atoi(numa.c_str());
        p.pciPath = pciPath;
        readPort(v, ctx, ibdevPath, port, &p);
        out.push_back(std::move(p));
      }
    }
    v.closeDevice(ctx);
  }
  v.freeDeviceList(list);
  if (out.empty() && why != nullptr) *why = "the RDMA devices found have no port that answers";
  return out;
}

std::vector<PortInfo> knownPorts(const Verbs& v, std::string* why) {
  struct Listing {
    std::vector<PortInfo> ports;
    std::string why;
  };
  static std::mutex mu;
  static auto* listings = new std::map<const Verbs*, Listing>();  // never destroyed: used up to exit
  std::lock_guard<std::mutex> lock(mu);
  auto it = listings->find(&v);
  if (it == listings->end()) {
    Listing l;
    l.ports = listPorts(v, &l.why);
    it = listings->emplace(&v, std::move(l)).first;
  }
  if (it->second.ports.empty() && why != nullptr) *why = it->second.why;
  return it->second.ports;
}

int chooseGidIndex(const std::vector<GidInfo>& gids, int family, int forced) {
  if (forced >= 0) return forced;
  auto first = [&](auto pred) {
    for (const auto& g : gids)
      if (pred(g)) return g.index;
    return -1;
  };
  int i = first([&](const GidInfo& g) {
    return g.type == GidType::RoCEv2 && (family == AF_INET6 ? !g.ipv4() && !g.linkLocal() : g.ipv4());
  });
  if (i < 0) i = first([](const GidInfo& g) { return g.type == GidType::RoCEv2; });
  if (i < 0) i = first([](const GidInfo& g) { return g.type == GidType::RoCEv1; });
  if (i < 0 && !gids.empty()) i = gids.front().index;
  return i;
}

}  // namespace ib
}  // namespace loom
