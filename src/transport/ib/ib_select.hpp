// Which port a rank uses, and the settings of its queue pairs, from the environment cluster users
// already write for NCCL (LOOM_IB_* named like NCCL_IB_*): LOOM_IB_HCA narrows the ports
// (hca_spec.hpp); among the active ones left, those on the NUMA node of the rank's CPUs come
// first, and ranks of one node spread over them by their local index.
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

/// The port for a rank whose CPUs are on NUMA node `numaNode` (-1: unknown) and which is the
/// `localIndex`-th rank of its node: among the active ports `spec` selects, those on that node (or
/// all, if none is), the `localIndex`-th modulo their number. Null and *why (naming what was found
/// and what LOOM_IB_HCA left) when none is left.
const PortInfo* choosePort(const std::vector<PortInfo>& ports, const HcaSpec& spec, int numaNode, int localIndex,
                           std::string* why);

/// The NUMA node most of the calling thread's allowed CPUs are on, or -1.
int callerNumaNode();

}  // namespace ib
}  // namespace loom
