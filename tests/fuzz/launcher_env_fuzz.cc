// Launcher detection on an arbitrary environment: NAME=VALUE lines (launcher_env.hpp).
#include <cstddef>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "bootstrap/launcher_env.hpp"
#include "loom/loom.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> vars;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  try {
    loom::LaunchInfo info = loom::detectLaunch([&](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
    if (info.rank < 0 || info.rank >= info.size) __builtin_trap();
    if (info.masterPort < 1 || info.masterPort > 65535) __builtin_trap();
  } catch (const loom::Error&) {
    // Missing or contradictory variables are errors, never crashes.
  }
  return 0;
}
