// The InfiniBand and RoCE ports this machine offers, as the verbs library reports them (verbs.hpp)
// and sysfs adds to (NUMA node, a GID's RoCE version where the library cannot say): what
// loom-info lists and what the ib transport chooses from (LOOM_IB_HCA, hca_spec.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/ib/verbs.hpp"

namespace loom {
namespace ib {

enum class GidType { Unknown, IB, RoCEv1, RoCEv2 };

struct GidInfo {
  int index = 0;
  uint8_t raw[16] = {};
  GidType type = GidType::Unknown;
  std::string text() const;  ///< as an IPv6 address (an IPv4-mapped one for IPv4 RoCE)
  bool ipv4() const;         ///< ::ffff:a.b.c.d, a RoCE GID of an IPv4 address
  bool linkLocal() const;    ///< fe80::/10
};

struct LinkSpeed {
  int lanes = 0;
  double laneGbps = 0;
  const char* name = "unknown";  ///< SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR
  double gbps() const { return lanes * laneGbps; }
};
/// The speed of a port from ibv_port_attr's active_speed and active_width codes.
LinkSpeed linkSpeed(uint8_t activeSpeed, uint8_t activeWidth);
/// Bytes of an ibv_mtu (IBV_MTU_256 .. IBV_MTU_4096); 0 for an unknown code.
int mtuBytes(int mtu);

struct PortInfo {
  std::string device;
  int port = 0;
  int state = 0;          ///< enum ibv_port_state
  bool ethernet = false;  ///< RoCE (link layer Ethernet); else InfiniBand
  uint16_t lid = 0;       ///< InfiniBand only
  int activeMtu = 0;      ///< enum ibv_mtu
  LinkSpeed speed;
  std::vector<GidInfo> gids;  ///< the port's non-zero GIDs
  int numaNode = -1;          ///< -1: unknown
  std::string pciPath;        ///< the adapter's sysfs path ("/sys/devices/pci0000:00/..."; "": unknown)
  bool active() const;
  std::string stateText() const;
  /// One line for loom-info and logs.
  std::string describe() const;
};

/// Every port of every device the library lists; [] and *why when there is none or the library
/// is absent.
std::vector<PortInfo> listPorts(const Verbs& v, std::string* why);
/// listPorts(v) as the process's first call of it for `v` found them: devices are listed once per
/// process, as NCCL does, not at every communicator's set-up (each listing rescans sysfs and opens
/// every device; a job that makes dozens of groups paid it dozens of times). A device or port that
/// appears later is seen by the next process. Thread-safe.
std::vector<PortInfo> knownPorts(const Verbs& v, std::string* why);

/// The GID index a RoCE port's queue pairs use: `forced` when 0 or more (LOOM_IB_GID_INDEX), else
/// the first RoCE v2 GID of the address family (AF_INET or AF_INET6; IPv6 ones not link-local),
/// else the first RoCE v2 GID, else the first RoCE v1 one, else the first GID; -1 when there is none.
int chooseGidIndex(const std::vector<GidInfo>& gids, int family, int forced);

}  // namespace ib
}  // namespace loom
