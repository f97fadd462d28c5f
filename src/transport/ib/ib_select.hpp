// Which port a rank uses, and the settings of its queue pairs, from the environment cluster users
// already write for NCCL (LOOM_IB_* named like NCCL_IB_*): LOOM_IB_HCA narrows the ports
// (hca_spec.hpp); among the active ones left, those nearest the rank's GPU (PCI bridges in common,
// else its NUMA node) or, without one, on the NUMA node of the rank's CPUs come first, and ranks of
// one node spread over them by their local index.
#pragma once

#include <string>
#include <vector>

#include "transport/ib/hca_spec.hpp"
#include "transport/ib/ib_device.hpp"

namespace loom {
namespace ib {

struct IbSettings {
  HcaSpec hca;               ///< LOOM_IB_HCA
  int gidIndex = -1;         ///< LOOM_IB_GID_INDEX (-1: chosen per port, chooseGidIndex)
  int family = 2;            ///< LOOM_IB_ADDR_FAMILY: AF_INET (2) or AF_INET6 (10), for RoCE GIDs
  int timeout = 20;          ///< LOOM_IB_TIMEOUT: 4.096 us * 2^timeout per try
  int retryCnt = 7;          ///< LOOM_IB_RETRY_CNT
  int trafficClass = 0;      ///< LOOM_IB_TC
  int serviceLevel = 0;      ///< LOOM_IB_SL
  int qpsPerConnection = 1;  ///< LOOM_IB_QPS_PER_CONNECTION: large messages striped over this many
};

/// The settings from the environment. Throws Error(InvalidArgument) naming the variable for a
/// value out of its range (timeout 1-31, retry count 0-7, TC 0-255, SL 0-15, QPs 1-16, family
/// AF_INET or AF_INET6) and for a bad LOOM_IB_HCA.
IbSettings ibSettingsFromEnv();

/// Where a rank runs, for choosing the port nearest it.
struct Locality {
  int numaNode = -1;       ///< the NUMA node of the rank's CPUs (-1: unknown)
  std::string gpuPciPath;  ///< the sysfs path of the rank's GPU ("/sys/devices/pci0000:00/..."; "": none)
  int gpuNumaNode = -1;    ///< the GPU's NUMA node (-1: unknown)
  int localIndex = 0;      ///< the rank's index among the ranks of its node
};

/// The port for a rank at `where`: among the active ports `spec` selects, those nearest the
/// rank's GPU where it has one (sharing the most PCI bridges with it; failing that, on its NUMA
/// node), else those on the NUMA node of its CPUs (or all, if none is), the localIndex-th modulo
/// their number. Null and *why (naming what was found and what LOOM_IB_HCA left) when none is left.
const PortInfo* choosePort(const std::vector<PortInfo>& ports, const HcaSpec& spec, const Locality& where,
                           std::string* why);

/// The PCI bridges two sysfs device paths share: 0 for devices under different host bridges,
/// 1 under the same one, more for each switch or root port in common.
int sharedPciDepth(const std::string& a, const std::string& b);

/// The calling rank's locality: the NUMA node most of its allowed CPUs are on, and the GPU the
/// device runtime has current on this thread (if any), as the `localIndex`-th rank of its node.
Locality callerLocality(int localIndex);

}  // namespace ib
}  // namespace loom
