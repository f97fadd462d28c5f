#include "transport/ib/hca_spec.hpp"

#include <cstdlib>

#include "core/format.hpp"
#include "core/status.hpp"
#include "net/interfaces.hpp"

namespace loom {
namespace ib {

HcaSpec parseHcaSpec(const std::string& text) {
  // LOOM_SOCKET_IFNAME's list syntax (net/interfaces.hpp), each item with an optional ":port".
  const IfnameSpec list = parseIfnameSpec(text);
  HcaSpec spec;
  spec.exclude = list.exclude;
  spec.exact = list.exact;
  for (const std::string& item : list.names) {
    HcaSpec::Entry e;
    const size_t colon = item.find(':');
    e.name = item.substr(0, colon);
    if (colon != std::string::npos) {
      const std::string port = item.substr(colon + 1);
      char* end = nullptr;
      const long p = std::strtol(port.c_str(), &end, 10);
      if (e.name.empty() || port.empty() || *end != '\0' || p < 1 || p > 255) {
        LOOM_THROW(ErrorCode::InvalidArgument, -1,
                   strFormat("LOOM_IB_HCA=\"%s\": \"%s\" is not a device name with a port from 1 to 255 "
                             "(write mlx5_0:1, or mlx5_0 for every port)",
                             text.c_str(), item.c_str()));
      }
      e.port = static_cast<int>(p);
    }
    spec.entries.push_back(e);
  }
  return spec;
}

bool hcaSelected(const HcaSpec& spec, const std::string& device, int port) {
  if (spec.entries.empty()) return true;  // "" and "^" alike: nothing named, nothing excluded
  bool hit = false;
  for (const auto& e : spec.entries) {
    const bool name = spec.exact ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (name && (e.port == 0 || e.port == port)) {
      hit = true;
      break;
    }
  }
  return spec.exclude ? !hit : hit;
}

}  // namespace ib
}  // namespace loom
