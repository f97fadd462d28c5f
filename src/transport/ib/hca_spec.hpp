// HcaSpec: which InfiniBand / RoCE devices and ports a rank may use, in NCCL_IB_HCA's syntax, which
// cluster users already write: a comma-separated list of device names, each optionally with a
// port ("mlx5_0:1,mlx5_1"); names match as prefixes unless the list starts with '=' (exact
// names); a leading '^' excludes the list instead ("^mlx5_2", "^=mlx5_0:1").
#pragma once

#include <string>
#include <vector>

namespace loom {
namespace ib {

struct HcaSpec {
  struct Entry {
    std::string name;
    int port = 0;  ///< 0: every port of the device
  };
  bool exclude = false;
  bool exact = false;
  std::vector<Entry> entries;  ///< empty: every device
};

/// Parses LOOM_IB_HCA's syntax. Throws Error(InvalidArgument) naming the entry for a port that is
/// not a number from 1 to 255 or an empty name before a port.
HcaSpec parseHcaSpec(const std::string& text);

/// Whether port `port` of device `device` is selected by `spec`.
bool hcaSelected(const HcaSpec& spec, const std::string& device, int port);

}  // namespace ib
}  // namespace loom
