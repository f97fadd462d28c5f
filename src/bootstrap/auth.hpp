// The job secret and the challenge-response that proves a connection belongs to the job.
//
// Both sides of every connection (rendezvous store and peer links) exchange 16-byte random nonces
// and each proves knowledge of the 32-byte job key with HMAC-SHA256 over a role label and both
// nonces, so that the key itself never crosses the wire and a recorded exchange cannot be
// replayed. SHA-256 and HMAC: bootstrap/sha256.hpp; random bytes: the kernel (getrandom).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

using JobKey = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 16>;
using Mac = std::array<uint8_t, 32>;

/// SHA-256 of a seed text (a job id, LOOM_JOB_KEY).
JobKey deriveJobKey(const std::string& seed);
/// Cryptographically random bytes.
void randomBytes(void* out, size_t n);
Nonce randomNonce();
/// HMAC-SHA256(key, label || a || b || extra).
Mac computeMac(const JobKey& key, const char* label, const Nonce& a, const Nonce& b, const void* extra = nullptr,
               size_t extraLen = 0);
/// Constant-time comparison.
bool macEqual(const Mac& x, const uint8_t* y);

}  // namespace loom
