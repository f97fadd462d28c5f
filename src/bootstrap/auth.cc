#include "bootstrap/auth.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "bootstrap/sha256.hpp"
#include "core/format.hpp"
#include "core/status.hpp"

namespace loom {

JobKey deriveJobKey(const std::string& seed) {
  const std::string labelled = "loom-job-key-v1:" + seed;
  return sha256(labelled.data(), labelled.size());
}

void randomBytes(void* out, size_t n) {
  // The kernel's generator: it blocks only until it is seeded at boot, and reads of up to 256 bytes
  // are not cut short by signals.
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      LOOM_THROW(ErrorCode::System, -1, "no random bytes available: getrandom: " + errnoText(errno));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

Nonce randomNonce() {
  Nonce n{};
  randomBytes(n.data(), n.size());
  return n;
}

Mac computeMac(const JobKey& key, const char* label, const Nonce& a, const Nonce& b, const void* extra,
               size_t extraLen) {
  const MacPart parts[] = {{label, std::strlen(label)}, {a.data(), a.size()}, {b.data(), b.size()}, {extra, extraLen}};
  return hmacSha256(key.data(), key.size(), parts, extraLen > 0 ? 4 : 3);
}

bool macEqual(const Mac& x, const uint8_t* y) {
  // Constant time: every byte is looked at, whatever the first difference.
  uint8_t diff = 0;
  for (size_t i = 0; i < x.size(); ++i) diff = static_cast<uint8_t>(diff | (x[i] ^ y[i]));
  return diff == 0;
}

}  // namespace loom
