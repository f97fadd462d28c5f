// The hwloc path of topology.hpp: the same HostTopology, read through hwloc (this machine, or a
// recorded XML export). Without hwloc in the build, loadHwloc says so and discoverTopology uses
// /sys.
#include <cstdio>
#include <string>

#include "core/format.hpp"
#include "core/param.hpp"
#include "core/topology.hpp"
#include "loom_config.h"

#if LOOM_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace loom {
namespace {

LOOM_PARAM_STR(topoParam, "LOOM_TOPO", "",
               "where the host layout comes from: hwloc, sysfs, or a recorded hwloc XML file (default: hwloc when "
               "built with it, else sysfs)");

#if LOOM_HAVE_HWLOC

std::vector<int> bitmapToList(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr) return out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

// The NUMA node an I/O object sits near: the one NUMA node of its closest non-I/O ancestor, or -1
// when that ancestor spans several (the firmware does not say, as /sys's -1).
int numaNear(hwloc_topology_t topo, hwloc_obj_t obj) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, obj);
  if (anc == nullptr || anc->nodeset == nullptr || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

std::string busId(hwloc_obj_t pci) {
  return strFormat("%04x:%02x:%02x.%01x", pci->attr->pcidev.domain, pci->attr->pcidev.bus, pci->attr->pcidev.dev,
                   pci->attr->pcidev.func);
}

#endif

}  // namespace

bool loadHwloc(const std::string& xmlPath, HostTopology* out, std::string* why, bool devices) {
#if LOOM_HAVE_HWLOC
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) {
    *why = "hwloc_topology_init failed";
    return false;
  }
  struct Guard {
    hwloc_topology_t t;
    ~Guard() { hwloc_topology_destroy(t); }
  } guard{topo};
  if (!xmlPath.empty() && hwloc_topology_set_xml(topo, xmlPath.c_str()) != 0) {
    *why = strFormat("hwloc cannot read %s: %s", xmlPath.c_str(), errnoText(errno).c_str());
    return false;
  }
  hwloc_topology_set_io_types_filter(topo, devices ? HWLOC_TYPE_FILTER_KEEP_IMPORTANT : HWLOC_TYPE_FILTER_KEEP_NONE);
  if (hwloc_topology_load(topo) != 0) {
    *why = strFormat("hwloc_topology_load failed: %s", errnoText(errno).c_str());
    return false;
  }
  HostTopology t;
  t.source = xmlPath.empty() ? "hwloc" : "hwloc XML " + xmlPath;
  t.cpus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  t.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  t.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  const int nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode node;
    node.index = static_cast<int>(n->os_index);
    node.cpus = bitmapToList(n->cpuset);
    node.memoryBytes = n->attr != nullptr ? n->attr->numanode.local_memory : 0;
    t.numa.push_back(std::move(node));
  }
  // GPUs: NVIDIA or AMD display / 3D controllers, as in the /sys path.
  for (hwloc_obj_t p = hwloc_get_next_pcidev(topo, nullptr); p != nullptr; p = hwloc_get_next_pcidev(topo, p)) {
    const unsigned cls = p->attr->pcidev.class_id, vendor = p->attr->pcidev.vendor_id;
    if ((cls != 0x0300 && cls != 0x0302) || (vendor != 0x10de && vendor != 0x1002)) continue;
    PciDevice d;
    d.kind = PciDevice::Kind::Gpu;
    d.pciAddress = d.name = busId(p);
    d.numaNode = numaNear(topo, p);
    t.devices.push_back(std::move(d));
  }
  // NICs: network and OpenFabrics OS devices, named as the kernel names them.
  for (hwloc_obj_t o = hwloc_get_next_osdev(topo, nullptr); o != nullptr; o = hwloc_get_next_osdev(topo, o)) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK) continue;
    PciDevice d;
    d.kind = PciDevice::Kind::Nic;
    d.name = o->name != nullptr ? o->name : "?";
    if (o->parent != nullptr && o->parent->type == HWLOC_OBJ_PCI_DEVICE) d.pciAddress = busId(o->parent);
    d.numaNode = numaNear(topo, o);
    t.devices.push_back(std::move(d));
  }
  *out = std::move(t);
  return true;
#else
  (void)xmlPath;
  (void)out;
  (void)devices;
  *why = "Loom was built without hwloc (Meson feature hwloc; apt-get install libhwloc-dev)";
  return false;
#endif
}

HostTopology discoverTopology(bool devices) {
  const std::string how = topoParam();
  if (how == "sysfs") return parseSysfs("/sys");
  HostTopology t;
  std::string why;
  if (loadHwloc(how == "hwloc" ? "" : how, &t, &why, devices)) return t;
  t = parseSysfs("/sys");
  if (!how.empty() || LOOM_HAVE_HWLOC) t.source += " (hwloc: " + why + ")";
  return t;
}

}  // namespace loom
