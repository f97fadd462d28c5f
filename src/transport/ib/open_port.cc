#include "transport/ib/open_port.hpp"

#include <cerrno>
#include <cstring>

#include "core/format.hpp"

namespace loom {
namespace ib {

std::unique_ptr<OpenPort> OpenPort::open(const Verbs& v, const IbSettings& settings,
                                         const std::function<Locality()>& locate, std::string* why) {
  const std::vector<PortInfo> ports = knownPorts(v, why);
  if (ports.empty()) return nullptr;  // *why says why there is none
  const PortInfo* chosen = choosePort(ports, settings.hca, locate(), why);
  if (chosen == nullptr) return nullptr;
  int gidIndex = -1;
  if (chosen->ethernet) {
    gidIndex = chooseGidIndex(chosen->gids, settings.family, settings.gidIndex);
    if (gidIndex < 0) {
      *why = strFormat("RoCE port %s:%d has no GID to send from", chosen->device.c_str(), chosen->port);
      return nullptr;
    }
  }
  int n = 0;
  ibv_device** list = v.getDeviceList(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; list != nullptr && i < n && ctx == nullptr; ++i)
    if (chosen->device == v.getDeviceName(list[i])) ctx = v.openDevice(list[i]);
  if (list != nullptr) v.freeDeviceList(list);
  if (ctx == nullptr) {
    *why = strFormat("cannot open %s: %s", chosen->device.c_str(), std::strerror(errno));
    return nullptr;
  }
  ibv_pd* pd = v.allocPd(ctx);
  if (pd == nullptr) {
    *why = strFormat("cannot allocate a protection domain on %s: %s", chosen->device.c_str(), std::strerror(errno));
    v.closeDevice(ctx);
    return nullptr;
  }
  std::unique_ptr<OpenPort> p(new OpenPort());
  p->pc_.verbs = &v;
  p->pc_.context = ctx;
  p->pc_.pd = pd;
  p->pc_.port = *chosen;
  p->pc_.gidIndex = gidIndex;
  p->pc_.settings = settings;
  return p;
}

OpenPort::~OpenPort() {
  if (pc_.pd != nullptr) pc_.verbs->deallocPd(pc_.pd);
  if (pc_.context != nullptr) pc_.verbs->closeDevice(pc_.context);
}

std::string OpenPort::describe() const {
  const PortInfo& p = pc_.port;
  if (!p.ethernet)
    return strFormat("%s:%d (InfiniBand, LID %u)", p.device.c_str(), p.port, static_cast<unsigned>(p.lid));
  std::string gid = "?";
  for (const auto& g : p.gids)
    if (g.index == pc_.gidIndex) gid = g.text();
  return strFormat("%s:%d (RoCE, GID index %d %s)", p.device.c_str(), p.port, pc_.gidIndex, gid.c_str());
}

}  // namespace ib
}  // namespace loom
