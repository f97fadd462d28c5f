// LOOM_SOCKET_IFNAME's syntax (interfaces.hpp).
#include <cstddef>
#include <cstdint>
#include <string>

#include "net/interfaces.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const loom::IfnameSpec spec = loom::parseIfnameSpec(text);
  for (const char* name : {"eth0", "lo", "docker0", "ib0", "", "enp1s0f1"}) (void)loom::ifnameMatches(spec, name);
  return 0;
}
