// Slurm's compressed host lists (SLURM_STEP_NODELIST), expanded with a bound (hostlist.hpp).
#include <cstddef>
#include <cstdint>
#include <string>

#include "bootstrap/hostlist.hpp"
#include "loom/loom.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto hosts = loom::expandHostList(text, 4096);
    if (hosts.size() > 4096) __builtin_trap();
    const std::string first = loom::firstHost(text);
    if (!hosts.empty() && first != hosts.front()) __builtin_trap();
  } catch (const loom::Error&) {
    // A malformed list is an error, never a crash.
  }
  return 0;
}
