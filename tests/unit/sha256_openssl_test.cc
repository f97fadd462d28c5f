// Loom's SHA-256 and HMAC-SHA256 against OpenSSL's on random messages and keys of every length up
// to a few blocks (built where OpenSSL's headers are).
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <random>
#include <vector>

#include "bootstrap/sha256.hpp"

namespace {

TEST(Sha256, MatchesOpenSsl) {
  std::mt19937 gen(12345);
  for (size_t len = 0; len < 300; ++len) {
    std::vector<uint8_t> msg(len), key(len % 150);
    for (auto& b : msg) b = static_cast<uint8_t>(gen());
    for (auto& b : key) b = static_cast<uint8_t>(gen());
    loom::Sha256Digest want{};
    unsigned int n = 0;
    ASSERT_EQ(EVP_Digest(msg.data(), msg.size(), want.data(), &n, EVP_sha256(), nullptr), 1);
    ASSERT_EQ(loom::sha256(msg.data(), msg.size()), want) << len;
    const uint8_t none = 0;  // OpenSSL's HMAC refuses a null key, even of length 0
    ASSERT_NE(HMAC(EVP_sha256(), key.empty() ? &none : key.data(), static_cast<int>(key.size()), msg.data(), msg.size(),
                   want.data(), &n),
              nullptr);
    const loom::MacPart part{msg.data(), msg.size()};
    ASSERT_EQ(loom::hmacSha256(key.data(), key.size(), &part, 1), want) << len;
  }
}

}  // namespace
