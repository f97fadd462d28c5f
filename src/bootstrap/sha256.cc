#include "bootstrap/sha256.hpp"

#include <algorithm>
#include <cstring>

namespace loom {

namespace {

// The first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

uint32_t loadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

constexpr size_t kBlock = 64;

}  // namespace

// The first 32 bits of the fractional parts of the square roots of the first 8 primes.
Sha256::Sha256() : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) w[t] = loadBe32(p + 4 * t);
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[t] + w[t];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(const void* data, size_t len) {
  if (len == 0) return;
  const auto* p = static_cast<const uint8_t*>(data);
  total_ += len;
  if (used_ > 0) {
    const size_t take = std::min(len, kBlock - used_);
    std::memcpy(buf_.data() + used_, p, take);
    used_ += take;
    p += take;
    len -= take;
    if (used_ < kBlock) return;
    block(buf_.data());
    used_ = 0;
  }
  for (; len >= kBlock; p += kBlock, len -= kBlock) block(p);
  if (len > 0) std::memcpy(buf_.data(), p, len);
  used_ = len;
}

Sha256Digest Sha256::finish() {
  // Padding: a one bit, zeros up to 56 bytes into a block, the message's length in bits.
  const uint64_t bits = total_ * 8;
  const uint8_t one = 0x80;
  update(&one, 1);
  const uint8_t zero[kBlock] = {};
  update(zero, (used_ <= 56 ? 56 - used_ : kBlock + 56 - used_));
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(length, 8);
  Sha256Digest out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[static_cast<size_t>(4 * i + j)] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
  return out;
}

Sha256Digest sha256(const void* data, size_t len) {
  Sha256 s;
  s.update(data, len);
  return s.finish();
}

Sha256Digest hmacSha256(const void* key, size_t keyLen, const MacPart* parts, size_t count) {
  // A key longer than a block is hashed first; a shorter one is padded with zeros.
  uint8_t k[kBlock] = {};
  if (keyLen > kBlock) {
    const Sha256Digest d = sha256(key, keyLen);
    std::memcpy(k, d.data(), d.size());
  } else if (keyLen > 0) {
    std::memcpy(k, key, keyLen);
  }
  uint8_t pad[kBlock];
  for (size_t i = 0; i < kBlock; ++i) pad[i] = static_cast<uint8_t>(k[i] ^ 0x36);
  Sha256 inner;
  inner.update(pad, kBlock);
  for (size_t i = 0; i < count; ++i) inner.update(parts[i].data, parts[i].len);
  const Sha256Digest innerDigest = inner.finish();
  for (size_t i = 0; i < kBlock; ++i) pad[i] = static_cast<uint8_t>(k[i] ^ 0x5c);
  Sha256 outer;
  outer.update(pad, kBlock);
  outer.update(innerDigest.data(), innerDigest.size());
  return outer.finish();
}

}  // namespace loom
