#include "bootstrap/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>
#include <vector>

#include "core/status.hpp"

namespace loom {

JobKey deriveJobKey(const std::string& seed) {
  JobKey key{};
  unsigned int len = 0;
  std::string labelled = "loom-job-key-v1:" + seed;
  if (EVP_Digest(labelled.data(), labelled.size(), key.data(), &len, EVP_sha256(), nullptr) != 1 || len != key.size()) {
    LOOM_THROW(ErrorCode::Internal, -1, "SHA-256 failed");
  }
  return key;
}

void randomBytes(void* out, size_t n) {
  if (RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(n)) != 1) {
    LOOM_THROW(ErrorCode::System, -1, "no random bytes available (OpenSSL RAND_bytes failed)");
  }
}

Nonce randomNonce() {
  Nonce n{};
  randomBytes(n.data(), n.size());
  return n;
}

Mac computeMac(const JobKey& key, const char* label, const Nonce& a, const Nonce& b, const void* extra,
               size_t extraLen) {
  std::vector<uint8_t> msg;
  size_t labelLen = std::strlen(label);
  msg.reserve(labelLen + a.size() + b.size() + extraLen);
  msg.insert(msg.end(), label, label + labelLen);
  msg.insert(msg.end(), a.begin(), a.end());
  msg.insert(msg.end(), b.begin(), b.end());
  if (extraLen > 0)
    msg.insert(msg.end(), static_cast<const uint8_t*>(extra), static_cast<const uint8_t*>(extra) + extraLen);
  Mac mac{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), msg.size(), mac.data(), &len) ==
          nullptr ||
      len != mac.size()) {
    LOOM_THROW(ErrorCode::Internal, -1, "HMAC-SHA256 failed");
  }
  return mac;
}

bool macEqual(const Mac& x, const uint8_t* y) { return CRYPTO_memcmp(x.data(), y, x.size()) == 0; }

}  // namespace loom
