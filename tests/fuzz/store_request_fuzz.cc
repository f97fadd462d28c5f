// The rendezvous store's request decoder, on whatever a stray client sends (store_protocol.hpp).
#include <cstddef>
#include <cstdint>
#include <string>

#include "bootstrap/store_protocol.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::storewire;
  size_t at = 0;
  while (at < size) {
    Request r;
    size_t used = 0;
    std::string why;
    const Parse p = decodeRequest(data + at, size - at, &r, &used, &why);
    if (p != Parse::Done) break;
    if (used == 0 || used > size - at) __builtin_trap();  // the decoder must move forward, inside the buffer
    // What was decoded encodes back to the same bytes.
    const loom::Bytes again = encodeRequest(r.op, r.key, r.value);
    if (again.size() != used) __builtin_trap();
    at += used;
  }
  return 0;
}
