// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the job key and the handshakes' proofs.
//
// Loom's own rather than OpenSSL's: every rank hashes a few dozen short messages in its life, and
// OpenSSL 3 makes its first caller load its configuration, its default provider and a random
// generator first (milliseconds of CPU in each process, paid by every rank of a crowded node).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace loom {

using Sha256Digest = std::array<uint8_t, 32>;

/// Incremental SHA-256: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  Sha256Digest finish();

 private:
  void block(const uint8_t* p);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;
  uint64_t total_ = 0;
};

Sha256Digest sha256(const void* data, size_t len);

/// A piece of a message: `len` bytes at `data`.
struct MacPart {
  const void* data;
  size_t len;
};
/// HMAC-SHA256 under `key` of the concatenation of `parts`.
Sha256Digest hmacSha256(const void* key, size_t keyLen, const MacPart* parts, size_t count);

}  // namespace loom
