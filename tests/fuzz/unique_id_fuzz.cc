// The unique id decoder, on bytes a user or a launcher hands over (rendezvous.hpp).
#include <cstddef>
#include <cstdint>
#include <string>

#include "bootstrap/rendezvous.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::UniqueIdFields f;
  std::string why;
  if (loom::decodeUniqueId(data, size, &f, &why)) {
    // A valid id round-trips.
    uint8_t out[128];
    loom::encodeUniqueId(f, out);
    loom::UniqueIdFields g;
    if (!loom::decodeUniqueId(out, sizeof out, &g, &why)) __builtin_trap();
  }
  return 0;
}
